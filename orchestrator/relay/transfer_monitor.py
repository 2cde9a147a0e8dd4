"""What the relay reports while bytes move, and the stall watchdog's clock.

The controller never sees file bytes: the writers report them ("at" lines inside a chunk, "ack" at its
end) and the pumps turn those into ``moved`` calls here. ``TransferMonitor`` keeps, per stream, since when
it has waited for bytes (the stall watchdog reads it) and passes progress on, in batches, as
``core.events.RelayProgress`` events (``orchestrator/ui/relay_progress.py`` renders them with rich).
"""

from __future__ import annotations

import threading
import time

from orchestrator.core.events import RelayProgress

PROGRESS_STEP = 2 << 20  # batch progress events: one per this many bytes and stream


class TransferMonitor:
    """One relay's progress and stall clock, shared by its pump threads."""

    def __init__(self, progress: RelayProgress, total: int, streams: int, label: str):
        self.progress = progress
        self.total = total
        self.streams = max(streams, 1)
        self.label = label
        self._unreported = [0] * self.streams
        self._lock = threading.Lock()
        self.activity: dict[int, list] = {}  # stream -> [what, since]: waiting for bytes since then

    def __enter__(self) -> "TransferMonitor":
        self.progress.start(self.label, self.total, self.streams)
        return self

    def __exit__(self, *exc) -> None:
        self.flush()
        self.progress.stop()

    def status(self, text: str) -> None:
        self.progress.status(text)

    def set_done(self, done: int) -> None:
        self.progress.set_done(self.total, done)

    def busy(self, k: int, what: str) -> None:
        """Stream k now waits for bytes (the clock starts unless it was already waiting)."""
        slot = self.activity.get(k)
        if slot is None:
            self.activity[k] = [what, time.monotonic()]
        else:
            slot[0] = what

    def idle(self, k: int) -> None:
        self.activity.pop(k, None)

    def moved(self, k: int, n: int) -> None:
        slot = self.activity.get(k)
        if slot is not None:
            slot[1] = time.monotonic()
        k = k if k < self.streams else 0
        with self._lock:
            self._unreported[k] += n
            flush = self._unreported[k] >= PROGRESS_STEP
        if flush:
            self.flush(k)

    def flush(self, k: int | None = None) -> None:
        for slot in ([k] if k is not None else range(self.streams)):
            with self._lock:
                n, self._unreported[slot] = self._unreported[slot], 0
            if n:
                self.progress.advance(slot, n)

    def stalled(self, timeout: float) -> tuple[int, float, str] | None:
        """(stream, seconds, what) of a stream that has waited longer than timeout for bytes."""
        now = time.monotonic()
        for k, (what, since) in list(self.activity.items()):
            if now - since > timeout:
                return k, now - since, what
        return None
