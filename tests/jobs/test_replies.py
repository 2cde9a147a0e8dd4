"""The jobs host script's replies, typed (pure): what the script answers parses, anything else is a HostError
naming the host and the field (the sandbox tests in tests/security/test_hostile_lows.py drive the CLI)."""

from __future__ import annotations

import base64

import pytest

from orchestrator.core.errors import HostError
from orchestrator.jobs import replies
from orchestrator.jobs.replies import JobStatus

HOST = "ct129"


def state(**changes) -> dict:
    """A `job_state` answer as the host script writes it."""
    info = {"job_id": "20260101-000000-abcd", "name": None, "job_dir": "/w/jobs/20260101-000000-abcd",
            "state": "succeeded", "argv": ["true"], "cwd": "/w", "lock": "gpu", "env_keys": ["A"],
            "created": "2026-01-01T00:00:00Z", "started": "2026-01-01T00:00:01Z", "finished": "2026-01-01T00:00:02Z",
            "pid": 123, "exit_code": 0, "signal": None, "heartbeat_age_s": 1.5, "log_size": 10, "results": 2,
            "refused": None, "cancel_requested": False, "log_tail": ["done"]}
    return {**info, **changes}


def test_the_scripts_own_answer_parses():
    st = JobStatus.from_host(HOST, state())
    assert (st.ref, st.state, st.ok, st.results, st.log_tail) == (f"{HOST}:20260101-000000-abcd", "succeeded", True, 2,
                                                                  ["done"])


@pytest.mark.parametrize("changes,what", [
    ({"state": "pwned"}, "the job state"), ({"job_id": "../x"}, "refused job id"), ({"argv": "rm -rf /"}, "command"),
    ({"started": "2026-13-01T00:00:00Z"}, "the start time"), ({"pid": "1"}, "the pid"), ({"pid": 0}, "the pid"),
    ({"heartbeat_age_s": float("nan")}, "heartbeat"), ({"log_size": True}, "the log size"),
    ({"results": -1}, "the results count"), ({"log_tail": [1]}, "the log tail"), ({"job_dir": None}, "directory"),
])
def test_a_malformed_status_names_the_host_and_the_field(changes, what):
    with pytest.raises(HostError, match=f"^{HOST}: ") as caught:
        JobStatus.from_host(HOST, state(**changes))
    assert what in caught.value.message


def test_poll_checks_the_chunk_and_that_the_offset_is_where_the_bytes_end():
    chunk = base64.b64encode(b"line\n").decode()
    st, data, offset = replies.polled(HOST, state(chunk=chunk, offset=105), 100)
    assert (st.state, data, offset) == ("succeeded", b"line\n", 105)
    for bad in ({"chunk": "not base64!", "offset": 100}, {"chunk": None, "offset": 100}, {"chunk": chunk, "offset": 7},
                {"chunk": chunk}):
        with pytest.raises(HostError, match="malformed jobs reply"):
            replies.polled(HOST, state(**bad), 100)


def test_launch_cancel_lock_and_list_replies():
    assert replies.Launched.from_host(HOST, {"ok": True, "job": state(), "notices": ["x"]}).notices == ["x"]
    refused = replies.Launched.from_host(HOST, {"ok": False, "refused": {"job_id": "j", "state": "running"}})
    assert (refused.ok, refused.refused["job_id"]) == (False, "j")
    assert replies.cancelled(HOST, {"job": state(), "group_alive": False})[1] is False
    assert replies.lock_state(HOST, {"holder": None, "state": None}) == {"holder": None, "state": None}
    assert [j.job_id for j in replies.job_list(HOST, {"jobs": [state()], "total": 1})] == ["20260101-000000-abcd"]
    for call, reply in ((replies.Launched.from_host, {"ok": "yes"}), (replies.Launched.from_host, []),
                        (replies.cancelled, {"job": state(), "group_alive": "no"}),
                        (replies.lock_state, {"holder": "me"}), (replies.job_list, {"jobs": {}}),
                        (replies.results_listing, "x")):
        with pytest.raises(HostError, match=f"^{HOST}: malformed jobs reply"):
            call(HOST, reply)  # type: ignore[operator]
