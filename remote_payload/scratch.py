"""Private scratch folders: the one way dfo makes (or accepts) a folder in a shared place such as /tmp.

A folder in /tmp is only safe if this user made it just now, exclusively, with mode 0700: another local user
can create any fixed name first (``mkdir -p`` then silently reuses their folder, and whatever they put in it,
a ``sitecustomize.py`` on PYTHONPATH say, runs as us). So a new folder comes from ``mkdtemp`` (an
unpredictable name, created exclusively, 0700), and a folder a user names (``DFO_GPU_SITE``) is created
exclusively or, when it exists, used only if it is a real folder (no link) owned by this user with no group or
other access. Stdlib only: hosts and ``scripts/gpu-check.sh`` run it before any package is installed.

    python -m remote_payload.scratch new PREFIX      make one, print its path
    python -m remote_payload.scratch own PATH        create PATH 0700 or check an existing one, print it
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


class UnsafeFolder(Exception):
    """A folder that someone else made, can enter or can write: not to be used."""


def check_private(path: str | Path) -> Path:
    """``path`` if it is a folder (not a link) of this user's with no access for group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise UnsafeFolder(f"{path}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFolder(f"{path} is not a folder (a link or a file is never followed)")
    if st.st_uid != os.getuid():
        raise UnsafeFolder(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    if st.st_mode & 0o077:
        raise UnsafeFolder(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; a private folder is 0700")
    return Path(path)


def private_dir(prefix: str, parent: str | Path | None = None) -> Path:
    """A new private folder (``mkdtemp``: exclusive, unpredictable, 0700), checked before it is handed out."""
    return check_private(tempfile.mkdtemp(prefix=prefix, dir=parent))


def own_dir(path: str | Path) -> Path:
    """A folder the user named: created 0700 when missing (exclusively: no ``-p`` reuse), else checked."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    return check_private(path)


@contextlib.contextmanager
def private_tmp(prefix: str) -> Iterator[Path]:
    """A private folder for the length of a ``with``; removed after (also on an exception)."""
    path = private_dir(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("new", "own"):
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    try:
        path = private_dir(argv[1]) if argv[0] == "new" else own_dir(argv[1])
    except UnsafeFolder as exc:
        print(f"refusing an unsafe folder: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
