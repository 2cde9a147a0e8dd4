"""Slurm's answers (sbatch, squeue, scontrol) typed on arrival.

The login node may be compromised, so its text is data: a job id is digits of bounded length, a state is one
of Slurm's job states, a node name and a reason are short strings of safe characters, an exit code is a
bounded integer. Anything else is a HostError naming the cluster and the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.core.errors import HostError

JOB_ID_RE = re.compile(r"^[0-9]{1,12}\Z")
NODE_RE = re.compile(r"^[A-Za-z0-9_.\[\],-]{1,200}\Z")
REASON_RE = re.compile(r"^[A-Za-z0-9_.,:()/ -]{0,200}\Z")
# Slurm's job states (squeue(1) "JOB STATE CODES"); a running array task may show any of them.
STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "CONFIGURING", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PENDING", "PREEMPTED", "RUNNING", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD",
    "REQUEUED", "RESIZING", "REVOKED", "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "SUSPENDED", "TIMEOUT",
})
ACTIVE = frozenset({"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING", "SIGNALING",
                    "STAGE_OUT", "SUSPENDED", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
# Killed by the scheduler rather than failed by the program.
SCHEDULER_KILLED = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY"})


@dataclass(frozen=True)
class TaskState:
    """One array task as Slurm sees it."""

    task: int
    job_id: str           # the task's own job id (Slurm gives each array task one)
    array_job_id: str
    state: str
    reason: str = ""
    node: str = ""
    exit_code: int | None = None
    signal: int | None = None

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def killed_by_scheduler(self) -> bool:
        return self.state in SCHEDULER_KILLED


def parse_job_id(cluster: str, text: str) -> str:
    """`sbatch --parsable` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    first = text.strip().split(";", 1)[0]
    if not JOB_ID_RE.match(first):
        raise HostError(cluster, f"sbatch answered {text.strip()[:80]!r}, not a job id",
                        hint="check that sbatch works on the login node (`dfo inventory check --connect`)")
    return first


def _field(cluster: str, name: str, value: str, regex: re.Pattern) -> str:
    if not regex.match(value):
        raise HostError(cluster, f"Slurm reported a malformed {name}: {value[:80]!r}")
    return value


def _state(cluster: str, value: str) -> str:
    state = value.split()[0] if value.strip() else ""
    state = state.rstrip("+")  # "CANCELLED+" / "CANCELLED by 0"
    if state not in STATES:
        raise HostError(cluster, f"Slurm reported an unknown job state {value[:40]!r}")
    return state


def _task_index(cluster: str, value: str) -> int:
    if not re.match(r"^[0-9]{1,4}\Z", value):
        raise HostError(cluster, f"Slurm reported a malformed array task id {value[:40]!r}")
    return int(value)


MAX_LINES = 10000  # read of one answer; the rest is ignored (the login node's text is data)


def _lines(text: str) -> Iterator[str]:
    """The answer's non-blank lines, at most MAX_LINES of them."""
    return (line for line in text.splitlines()[:MAX_LINES] if line.strip())


def _records(cluster: str, command: str, text: str, fields: int) -> Iterator[list[str]]:
    """``|``-separated lines (``-o`` / ``-P`` output), each with exactly ``fields`` fields."""
    for line in _lines(text):
        parts = line.split("|")
        if len(parts) != fields:
            raise HostError(cluster, f"{command} line with {len(parts)} fields, expected {fields}: {line[:80]!r}")
        yield parts


SQUEUE_FORMAT = "%i|%A|%K|%F|%T|%r|%N"


def parse_squeue(cluster: str, array_job_id: str, text: str) -> dict[int, TaskState]:
    """``squeue -h -r -j ID -o SQUEUE_FORMAT``: one line per array task still known to the queue."""
    tasks: dict[int, TaskState] = {}
    for _, job_id, task, array_id, state, reason, node in _records(cluster, "squeue", text, 7):
        if array_id != array_job_id or task in ("N/A", ""):
            continue  # not one of ours, or the array's pending remainder ("0-3"): listed per task with -r
        index = _task_index(cluster, task)
        tasks[index] = TaskState(task=index, job_id=_field(cluster, "job id", job_id, JOB_ID_RE),
                                 array_job_id=array_job_id, state=_state(cluster, state),
                                 reason=_field(cluster, "reason", "" if reason == "None" else reason, REASON_RE),
                                 node=_field(cluster, "node", node, NODE_RE) if node else "")
    return tasks


