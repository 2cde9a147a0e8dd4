"""The relay's progress: operations report events, orchestrator/ui renders them (and chooses how)."""

from __future__ import annotations

import ast
from io import StringIO
from pathlib import Path

from rich.console import Console

from orchestrator.core.events import QuietEvents, QuietRelayProgress
from orchestrator.relay.transfer_monitor import PROGRESS_STEP, TransferMonitor
from orchestrator.ui.console_events import ConsoleEvents
from orchestrator.ui.relay_progress import RichRelayProgress
from orchestrator.ui.safe_console import SafeConsole

REPO = Path(__file__).resolve().parents[2]


def console(terminal: bool) -> tuple[Console, StringIO]:
    buf = StringIO()
    return SafeConsole(file=buf, width=120, force_terminal=terminal, color_system=None), buf


class Recorder:
    def __init__(self):
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_the_renderer_chooses_a_bar_on_a_terminal_and_nothing_in_a_log():
    assert isinstance(ConsoleEvents(console(terminal=True)[0]).relay_progress(), RichRelayProgress)
    assert isinstance(ConsoleEvents(console(terminal=False)[0]).relay_progress(), QuietRelayProgress)
    assert isinstance(QuietEvents().relay_progress(), QuietRelayProgress)


def test_the_bar_shows_the_hosts_text_as_text():
    con, buf = console(terminal=True)
    bar = RichRelayProgress(con)
    bar.start("[bold]ck.pt\x1b]0;x\x07", 10 * PROGRESS_STEP, 2)
    bar.advance(1, PROGRESS_STEP)
    bar.status("publishing [/x]ck.pt")
    bar.stop()
    out = buf.getvalue()
    assert "publishing [/x]ck.pt" in out and "\x1b]0;" not in out


def test_the_monitor_batches_bytes_into_events_that_add_up():
    progress = Recorder()
    with TransferMonitor(progress, 5 * PROGRESS_STEP, 2, "ck.pt") as monitor:
        for _ in range(10):
            monitor.moved(0, PROGRESS_STEP // 4)
        monitor.moved(1, 3 * PROGRESS_STEP)
        monitor.moved(1, 7)
    assert progress.calls[0] == ("start", "ck.pt", 5 * PROGRESS_STEP, 2) and progress.calls[-1] == ("stop",)
    advanced = [c for c in progress.calls if c[0] == "advance"]
    assert sum(n for _, k, n in advanced if k == 0) == 10 * (PROGRESS_STEP // 4)
    assert sum(n for _, k, n in advanced if k == 1) == 3 * PROGRESS_STEP + 7
    assert len(advanced) < 11 + 2  # batched: not one event per report


def _rich_users(path: Path) -> list[str]:
    """Imports of rich and attribute reads of ``.console`` in one module."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rich":
            found.append(f"from {node.module} import")
        elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "rich" for a in node.names):
            found.append("import rich")
        elif isinstance(node, ast.Attribute) and node.attr == "console":
            found.append(".console")
        elif isinstance(node, ast.Constant) and node.value == "console":
            found.append("'console'")
    return found


def test_the_relay_and_the_eval_build_no_terminal_ui_of_their_own():
    modules = [*sorted((REPO / "orchestrator" / "relay").glob("*.py")), REPO / "orchestrator" / "evaluation" /
               "operation.py"]
    found = {p.relative_to(REPO).as_posix(): _rich_users(p) for p in modules}
    assert {m: f for m, f in found.items() if f} == {}
