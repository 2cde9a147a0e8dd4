# Host side of dfo's detached jobs (orchestrator/jobs/operation.py). Stdlib only, Python >= 3.8.
#
# Layout under WORKDIR:
#   jobs/<job id>/job.json        what runs: argv, cwd, name, env keys (values live in env.json, mode 600)
#                 env.json        the job's extra environment
#                 supervisor.py   this file; runs the command and records what happens to it
#                 pid.json        supervisor pid (= process group and session id), start time
#                 heartbeat       rewritten every few seconds while the command runs
#                 log             the command's stdout + stderr (and the supervisor's own notes)
#                 exit.json       exit code / signal, finish time (written atomically at the end)
#                 cancel          present once a cancel was asked for
#                 results/        where the command writes results ($DFO_RESULTS_DIR)
#   locks/<name>.lock             {"job_id", "job_dir"}: one job at a time per lock (e.g. the GPUs)
#
# The same file is the supervisor: `python supervisor.py supervise JOB_DIR`, started detached with
# `setsid nohup ... >log 2>&1 </dev/null &` so it leads its own session and process group (cancel kills
# the group) and the SSH call that launched it returns at once.
import base64
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

START_GRACE_S = 30.0  # a job with no pid file yet is "starting" this long, then "lost"






def _now():
    return time.time()


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) if t else None


def _job_dir(workdir, job_id):
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ValueError("bad job id %r" % job_id)
    return os.path.join(workdir, "jobs", job_id)


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _tail_lines(path, lines):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 65536))
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:] if lines else []


def job_state(job_dir, tail=0):
    spec = _read_json(os.path.join(job_dir, "job.json"))
    if spec is None:
        return None
    pid_info = _read_json(os.path.join(job_dir, "pid.json")) or {}
    exit_info = _read_json(os.path.join(job_dir, "exit.json"))
    refused = _read_json(os.path.join(job_dir, "refused.json"))
    cancel = os.path.exists(os.path.join(job_dir, "cancel"))
    pid = pid_info.get("pid")
    if refused:
        state = "refused"
    elif exit_info is not None:
        code = exit_info.get("exit_code")
        state = "succeeded" if code == 0 else ("cancelled" if cancel else "failed")
    elif pid:
        state = "running" if _pid_alive(pid, cmdline_has=job_dir) else ("cancelled" if cancel else "lost")
    else:
        state = "starting" if _now() - spec.get("created", 0) < START_GRACE_S else ("cancelled" if cancel else "lost")
    try:
        hb_age = _now() - os.path.getmtime(os.path.join(job_dir, "heartbeat"))
    except OSError:
        hb_age = None
    log = os.path.join(job_dir, "log")
    results = os.path.join(job_dir, "results")
    n_results = 0
    for _base, _dirs, names in os.walk(results):
        n_results += len(names)
    out = {
        "job_id": spec["job_id"],
        "name": spec.get("name"),
        "job_dir": job_dir,
        "state": state,
        "argv": spec.get("argv"),
        "cwd": spec.get("cwd"),
        "lock": spec.get("lock"),
        "env_keys": spec.get("env_keys", []),
        "created": _iso(spec.get("created")),
        "started": _iso(pid_info.get("started")),
        "finished": _iso((exit_info or {}).get("finished")),
        "pid": pid,
        "exit_code": (exit_info or {}).get("exit_code"),
        "signal": (exit_info or {}).get("signal"),
        "heartbeat_age_s": None if hb_age is None else round(hb_age, 1),
        "log_size": os.path.getsize(log) if os.path.exists(log) else 0,
        "results": n_results,
        "refused": refused,
        "cancel_requested": cancel,
    }
    if tail:
        out["log_tail"] = _tail_lines(log, tail)
    return out


# ----------------------------------------------------------------------------------- locks


