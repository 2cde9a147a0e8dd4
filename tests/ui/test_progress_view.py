"""ProgressView: payload progress lines become bars (terminal) or throttled text (logs); the rest passes through."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from rich.console import Console

from orchestrator.ui.progress_view import ProgressView, parse_line
from orchestrator.ui.safe_console import SafeConsole


def progress(stage: str, done: int, total: int, **extra) -> str:
    return json.dumps({"dfo": "progress", "stage": stage, "done": done, "total": total, **extra})


def console(terminal: bool = False) -> tuple[Console, StringIO]:
    buf = StringIO()
    return Console(file=buf, width=120, force_terminal=terminal, color_system=None), buf


def test_parse_line_accepts_only_known_dfo_records():
    assert parse_line(progress("gen", 1, 2))["stage"] == "gen"
    assert parse_line('  {"dfo": "warning", "message": "x"}  ')["dfo"] == "warning"
    for text in ("plain text", '{"dfo": "something-else"}', '{"other": 1}', "{broken json", "[1, 2]",
                 '{"dfo": "progress"}', ""):
        assert parse_line(text) is None, text


def test_text_mode_throttles_progress_and_passes_other_lines_through():
    con, buf = console()
    with ProgressView(con, text_every=3600) as view:
        view.feed(progress("generate", 1, 4, unit="prompts") + "\nhello world\n")
        view.feed(progress("generate", 2, 4, unit="prompts") + "\n")
        view.feed(progress("generate", 4, 4, unit="prompts", tokens_per_s=12.5) + "\n")
        view.feed('{"dfo": "unknown-kind", "x": 1}\n[not markup]\n')
    out = buf.getvalue().splitlines()
    assert out == [
        "generate 1/4 prompts (25%)",
        "hello world",
        "generate 4/4 prompts (100%), 12.5 tok/s",  # 2/4 was throttled, the final one always shows
        '{"dfo": "unknown-kind", "x": 1}',
        "[not markup]",  # printed literally, not read as rich markup
    ]
    assert view.stages["generate"].done == 4 and view.text_lines == ["hello world", '{"dfo": "unknown-kind", "x": 1}',
                                                                    "[not markup]"]


def test_lines_split_across_chunks_and_utf8_split_inside_a_character():
    con, buf = console()
    view = ProgressView(con)
    data = ("első sor\n" + progress("s", 1, 1) + "\nlast line without newline").encode()
    for i in range(0, len(data), 3):  # 3-byte chunks cut through the multi-byte 'ő'
        view.feed(data[i:i + 3])
    view.close()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "első sor" and lines[1] == "s 1/1 (100%)" and lines[2] == "last line without newline"


def test_stage_warning_and_result_records():
    con, buf = console()
    with ProgressView(con) as view:
        for rec in ({"dfo": "stage", "stage": "load", "status": "start", "message": "target"},
                    {"dfo": "stage", "stage": "load", "status": "done", "elapsed_s": 1.25},
                    {"dfo": "warning", "message": "fla kernels unavailable", "stage": "load"},
                    {"dfo": "result", "tau": 3.21, "out": "results/eval.json"}):
            view.feed(json.dumps(rec) + "\n")
    out = buf.getvalue()
    assert "▶ load — target" in out and "✓ load (1.2s)" in out
    assert "warning (load): fla kernels unavailable" in out
    assert "result: tau=3.21, out=results/eval.json" in out
    assert view.warnings == ["fla kernels unavailable"] and view.results == [{"tau": 3.21, "out": "results/eval.json"}]
    assert view.stages["load"].finished


def test_terminal_mode_draws_bars_and_keeps_text_above_them():
    con, buf = console(terminal=True)
    with ProgressView(con) as view:
        view.feed(progress("verify", 3, 10, unit="blocks") + "\n")
        view.feed("a log line\n")
        view.feed(progress("verify", 10, 10, unit="blocks") + "\n")
    out = buf.getvalue()
    assert "a log line" in out and "verify" in out and "10/10" in out
    assert '"dfo"' not in out
    assert view.stages["verify"].done == 10


# ------------------------------------------------------------------------------ host text

# What a compromised host (or any job on it) can put in its log: sequences rich itself never writes.
HOST_CONTROLS = ("\x1b]52;c;ZXZpbA==\x07", "\x1b]8;;http://evil.example/\x1b\\", "\x1b]0;title\x07", "\x1b[5n",
                 "\x1b[3J", "\x9b2J", "\x08\x7f", "\rFORGED")
EVIL = "".join(HOST_CONTROLS)
MARKUP = "[/x][conceal]hidden[/conceal][link=http://evil.example/]here[/link]"
# rich's own output on a terminal: colours, and for live bars hide/show cursor, cursor up, erase line, CR.
RICH_OWN = re.compile(r"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\x1b\[\d*A|\x1b\[2K|\r")


def cli_console(terminal: bool) -> tuple[SafeConsole, StringIO]:
    """The console class the CLI writes with (cli/context.py), on a buffer."""
    buf = StringIO()
    return SafeConsole(file=buf, width=160, force_terminal=terminal, color_system="truecolor" if terminal else None,
                       highlight=False), buf


def host_controls_in(out: str) -> list[str]:
    """Control characters left once rich's own sequences are taken out (newlines and tabs are text)."""
    return re.findall(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", RICH_OWN.sub("", out).replace("\n", "").replace("\t", ""))


@pytest.mark.parametrize("live", [False, True])
def test_host_text_in_log_lines_and_records_reaches_the_terminal_as_plain_text(live):
    con, buf = cli_console(terminal=True)
    with ProgressView(con, live=live, text_every=0, prefix=f"ct129{EVIL}") as view:
        view.feed(f"plain line {EVIL} {MARKUP}\n")
        view.feed(progress(f"gen{EVIL}[/x]", 1, 2, unit=f"tok{EVIL}[/]", message=f"{MARKUP}{EVIL}") + "\n")
        view.feed(json.dumps({"dfo": "stage", "stage": f"load{EVIL}", "status": "done", "message": MARKUP}) + "\n")
        view.feed(json.dumps({"dfo": "warning", "stage": "[/x]", "message": f"careful{EVIL}{MARKUP}"}) + "\n")
        view.feed(json.dumps({"dfo": "result", "out": f"r{EVIL}[/x]"}) + "\n")
        view.feed(progress(f"gen{EVIL}[/x]", 2, 2) + "\n")
    out = buf.getvalue()
    for seq in HOST_CONTROLS:
        assert seq not in out, repr(seq)
    assert host_controls_in(out) == [], repr(out)
    assert "FORGED" in out and "ZXZpbA==" in out  # what the sequences carried is shown as text
    for shown in ("[conceal]hidden[/conceal]", "[link=http://evil.example/]here[/link]", "[/x]", "warning ([/x]):"):
        assert shown in out, shown  # markup in host text is printed, never applied


def test_plain_console_output_has_no_control_character_at_all():
    con, buf = cli_console(terminal=False)
    with ProgressView(con, text_every=0) as view:
        view.feed(f"line {EVIL}\n" + progress(f"s{EVIL}", 1, 1, unit=EVIL, message=EVIL) + "\n")
    out = buf.getvalue()
    assert re.findall(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out) == [], repr(out)
    assert "line ]52;c;ZXZpbA==" in out


@pytest.mark.parametrize("live", [False, True])
def test_malformed_progress_fields_are_ignored_not_raised(live):
    con, buf = cli_console(terminal=live)
    with ProgressView(con, live=live, text_every=0) as view:
        view.feed(progress("gen", 1, 4, unit="prompts", message="warming up") + "\n")
        for bad in ({"unit": 5, "message": {"a": 1}}, {"unit": ["x"], "message": 3.5}, {"done": "7", "total": "9"},
                    {"done": 10**400, "total": 1e400}, {"done": True, "total": None}, {"tokens_per_s": "fast"},
                    {"done": 10**300, "total": 3}):
            view.feed(json.dumps({"dfo": "progress", "stage": "gen", **bad}) + "\n")
        view.feed(json.dumps({"dfo": "stage", "stage": "gen", "status": "done", "elapsed_s": "long",
                              "message": {"not": "text"}}) + "\n")
        view.feed(json.dumps({"dfo": "warning", "message": ["a", "list"], "stage": 7}) + "\n")
    st = view.stages["gen"]
    assert st.unit == "prompts" and st.message == "warming up"  # wrong types left the last good values
    assert st.total == 3 and st.done == 10**300 and st.tokens_per_s is None and st.finished
    assert view.warnings == [""]
    assert "prompts" in buf.getvalue()


def test_the_eval_result_record_is_a_readable_line():
    con, buf = console()
    record = {"dfo": "result", "results": "/w/jobs/7/out/results.json", "samples": "/w/jobs/7/out/samples.jsonl",
              "drafters": {"ours": 3.7109301139473554, "zlab": 5.1234, "broken": "x"}}
    with ProgressView(con) as view:
        view.feed(json.dumps(record) + "\n")
    assert buf.getvalue().strip() == "result: ours τ 3.71, zlab τ 5.12, broken τ ? → /w/jobs/7/out"
    assert view.results == [{k: v for k, v in record.items() if k != "dfo"}]


def test_other_result_records_round_numbers_and_show_no_json():
    con, buf = console()
    with ProgressView(con) as view:
        view.feed(json.dumps({"dfo": "result", "out": "/f", "built": ["target", "drafter"], "loss": 0.123456789,
                              "sizes": {"a": 1, "b": 2.5}}) + "\n")
    assert buf.getvalue().strip() == "result: out=/f, built=target, drafter, loss=0.1235, sizes=a 1, b 2.5"
