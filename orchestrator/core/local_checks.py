"""Checks of local paths a command will write later, made before anything moves: a folder that cannot be written
is found at the start, not after a checkpoint was stripped, relayed and evaluated."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from orchestrator.core.errors import InputError


def writable_folder(path: str | Path, flag: str, *, given: str | Path | None = None) -> Path:
    """PATH as an absolute folder that a file can be written in, checked by writing one there (in the nearest
    folder that exists when PATH is still to be made, so that a check leaves nothing behind). ``given``: what
    the user named, where PATH is its folder (the messages quote it)."""
    folder = Path(path).expanduser().resolve()
    path = path if given is None else given
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


def writable_file(path: str | Path, flag: str) -> Path:
    """PATH as an absolute file that the command can write later (through a temporary name in its folder, then a
    rename): not a folder, its folder writable (checked as writable_folder does). Made before any work starts."""
    file = Path(path).expanduser().resolve()
    if file.is_dir():
        raise InputError(f"{flag} {path}: {file} is a folder, not a file", hint=f"give {flag} a file name")
    writable_folder(file.parent, flag, given=path)
    return file
