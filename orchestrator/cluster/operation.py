"""Submit, follow, cancel and resume an array job on a Slurm cluster, through its login node.

The login node is reached as any host is: ``ClusterLogin`` holds its control session (``transport/control.py``),
the host's ``env:`` and its Python (the sandbox's ``LocalLoginSession`` has the same shape). Slurm's commands
run on the login node inside ``host_script.py`` (through ``transport/hostcall.py``: arguments travel as JSON,
commands as argv lists, no shell), the batch script is rendered there from values ``plan.py`` validated, and
every answer is typed by ``replies.py`` before use: the login node may be hostile.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from orchestrator.cluster.plan import BatchRequest, batch_spec, render, task_dir
from orchestrator.cluster.replies import (
    JOB_ID_RE,
    TaskState,
    command_reply,
    parse_job_id,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
)
from orchestrator.core.errors import HostError, OperationError
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.jobs.operation import checked_manifest
from orchestrator.transport import hostcall

HOST_SCRIPT = Path(__file__).with_name("host_script.py")


class LoginSession(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def session(self) -> Any: ...  # what hostcall runs host_script.py through (a control session)
    @property
    def env(self) -> dict[str, str]: ...  # exported for every Slurm command (the host's env:, e.g. SLURM_CONF)
    @property
    def interpreter(self) -> str: ...  # the login node's Python


@dataclass(frozen=True)
class ClusterLogin:
    """The login node of a cluster host: its control session, the host's ``env:`` (e.g. SLURM_CONF on a
    cluster without a system-wide one; the values travel on stdin, never in a command line) and its Python."""

    session: Any
    env: dict[str, str]
    interpreter: str = "python3"

    @property
    def name(self) -> str:
        return self.session.name


def login_session(connector: Any, host: str) -> ClusterLogin:
    """The cluster HOST's login node, through CONNECTOR (a transport Connector)."""
    return ClusterLogin(connector.session(host), connector.inventory.host_env(host),
                        connector.inventory.hosts[host].python)


# Every call to the login node ends: its Slurm commands time out at 120 s each (host_script._run) and its file reads
# are bounded and never block (a FIFO planted in a job folder is not read), so a call past this is a stuck host.
CALL_TIMEOUT_S = 600.0


def call(login: LoginSession, func: str, timeout: float | None = CALL_TIMEOUT_S, **kwargs: Any) -> Any:
    """``host_script.FUNC(**kwargs)`` on the login node (its answer still to be typed by the caller)."""
    return hostcall.call(login.session, HOST_SCRIPT, func, python=login.interpreter, timeout=timeout,
                         host_env=login.env, **kwargs)


@dataclass(frozen=True)
class Submitted:
    array_job_id: str
    job_dir: str
    tasks: tuple[int, ...]
    script: str


def submit(session: LoginSession, section: SlurmSection, request: BatchRequest, *, resume: bool = False) -> Submitted:
    """Create the job's folder (a new one, 0700: never one that exists, unless RESUME submits tasks of this
    job again) and its task folders, keep the script beside them, submit it; the array's job id."""
    spec = batch_spec(section, request)
    folders = [task_dir(request.job_dir, task) for task in request.tasks]
    keep_as = f"{request.job_dir}/batch-{int(time.time() * 1000)}.sh"
    reply = command_reply(session.name, "sbatch", call(session, "submit", spec=spec, folders=folders,
                                                       keep_as=keep_as, resume=resume))
    if reply.exit_code != 0:
        raise HostError(session.name, f"sbatch refused the job: {refusal_reason(reply.err or reply.out)}",
                        hint=refusal_hint(section))
    return Submitted(parse_job_id(session.name, reply.out), request.job_dir, request.tasks, render(spec))