def _lock_holder(workdir, name):
    """(holder record, holder's state) or (None, None). A lock file that is not a dfo job's lock (no job
    id, or a job_dir other than WORKDIR/jobs/<id>) is reported, never treated as stale: clearing it
    could delete someone else's file."""
    path = _lock_path(workdir, name)
    if not os.path.lexists(path):
        return None, None
    holder = _read_json(path)
    job_id = holder.get("job_id") if isinstance(holder, dict) else None
    if (not isinstance(job_id, str) or "/" in job_id or job_id.startswith(".")
            or holder.get("job_dir") != os.path.join(workdir, "jobs", job_id)):
        raise RuntimeError("%s is not a dfo job lock; refusing to use or clear it (remove it by hand if it is "
                           "yours)" % path)
    state = job_state(holder["job_dir"])
    return holder, (state or {}).get("state")


def _take_lock(workdir, name, job_id, job_dir, force):
    """Acquire lock ``name`` for the job. Returns (ok, notices, holder).

    Examining, clearing and taking happen under the locks guard, so two launchers that both find a stale
    lock cannot both clear it and both run."""
    notices = []  # type: list[str]
    path = _lock_path(workdir, name)
    record = {"job_id": job_id, "job_dir": job_dir, "since": _now(), "taken_by_pid": os.getpid()}
    with _Guard(workdir):
        holder, state = _lock_holder(workdir, name)
        if holder is not None and state in ("starting", "running"):
            if not force:
                return False, notices, dict(holder, state=state)
            notices.append("--force: running although lock %r is held by job %s (%s)"
                           % (name, holder.get("job_id"), state))
            _write_json(path, record)
            return True, notices, None
        if holder is not None:  # stale: finished, lost or gone (its supervisor is not running)
            os.unlink(path)
            notices.append("cleared stale lock %r held by job %s (%s; its supervisor is not running)"
                           % (name, holder.get("job_id"), state or "job directory missing"))
        if not _create_lock(path, record):
            return False, notices, {"job_id": "?", "state": "contended"}
    return True, notices, None


def _release_lock(workdir, name, job_id):
    path = _lock_path(workdir, name)
    with _Guard(workdir):
        holder = _read_json(path)
        if isinstance(holder, dict) and holder.get("job_id") == job_id:
            try:
                os.unlink(path)
            except OSError:
                pass


def lock_status(workdir, lock):
    holder, state = _lock_holder(workdir, lock)
    return {"holder": holder, "state": state}


# ---------------------------------------------------------------------------------- launch


def launch(workdir, job_id, argv, env, cwd, job_name, lock, force, supervisor_source, heartbeat_s=5.0):
    interpreter = sys.executable  # the one running this script: it exists
    job_dir = _job_dir(workdir, job_id)
    if os.path.exists(job_dir):
        raise RuntimeError("job directory %s already exists" % job_dir)
    notices = []  # type: list[str]
    if lock:  # refuse before creating anything when a live job holds the lock
        holder, state = _lock_holder(workdir, lock)
        if holder and state in ("starting", "running") and not force:
            return {"ok": False, "refused": dict(holder, state=state), "notices": notices}
    os.makedirs(os.path.join(job_dir, "results"))
    cwd = cwd or workdir
    # The real folder the job runs in (`payload` is a symlink that a deploy may switch): a release that
    # a running job uses is never pruned (deploy's host script reads this).
    spec = {"job_id": job_id, "name": job_name, "argv": argv, "cwd": cwd, "cwd_real": os.path.realpath(cwd),
            "lock": lock, "created": _now(),
            "env_keys": sorted(env), "heartbeat_s": heartbeat_s, "workdir": workdir}
    _write_json(os.path.join(job_dir, "env.json"), env, mode=0o600)
    _write_json(os.path.join(job_dir, "job.json"), spec)
    if lock:
        ok, lock_notices, holder = _take_lock(workdir, lock, job_id, job_dir, force)
        notices += lock_notices
        if not ok:
            shutil.rmtree(job_dir, ignore_errors=True)
            return {"ok": False, "refused": holder, "notices": notices}
    supervisor = os.path.join(job_dir, "supervisor.py")
    with open(supervisor, "w") as fh:
        fh.write(supervisor_source)
    log = os.path.join(job_dir, "log")
    if shutil.which("setsid") and shutil.which("nohup"):
        # All three streams redirected: otherwise the SSH channel stays open until the job ends.
        subprocess.run(["sh", "-c", 'setsid nohup "$1" "$2" supervise "$3" >"$4" 2>&1 </dev/null &',
                        "sh", interpreter, supervisor, job_dir, log], check=True, cwd=job_dir)
    else:  # no util-linux: the same detachment from Python
        with open(log, "ab") as out, open(os.devnull, "rb") as devnull:
            subprocess.Popen([interpreter, supervisor, "supervise", job_dir], stdin=devnull, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, cwd=job_dir, close_fds=True)
    deadline = _now() + 15
    while _now() < deadline:
        info = job_state(job_dir)
        if info["state"] != "starting":
            break
        time.sleep(0.02)
    info = job_state(job_dir, tail=20)
    if info["state"] == "starting":
        notices.append("the supervisor has not reported its pid after 15 s")
    return {"ok": True, "job": info, "notices": notices}


