"""What the controller shows of a failed payload: its one error line, never a traceback's frames."""

from orchestrator.core.errors import payload_error_text

TRACEBACK = """Traceback (most recent call last):
  File "/w/payload/remote_payload/models/checkpoint.py", line 164, in read_training_checkpoint
    f"({str(exc).splitlines()[0][:160]}); re-save it with plain dicts") from None
        ~~~~~~~~~~~~~~~~~~~~~^^^
IndexError: list index out of range
"""


def test_the_payload_s_own_error_line_is_what_is_shown():
    said = payload_error_text("warming up\ndfo-payload error: training checkpoint /c/a.pt: an empty file (0 bytes)\n")
    assert said == "training checkpoint /c/a.pt: an empty file (0 bytes)"


def test_a_traceback_shows_only_its_exception_line():
    said = payload_error_text(TRACEBACK)
    assert said is not None and "IndexError: list index out of range" in said and "a bug in dfo's payload" in said
    assert "File " not in said and "splitlines" not in said and "Traceback" not in said


def test_other_output_is_left_to_the_caller():
    assert payload_error_text("ssh: connect to host kpro6 port 22: Connection refused") is None
