"""Render a job's log: the payload's JSON progress lines become rich progress bars, the rest is text.

The payload (remote_payload/progress.py) writes one JSON object per line with ``"dfo": KIND``:
``progress`` (stage, done, total, unit, tokens_per_s, eta_s, message), ``stage`` (stage, status start|done,
elapsed_s, message), ``warning`` (message, stage) and ``result`` (free fields, shown as one readable line:
``result_summary``). Any other line — plain
text, JSON without a known ``dfo`` kind, half a line — passes through as log text, unchanged.

On a terminal the bars are live; otherwise (CI logs, pipes) progress is printed as text lines, at most
one per stage every ``text_every`` seconds plus the final one, so logs stay readable.

Every line is the host's text: it goes to rich as ``Text`` (a ``[tag]`` in it is shown, not applied) and
the CLI's console strips its control characters. A record whose fields have the wrong type (a unit that
is not a string, a count that is not a finite number) has those fields ignored.
"""

from __future__ import annotations

import codecs
import json
import math
import posixpath
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.text import Text

from orchestrator.core.host_text import decode_json
from orchestrator.core.units import human_duration

KNOWN_KINDS = ("progress", "stage", "warning", "result")


def parse_line(line: str) -> dict | None:
    """The record of a structured payload line, or None when the line is plain text."""
    text = line.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        record = decode_json(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("dfo") not in KNOWN_KINDS:
        return None
    if record["dfo"] == "progress" and not isinstance(record.get("stage"), str):
        return None
    return record


@dataclass
class StageState:
    done: float = 0
    total: float | None = None
    unit: str | None = None
    message: str | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None  # the payload's own estimate of the seconds left (rows of unknown length)
    finished: bool = False
    elapsed_s: float | None = None
    last_text: float | None = field(default=None, repr=False)  # when progress was last printed as text


class ProgressView:
    """Feed it log bytes or text (any chunking); it prints text lines and keeps one bar per stage.

    ``stages``, ``warnings``, ``results`` and ``text_lines`` record what was seen (for callers and tests).
    Use as a context manager, or call ``close()`` to flush a last partial line and stop the live display.
    """

    def __init__(self, console: Console, *, live: bool | None = None, text_every: float = 10.0, prefix: str = ""):
        self.console = console
        self.live = console.is_terminal if live is None else live
        self.text_every = text_every
        self.prefix = prefix
        self.stages: dict[str, StageState] = {}
        self.warnings: list[str] = []
        self.results: list[dict] = []
        self.text_lines: list[str] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._tasks: dict[str, TaskID] = {}
        self._progress: Progress | None = None

    # -- input

    def feed(self, data: bytes | str) -> None:
        text = self._decoder.decode(data) if isinstance(data, bytes) else data
        text = self._partial + text
        *lines, self._partial = text.split("\n")
        for line in lines:
            self.feed_line(line.rstrip("\r"))

    def feed_line(self, line: str) -> None:
        record = parse_line(line)
        if record is None:
            self.text_lines.append(line)
            self._print(Text(line))
            return
        getattr(self, f"_on_{record['dfo']}")(record)

    def close(self) -> None:
        tail = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        if tail:
            self.feed_line(tail)
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> "ProgressView":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- records

    def _on_progress(self, rec: dict) -> None:
        name = rec["stage"]
        st = self.stages.setdefault(name, StageState())
        st.done = _number(rec.get("done"), st.done)
        total = _number(rec.get("total"), None)
        st.total = total if total is not None else st.total
        st.unit = _text(rec.get("unit")) or st.unit
        st.message = _text(rec.get("message")) or st.message
        st.tokens_per_s = _number(rec.get("tokens_per_s"), st.tokens_per_s)
        st.eta_s = _number(rec.get("eta_s"), None)
        if self.live:
            self._bar(name, st)
        else:
            complete = st.total is not None and st.done >= st.total
            now = time.monotonic()
            if complete or st.last_text is None or now - st.last_text >= self.text_every:
                st.last_text = now
                self._print(Text.assemble((name, "cyan"), " ", _fmt_progress(st)))

    def _on_stage(self, rec: dict) -> None:
        name = str(rec.get("stage", "?"))
        st = self.stages.setdefault(name, StageState())
        message = _text(rec.get("message"))
        msg = f" — {message}" if message else ""
        if rec.get("status") == "done":
            st.finished = True
            st.elapsed_s = _number(rec.get("elapsed_s"), None)
            if name in self._tasks and self._progress is not None:
                task = self._tasks[name]
                self._progress.update(task, completed=st.total or st.done or 1, total=st.total or st.done or 1)
            took = f" ({st.elapsed_s:.1f}s)" if st.elapsed_s is not None else ""
            self._print(Text.assemble(("✓", "green"), f" {name}{took}{msg}"))
        else:
            self._print(Text.assemble(("▶", "bold"), f" {name}{msg}"))

    def _on_warning(self, rec: dict) -> None:
        message = _text(rec.get("message")) or ""
        self.warnings.append(message)
        stage = _text(rec.get("stage"))
        self._print(Text.assemble((f"warning ({stage}):" if stage else "warning:", "yellow"), f" {message}"))

    def _on_result(self, rec: dict) -> None:
        fields = {k: v for k, v in rec.items() if k != "dfo"}
        self.results.append(fields)
        self._print(Text.assemble(("result:", "bold green"), f" {result_summary(fields)}"))

    # -- output

    def _print(self, text: Text) -> None:
        line = Text.assemble((self.prefix, "dim"), " ", text) if self.prefix else text
        if self._progress is not None:
            self._progress.console.print(line, highlight=False)  # above the live bars
        else:
            self.console.print(line, highlight=False)

    def _bar(self, name: str, st: StageState) -> None:
        if self._progress is None:
            self._progress = Progress(
                # Host text in the columns: markup=False, or a "[/x]" in a stage name would raise MarkupError.
                TextColumn("{task.description}", style="cyan", markup=False), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[unit]}", markup=False), TimeRemainingColumn(),
                TextColumn("{task.fields[extra]}", markup=False),
                console=self.console, transient=False,
            )
            self._progress.start()
        extra = " ".join(x for x in (
            f"{st.tokens_per_s:.1f} tok/s" if st.tokens_per_s is not None else "",
            f"ETA {human_duration(st.eta_s)}" if st.eta_s is not None else "", st.message or "") if x)
        if name not in self._tasks:
            # rich's add_task annotates completed as int; its Task and Progress.update hold a float.
            self._tasks[name] = self._progress.add_task(name, total=st.total, completed=st.done,  # type: ignore[arg-type]
                                                        unit=st.unit or "", extra=extra)
        else:
            self._progress.update(self._tasks[name], total=st.total, completed=st.done, unit=st.unit or "",
                                  extra=extra)


