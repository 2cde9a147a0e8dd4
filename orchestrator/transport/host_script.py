# Host side of transport's own calls, behind the shared prelude (stdlib only, Python >= 3.8): the per-host
# lock's holder (hostlock.py) and the facts `dfo inventory check --connect` shows (facts.py).
import json
import os
import signal
import sys
import time


def host_facts(paths):
    """This interpreter's version, the GPUs nvidia-smi lists, and the free bytes where each of PATHS is."""
    import platform

    gpus = _command_lines(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return {"python": platform.python_version(), "gpus": gpus, "free_disk": {p: _free_bytes(p) for p in paths}}


def _say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _is_host_lock(record):
    return isinstance(record, dict) and isinstance(record.get("pid"), int) and "op" in record


def hold(workdir, owner, op):
    """Take WORKDIR/locks/host.lock (clearing a stale one), say so, hold it until stdin ends, release it."""
    path = _lock_path(workdir, "host")
    me = {"pid": os.getpid(), "start": _proc_start(os.getpid()), "owner": owner, "op": op, "since": time.time()}
    notice = None
    try:
        with _Guard(workdir):
            if os.path.lexists(path):
                holder = _read_json(path)
                if not _is_host_lock(holder):
                    _say({"error": "%s is not a dfo host lock; refusing to use or clear it" % path})
                    return
                if _pid_alive(holder["pid"], holder.get("start")):
                    _say({"held_by": holder})
                    return
                os.unlink(path)
                notice = "cleared a stale host lock of %s (%s; its process is gone)" % (holder.get("owner"),
                                                                                      holder.get("op"))
            if not _create_lock(path, me):
                _say({"held_by": _read_json(path) or {}})
                return
    except OSError as exc:
        _say({"error": str(exc)})
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(0))
    try:
        _say({"held": True, "notice": notice})
        sys.stdin.read()  # until the controller closes its channel (or its connection dies)
    finally:
        with _Guard(workdir):
            current = _read_json(path)
            if isinstance(current, dict) and current.get("pid") == me["pid"] and current.get("start") == me["start"]:
                os.unlink(path)
