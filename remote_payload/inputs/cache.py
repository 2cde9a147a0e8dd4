"""On-disk caches (reference continuations, hidden-state features) keyed by what produced them.

A cache entry is reused only when every recorded field that affects its content matches the current
run; otherwise the caller is told which fields differ, and says so before recomputing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
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


# The cache's index of its own entries: the folders its writers use and the suffix of the names they give
# (inputs.reference / sampled_reference: references/, inputs.features: features/, inputs.server_reference and
# server_tails: server-references/). Nothing else under the cache folder is an entry: the fixture cache may
# sit inside it (the default one does), a --cache-dir may hold other data, and engine-drafters/ holds whole
# exported folders, not files to drop one by one.
ENTRY_FOLDERS = {"references": ".json", "features": ".safetensors", "server-references": ".json"}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def _entry_name(name: str, suffix: str) -> bool:
    return name.endswith(suffix) and not name.startswith(".") and "/" not in name  # .x.tmp: a writer's


def enforce_limit(cache_dir: Path, limit_bytes: int, keep: Iterable[Path] = ()) -> dict:
    """Remove the least recently used entries of ``cache_dir`` until they hold at most ``limit_bytes``; files
    in ``keep`` (what the running eval still reads) are never removed. Returns what it found and did.

    Only the index's folders are read, each opened once without following a link (O_NOFOLLOW), and every
    stat and unlink goes through that folder's descriptor: a folder swapped for a link after the scan is not
    followed, and one that vanishes mid-scan simply holds nothing."""
    kept = set()
    for p in keep:
        with contextlib.suppress(OSError):
            st = os.stat(p)
            kept.add((st.st_dev, st.st_ino))
    entries: list[tuple[float, int, int, str, tuple[int, int]]] = []
    fds: list[int] = []
    try:
        try:
            root = os.open(cache_dir, _DIR_FLAGS)  # the cache folder itself may be a link the user chose
        except OSError:
            return _limit_report(limit_bytes, 0, 0, 0, 0)
        fds.append(root)
        for folder, suffix in ENTRY_FOLDERS.items():
            try:
                fd = os.open(folder, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root)
            except OSError:  # missing, vanished, or a link: nothing of the cache's own there
                continue
            fds.append(fd)
            with contextlib.suppress(OSError):
                for name in os.listdir(fd):
                    if not _entry_name(name, suffix):
                        continue
                    try:
                        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    except OSError:  # gone since the listing
                        continue
                    if stat.S_ISREG(st.st_mode):
                        entries.append((max(st.st_atime, st.st_mtime), st.st_size, fd, name,  # last written/used
                                        (st.st_dev, st.st_ino)))
        total = before = sum(e[1] for e in entries)
        evicted, evicted_bytes = 0, 0
        for _, size, fd, name, ident in sorted(entries, key=lambda e: e[0]):
            if total <= limit_bytes:
                break
            if ident in kept:
                continue
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                continue
            total -= size
            evicted += 1
            evicted_bytes += size
        return _limit_report(limit_bytes, before, total, evicted, evicted_bytes)
    finally:
        for fd in fds:
            os.close(fd)


def _limit_report(limit_bytes: int, before: int, total: int, evicted: int, evicted_bytes: int) -> dict:
    return {"limit_bytes": limit_bytes, "bytes_before": before, "bytes": total, "evicted": evicted,
            "evicted_bytes": evicted_bytes, "over_limit": total > limit_bytes}