def refusal_reason(text: str) -> str:
    """Slurm's reason from sbatch's error output, on one line: its last line without the ``sbatch: error:``
    and ``Batch job submission failed:`` prefixes (pure; the text is the login node's, shown as text)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[-1] if lines else "no reason given"
    for prefix in ("sbatch: error:", "Batch job submission failed:"):
        if reason.startswith(prefix):
            reason = reason[len(prefix):].strip()
    return reason[:300]


def refusal_hint(section: SlurmSection) -> str:
    """Where to look when sbatch refuses a job SECTION describes (pure)."""
    gpus = f"--gres={section.gres}" if section.gres else \
        f"--gpus-per-task={section.gpus_per_task}" if section.gpus_per_task else ""
    if gpus:
        return (f"each task asks {gpus}: `sinfo -o '%P %G'` on the login node lists each partition's GPUs per "
                "node; fix slurm.gres / slurm.gpus_per_task (or the partition) in the inventory")
    return "check the host's slurm: section (partition, account, limits) against `sinfo`"


def task_states(session: LoginSession, array_job_id: str) -> dict[int, TaskState]:
    """Every array task Slurm still knows: squeue for the queued and running, scontrol for the finished."""
    answers = call(session, "states", array_job_id=_checked_id(session, array_job_id))
    if not isinstance(answers, dict):
        raise HostError(session.name, "cluster.states: the answer is not an object")
    queued = command_reply(session.name, "squeue", answers.get("squeue"))
    shown = command_reply(session.name, "scontrol", answers.get("scontrol"))
    states = parse_squeue(session.name, array_job_id, queued.out) if queued.exit_code == 0 else {}
    if shown.exit_code == 0:
        for task, state in parse_scontrol(session.name, array_job_id, shown.out).items():
            if task not in states or not state.active:
                states[task] = state
    return states


def accounted_states(session: LoginSession, array_job_id: str, job_ids: dict[str, int]) -> dict[int, TaskState]:
    """sacct's view of tasks Slurm's controller has forgotten: accounting where the cluster has it, else the
    job completion log, which knows each task by its own job id only (JOB_IDS: job id -> task)."""
    return accounted(session, array_job_id, job_ids)[0]


def accounted(session: LoginSession, array_job_id: str,
              job_ids: dict[str, int]) -> tuple[dict[int, TaskState], str]:
    """``accounted_states`` and which of sacct's sources answered: ``accounting`` (the database),
    ``completion`` (the job completion log), or "" (neither knows the array)."""
    ids = sorted(i for i in job_ids if JOB_ID_RE.match(i))
    answer = call(session, "accounted", array_job_id=_checked_id(session, array_job_id), job_ids=ids)
    if not isinstance(answer, dict) or not isinstance(answer.get("text", ""), str):
        raise HostError(session.name, "cluster.accounted: the answer is not an object with a text")
    source = answer.get("source")
    if source not in ("accounting", "completion"):
        return {}, ""
    return parse_sacct(session.name, array_job_id, answer["text"], job_ids), source


def _checked_id(session: LoginSession, job_id: str) -> str:
    if not JOB_ID_RE.match(job_id):
        raise HostError(session.name, f"not a Slurm job id: {job_id[:40]!r}")
    return job_id


def follow(session: LoginSession, submitted: Submitted, *, poll: float = 1.0, timeout: float = 3600.0,
           on_change: Callable[[TaskState], None] | None = None, max_poll: float = 30.0) -> dict[int, TaskState]:
    """Poll until every task has left the queue; ON_CHANGE sees each task whenever its state changes. The
    interval between squeue calls grows from POLL to MAX_POLL while nothing changes (a long job does not hammer
    slurmctld), and is cut short when a task writes its started or finished record (``wait_for_records``): a
    task's end is seen within a second of it, not up to MAX_POLL later."""
    deadline = time.monotonic() + timeout
    seen: dict[int, TaskState] = {}
    records_seen: dict[int, set[str]] = {}
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
        elif forgotten and polls >= 5:  # nothing listed: the job ended long ago and Slurm's controller forgot it
            ids = {r.job_id: task for task, r in task_records(session, submitted.job_dir, tuple(forgotten)).items()
                   if r.job_id}
            states.update({t: s for t, s in accounted_states(session, submitted.array_job_id, ids).items()
                           if t in forgotten})
            forgotten = [task for task in forgotten if task not in states]
        if forgotten and not states and polls >= 5:
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
        if wait_for_records(session, submitted, records_seen, interval, at_least=poll):
            interval = poll


