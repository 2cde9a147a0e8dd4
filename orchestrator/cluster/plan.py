"""The batch script of a cluster job, as pure text (what `--dry-run` prints and what `sbatch` receives).

One job is one `sbatch --array=0-(N-1)` submission; array task i runs the task command on shard i and writes
only under ``<job dir>/tasks/<i>/``. The script writes the task's own record there first (``started.json``:
job id, task id, node, start time) and, when the command returns, ``finished.json`` with its exit status —
each through a temporary name and a rename, so a task killed by the scheduler leaves no finished record and
its results are never taken for complete. Every value reaching the script is validated or ``shlex.quote``d.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field

from orchestrator.core.errors import InputError
from orchestrator.core.slurm_section import SlurmSection

JOB_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
MAX_TASKS = 1000


@dataclass(frozen=True)
class BatchRequest:
    """One array job: NAME in squeue, JOB_DIR its folder on the shared filesystem, COMMAND the argv each task
    runs (the placeholder ``{task}`` in an argument becomes the task's index, ``{task_dir}`` its folder)."""

    name: str
    job_dir: str
    tasks: tuple[int, ...]
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None  # where the command runs (default: the task's folder)


def task_dir(job_dir: str, task: int) -> str:
    return posixpath.join(job_dir, "tasks", str(task))


def array_spec(tasks: tuple[int, ...], max_parallel: int | None = None) -> str:
    """``--array`` value: ranges of consecutive indices (``0-3,7``), throttled with ``%K`` when asked."""
    if not tasks:
        raise InputError("a cluster job needs at least one task")
    ordered = sorted(set(tasks))
    if ordered[0] < 0 or ordered[-1] >= MAX_TASKS:
        raise InputError(f"array task indices must be 0-{MAX_TASKS - 1}, got {ordered[0]}..{ordered[-1]}")
    parts: list[str] = []
    start = prev = ordered[0]
    following: list[int | None] = [*ordered[1:], None]
    for index in following:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    spec = ",".join(parts)
    return f"{spec}%{max_parallel}" if max_parallel else spec


def sbatch_options(section: SlurmSection) -> list[str]:
    """The ``#SBATCH`` options the inventory's slurm section asks for (already validated there)."""
    options = [f"--time={section.time_limit}", f"--cpus-per-task={section.cpus_per_task}", "--ntasks=1"]
    for flag, value in (("--partition", section.partition), ("--account", section.account),
                        ("--qos", section.qos), ("--gres", section.gres), ("--mem", section.mem)):
        if value:
            options.append(f"{flag}={value}")
    if section.gpus_per_task:
        options.append(f"--gpus-per-task={section.gpus_per_task}")
    return options + list(section.extra_sbatch)


def batch_script(section: SlurmSection, request: BatchRequest) -> str:
    """The whole batch script for REQUEST on the cluster described by SECTION."""
    if not JOB_NAME_RE.match(request.name):
        raise InputError(f"cluster job name {request.name!r}: expected letters, digits, '_', '.', '-'")
    if not request.job_dir.startswith(section.shared.rstrip("/") + "/") or "%" in request.job_dir \
            or "\n" in request.job_dir or posixpath.normpath(request.job_dir) != request.job_dir:
        raise InputError(f"cluster job folder {request.job_dir!r} must be a normalised path inside "
                         f"slurm.shared ({section.shared}) without '%'")
    if not request.command:
        raise InputError("a cluster job needs a command")
    for key, value in request.env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", key) or "\n" in value or "\x00" in value:
            raise InputError(f"cluster job environment {key!r}: expected a shell identifier and a one-line value")
    lines = ["#!/bin/bash", f"#SBATCH --job-name={request.name}",
             f"#SBATCH --array={array_spec(request.tasks, section.max_parallel)}",
             f"#SBATCH --output={request.job_dir}/tasks/%a/slurm.log",
             f"#SBATCH --chdir={request.job_dir}"]
    lines += [f"#SBATCH {option}" for option in sbatch_options(section)]
    command = " ".join(_with_placeholders(arg) for arg in request.command)
    lines += [
        "set -u",
        f"job_dir={shlex.quote(request.job_dir)}",
        'task="${SLURM_ARRAY_TASK_ID:?not an array task}"',
        'task_dir="$job_dir/tasks/$task"',
        'mkdir -p "$task_dir" && rm -f "$task_dir/finished.json"',
        *[f"export {key}={shlex.quote(value)}" for key, value in sorted(request.env.items())],
        # The task's own record: which job, which node, when (the controller cross-checks it with Slurm's).
        'printf \'{"job_id": "%s", "array_job_id": "%s", "task": %d, "node": "%s", "started": %s}\\n\' '
        '"${SLURM_JOB_ID}" "${SLURM_ARRAY_JOB_ID}" "$task" "${SLURMD_NODENAME:-unknown}" "$(date +%s.%N)" '
        '> "$task_dir/.started.json.tmp" && mv "$task_dir/.started.json.tmp" "$task_dir/started.json"',
        f"cd {shlex.quote(request.cwd)} || exit 1" if request.cwd else 'cd "$task_dir" || exit 1',
        command,
        "status=$?",
        'printf \'{"exit_code": %d, "finished": %s}\\n\' "$status" "$(date +%s.%N)" '
        '> "$task_dir/.finished.json.tmp" && mv "$task_dir/.finished.json.tmp" "$task_dir/finished.json"',
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def _with_placeholders(arg: str) -> str:
    """ARG quoted for bash, with ``{task}`` and ``{task_dir}`` left to expand from the task's variables."""
    pieces = re.split(r"(\{task\}|\{task_dir\})", arg)
    out = []
    for piece in pieces:
        if piece == "{task}":
            out.append('"$task"')
        elif piece == "{task_dir}":
            out.append('"$task_dir"')
        elif piece:
            out.append(shlex.quote(piece))
    return "".join(out) or "''"
