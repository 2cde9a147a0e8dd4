"""Structured progress lines for the controller: one JSON object per line on stdout, flushed.

Line kinds (every object has ``"dfo": KIND``):
- ``progress``: ``stage``, ``done``, ``total`` and optional ``unit``, ``tokens_per_s``, ``eta_s`` (seconds left,
  where the stage can estimate them), ``message``;
- ``stage``: ``stage``, ``status`` ("start" | "done"), optional ``elapsed_s``, ``message``;
- ``warning``: ``message`` (and optional ``stage``);
- ``result``: the final summary of a subcommand (paths written, headline figures).
Anything else printed by the payload is free text (``text``: e.g. the ``--diagnose`` report).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False):
        self._stream = stream
        self._quiet = quiet
        self._stage_started: dict[str, float] = {}

    def emit(self, kind: str, **fields: Any) -> None:
        if self._quiet:
            return
        record = {"dfo": kind}
        record.update({k: v for k, v in fields.items() if v is not None})
        stream = self._stream or sys.stdout
        stream.write(json.dumps(record, sort_keys=False) + "\n")
        stream.flush()

    def progress(self, stage: str, done: int, total: int, unit: str | None = None,
                 tokens_per_s: float | None = None, message: str | None = None, eta_s: float | None = None) -> None:
        self.emit("progress", stage=stage, done=done, total=total, unit=unit,
                  tokens_per_s=None if tokens_per_s is None else round(tokens_per_s, 2),
                  eta_s=None if eta_s is None else round(eta_s, 1), message=message)

    def stage_start(self, stage: str, message: str | None = None) -> None:
        self._stage_started[stage] = time.perf_counter()
        self.emit("stage", stage=stage, status="start", message=message)

    def stage_done(self, stage: str, message: str | None = None) -> float:
        elapsed = time.perf_counter() - self._stage_started.pop(stage, time.perf_counter())
        self.emit("stage", stage=stage, status="done", elapsed_s=round(elapsed, 3), message=message)
        return elapsed

    def warning(self, message: str, stage: str | None = None) -> None:
        self.emit("warning", message=message, stage=stage)

    def result(self, **fields: Any) -> None:
        self.emit("result", **fields)

    def text(self, text: str) -> None:
        """Free text for a person (e.g. the diagnostics report): plain lines, never starting with '{'."""
        if self._quiet:
            return
        stream = self._stream or sys.stdout
        for line in text.splitlines():
            stream.write((" " + line if line.startswith("{") else line) + "\n")
        stream.flush()


SILENT = Progress(quiet=True)