def _number(value, default):
    """VALUE when it is a finite int or float (not a bool), else DEFAULT (the record came from a host)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    try:
        return value if math.isfinite(value) else default
    except OverflowError:  # an int too large for a float: the percentage and the bar would raise
        return default


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


def _fmt_progress(st: StageState) -> str:
    def num(x):
        return f"{x:g}" if isinstance(x, float) else str(x)

    text = f"{num(st.done)}/{num(st.total)}" if st.total is not None else num(st.done)
    if st.unit:
        text += f" {st.unit}"
    if st.total:
        text += f" ({100 * (st.done / st.total):.0f}%)"  # divided first: huge ints must not overflow
    if st.tokens_per_s is not None:
        text += f", {st.tokens_per_s:.1f} tok/s"
    if st.eta_s is not None:
        text += f", ETA {human_duration(st.eta_s)}"
    if st.message:
        text += f" — {st.message}"
    return text


def result_summary(fields: dict) -> str:
    """A result record for a person: each drafter's τ (``drafters``: name -> τ, what the eval reports), the
    other fields as ``key=value`` with numbers rounded, and ``→ FOLDER`` of the ``results`` file last."""
    parts = []
    drafters = fields.get("drafters")
    if isinstance(drafters, dict):
        parts += [f"{name} τ {_rounded(tau, '.2f')}" for name, tau in drafters.items()]
    results = fields.get("results")
    folder = posixpath.dirname(results) if isinstance(results, str) else None
    for key, value in fields.items():
        if (key == "drafters" and isinstance(drafters, dict)) or (key == "results" and folder is not None):
            continue
        if key == "samples" and isinstance(value, str) and folder is not None and posixpath.dirname(value) == folder:
            continue  # beside results.json: the folder says where both are
        parts.append(f"{key}={_short(value)}")
    text = ", ".join(parts)
    if folder is not None:
        text += f" → {folder or results}"
    return text


def _rounded(value, spec: str = ".4g") -> str:
    number = _number(value, None)
    return "?" if number is None else format(number, spec) if isinstance(number, float) else str(number)


def _short(value, limit: int = 60) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        text = _rounded(value)
    elif isinstance(value, list):
        text = ", ".join(_short(v, limit) for v in value)
    elif isinstance(value, dict):
        text = ", ".join(f"{k} {_short(v, limit)}" for k, v in value.items())
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"
