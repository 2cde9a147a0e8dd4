"""A step's part file: its figures, rewritten (atomically) after every measurement.

The script kills a step that overruns its limit; whatever the part holds by then is what the step measured.
Each measurement is a *section*: an exception inside one is recorded under ``errors`` (type, message, the
traceback's last lines) and the step goes on with the next, so one failure costs only its own figures.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from pathlib import Path
from typing import Iterator

from remote_payload.inputs.cache import atomic_write_json

TRACE_LINES = 12


class Part:
    def __init__(self, path: Path, step: str, mode: str):
        self.path = Path(path)
        self.data: dict = {"step": step, "mode": mode, "status": "running", "sections": {}, "errors": {},
                           "notes": []}
        self._started = time.perf_counter()
        self.save()

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self._started, 2)
        atomic_write_json(self.path, self.data)

    def put(self, section: str, value) -> None:
        self.data["sections"][section] = value
        self.save()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[dict]:
        """``with part.section("x") as out: out[...] = ...``: saved when done; an exception is recorded, not raised."""
        out: dict = {}
        self.data["sections"][name] = out
        started = time.perf_counter()
        try:
            yield out
        except Exception as exc:  # noqa: BLE001 - a failed measurement must not take the step's others with it
            tail = traceback.format_exc().strip().splitlines()[-TRACE_LINES:]
            self.data["errors"][name] = {"type": type(exc).__name__, "message": str(exc)[:2000], "traceback": tail}
        finally:
            out["section_s"] = round(time.perf_counter() - started, 2)
            self.save()

    def ok(self, name: str) -> bool:
        return name in self.data["sections"] and name not in self.data["errors"]

    def finish(self) -> int:
        """Mark the step done; exit status 1 when any section failed."""
        self.data["status"] = "failed" if self.data["errors"] else "ok"
        self.save()
        return 1 if self.data["errors"] else 0