def parse_scontrol(cluster: str, array_job_id: str, text: str) -> dict[int, TaskState]:
    """``scontrol show job ID --oneliner``: ``Key=Value`` words, one line per array task."""
    tasks: dict[int, TaskState] = {}
    for line in _lines(text):
        if not line.startswith("JobId="):
            continue
        words = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if words.get("ArrayJobId") != array_job_id or "ArrayTaskId" not in words:
            continue
        exit_code, signal = _exit(cluster, words.get("ExitCode", "0:0"))
        node = words.get("NodeList", "")
        # A task that never started is listed in the array's remainder record ("ArrayTaskId=2-3%1").
        for index in _task_range(cluster, words["ArrayTaskId"]):
            tasks[index] = TaskState(
                task=index, job_id=_field(cluster, "job id", words.get("JobId", ""), JOB_ID_RE),
                array_job_id=array_job_id, state=_state(cluster, words.get("JobState", "")),
                reason=_field(cluster, "reason", "" if words.get("Reason") == "None" else words.get("Reason", ""),
                              REASON_RE),
                node="" if node in ("(null)", "") else _field(cluster, "node", node, NODE_RE),
                exit_code=exit_code, signal=signal)
    return tasks


def _task_range(cluster: str, value: str) -> list[int]:
    """``3``, ``0-3`` or ``0-1,5%2`` as task indices (bounded: at most 1000 tasks of 0-9999)."""
    spec = value.split("%", 1)[0]
    indices: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        first = _task_index(cluster, low)
        last = _task_index(cluster, high) if high else first
        if last < first or last - first + len(indices) >= 1000:
            raise HostError(cluster, f"Slurm reported a malformed array task range {value[:40]!r}")
        indices.extend(range(first, last + 1))
    return indices


def _exit(cluster: str, value: str) -> tuple[int, int]:
    match = re.match(r"^([0-9]{1,3}):([0-9]{1,3})\Z", value)
    if not match or int(match.group(1)) > 255 or int(match.group(2)) > 255:
        raise HostError(cluster, f"Slurm reported a malformed exit code {value[:40]!r}")
    return int(match.group(1)), int(match.group(2))


@dataclass(frozen=True)
class CommandReply:
    """A Slurm command's answer as host_script.py hands it back: exit code, stdout, stderr tail."""

    exit_code: int
    out: str
    err: str


def command_reply(cluster: str, what: str, value: object) -> CommandReply:
    """``[exit code, stdout, stderr]`` from the login node, checked for shape and size."""
    if (not isinstance(value, list) or len(value) != 3 or not isinstance(value[0], int)
            or isinstance(value[0], bool) or not -255 <= value[0] <= 255
            or not all(isinstance(v, str) and len(v) <= (1 << 20) for v in value[1:])):
        raise HostError(cluster, f"{what}: the login node's answer is not [exit code, stdout, stderr]")
    return CommandReply(value[0], value[1], value[2])


def parse_sacct(cluster: str, array_job_id: str, text: str, job_tasks: dict[str, int]) -> dict[int, TaskState]:
    """``sacct -X -n -P -o JobID,JobIDRaw,State,ExitCode,NodeList``. Accounting names a task ``ARRAY_TASK``;
    the job completion log (``sacct -c``) names it by its own job id only, mapped through JOB_TASKS (job id ->
    task, as the tasks recorded them). A pending remainder (``ARRAY_[2-3]``) and other jobs are skipped."""
    tasks: dict[int, TaskState] = {}
    for job, raw, state, exit_code, node in _records(cluster, "sacct", text, 5):
        match = re.match(r"^([0-9]{1,12})_([0-9]{1,4})\Z", job)
        if match and match.group(1) == array_job_id:
            index = int(match.group(2))
        elif not match and raw in job_tasks:
            index = job_tasks[raw]
        else:
            continue
        code, signal = _exit(cluster, exit_code)
        tasks[index] = TaskState(task=index, job_id=_field(cluster, "job id", raw, JOB_ID_RE),
                                 array_job_id=array_job_id, state=_state(cluster, state),
                                 node="" if node in ("", "None assigned", "(null)") else
                                 _field(cluster, "node", node, NODE_RE),
                                 exit_code=code, signal=signal)
    return tasks
