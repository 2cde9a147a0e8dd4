"""Which checkpoints a training folder holds, ordered by training step (pure: a listing in, checkpoints out).

A listing comes from ``probe.list_folder`` on the training host: one entry per file or directory in the
folder with its size and mtime (a directory: the sum and the newest over its files) and, for a directory,
the step recorded in its metadata when it has any (``trainer_state.json`` ``global_step``,
``config.json`` ``training.step``, ``dfo-source.json`` ``step``). The step is read from the name when
the name carries a number (``step_20000.pt``, ``checkpoint-1500``), else from the metadata, and each
checkpoint says which (``step_source``).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from orchestrator.core.errors import InputError

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


def step_from_name(name: str) -> int | None:
    stem = name
    for suffix in CHECKPOINT_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    m = _STEP_WORD.search(stem)
    if m:
        return int(m.group(1))
    numbers = _ANY_NUMBER.findall(stem)
    return int(numbers[-1]) if numbers else None


def _looks_like_checkpoint(entry: dict) -> bool:
    if entry.get("is_dir"):
        return bool(entry.get("has_weights"))
    return str(entry["name"]).endswith(CHECKPOINT_SUFFIXES)


def _step(entry: dict, step_from: str) -> tuple[int | None, str]:
    by_name = step_from_name(entry["name"])
    meta = entry.get("meta") or {}
    by_meta = meta.get("step") if isinstance(meta.get("step"), int) else None
    meta_source = f"metadata:{meta.get('file')}"
    if step_from == "name":
        return by_name, "name"
    if step_from == "metadata":
        return by_meta, meta_source
    if by_name is not None:
        return by_name, "name"
    return by_meta, meta_source


def parse_listing(doc: dict, *, pattern: str | None = None, step_from: str = "auto") -> Listing:
    """``doc``: what the host's listing script printed. ``pattern``: an fnmatch pattern on the entry name
    (default: checkpoint files and directories that hold weights)."""
    if step_from not in STEP_FROM:
        raise InputError(f"--step-from {step_from!r}: expected one of {', '.join(STEP_FROM)}")
    if doc.get("error"):
        raise InputError(f"{doc.get('host', 'training host')}: {doc['error']}")
    folder = str(doc.get("folder", ""))
    out: list[Checkpoint] = []
    ignored: list[tuple[str, str]] = []
    for entry in doc.get("entries", []):
        name = str(entry.get("name", ""))
        if not name or _IGNORED.search(name):
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
                              size=int(entry.get("size") or 0), mtime=float(entry.get("mtime") or 0.0),
                              is_dir=bool(entry.get("is_dir"))))
    out.sort(key=lambda c: (c.step, c.name))
    steps = [c.step for c in out]
    for c in out:
        if steps.count(c.step) > 1:
            ignored.append((c.name, f"step {c.step} is claimed by {steps.count(c.step)} checkpoints"))
    dup = {c.step for c in out if steps.count(c.step) > 1}
    return Listing(folder=folder, host_now=float(doc.get("now") or 0.0),
                   checkpoints=[c for c in out if c.step not in dup], ignored=ignored)