# ------------------------------------------------------------------------------ supervisor


def supervise(job_dir):
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    spec = _read_json(os.path.join(job_dir, "job.json"))
    extra = _read_json(os.path.join(job_dir, "env.json")) or {}
    env = dict(os.environ)
    env.update(extra)
    pid = os.getpid()
    _write_json(os.path.join(job_dir, "pid.json"), {"pid": pid, "pgid": os.getpgid(0), "sid": os.getsid(0),
                                                     "started": _now()})
    heartbeat = os.path.join(job_dir, "heartbeat")
    stop = threading.Event()
    received = []

    def beat():
        while not stop.is_set():
            with open(heartbeat, "w") as fh:
                fh.write("%.3f\n" % _now())
            stop.wait(spec.get("heartbeat_s") or 5.0)

    child = None

    def on_signal(signum, _frame):
        received.append(signum)
        if child is not None and child.poll() is None:
            try:
                child.send_signal(signum)  # reaches it also when only the supervisor was signalled
            except OSError:
                pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=beat, daemon=True).start()
    code, sig = None, None
    try:
        child = subprocess.Popen(spec["argv"], cwd=spec.get("cwd") or None, env=env, stdin=subprocess.DEVNULL)
        while True:
            try:
                code = child.wait()
                break
            except InterruptedError:
                continue
    except OSError as exc:
        sys.stdout.write("dfo-job: cannot start %s: %s\n" % (spec["argv"][0] if spec["argv"] else "?", exc))
        sys.stdout.flush()
        code = 127
    stop.set()
    if code is not None and code < 0:
        sig, code = -code, 128 - code
    _write_json(os.path.join(job_dir, "exit.json"), {
        "exit_code": code, "signal": signal.Signals(sig).name if sig else None, "finished": _now(),
        "supervisor_signals": [signal.Signals(s).name for s in received]})
    if spec.get("lock"):
        _release_lock(spec.get("workdir") or os.path.dirname(os.path.dirname(job_dir)), spec["lock"], spec["job_id"])
    return 0


# ------------------------------------------------------------------------------ inspection


