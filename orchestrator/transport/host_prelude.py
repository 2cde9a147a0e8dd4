# Shared prelude of every host script (stdlib only, Python >= 3.8): sent to the host in front of the
# feature's own script (see hostcall.script_source), so these helpers exist once in the repository and
# the host still receives one self-contained program.
import hashlib
import json
import os


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
    tmp = "%s.tmp-%s" % (path, os.urandom(4).hex())  # not uuid: its import costs every host process ~10 ms
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _free_bytes(path):
    """Free bytes where PATH is or, not existing yet, would be created (its nearest existing parent); None
    when that cannot be measured."""
    where = path
    while not os.path.exists(where) and where not in ("/", ""):
        where = os.path.dirname(where)
    try:
        st = os.statvfs(where or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _command_lines(argv, timeout=60):
    """ARGV's stdout lines (stripped, non-empty), or [] when it is not installed or fails to run."""
    import shutil
    import subprocess

    if not shutil.which(argv[0]):
        return []
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=timeout).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


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


# ----------------------------------------------------------------------------------- locks
# Lock files live in WORKDIR/locks/<name>.lock, are created with O_EXCL, and are examined, taken and
# cleared only while holding flock(WORKDIR/locks/.guard): two processes can never both decide that the
# same lock is stale and both take it (the kernel drops a flock when its holder dies, so the guard
# itself cannot go stale).

LOCK_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


def _lock_path(workdir, name):
    import re
    if not isinstance(name, str) or not re.match(LOCK_NAME_RE, name) or ".." in name:
        raise RuntimeError("bad lock name %r: expected letters, digits, '.', '_' or '-'" % (name,))
    return os.path.join(workdir, "locks", "%s.lock" % name)


class _Guard(object):
    def __init__(self, workdir):
        self.path = os.path.join(workdir, "locks", ".guard")

    def __enter__(self):
        import fcntl
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the flock


def _create_lock(path, record):
    """Create PATH with O_EXCL holding RECORD; False when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def _proc_start(pid):
    """The kernel's start time of PID (field 22 of /proc/PID/stat), or None: with the pid it names one process."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else fields[19]
    except (OSError, IndexError, ValueError):
        return None


def _pid_alive(pid, start=None, cmdline_has=None):
    """Is PID running, and still the process meant (not a recycled pid)? START: its recorded start time
    (``_proc_start``); CMDLINE_HAS: text its command line contains (a job's supervisor names its folder)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        if cmdline_has is not None:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                if cmdline_has.encode() not in fh.read():
                    return False
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True  # no /proc: trust kill(0)
    if fields[0] == "Z":  # a zombie waiting for its reaper is dead for our purposes
        return False
    return start is None or fields[19] == start
