"""What the resident workers of a `dfo watch` session share (``eval-worker`` in remote_payload/eval/worker.py,
``strip-worker`` in remote_payload/models/strip_worker.py): the worker's folder and loop, and its client's wait.

A worker's folder WORKER_DIR holds ``worker.json`` (its pid, the pid's start time and its state: ``loading``,
``ready``, ``stopped``, rewritten as it changes and every HEARTBEAT_S while it runs, a heartbeat) and
``inbox/``, where a client puts one request at a time (a temporary name, then a rename). The worker takes the
oldest request by renaming it (so it acts on each once), serves it, and exits after ``idle_exit`` seconds
without one. A worker is alive while its heartbeat is younger than HEARTBEAT_DEADLINE_S and its pid names the
same process (a pid alone may since name another user's process). The client waits for its reply file, or
exits ``WORKER_GONE`` when the worker stopped first or did not take the request in time (the controller then
does the work without a worker). Stdlib only at import: a client imports nothing heavy.

A worker that runs as a Slurm job (`dfo watch --host CLUSTER --resident-job`) lives on a compute node while its
client runs on the login node: its pid means nothing there. Its record names its Slurm job instead
(``ARRAYID_TASK``), and the client, told which job to expect, judges it by the heartbeat on the shared
filesystem and by Slurm's own state of that job (squeue, asked at most every SLURM_LOOK_S); a job still
pending or starting is waited for (up to LOAD_TIMEOUT_S) rather than taken for gone. The heartbeat's deadline
compares two nodes' clocks: a Slurm cluster keeps them in step (munge's credentials expire otherwise).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from remote_payload.errors import PayloadError

WORKER_GONE = 75  # EX_TEMPFAIL: the handover did not happen; nothing is wrong with what was handed over
HEARTBEAT_S = 2.0
HEARTBEAT_DEADLINE_S = 30.0  # a beat older than this: the worker is gone (killed, or stalled), whatever its pid is now
TAKE_TIMEOUT_S = 60.0  # a ready worker takes a request within a poll; untaken this long, the handover is withdrawn
LOAD_TIMEOUT_S = 1800.0  # the longest a handover waits for a worker still loading (a 27B target loads in minutes)
TEST_EXIT_ENV = "DFO_WATCH_TEST_KILL_AT"  # tests only (orchestrator/watch/loop.py's kill points)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
LIVE = ("loading", "ready")
SLURM_JOB_RE = re.compile(r"^[0-9]{1,12}(_[0-9]{1,6})?\Z")  # a job id, or an array task as ARRAYID_TASK
SLURM_LOOK_S = 5.0  # how often a client asks Slurm about the worker's job (every squeue is slurmctld's load)
SLURM_STARTING = ("PENDING", "CONFIGURING", "RUNNING")  # a worker without a record yet may still come up
# A job in these states may have a live worker: a fresh beat from it then decides (Slurm's answer, asked every
# few seconds, may still say PENDING when the worker has started). Any other answer: the job has ended.
SLURM_ACTIVE = (*SLURM_STARTING, "COMPLETING")


def write_json(path: Path, doc: dict) -> None:
    """Temporary name in the same folder, then rename: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")  # the beat writes beside
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_start(pid: int) -> str | None:
    """The start time of process PID (clock ticks since boot, /proc/PID/stat), or None where there is none."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def inside(path: str, root: Path) -> Path:
    """PATH resolved, when it lies strictly inside ROOT (links resolved too); else a PayloadError."""
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if base not in real.parents:
        raise PayloadError(f"{path} is not inside {root}")
    return real


def slurm_job_here() -> str | None:
    """The Slurm job this process runs in (``ARRAYID_TASK`` for an array task), or None outside Slurm."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID", ""), os.environ.get("SLURM_ARRAY_TASK_ID", "")
    ident = f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID", "")
    return ident if SLURM_JOB_RE.match(ident) else None


def slurm_job_state(job: str, timeout: float = 30.0) -> str | None:
    """Slurm's state of JOB (``squeue -h -j JOB -o %T``): RUNNING, PENDING, …; "" when Slurm no longer lists it
    (ended); None when squeue cannot answer (missing or failing): unknown, the heartbeat decides alone."""
    if not SLURM_JOB_RE.match(job):
        return ""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return "" if "invalid job id" in done.stderr.lower() else None
    words = done.stdout.split()
    return words[0] if words and re.match(r"^[A-Z_]{1,32}\Z", words[0]) else ""


class SlurmLook:
    """Slurm's state of one job, asked again only after SLURM_LOOK_S (a client polls far more often)."""

    def __init__(self, job: str, ask: Callable[[str], str | None] = slurm_job_state):
        self.job, self.ask = job, ask
        self.state: str | None = None
        self.asked = -float("inf")

    def __call__(self) -> str | None:
        if time.monotonic() - self.asked >= SLURM_LOOK_S:
            self.state, self.asked = self.ask(self.job), time.monotonic()
        return self.state


def test_exit(point: str) -> None:
    """Tests only: a worker that dies at POINT (``DFO_WATCH_TEST_KILL_AT``; never set in production)."""
    if os.environ.get(TEST_EXIT_ENV) == point:
        os._exit(1)