def resolve(workdir, ref):
    """A job id from a reference: the exact id, a unique prefix, or "last"/"latest"."""
    root = os.path.join(workdir, "jobs")
    ids = sorted(n for n in os.listdir(root) if not n.startswith(".")) if os.path.isdir(root) else []
    if ref in ("last", "latest"):
        if not ids:
            raise LookupError("no jobs on this host (%s)" % root)
        return ids[-1]
    if ref in ids:
        return ref
    matches = [i for i in ids if i.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError("no job %r in %s" % (ref, root))
    raise LookupError("job reference %r is ambiguous: %s" % (ref, ", ".join(matches[:6])))


def find(workdir, ref):
    """Like resolve, but None instead of an error when there is no such job (for searching hosts)."""
    try:
        return resolve(workdir, ref)
    except LookupError as exc:
        if "ambiguous" in str(exc):
            raise
        return None


def status(workdir, job_id, tail=20):
    info = job_state(_job_dir(workdir, job_id), tail=tail)
    if info is None:
        raise LookupError("no job %s in %s" % (job_id, os.path.join(workdir, "jobs")))
    return info


def list_jobs(workdir, limit=50):
    root = os.path.join(workdir, "jobs")
    ids = sorted((n for n in os.listdir(root) if not n.startswith(".")), reverse=True) if os.path.isdir(root) else []
    out = []
    for job_id in ids[:limit]:
        info = job_state(os.path.join(root, job_id))
        if info is not None:
            out.append(info)
    return {"jobs": out, "total": len(ids)}


def poll(workdir, job_id, offset, max_bytes=262144, tail=0):
    """New log bytes from ``offset`` (base64) and the job's state: one round trip per follow step."""
    info = status(workdir, job_id, tail=tail)
    data = b""
    log = os.path.join(info["job_dir"], "log")
    try:
        with open(log, "rb") as fh:
            fh.seek(offset)
            data = fh.read(max_bytes)
    except OSError:
        pass
    info["chunk"] = base64.b64encode(data).decode()
    info["offset"] = offset + len(data)
    return info


def cancel(workdir, job_id, grace=5.0):
    """SIGTERM the job's whole process group, SIGKILL what is left after ``grace`` seconds."""
    job_dir = _job_dir(workdir, job_id)
    info = status(workdir, job_id, tail=0)
    if info["state"] not in ("starting", "running"):
        return {"signalled": False, "killed": False, "job": info}
    with open(os.path.join(job_dir, "cancel"), "w") as fh:
        fh.write("%.3f\n" % _now())
    deadline = _now() + 5
    while info["state"] == "starting" and _now() < deadline:
        time.sleep(0.05)
        info = status(workdir, job_id, tail=0)
    pgid = (_read_json(os.path.join(job_dir, "pid.json")) or {}).get("pgid")
    killed = False
    if pgid and _group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        end = _now() + grace
        while _now() < end and _group_alive(pgid):
            time.sleep(0.05)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed = True
            except ProcessLookupError:
                pass
            end = _now() + 5
            while _now() < end and _group_alive(pgid):
                time.sleep(0.05)
    spec = _read_json(os.path.join(job_dir, "job.json")) or {}
    if spec.get("lock"):
        _release_lock(workdir, spec["lock"], job_id)
    return {"signalled": True, "killed": killed, "group_alive": bool(pgid) and _group_alive(pgid),
            "job": status(workdir, job_id, tail=20)}




def _group_members(pgid):
    """[{pid, command}] of the processes in process group PGID, from /proc; None where there is no /proc."""
    if not os.path.isdir("/proc"):
        return None
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:  # fields after "(comm)": state ppid pgrp
                continue
            with open("/proc/%s/cmdline" % name, "rb") as fh:
                argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or not ours to read
        out.append({"pid": int(name), "command": argv or ["[" + stat[stat.find("(") + 1:stat.rfind(")")] + "]"]})
    return sorted(out, key=lambda p: p["pid"])


def cancel_preview(workdir, job_id):
    """What ``cancel`` would signal, changing nothing: the job's state and the processes of its group."""
    info = status(workdir, job_id, tail=0)
    pgid = (_read_json(os.path.join(_job_dir(workdir, job_id), "pid.json")) or {}).get("pgid")
    live = info["state"] in ("starting", "running") and isinstance(pgid, int) and pgid > 0
    return {"job": info, "pgid": pgid if live else None, "processes": _group_members(pgid) if live else []}

def results(workdir, job_id):
    """sha256 and size of every file under the job's results folder (what `pull` must reproduce)."""
    job_dir = _job_dir(workdir, job_id)
    info = status(workdir, job_id, tail=0)
    root = os.path.join(job_dir, "results")
    files = {}
    for base, dirs, names in os.walk(root):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(base, n)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            rel = os.path.relpath(path, root)
            files[rel] = {"sha256": _sha256(path), "size": os.path.getsize(path)}
    return {"root": root, "files": files, "job": info}


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "supervise":
    sys.exit(supervise(sys.argv[2]))
