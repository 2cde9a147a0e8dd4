"""ProgressView: payload progress lines become bars (terminal) or throttled text (logs); the rest passes through."""

from __future__ import annotations

import json
from io import StringIO

from rich.console import Console

from orchestrator.ui.progress_view import ProgressView, parse_line


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
