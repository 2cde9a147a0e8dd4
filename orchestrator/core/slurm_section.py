"""The ``slurm:`` section of an inventory host: the host is a cluster's login node, and dfo's work runs as
Slurm jobs on its compute nodes.

Every value here ends up in a batch script's ``#SBATCH`` lines or on ``sbatch``'s command line, so each is
checked against the shape Slurm itself accepts (names, durations, memory sizes, counts) and none may carry a
space, a quote, a newline or a shell character. ``shared`` is the folder on the cluster's shared filesystem
(seen by the login node and every compute node) where dfo keeps the releases, the venv, the features cache
and one folder per job: the host's ``workdir`` must lie inside it, so ``dfo deploy`` and ``dfo provision``,
run once on the login node, serve every compute node.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# A partition, account or QOS name: what Slurm's own tools print (letters, digits, '_', '-', '.').
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\Z")
# --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch(1)).
TIME_RE = re.compile(r"^(?:\d{1,6}|\d{1,4}:\d{2}|\d{1,4}:\d{2}:\d{2}|\d{1,3}-\d{1,2}(?::\d{2}){0,2})\Z")
# --mem: a number with an optional K/M/G/T suffix.
MEM_RE = re.compile(r"^[1-9][0-9]{0,8}[KMGT]?\Z")
# --gres: name[:type]:count, comma separated (e.g. gpu:1, gpu:a100:2).
GRES_RE = re.compile(r"^[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)?(?::[0-9]{1,3})?(?:,[A-Za-z0-9_]+(?::[A-Za-z0-9_.-]+)?"
                     r"(?::[0-9]{1,3})?)*\Z")
# One extra `#SBATCH` line: --option or --option=value, the value of safe characters only.
EXTRA_RE = re.compile(r"^--[a-z][a-z0-9-]{0,40}(?:=[A-Za-z0-9_.,:@%+/=-]{1,200})?\Z")
# The shared folder: it is written into `#SBATCH --output=` and `--chdir=` lines, where a space would start
# another option and sbatch expands '%'.
SHARED_RE = re.compile(r"^/[A-Za-z0-9_.,+@=/-]{0,400}\Z")
# Options dfo sets itself: an extra line may not override where the job writes or what it runs.
RESERVED_OPTIONS = frozenset({"--array", "--output", "--error", "--chdir", "--wrap", "--job-name", "--parsable",
                              "--export", "--input", "--open-mode", "--wait"})


def _pattern(regex: re.Pattern, code: str, expected: str) -> Any:
    def check(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not regex.match(value):
            raise PydanticCustomError(code, expected)
        return value
    return BeforeValidator(check)


def _extra(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    for line in value:
        if not isinstance(line, str) or not EXTRA_RE.match(line):
            raise PydanticCustomError("sbatch_line", f"extra_sbatch line {str(line)[:60]!r}: expected --option or "
                                      "--option=value (letters, digits and _.,:@%+/=- only)")
        reserved = reserved_option(line.split("=", 1)[0])
        if reserved:
            raise PydanticCustomError("sbatch_line", f"extra_sbatch line {line[:60]!r}: dfo sets {reserved} itself"
                                      + ("" if reserved == line.split("=", 1)[0] else
                                         " (sbatch takes an unambiguous abbreviation for the whole option)"))
    return value


def reserved_option(option: str) -> str | None:
    """The reserved option OPTION names, whole or abbreviated (sbatch, like getopt_long, takes any unambiguous
    prefix: ``--outp`` is ``--output``, ``--chd`` ``--chdir``); None for another option (pure)."""
    return next((r for r in sorted(RESERVED_OPTIONS) if len(option) > 2 and r.startswith(option)), None)


def _shared(value: Any) -> Any:
    if not isinstance(value, str) or not value.startswith("/"):
        raise PydanticCustomError("abs_path", "expected an absolute path on the cluster's shared filesystem")
    if not SHARED_RE.match(value):
        raise PydanticCustomError("abs_path", "the shared path may hold letters, digits and _.,+@=/- only (it is "
                                  "written into #SBATCH lines, which sbatch splits at spaces; '%' it expands)")
    return posixpath.normpath(value)


SlurmName = Annotated[str, _pattern(SLURM_NAME_RE, "slurm_name", "expected a Slurm name (letters, digits, '_', "
                                    "'.', '-'; not starting with '-')")]
TimeLimit = Annotated[str, _pattern(TIME_RE, "slurm_time", "expected a time limit: minutes, MM:SS, HH:MM:SS, D-HH, "
                                    "D-HH:MM or D-HH:MM:SS")]
Memory = Annotated[str, _pattern(MEM_RE, "slurm_mem", "expected a memory size such as 16G, 4000M or 64000")]
Gres = Annotated[str, _pattern(GRES_RE, "slurm_gres", "expected a generic resource such as gpu:1 or gpu:a100:2")]


class SlurmSection(BaseModel):
    """How dfo submits to the cluster behind this login node."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    shared: Annotated[str, BeforeValidator(_shared)] = Field(
        description="folder on the shared filesystem (login and compute nodes); the host's workdir lies inside it")
    partition: SlurmName | None = Field(None, description="--partition (default: the cluster's default)")
    account: SlurmName | None = None
    qos: SlurmName | None = None
    time_limit: TimeLimit = Field("1:00:00", description="--time of each task")
    resident_time_limit: TimeLimit | None = Field(
        None, description="--time of the resident worker job (`dfo watch --resident-job`); default: time_limit")
    gres: Gres | None = Field(None, description="--gres per task, e.g. gpu:1")
    gpus_per_task: int | None = Field(None, ge=1, le=64, description="--gpus-per-task (instead of gres)")
    cpus_per_task: int = Field(1, ge=1, le=1024)
    mem: Memory | None = Field(None, description="--mem per task, e.g. 64G")
    extra_sbatch: Annotated[list[str], BeforeValidator(_extra)] = Field(
        default_factory=list, description="more #SBATCH lines, e.g. --constraint=h100")
    max_parallel: int | None = Field(None, ge=1, le=10000, description="array throttle: tasks at once")

    @model_validator(mode="after")
    def _one_gpu_form(self) -> "SlurmSection":
        if self.gres and self.gpus_per_task:
            raise PydanticCustomError("slurm_gpus", "give either 'gres' or 'gpus_per_task', not both")
        return self


def workdir_inside_shared(workdir: str, shared: str) -> bool:
    """Whether WORKDIR (normalised, absolute) is SHARED or below it."""
    return workdir == shared or workdir.startswith(shared.rstrip("/") + "/")


def resident_section(section: SlurmSection) -> SlurmSection:
    """The section the resident worker job is submitted with: its own time limit where one is given (pure)."""
    if section.resident_time_limit is None:
        return section
    return section.model_copy(update={"time_limit": section.resident_time_limit})
