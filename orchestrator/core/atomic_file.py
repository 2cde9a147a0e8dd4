"""Files that appear whole: written under a fresh, unpredictable temporary name beside the target (``mkstemp``:
created exclusively, so a link planted at a guessable name is never written through), flushed, then renamed
over the target (a link there is replaced, not followed). A reader never sees half a file, and a failure
leaves the old file and no temporary one. The file gets the mode the umask gives an ordinary new file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


@contextlib.contextmanager
def atomic_target(path: Path) -> Iterator[Path]:
    """A fresh temporary path beside PATH for a writer that wants a file name (matplotlib's savefig); renamed
    over PATH when the ``with`` ends, removed on an exception."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """PATH holding DATA, written whole (see the module's text)."""
    with atomic_target(path) as tmp:
        with open(tmp, "r+b") as fh:  # the file mkstemp made (r+: never a new one at that name)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))
