"""A name that came from another machine is data, never a path until it is confined.

Hosts answer with file names (a relay's source listing, a job id, a run's file list). A compromised host
can answer ``../../home/u/.ssh/authorized_keys`` or ``/etc/cron.d/x``; joined onto a local root unchecked,
that writes anywhere the user can. ``confine`` is the one check every boundary uses before a remote name
touches the filesystem; ``host_prelude._confine`` is its twin on the host side (host scripts check again
themselves: they cannot trust the controller either).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from orchestrator.core.errors import HostError

# A single file-name component that is also safe in a shell word, a lock name and a directory name.
_COMPONENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # fullmatch: "$" would let a trailing newline in


def name_problem(rel: object) -> str | None:
    """Why ``rel`` is not a clean relative name, or None when it is one."""
    if not isinstance(rel, str):
        return f"not a string ({type(rel).__name__})"
    if rel == "":
        return "empty"
    if "\x00" in rel:
        return "contains a NUL byte"
    if rel.startswith("/"):
        return "absolute"
    parts = rel.split("/")
    if any(part == "" for part in parts):
        return "has an empty component"
    if any(part in (".", "..") for part in parts):
        return "has a '.' or '..' component"
    return None


def check_name(rel: object, *, host: str, what: str = "file name") -> str:
    """``rel`` when it is a clean relative name (the lexical half of ``confine``); a HostError otherwise."""
    problem = name_problem(rel)
    if problem is not None:
        raise HostError(host, f"refused {what} {rel!r} from the host: {problem}",
                        hint="a host answered a name that would leave its folder; treat that host as compromised")
    assert isinstance(rel, str)  # name_problem refuses anything else
    return rel


def confine(root: str | os.PathLike, rel: object, *, host: str, what: str = "file name") -> Path:
    """``root/rel`` after checking that it stays under ``root``; a HostError naming HOST and REL otherwise.

    Symlinks already under ``root`` are resolved too, so a link planted inside cannot lead out.
    """
    check_name(rel, host=host, what=what)
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(base / str(rel)))
    if target != base and base not in target.parents:
        raise HostError(host, f"refused {what} {rel!r} from the host: it resolves outside {base}",
                        hint="a symlink under that folder leads out of it; remove it")
    return target


def check_component(value: object, *, host: str, what: str) -> str:
    """``value`` when it is one plain name component (letters, digits, '.', '_', '-'); a HostError otherwise."""
    if not isinstance(value, str) or not _COMPONENT_RE.fullmatch(value) or value in (".", ".."):
        raise HostError(host, f"refused {what} {value!r} from the host: expected letters, digits, '.', '_' or '-'",
                        hint="a host answered a malformed name; treat that host as compromised")
    return value

