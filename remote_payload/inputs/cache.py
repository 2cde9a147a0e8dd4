"""On-disk caches (reference continuations, hidden-state features) keyed by what produced them.

A cache entry is reused only when every recorded field that affects its content matches the current
run; otherwise the caller is told which fields differ, and says so before recomputing.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable


def tokens_digest(tokens: Iterable[int]) -> str:
    return hashlib.sha256(json.dumps(list(map(int, tokens))).encode()).hexdigest()


def mismatches(expected: dict, found: dict | None, fields: Iterable[str]) -> list[str]:
    """Human-readable reasons why a cached entry cannot be reused (empty list: reuse it)."""
    if found is None:
        return ["no metadata"]
    reasons = []
    for key in fields:
        if expected.get(key) != found.get(key):
            reasons.append(f"{key} {_short(found.get(key))} -> {_short(expected.get(key))}")
    return reasons


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 24 else text[:12] + "…"


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:80]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with_suppress_unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def with_suppress_unlink(path: str | Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def temp_path_for(path: Path) -> Path:
    """A temporary sibling name, for writers (safetensors) that need a path rather than bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


# ------------------------------------------------------------------------------ size limit (LRU)


def mark_used(path: Path) -> None:
    """A reused entry becomes the most recently used: its access time is set now (a mount with noatime would
    not), its modification time kept (it still says when the entry was written)."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass


def enforce_limit(cache_dir: Path, limit_bytes: int, keep: Iterable[Path] = ()) -> dict:
    """Remove the least recently used files of ``cache_dir`` until it holds at most ``limit_bytes``; files in
    ``keep`` (what the running eval still reads) are never removed. Returns what it found and did."""
    kept = {Path(p).resolve() for p in keep}
    entries = []
    for path in cache_dir.rglob("*") if cache_dir.is_dir() else []:
        try:
            st = path.lstat()
        except OSError:
            continue
        if path.is_file() and not path.is_symlink() and not path.name.startswith("."):  # .x.tmp: a writer's
            entries.append((max(st.st_atime, st.st_mtime), st.st_size, path))  # last written or used
    total = sum(size for _, size, _ in entries)
    before, evicted, evicted_bytes = total, 0, 0
    for _, size, path in sorted(entries, key=lambda e: e[0]):
        if total <= limit_bytes:
            break
        if path.resolve() in kept:
            continue
        try:
            path.unlink()
        except OSError:
            continue
        total -= size
        evicted += 1
        evicted_bytes += size
    return {"limit_bytes": limit_bytes, "bytes_before": before, "bytes": total, "evicted": evicted,
            "evicted_bytes": evicted_bytes, "over_limit": total > limit_bytes}
