"""Checks of local paths a command will write later, made before anything moves: a folder that cannot be written
is found at the start, not after a checkpoint was stripped, relayed and evaluated."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from orchestrator.core.errors import InputError


def writable_folder(path: str | Path, flag: str) -> Path:
    """PATH as an absolute folder that a file can be written in, checked by writing one there (in the nearest
    folder that exists when PATH is still to be made, so that a check leaves nothing behind)."""
    folder = Path(path).expanduser().resolve()
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"{flag} {path}: {existing} is a file, not a folder", hint=f"give {flag} a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dfo-write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write there ({exc.strerror or exc})",
                         hint=f"give {flag} a folder you can write, or fix its permissions") from None
    return folder
