"""Issue 30, finding 5: ``--cache-limit-gib`` removes only the cache's own entries, through folder descriptors.

Before, the limit deleted the least recently used files anywhere under the cache folder (the fixture cache
inside the default payload cache, a --cache-dir's other data), unlinked by a path walked again after the scan
(a sub-folder swapped for a link then led outside the cache), and a folder vanishing mid-scan ended the eval
with FileNotFoundError after the extraction.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from remote_payload.inputs.cache import ENTRY_FOLDERS, enforce_limit
from remote_payload.inputs.server_reference import CACHE_SUBDIR


def _file(path: Path, size: int, age_s: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_only_the_caches_own_entries_are_evicted(tmp_path):
    # The oldest files of all: a fixture model's weights and a user's data under the same folder.
    fixture = _file(tmp_path / "fixtures" / "k1" / "target" / "model.safetensors", 4000, 10_000)
    data = _file(tmp_path / "notes.json", 4000, 10_000)
    export = _file(tmp_path / "engine-drafters" / "d-1" / "model.safetensors", 4000, 10_000)
    old = _file(tmp_path / "features" / "m-1.safetensors", 1000, 100)
    new = _file(tmp_path / "references" / "m-2.json", 1000, 10)
    out = enforce_limit(tmp_path, 1500)
    assert fixture.read_bytes() == b"x" * 4000 and data.exists() and export.exists()
    assert not old.exists() and new.exists()
    assert out["evicted"] == 1 and out["bytes_before"] == 2000 and out["bytes"] == 1000
    assert CACHE_SUBDIR in ENTRY_FOLDERS  # the server references' folder is in the index


def test_a_folder_swapped_for_a_link_after_the_scan_is_not_followed(tmp_path, monkeypatch):
    root, outside = tmp_path / "cache", tmp_path / "outside"
    victim = _file(outside / "m-1.safetensors", 1000, 0)
    entry = _file(root / "features" / "m-1.safetensors", 1000, 100)
    real_unlink = os.unlink

    def swap_then_unlink(path, *args, **kwargs):
        # Another user of a shared cache folder wins the race: features/ becomes a link to a folder of theirs.
        if not (root / "features").is_symlink():
            (root / "features").rename(root / "features.old")
            (root / "features").symlink_to(outside)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", swap_then_unlink)
    out = enforce_limit(root, 0)
    assert victim.exists(), "the limit deleted a file outside the cache through a swapped link"
    assert out["evicted"] == 1 and not (root / "features.old" / entry.name).exists()


def test_a_folder_vanishing_mid_scan_is_no_error(tmp_path, monkeypatch):
    _file(tmp_path / "references" / "a.json", 1000, 100)
    _file(tmp_path / "features" / "b.safetensors", 1000, 50)
    vanished: list[str] = []

    def vanishing(open_folder):
        # Another eval's clean-up removes references/ after the scan saw it, right before it is opened.
        def wrapper(path, *args, **kwargs):
            name = os.path.basename(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
            if name == "references" and not vanished:
                vanished.append(name)
                shutil.rmtree(tmp_path / "references")
            return open_folder(path, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(os, "scandir", vanishing(os.scandir))
    monkeypatch.setattr(os, "open", vanishing(os.open))
    out = enforce_limit(tmp_path, 0)  # before: FileNotFoundError, after the eval's expensive extraction
    assert vanished and out["bytes"] == 0 and out["evicted"] == 1
    assert not (tmp_path / "features" / "b.safetensors").exists()
