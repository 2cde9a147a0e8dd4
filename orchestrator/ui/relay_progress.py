"""The relay's progress bar: rich rendering of ``core.events.RelayProgress`` (``ConsoleEvents.relay_progress``)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class RichRelayProgress:
    """One bar for the relay, one per stream when there are several (transient: gone when done)."""

    def __init__(self, console: Console):
        # The label and status quote the hosts' paths and notes: never read as markup.
        self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                            DownloadColumn(binary_units=True), TransferSpeedColumn(), TimeRemainingColumn(),
                            console=console, transient=True)
        self.main: TaskID | None = None
        self.streams: list[TaskID] = []

    def start(self, label: str, total: int, streams: int) -> None:
        self.main = self.bar.add_task(label, total=max(total, 1))
        if streams > 1:
            self.streams = [self.bar.add_task(f"  stream {k + 1}", total=None) for k in range(streams)]
        self.bar.start()

    def status(self, text: str) -> None:
        if self.main is not None:
            self.bar.update(self.main, description=text)

    def set_done(self, total: int, done: int) -> None:
        if self.main is not None:
            self.bar.update(self.main, total=max(total, 1), completed=done)

    def advance(self, stream: int, n: int) -> None:
        if self.main is not None:
            self.bar.advance(self.main, n)
        if stream < len(self.streams):
            self.bar.advance(self.streams[stream], n)

    def stop(self) -> None:
        self.bar.stop()
