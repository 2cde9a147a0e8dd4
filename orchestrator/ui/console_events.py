"""``Events`` rendered with rich on one console (the CLI's stderr console)."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from orchestrator.ui.progress_view import ProgressView

_STEP_STYLE = {None: "[bold cyan]▸[/]", "demo": "[bold magenta]demo ▸[/]"}


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
        lead = _STEP_STYLE.get(tag) or f"[bold]{escape(tag or '')} ▸[/]"
        self.console.print(("\n" if tag == "demo" else "") + f"{lead} {escape(text)}")

    def info(self, text: str) -> None:
        self.console.print(escape(text))

    def success(self, text: str) -> None:
        self.console.print(f"[green]{escape(text)}[/]")

    def warn(self, text: str) -> None:
        self.console.print(f"[yellow]{escape(text)}[/]")

    @contextmanager
    def transfer(self, label: str, total_bytes: int) -> Iterator[Callable[[int], None]]:
        with self._lock:
            if self._bars is None:
                self._bars = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                      TransferSpeedColumn(), console=self.console, transient=True,
                                      disable=not self.console.is_terminal)
                self._bars.start()
            bars = self._bars
            self._active += 1
            task = bars.add_task(escape(label), total=total_bytes or 1)
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
