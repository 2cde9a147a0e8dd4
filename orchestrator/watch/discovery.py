"""Which checkpoints a training folder holds, ordered by training step (pure: a listing in, checkpoints out).

A listing comes from ``probe.list_folder`` on the training host and is data from another machine: every
field is checked here (names are single folder entries, sizes and times numbers), and a malformed answer
is a HostError naming the host and the field. It has one entry per file or directory in the
folder with its size and mtime (a directory: the sum and the newest over its files) and, for a directory,
the step recorded in its metadata when it has any (``trainer_state.json`` ``global_step``,
``config.json`` ``training.step``, ``dfo-source.json`` ``step``). The step is read from the name when
the name carries a number (``step_20000.pt``, ``checkpoint-1500``), else from the metadata, and each
checkpoint says which (``step_source``).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from orchestrator.core.confine import check_name, name_problem
from orchestrator.core.errors import HostError, InputError

# Files a trainer writes as whole checkpoints (the eval strips their optimizer state on the source host).
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
# Names that are never checkpoints: relay temporaries, sidecars, hidden files.
_IGNORED = re.compile(r"(^\.|\.dfo-partial$|\.dfo-manifest\.json$|\.tmp$|^spec\.(json|ya?ml)$)")
# The step in a name: prefer a number after a step-like word, else the last number in the name.
_STEP_WORD = re.compile(r"(?:global[_-]?step|step|iter(?:ation)?|ckpt|checkpoint|epoch)[_-]?(\d+)", re.I)
_ANY_NUMBER = re.compile(r"(\d+)")
STEP_FROM = ("auto", "name", "metadata")


@dataclass(frozen=True)
class Checkpoint:
    name: str
    path: str            # absolute path on the training host
    step: int
    step_source: str     # "name" or "metadata:<file>"
    size: int
    mtime: float         # the training host's clock
    is_dir: bool
    mtime_ns: int | None = None  # a file's, as the relay's strip names its copy by it

    @property
    def observed(self) -> dict:
        """What the watcher compares to tell whether the trainer touched the checkpoint again."""
        return {"size": self.size, "mtime": self.mtime}


@dataclass(frozen=True)
class Listing:
    folder: str
    host_now: float                 # the training host's clock when it listed (mtimes are on that clock)
    checkpoints: list[Checkpoint]   # ordered by step, then name
    ignored: list[tuple[str, str]]  # (name, reason) for entries matching the pattern that are not usable


# Every integer a host answers (steps, sizes, times in ns) is below 2**63: TensorBoard, W&B and MLflow store
# steps as int64, and a bigger one would crash the watcher at every restart on the same checkpoint.
INT_LIMIT = 2**63


def _in_range(digits: str) -> int | None:
    # len() first: int() of a few thousand digits raises ValueError (and costs quadratic time before that).
    value = int(digits) if len(digits) <= 19 else INT_LIMIT
    return value if value < INT_LIMIT else None


def step_from_name(name: str) -> int | None:
    """The step a checkpoint name carries, or None (no number, or one of 2**63 and over: not a step)."""
    stem = name
    for suffix in CHECKPOINT_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    m = _STEP_WORD.search(stem)
    if m:
        return _in_range(m.group(1))
    numbers = _ANY_NUMBER.findall(stem)
    return _in_range(numbers[-1]) if numbers else None


@dataclass(frozen=True)
class Entry:
    """One entry of the host's listing, checked (see ``listing_entries``)."""
    name: str
    is_dir: bool
    size: int
    mtime: float
    has_weights: bool
    meta_file: str | None      # which metadata file recorded the step
    meta_step: int | None
    mtime_ns: int | None = None


# The metadata files the listing script reads (watch/host_script.py); any other name is a lie.
_META_FILES = ("trainer_state.json", "dfo-source.json", "config.json")


def _malformed(host: str, what: str, value: object) -> HostError:
    return HostError(host, f"malformed folder listing from the host: {what} is {value!r:.80}",
                     hint="dfo's listing script never answers this; treat the training host as compromised")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < INT_LIMIT


def _time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_entry_name(name: object) -> bool:
    """NAME can be one entry of a folder: a clean relative name without '/'."""
    return name_problem(name) is None and "/" not in str(name)


def checkpoint_name(name: object, *, host: str) -> str:
    """NAME when it is one plain entry of a folder listing (what ``os.listdir`` can return); else a HostError.

    The name is joined onto the folder to make the path the relay reads and names the relayed copy on the
    eval host after: ``step_7/`` would relay into the relay folder itself (and the clean-up would then
    remove that folder), a NUL breaks every command that carries the name."""
    check_name(name, host=host, what="checkpoint name")
    if "/" in str(name):
        raise HostError(host, f"refused checkpoint name {name!r} from the host: a folder entry has no '/'",
                        hint="a host answered a name that would leave its folder; treat that host as compromised")
    return str(name)


