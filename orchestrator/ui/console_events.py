"""``Events`` rendered with rich on one console (the CLI's stderr console).

Event texts may quote a host (an error, a note, a file name): they go to rich as ``Text``, never as
markup, and the console (``safe_console.SafeConsole``) strips their control characters.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.text import Text

from orchestrator.core.events import QuietRelayProgress, RelayProgress
from orchestrator.ui.progress_view import ProgressView
from orchestrator.ui.relay_progress import RichRelayProgress

_STEP_STYLE = {None: ("▸", "bold cyan"), "demo": ("demo ▸", "bold magenta")}


class ConsoleEvents:
    def __init__(self, console: Console):
        self.console = console
        # Transfers of several hosts at once share one live display (rich allows one per console).
        self._bars: Progress | None = None
        self._active = 0
        self._lock = threading.Lock()

    @property
    def is_terminal(self) -> bool:
        return self.console.is_terminal

    def step(self, text: str, tag: str | None = None) -> None:
        lead = _STEP_STYLE.get(tag) or (f"{tag or ''} ▸", "bold")
        self.console.print(Text.assemble("\n" if tag == "demo" else "", lead, " ", text))

    def info(self, text: str) -> None:
        self.console.print(Text(text))

    def success(self, text: str) -> None:
        self.console.print(Text(text, style="green"))

    def warn(self, text: str) -> None:
        self.console.print(Text(text, style="yellow"))

    @contextmanager
    def transfer(self, label: str, total_bytes: int) -> Iterator[Callable[[int], None]]:
        with self._lock:
            if self._bars is None:
                self._bars = Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                                      TransferSpeedColumn(), console=self.console, transient=True,
                                      disable=not self.console.is_terminal)
                self._bars.start()
            bars = self._bars
            self._active += 1
            task = bars.add_task(label, total=total_bytes or 1)
        try:
            yield lambda done: bars.update(task, completed=done)
        finally:
            with self._lock:
                bars.remove_task(task)
                self._active -= 1
                if self._active == 0:
                    bars.stop()
                    self._bars = None

    def job_output(self, prefix: str = "", live: bool | None = None) -> ProgressView:
        return ProgressView(self.console, live=live, prefix=prefix)

    def relay_progress(self) -> RelayProgress:
        # A live bar only for a person watching: logs and pipes get the relay's summary alone.
        return RichRelayProgress(self.console) if self.console.is_terminal else QuietRelayProgress()
