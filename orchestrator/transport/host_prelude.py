# Shared prelude of every host script (stdlib only, Python >= 3.8): sent to the host in front of the
# feature's own script (see hostcall.script_source), so these helpers exist once in the repository and
# the host still receives one self-contained program.
import hashlib
import json
import os
import uuid


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_json(path):
    """The JSON document at PATH, or None when it is missing or unreadable."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _write_json(path, data, mode=0o644):
    """Write atomically: a fresh temporary name (O_EXCL), fsync, then rename over PATH."""
    tmp = "%s.tmp-%s" % (path, uuid.uuid4().hex[:8])
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _confine(root, rel):
    """ROOT/REL after checking that REL is a clean relative name that stays under ROOT (symlinks resolved).

    The host-side twin of orchestrator.core.confine: a name from the controller (or relayed from another
    host) is data, never a path until confined. Raises RuntimeError (reported as the host's error).
    """
    if not isinstance(rel, str) or rel == "" or "\x00" in rel or rel.startswith("/"):
        raise RuntimeError("refused name %r: not a relative name" % (rel,))
    if any(part in ("", ".", "..") for part in rel.split("/")):
        raise RuntimeError("refused name %r: empty, '.' or '..' component" % (rel,))
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, rel))
    if target != base and not target.startswith(base.rstrip("/") + "/"):
        raise RuntimeError("refused name %r: it resolves outside %s" % (rel, base))
    return target
