"""Submit, follow, cancel and resume an array job on a Slurm cluster, through its login node.

The login node is reached as any host is: ``session`` is a control session (``transport/control.py``) or
anything with the same ``run(command, stdin=, check=)``. Every command line is built from argv lists
(``shlex.quote``d by the transport), the batch script travels on sbatch's stdin, and every answer is typed by
``replies.py`` before use.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from orchestrator.cluster.plan import BatchRequest, batch_script, task_dir
from orchestrator.cluster.replies import SQUEUE_FORMAT, TaskState, parse_job_id, parse_scontrol, parse_squeue
from orchestrator.core.errors import HostError, OperationError
from orchestrator.core.slurm_section import SlurmSection


class LoginSession(Protocol):
    name: str

    def run(self, command: Any, *, stdin: bytes | None = None, check: bool = True,
            timeout: float | None = None, env: dict[str, str] | None = None) -> Any: ...


class ClusterLogin:
    """A control session to the login node whose commands carry the host's ``env:`` (e.g. SLURM_CONF on a
    cluster without a system-wide one); the values travel on stdin, never in a command line."""

    def __init__(self, session: LoginSession, env: dict[str, str]):
        self.session, self.env, self.name = session, env, session.name

    def run(self, command: Any, *, stdin: bytes | None = None, check: bool = True,
            timeout: float | None = None, env: dict[str, str] | None = None) -> Any:
        return self.session.run(command, stdin=stdin, check=check, timeout=timeout, env={**self.env, **(env or {})})


def login_session(connector: Any, host: str) -> ClusterLogin:
    """The cluster HOST's login node, through CONNECTOR (a transport Connector)."""
    return ClusterLogin(connector.session(host), connector.inventory.host_env(host))


@dataclass(frozen=True)
class Submitted:
    array_job_id: str
    job_dir: str
    tasks: tuple[int, ...]
    script: str


def submit(session: LoginSession, section: SlurmSection, request: BatchRequest) -> Submitted:
    """Create the task folders, keep the script beside them, submit it; the array's job id."""
    script = batch_script(section, request)
    folders = [task_dir(request.job_dir, task) for task in request.tasks]
    keep = shlex.join(["tee", f"{request.job_dir}/batch-{int(time.time() * 1000)}.sh"])
    line = (shlex.join(["mkdir", "-p", "--", *folders]) + f" && {keep} | "
            + shlex.join(["sbatch", "--parsable"]))
    result = session.run(line, stdin=script.encode(), check=False)
    if result.exit_code != 0:
        detail = (result.err_text or result.text).strip()[-400:]
        raise HostError(session.name, f"sbatch refused the job: {detail}",
                        hint="check the host's slurm: section (partition, account, limits) against `sinfo`")
    return Submitted(parse_job_id(session.name, result.text), request.job_dir, request.tasks, script)


def task_states(session: LoginSession, array_job_id: str) -> dict[int, TaskState]:
    """Every array task Slurm still knows: squeue for the queued and running, scontrol for the finished."""
    queued = session.run(["squeue", "-h", "-r", "-j", array_job_id, "-o", SQUEUE_FORMAT], check=False)
    states = parse_squeue(session.name, array_job_id, queued.text) if queued.exit_code == 0 else {}
    shown = session.run(["scontrol", "show", "job", array_job_id, "--oneliner"], check=False)
    if shown.exit_code == 0:
        for task, state in parse_scontrol(session.name, array_job_id, shown.text).items():
            if task not in states or not state.active:
                states[task] = state
    return states


