"""What long operations report while they run, with no terminal library in sight.

Operations (deploy, provision, jobs, relay, eval, demo) take an ``Events`` and call it; the CLI passes the
rich implementation from ``orchestrator/ui/console_events.py``, tests and scripts may pass ``QuietEvents`` (or
nothing). No operation builds a console, a bar or a table itself: that is the renderer's choice. Texts are
plain and may quote a host (its errors, names, notes): the renderer styles them and shows them as text, never
markup, on a console that strips their control characters (``orchestrator/ui/safe_console.py``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Protocol


class OutputSink(Protocol):
    """Receives a remote job's log as it arrives (bytes or text, split anywhere)."""

    def feed(self, data: bytes | str) -> None: ...

    def close(self) -> None: ...


class RelayProgress(Protocol):
    """A relay's bytes as they move over its parallel streams (batched by ``relay/transfer_monitor.py``)."""

    def start(self, label: str, total: int, streams: int) -> None: ...

    def status(self, text: str) -> None:
        """What the relay does now (verifying, publishing, the file it sends)."""

    def set_done(self, total: int, done: int) -> None: ...

    def advance(self, stream: int, n: int) -> None:
        """``n`` more bytes arrived over stream ``stream`` (0-based)."""

    def stop(self) -> None: ...


class Events(Protocol):
    is_terminal: bool  # an interactive terminal: live bars instead of periodic lines

    def step(self, text: str, tag: str | None = None) -> None:
        """A stage of a long operation begins (``tag`` names the story it belongs to, e.g. "demo")."""

    def info(self, text: str) -> None: ...

    def success(self, text: str) -> None: ...

    def warn(self, text: str) -> None: ...

    def transfer(self, label: str, total_bytes: int) -> AbstractContextManager[Callable[[int], None]]:
        """A byte transfer: the context gives a callback taking the bytes done so far."""

    def job_output(self, prefix: str = "", live: bool | None = None) -> OutputSink:
        """A sink for one job's log (progress records become bars or lines)."""

    def relay_progress(self) -> RelayProgress:
        """Where one relay reports its streams' bytes (a bar per stream on a terminal)."""


class _Discard:
    def feed(self, data: bytes | str) -> None:
        pass

    def close(self) -> None:
        pass


class QuietRelayProgress:
    def start(self, label: str, total: int, streams: int) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def set_done(self, total: int, done: int) -> None:
        pass

    def advance(self, stream: int, n: int) -> None:
        pass

    def stop(self) -> None:
        pass


class QuietEvents:
    """Reports nothing: for library use and tests that only look at results."""

    is_terminal = False

    def step(self, text: str, tag: str | None = None) -> None:
        pass

    def info(self, text: str) -> None:
        pass

    def success(self, text: str) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def transfer(self, label: str, total_bytes: int) -> AbstractContextManager[Callable[[int], None]]:
        return nullcontext(lambda done: None)

    def job_output(self, prefix: str = "", live: bool | None = None) -> OutputSink:
        return _Discard()

    def relay_progress(self) -> RelayProgress:
        return QuietRelayProgress()