class ResidentLoop:
    """A worker's folder and its loop: the state in worker.json (with a heartbeat), requests from inbox/."""

    def __init__(self, worker_dir: Path, idle_exit: float, progress: Any, *, what: str):
        self.dir, self.inbox, self.idle_exit, self.progress, self.what = worker_dir, worker_dir / "inbox", \
            idle_exit, progress, what
        self.state: dict[str, Any] = {"pid": os.getpid(), "pid_start": process_start(os.getpid()),
                                      "state": "loading", "started": time.time(), "served": 0,
                                      "slurm_job": slurm_job_here(),
                                      "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname()}
        self._stop = threading.Event()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.publish()
            except OSError:  # a full disk for a moment: the next beat tries again (a missed deadline ends it)
                pass

    def publish(self, **changes: Any) -> None:
        self.state.update(changes, beat=time.time())
        write_json(self.dir / "worker.json", self.state)

    def run(self, load: Callable[[], Any], handle: Callable[[Any, Path, Path], None]) -> int:
        """``load()`` once (its value is passed on), then ``handle(value, request, taken)`` per request: TAKEN is
        the request renamed out of the inbox (removed afterwards); REQUEST its name in the inbox. The handler
        publishes its outcome (``served`` counts them)."""
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.publish()
        threading.Thread(target=self._beat, daemon=True).start()
        try:
            loaded = load()
            self.publish(state="ready", ready=time.time(), startup_s=round(time.time() - self.state["started"], 3))
            self.progress.text(f"resident {self.what} ready in {self.state['startup_s']:.1f}s; inbox {self.inbox}")
            last = time.monotonic()
            while time.monotonic() - last < self.idle_exit:
                pending = sorted(p for p in self.inbox.glob("*.json") if not p.name.startswith("."))
                if not pending:
                    time.sleep(0.05)
                    continue
                taken = pending[0].with_name(f".{pending[0].name}.taken")
                try:
                    os.replace(pending[0], taken)  # one worker acts on a request once
                except OSError:
                    continue
                try:
                    handle(loaded, pending[0], taken)
                finally:
                    taken.unlink(missing_ok=True)
                last = time.monotonic()
            self.progress.text(f"no request for {self.idle_exit:g}s: the resident {self.what} stops")
            return 0
        finally:
            self._stop.set()
            self.publish(state="stopped")


def worker_live(worker_dir: Path, slurm: SlurmLook | None = None) -> dict | None:
    """The worker's state when it is loading or ready, its heartbeat is within the deadline and it is the worker
    expected: the process that wrote it (its pid, on this machine), or with SLURM the Slurm job named there,
    which Slurm still runs. Else None."""
    state = read_json(worker_dir / "worker.json") or {}
    beat, pid, started = state.get("beat"), state.get("pid"), state.get("pid_start")
    if state.get("state") not in LIVE or isinstance(beat, bool) or not isinstance(beat, (int, float)) or \
            abs(time.time() - beat) > HEARTBEAT_DEADLINE_S:
        return None
    if slurm is not None:  # on another node: its pid names nothing here
        return state if state.get("slurm_job") == slurm.job and slurm() in (*SLURM_ACTIVE, None) else None
    if not pid_alive(pid):
        return None
    assert isinstance(pid, int)  # pid_alive takes ints only
    now_start = process_start(pid)
    if started is not None and now_start is not None and started != now_start:
        return None  # the pid was reused: another process runs under it now
    return state


def _starting(worker_dir: Path, slurm: SlurmLook | None) -> bool:
    """A Slurm worker not live yet that may still come up: its job pending or starting and no record of its
    own in the folder yet (a record of this job that went stale is a worker that stopped)."""
    if slurm is None or slurm() not in SLURM_STARTING:
        return False
    return (read_json(worker_dir / "worker.json") or {}).get("slurm_job") != slurm.job


def hand_over(worker_dir: Path, request: Path, doc: dict, reply: Path, poll: float = 0.05,
              slurm: SlurmLook | None = None) -> dict | None:
    """Put DOC in the worker's inbox as REQUEST and wait for the worker's REPLY: its document, or None when the
    worker is not running, stopped before it replied, or did not take the request within TAKE_TIMEOUT_S (of
    being ready) or LOAD_TIMEOUT_S (in all). A request it never took is withdrawn: a later worker must not act
    on it, and the caller does the work itself. SLURM: the worker is that Slurm job (see the module's text)."""
    take_timeout, load_timeout = TAKE_TIMEOUT_S, LOAD_TIMEOUT_S
    started = time.monotonic()
    while worker_live(worker_dir, slurm) is None:
        if not _starting(worker_dir, slurm) or time.monotonic() - started > load_timeout:
            return None
        time.sleep(max(poll, 0.5))
    write_json(request, doc)
    ready_since: float | None = None
    while True:
        outcome = read_json(reply)
        if outcome is not None:
            return outcome
        state = worker_live(worker_dir, slurm)
        if state is None:
            request.unlink(missing_ok=True)
            return read_json(reply)
        now = time.monotonic()
        if state.get("state") == "ready" and ready_since is None:
            ready_since = now
        late = (ready_since is not None and now - ready_since > take_timeout) or now - started > load_timeout
        if late and request.exists():
            try:
                request.unlink()
            except FileNotFoundError:  # taken just now: its reply follows
                continue
            return None
        time.sleep(poll)


def gone(why: str, instead: str) -> int:
    """The client's exit when the worker stopped first: its line (INSTEAD: what the controller does now), and
    WORKER_GONE."""
    print(f"dfo-payload error: {why} (worker gone: {instead})", file=sys.stderr, flush=True)
    return WORKER_GONE