def wait_for_records(session: LoginSession, submitted: Submitted, seen: dict[int, set[str]], wait_s: float, *,
                     at_least: float) -> bool:
    """Wait up to WAIT_S for a task of SUBMITTED to write a started or finished record not in SEEN (updated in
    place); True when one did. The login node's answer is only a hint to look again, never a result, and the
    wait lasts AT_LEAST seconds whatever it answers (a host that always claims news cannot make the follower
    spin on slurmctld)."""
    started = time.monotonic()
    answer = call(session, "wait_records", timeout=wait_s + CALL_TIMEOUT_S, job_dir=submitted.job_dir,
                  tasks=list(submitted.tasks), seen={str(t): sorted(names) for t, names in seen.items()},
                  wait_s=wait_s)
    news = False
    for task in submitted.tasks:
        texts = answer.get(str(task)) if isinstance(answer, dict) else None
        record = task_record(task, texts)
        have = {name for name, present in (("started", record.started), ("finished", record.exit_code is not None))
                if present}
        news = news or bool(have - seen.get(task, set()))
        seen[task] = seen.get(task, set()) | have
    rest = at_least - (time.monotonic() - started)
    if rest > 0:
        time.sleep(rest)
    return news


def cancel(session: LoginSession, array_job_id: str, task: int | None = None) -> None:
    """``scancel`` the whole array, or one of its tasks."""
    target = _checked_id(session, array_job_id) + ("" if task is None else f"_{int(task)}")
    reply = command_reply(session.name, "scancel", call(session, "cancel", target=target))
    if reply.exit_code != 0:
        raise HostError(session.name, f"scancel {target} failed: {(reply.err or reply.out).strip()[-300:]}")


@dataclass(frozen=True)
class TaskRecord:
    """What a task wrote in its folder (the task's side of the story; Slurm's is TaskState)."""

    task: int
    started: bool
    exit_code: int | None  # None: no finished.json (never finished, or killed before it could write one)
    node: str = ""
    started_at: float | None = None   # the task's own clock (epoch seconds), as it wrote them
    finished_at: float | None = None
    job_id: str = ""  # the task's own Slurm job id, as it recorded it ("" when unknown)


def task_records(session: LoginSession, job_dir: str, tasks: tuple[int, ...]) -> dict[int, TaskRecord]:
    """Read every task's started/finished records (at most 512 bytes each, parsed as untrusted JSON)."""
    answer = call(session, "records", job_dir=job_dir, tasks=[int(t) for t in tasks])
    answer = answer if isinstance(answer, dict) else {}
    return {task: task_record(task, answer.get(str(task))) for task in tasks}


def task_results(session: LoginSession, job_dir: str, task: int) -> dict[str, dict]:
    """The manifest of task TASK's results folder (name -> sha256 and size), checked as an SSH job's is:
    names confined, digests and sizes typed, the total within the pull's limit (jobs/operation.py)."""
    return checked_manifest(session.name, call(session, "task_results", job_dir=job_dir, task=int(task)))


def task_record(task: int, texts: Any) -> TaskRecord:
    """One task's record from its started.json and finished.json texts (absent, half-written or hostile
    text counts as absent; every field is checked)."""
    files: dict[str, dict] = {}
    for name in ("started", "finished"):
        text = texts.get(name) if isinstance(texts, dict) else None
        try:
            value = json.loads(text) if isinstance(text, str) and text.strip() else None
        except ValueError:
            value = None
        if isinstance(value, dict):
            files[name] = value
    started, finished = files.get("started", {}), files.get("finished", {})
    code, node, job_id = finished.get("exit_code"), started.get("node"), started.get("job_id")
    return TaskRecord(task, "started" in files,
                      code if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255 else None,
                      node if isinstance(node, str) and node.isprintable() and len(node) < 200 else "",
                      _epoch(started.get("started")), _epoch(finished.get("finished")),
                      job_id if isinstance(job_id, str) and JOB_ID_RE.match(job_id) else "")


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
                                                 request.env, request.cwd), resume=True)