def _entry(raw: object, host: str) -> Entry:
    if not isinstance(raw, dict):
        raise _malformed(host, "an entry", raw)
    name = checkpoint_name(raw.get("name"), host=host)
    is_dir, has_weights = raw.get("is_dir"), raw.get("has_weights", False)
    if not isinstance(is_dir, bool) or not isinstance(has_weights, bool):
        raise _malformed(host, f"is_dir/has_weights of {name!r}", (is_dir, has_weights))
    if not _count(raw.get("size")):
        raise _malformed(host, f"the size of {name!r}", raw.get("size"))
    if not _time(raw.get("mtime")):
        raise _malformed(host, f"the mtime of {name!r}", raw.get("mtime"))
    if raw.get("mtime_ns") is not None and not _count(raw.get("mtime_ns")):
        raise _malformed(host, f"the mtime_ns of {name!r}", raw.get("mtime_ns"))
    meta = raw.get("meta")
    if meta is not None and not (isinstance(meta, dict) and meta.get("file") in _META_FILES
                                 and isinstance(meta.get("step"), int) and not isinstance(meta["step"], bool)):
        raise _malformed(host, f"the metadata step of {name!r}", meta)
    # A step of 2**63 or over (or below 0) in the metadata is no step: the entry is listed as ignored.
    meta_step = meta["step"] if meta and _count(meta["step"]) else None
    return Entry(name=name, is_dir=is_dir, size=raw["size"], mtime=float(raw["mtime"]), has_weights=has_weights,
                 meta_file=meta["file"] if meta else None, meta_step=meta_step, mtime_ns=raw.get("mtime_ns"))


def listing_entries(doc: object, *, host: str) -> tuple[float, list[Entry]]:
    """(the host's clock, its entries), every field checked; an answer that cannot be a listing is a HostError."""
    if not isinstance(doc, dict):
        raise _malformed(host, "the answer", doc)
    if "error" in doc:
        if not isinstance(doc["error"], str):
            raise _malformed(host, "the error", doc["error"])
        raise InputError(f"{host}: {doc['error']}")
    if not _time(doc.get("now")):
        raise _malformed(host, "the host's clock", doc.get("now"))
    raw = doc.get("entries")
    if not isinstance(raw, list):
        raise _malformed(host, "the entries", raw)
    entries = [_entry(e, host) for e in raw]
    if len({e.name for e in entries}) != len(entries):
        raise _malformed(host, "the entries", "a name listed twice")
    return float(doc["now"]), entries


def _looks_like_checkpoint(entry: Entry) -> bool:
    if entry.is_dir:
        return entry.has_weights
    return entry.name.endswith(CHECKPOINT_SUFFIXES)


def _step(entry: Entry, step_from: str) -> tuple[int | None, str]:
    by_name = step_from_name(entry.name)
    meta_source = f"metadata:{entry.meta_file}"
    if step_from == "name":
        return by_name, "name"
    if step_from == "metadata":
        return entry.meta_step, meta_source
    if by_name is not None:
        return by_name, "name"
    return entry.meta_step, meta_source


def parse_listing(doc: object, *, host: str, folder: str, pattern: str | None = None,
                  step_from: str = "auto") -> Listing:
    """``doc``: what ``host_script.list_folder`` answered on HOST for FOLDER (the folder dfo asked for, never
    the one the answer names). ``pattern``: an fnmatch pattern on the entry name (default: checkpoint files
    and directories that hold weights)."""
    if step_from not in STEP_FROM:
        raise InputError(f"--step-from {step_from!r}: expected one of {', '.join(STEP_FROM)}")
    host_now, entries = listing_entries(doc, host=host)
    out: list[Checkpoint] = []
    ignored: list[tuple[str, str]] = []
    for entry in entries:
        name = entry.name
        if _IGNORED.search(name):
            continue
        if pattern is not None:
            if not fnmatch.fnmatchcase(name, pattern):
                continue
        elif not _looks_like_checkpoint(entry):
            continue
        step, source = _step(entry, step_from)
        if step is None:
            why = "no step number in the name" if step_from == "name" else \
                "no step in its metadata" if step_from == "metadata" else "no step in the name or metadata"
            ignored.append((name, why))
            continue
        out.append(Checkpoint(name=name, path=f"{folder.rstrip('/')}/{name}", step=step, step_source=source,
                              size=entry.size, mtime=entry.mtime, is_dir=entry.is_dir, mtime_ns=entry.mtime_ns))
    out.sort(key=lambda c: (c.step, c.name))
    steps = [c.step for c in out]
    for c in out:
        if steps.count(c.step) > 1:
            ignored.append((c.name, f"step {c.step} is claimed by {steps.count(c.step)} checkpoints"))
    dup = {c.step for c in out if steps.count(c.step) > 1}
    return Listing(folder=folder, host_now=host_now, checkpoints=[c for c in out if c.step not in dup],
                   ignored=ignored)
