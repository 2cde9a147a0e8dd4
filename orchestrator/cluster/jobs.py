"""`dfo jobs status|cancel CLUSTER:ARRAY[_TASK]`: a cluster host's jobs are Slurm array jobs.

Status asks squeue and scontrol; once Slurm's controller has forgotten the array (it ended longer ago than
MinJobAge), sacct answers: accounting where the cluster keeps it, else the job completion log, which knows
each task by its own job id only — those come from the tasks' started.json records under the host's
``<workdir>/slurm-jobs`` (cluster/plan.py jobs_root; read only when it is this user's and private). Cancel
is ``scancel`` of the array or of one task, then a short wait until Slurm shows the cancelled tasks ended.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from dataclasses import dataclass
from typing import Any

from orchestrator.cluster.operation import LoginSession, accounted, call, cancel, login_session, task_states
from orchestrator.cluster.plan import jobs_root
from orchestrator.cluster.replies import JOB_ID_RE, TaskState
from orchestrator.core.errors import HostError, InputError, OperationError

REF_RE = re.compile(r"^([0-9]{1,12})(?:_([0-9]{1,4}))?\Z")


@dataclass(frozen=True)
class ArrayRef:
    host: str
    array_job_id: str
    task: int | None = None  # one task of the array, or all of them

    def __str__(self) -> str:
        return f"{self.host}:{self.array_job_id}" + ("" if self.task is None else f"_{self.task}")


def parse_array_ref(host: str, job: str) -> ArrayRef:
    """``ARRAY`` or ``ARRAY_TASK`` (squeue's notation) on cluster HOST (pure)."""
    match = REF_RE.match(job)
    if not match:
        raise InputError(f"{host} is a Slurm cluster: expected its array job id (digits, e.g. 1234) or one task "
                         f"of it (1234_0), got {job!r}",
                         hint="the eval prints the array's job id; run.json keeps it under jobs.HOST.slurm")
    return ArrayRef(host, match.group(1), None if match.group(2) is None else int(match.group(2)))


def array_status(login: LoginSession, root: str, ref: ArrayRef) -> tuple[dict[int, TaskState], str]:
    """Each task Slurm knows of the array, and where the answer came from (``queue``: squeue and scontrol;
    once the controller forgot the array, sacct's ``accounting`` database or job ``completion`` log), restricted
    to REF's task when it names one (ROOT: the host's jobs root, cluster/plan.py jobs_root). An array no source
    knows is an InputError."""
    states, source = task_states(login, ref.array_job_id), "queue"
    if not states:
        job_ids = recorded_job_ids(login, root, ref.array_job_id)
        states, source = accounted(login, ref.array_job_id, job_ids)
    states = {t: s for t, s in sorted(states.items()) if ref.task is None or t == ref.task}
    if not states:
        raise InputError(f"{ref}: Slurm knows no such job (not in the queue, not in sacct)",
                         hint=f"squeue -u $USER on {ref.host} lists your jobs; a finished array's results stay in "
                         f"its folder under {root}")
    return states, source


def recorded_job_ids(login: LoginSession, root: str, array_job_id: str) -> dict[str, int]:
    """Job id -> task, from the started.json records under ROOT (the jobs root) that name the array (each
    checked: a folder inside ROOT, a task index, a digits job id of that array)."""
    found = call(login, "find_array", jobs_root=root, array_job_id=array_job_id)
    if not isinstance(found, list):
        raise HostError(login.name, "cluster.find_array: the answer is not a list")
    ids: dict[str, int] = {}
    for entry in found[:2000]:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], int) and isinstance(entry[2], str)):
            continue
        folder, task, text = entry
        if posixpath.dirname(posixpath.normpath(folder)) != root or not 0 <= task < 10000:
            continue
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if (isinstance(record, dict) and record.get("array_job_id") == array_job_id
                and record.get("task") == task and isinstance(record.get("job_id"), str)
                and JOB_ID_RE.match(record["job_id"])):
            ids[record["job_id"]] = task
    return ids


def cancel_array(login: LoginSession, root: str, ref: ArrayRef, *,
                 wait_s: float = 30.0) -> tuple[dict[int, TaskState], dict[int, TaskState]]:
    """``scancel`` REF (the array, or one task) unless nothing of it is active; (before, after): after is what
    Slurm shows of the tasks that were active once they ended (or WAIT_S passed)."""
    before, _ = array_status(login, root, ref)
    if not any(s.active for s in before.values()):
        return before, before
    cancel(login, ref.array_job_id, ref.task)
    deadline = time.monotonic() + wait_s
    targeted = {t: s for t, s in before.items() if s.active}
    while True:
        after = {t: s for t, s in sorted(task_states(login, ref.array_job_id).items()) if t in targeted}
        for task in targeted.keys() - after.keys():
            # A pending task that is cancelled leaves the array's remainder without a record of its own.
            after[task] = TaskState(task, targeted[task].job_id, ref.array_job_id, "CANCELLED",
                                    reason="removed from the array before it started")
        if not any(s.active for s in after.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    after = dict(sorted(after.items()))
    if any(s.active for s in after.values()):
        raise OperationError(f"{ref}: scancel was sent but task(s) "
                             f"{', '.join(str(t) for t, s in sorted(after.items()) if s.active)} still show as active "
                             f"after {wait_s:.0f} s", hint=f"check with squeue -j {ref.array_job_id} on {ref.host}")
    return before, after


def cluster_login(connector: Any, ref: ArrayRef) -> tuple[LoginSession, str]:
    """REF's login node and its jobs root (under the host's workdir)."""
    return login_session(connector, ref.host), jobs_root(connector.inventory.hosts[ref.host].workdir)


def task_line(state: TaskState) -> str:
    """One task as `dfo jobs status` prints it (pure)."""
    where = f" on {state.node}" if state.node else ""
    why = f" ({state.reason})" if state.reason and state.state == "PENDING" else ""
    ended = not state.active and state.exit_code is not None
    code = f", exit {state.exit_code}" if ended and (state.exit_code or state.state == "COMPLETED") else ""
    signal = f", signal {state.signal}" if ended and state.signal else ""
    killed = " — killed by the scheduler" if state.killed_by_scheduler else ""
    return f"task {state.task} (job {state.job_id}): {state.state}{why}{where}{code}{signal}{killed}"


def as_json(ref: ArrayRef, states: dict[int, TaskState], source: str) -> dict:
    return {"ref": str(ref), "array_job_id": ref.array_job_id, "source": source,
            "tasks": {str(t): {"job_id": s.job_id, "state": s.state, "reason": s.reason, "node": s.node,
                               "exit_code": s.exit_code, "signal": s.signal,
                               "killed_by_scheduler": s.killed_by_scheduler}
                      for t, s in sorted(states.items())}}
