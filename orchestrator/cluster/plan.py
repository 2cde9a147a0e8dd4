"""The batch script of a cluster job: its validated values (what the login node renders and `sbatch` receives;
`--dry-run` prints the same rendering).

One job is one `sbatch --array=0-(N-1)` submission; array task i runs the task command on shard i and writes
only under ``<job dir>/tasks/<i>/``. The script writes the task's own record there first (``started.json``:
job id, task id, node, start time) and, when the command returns, ``finished.json`` with its exit status —
each through a temporary name and a rename, so a task killed by the scheduler leaves no finished record and
its results are never taken for complete. Every value reaching the script is validated here and
``shlex.quote``d by the rendering (``host_script.batch_script_text``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from orchestrator.core.errors import InputError
from orchestrator.core.slurm_section import SHARED_RE, SlurmSection

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


JOBS_FOLDER = "slurm-jobs"  # under the host's workdir (on the shared filesystem, inside slurm.shared)


def jobs_root(workdir: str) -> str:
    """Where a cluster host's job folders live: ``<workdir>/slurm-jobs``, made 0700 by the login node and checked
    (this user's, private; the workdir not writable by others) before every use (host_script.submit)."""
    return posixpath.join(workdir, JOBS_FOLDER)


def job_folder(workdir: str, label: str) -> tuple[str, str]:
    """(Slurm job name, job folder) for LABEL (a run's or a worker's name): the name cut to fit squeue, the
    folder's name cut too but ending in a digest of the whole label, so two labels that share their first 64
    characters (two runs started in the same second on a long host name) never share a folder (pure)."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", label)
    digest = hashlib.sha256(label.encode()).hexdigest()[:10]
    return clean[:64], posixpath.join(jobs_root(workdir), f"{clean[:53]}-{digest}")


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


def batch_spec(section: SlurmSection, request: BatchRequest) -> dict:
    """The validated values of REQUEST's batch script on the cluster described by SECTION: the keyword
    arguments of ``host_script.batch_script_text``, which renders the script on the login node (pure)."""
    if not JOB_NAME_RE.match(request.name):
        raise InputError(f"cluster job name {request.name!r}: expected letters, digits, '_', '.', '-'")
    if not request.job_dir.startswith(section.shared.rstrip("/") + "/") or not SHARED_RE.match(request.job_dir) \
            or posixpath.normpath(request.job_dir) != request.job_dir:
        raise InputError(f"cluster job folder {request.job_dir!r} must be a normalised path inside "
                         f"slurm.shared ({section.shared}) of letters, digits and _.,+@=/- only")
    if not request.command:
        raise InputError("a cluster job needs a command")
    for key, value in request.env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\Z", key) or "\n" in value or "\x00" in value:
            raise InputError(f"cluster job environment {key!r}: expected a shell identifier and a one-line value")
    if request.cwd is not None and ("\n" in request.cwd or not request.cwd.startswith("/")):
        raise InputError(f"cluster job directory {request.cwd!r}: expected an absolute one-line path")
    return {"name": request.name, "array": array_spec(request.tasks, section.max_parallel),
            "job_dir": request.job_dir, "options": sbatch_options(section), "command": list(request.command),
            "env": dict(request.env), "cwd": request.cwd}


def render(spec: dict) -> str:
    """The batch script SPEC describes, rendered here by the login node's own function (for --dry-run)."""
    return _host_script().batch_script_text(**spec)


def batch_script(section: SlurmSection, request: BatchRequest) -> str:
    """The whole batch script for REQUEST on the cluster described by SECTION, as sbatch will receive it."""
    return render(batch_spec(section, request))


@functools.cache
def _host_script() -> ModuleType:
    """cluster/host_script.py as a module (stdlib only; its rendering needs nothing from the host prelude)."""
    path = Path(__file__).with_name("host_script.py")
    spec = importlib.util.spec_from_file_location("dfo_cluster_host_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