def follow(session: LoginSession, submitted: Submitted, *, poll: float = 1.0, timeout: float = 3600.0,
           on_change: Callable[[TaskState], None] | None = None, max_poll: float = 30.0) -> dict[int, TaskState]:
    """Poll until every task has left the queue; ON_CHANGE sees each task whenever its state changes. The
    interval grows from POLL to MAX_POLL while nothing changes (a long job does not hammer slurmctld)."""
    deadline = time.monotonic() + timeout
    seen: dict[int, TaskState] = {}
    polls = 0
    interval = poll
    while True:
        states = task_states(session, submitted.array_job_id)
        polls += 1
        forgotten = [task for task in submitted.tasks if task not in seen and task not in states]
        if forgotten and states and polls >= 3:
            # The array is known but never listed these: cancelled before they started (Slurm then drops a
            # task from the array's pending remainder without a record of its own).
            for task in forgotten:
                states[task] = TaskState(task, submitted.array_job_id, submitted.array_job_id, "CANCELLED",
                                         reason="removed from the array before it started")
        elif forgotten and polls >= 5:  # nothing listed: the job ended long ago and Slurm has forgotten it
            raise OperationError(f"{session.name}: Slurm does not know task(s) {', '.join(map(str, forgotten))} of "
                                 f"job {submitted.array_job_id} (ended and forgotten, or never submitted)",
                                 hint="tasks without complete results are submitted again by `dfo runs pull RUN "
                                 "--resume`")
        changed = [state for task, state in sorted(states.items()) if seen.get(task) != state]
        for state in changed:
            if on_change:
                on_change(state)
        interval = poll if changed else min(max_poll, interval * 1.5)
        seen.update(states)
        if all(task in seen and not seen[task].active for task in submitted.tasks):
            return {task: seen[task] for task in submitted.tasks}
        if time.monotonic() > deadline:
            raise OperationError(f"{session.name}: job {submitted.array_job_id} still has tasks in the queue after "
                                 f"{timeout:.0f} s", hint=f"follow it with squeue -j {submitted.array_job_id}, or "
                                 f"cancel it with scancel {submitted.array_job_id} on the login node")
        time.sleep(interval)


def cancel(session: LoginSession, array_job_id: str, task: int | None = None) -> None:
    """``scancel`` the whole array, or one of its tasks."""
    target = array_job_id if task is None else f"{array_job_id}_{int(task)}"
    session.run(["scancel", target])


@dataclass(frozen=True)
class TaskRecord:
    """What a task wrote in its folder (the task's side of the story; Slurm's is TaskState)."""

    task: int
    started: bool
    exit_code: int | None  # None: no finished.json (never finished, or killed before it could write one)
    node: str = ""
    started_at: float | None = None   # the task's own clock (epoch seconds), as it wrote them
    finished_at: float | None = None


def task_records(session: LoginSession, job_dir: str, tasks: tuple[int, ...]) -> dict[int, TaskRecord]:
    """Read every task's started/finished records (at most 512 bytes each, parsed as untrusted JSON)."""
    script = "\n".join(
        f"for f in started finished; do printf '%s %s ' {int(task)} \"$f\"; "
        f"head -c 512 {shlex.quote(task_dir(job_dir, task))}/\"$f\".json 2>/dev/null | tr -d '\\n'; echo; done"
        for task in tasks)
    text = session.run(["bash", "-c", script]).text
    found: dict[int, dict[str, dict]] = {task: {} for task in tasks}
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 3 or not parts[0].isdigit() or int(parts[0]) not in found or not parts[2].strip():
            continue
        try:
            value = json.loads(parts[2])
        except ValueError:
            continue  # a half-written or hostile record counts as absent
        if isinstance(value, dict):
            found[int(parts[0])][parts[1]] = value
    records = {}
    for task, files in found.items():
        code = files.get("finished", {}).get("exit_code")
        node = files.get("started", {}).get("node")
        records[task] = TaskRecord(task, "started" in files,
                                   code if isinstance(code, int) and not isinstance(code, bool)
                                   and 0 <= code <= 255 else None,
                                   node if isinstance(node, str) and node.isprintable() and len(node) < 200 else "",
                                   _epoch(files.get("started", {}).get("started")),
                                   _epoch(files.get("finished", {}).get("finished")))
    return records


def _epoch(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e11
    return float(value) if ok else None


def missing_tasks(records: dict[int, TaskRecord]) -> tuple[int, ...]:
    """The tasks whose results are not complete: what `--resume` submits again (pure)."""
    return tuple(sorted(task for task, record in records.items() if record.exit_code != 0))


def resubmit(session: LoginSession, section: SlurmSection, request: BatchRequest) -> Submitted | None:
    """Submit again only REQUEST's tasks without a successful finished record; None when none is missing."""
    missing = missing_tasks(task_records(session, request.job_dir, request.tasks))
    if not missing:
        return None
    return submit(session, section, BatchRequest(request.name, request.job_dir, missing, request.command,
                                                 request.env, request.cwd))
