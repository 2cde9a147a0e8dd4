"""The jobs host script's answers, typed: parsed once at the boundary, checked as they are parsed.

A host's answer is data: a compromised host may answer any JSON. Every field the controller reads is
checked for its type (a job id is one plain name, times are the script's ISO form, counts are
non-negative integers), so a malformed answer is a HostError naming the host and the field, never an
AttributeError or a ValueError in a command that prints it later.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.core.confine import check_component
from orchestrator.core.errors import HostError
from orchestrator.core.host_text import INT64_MAX, PID_MAX, whole_number

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "lost", "refused"})
STATES = FINAL_STATES | {"starting", "running"}
_HINT = "dfo's jobs script never answers this; treat the host as compromised (or its Python as broken)"


def malformed(host: str, what: str, value: object) -> HostError:
    return HostError(host, f"malformed jobs reply from the host: {what} is {value!r:.80}", hint=_HINT)


def _object(host: str, what: str, value: object) -> dict:
    if not isinstance(value, dict):
        raise malformed(host, what, value)
    return value


def _str(host: str, what: str, value: object, *, optional: bool = True) -> str | None:
    if (value is None and optional) or isinstance(value, str):
        return value
    raise malformed(host, what, value)


def _int(host: str, what: str, value: object, *, optional: bool = True, minimum: int = 0,
         maximum: int = INT64_MAX) -> int | None:
    if value is None and optional:
        return None
    if not whole_number(value, minimum, maximum):
        raise malformed(host, what, value)
    assert isinstance(value, int)
    return value


def _number(host: str, what: str, value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise malformed(host, what, value)
    return float(value)


def _strings(host: str, what: str, value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise malformed(host, what, value)
    return value


def _time(host: str, what: str, value: object) -> str | None:
    """An ISO time as the host script writes it (``2026-01-02T03:04:05Z``): the CLI computes durations from it."""
    text = _str(host, what, value)
    if text is None:
        return None
    try:
        _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        raise malformed(host, what, value) from None
    return text


@dataclass
class JobStatus:
    host: str
    job_id: str
    state: str
    name: str | None = None
    job_dir: str = ""
    argv: list[str] = field(default_factory=list)
    cwd: str | None = None
    lock: str | None = None
    created: str | None = None
    started: str | None = None
    finished: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    heartbeat_age_s: float | None = None
    log_size: int = 0
    results: int = 0
    log_tail: list[str] = field(default_factory=list)
    env_keys: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.host}:{self.job_id}"

    @property
    def done(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    def as_dict(self) -> dict:
        return asdict(self) | {"ref": self.ref}

    @classmethod
    def from_host(cls, host: str, info: object) -> "JobStatus":
        """The host's ``job_state`` answer, every field checked (unknown extra keys are ignored)."""
        info = _object(host, "a job's status", info)
        state = info.get("state")
        if state not in STATES:
            raise malformed(host, "the job state", state)
        return cls(
            host=host,
            job_id=check_component(info.get("job_id"), host=host, what="job id"),
            state=state,
            name=_str(host, "the job name", info.get("name")),
            job_dir=_str(host, "the job directory", info.get("job_dir"), optional=False) or "",
            argv=_strings(host, "the job command", info.get("argv")),
            cwd=_str(host, "the job cwd", info.get("cwd")),
            lock=_str(host, "the job lock", info.get("lock")),
            created=_time(host, "the creation time", info.get("created")),
            started=_time(host, "the start time", info.get("started")),
            finished=_time(host, "the finish time", info.get("finished")),
            pid=_int(host, "the pid", info.get("pid"), minimum=1, maximum=PID_MAX),
            exit_code=_int(host, "the exit code", info.get("exit_code"), minimum=-255, maximum=255),
            signal=_str(host, "the signal", info.get("signal")),
            heartbeat_age_s=_number(host, "the heartbeat age", info.get("heartbeat_age_s")),
            log_size=_int(host, "the log size", info.get("log_size", 0), optional=False, minimum=0) or 0,
            results=_int(host, "the results count", info.get("results", 0), optional=False, minimum=0) or 0,
            log_tail=_strings(host, "the log tail", info.get("log_tail")),
            env_keys=_strings(host, "the environment keys", info.get("env_keys")),
        )


@dataclass(frozen=True)
class Launched:
    ok: bool
    job: JobStatus | None
    refused: dict                 # the lock holder when not ok: {"job_id", "state", …}
    notices: list[str]

    @classmethod
    def from_host(cls, host: str, reply: object) -> "Launched":
        reply = _object(host, "the launch reply", reply)
        ok = reply.get("ok")
        if not isinstance(ok, bool):
            raise malformed(host, "the launch outcome", ok)
        notices = _strings(host, "the launch notices", reply.get("notices"))
        if not ok:
            return cls(False, None, lock_holder(host, reply.get("refused")) or {}, notices)
        return cls(True, JobStatus.from_host(host, reply.get("job")), {}, notices)


def lock_holder(host: str, value: object) -> dict | None:
    """The job holding a lock, as the host names it: its id and state are printed and put into hints."""
    if value is None:
        return None
    holder = _object(host, "the lock holder", value)
    return dict(holder, job_id=_str(host, "the lock holder's job id", holder.get("job_id")),
                state=_str(host, "the lock holder's state", holder.get("state")))


def lock_state(host: str, reply: object) -> dict:
    """``lock_status``'s answer: {"holder": dict | None, "state": str | None}."""
    reply = _object(host, "the lock status", reply)
    return {"holder": lock_holder(host, reply.get("holder")), "state": _str(host, "the lock state", reply.get("state"))}


def job_list(host: str, reply: object) -> list[JobStatus]:
    jobs = _object(host, "the job list", reply).get("jobs")
    if not isinstance(jobs, list):
        raise malformed(host, "the job list", jobs)
    return [JobStatus.from_host(host, info) for info in jobs]


def polled(host: str, reply: object, offset: int) -> tuple[JobStatus, bytes, int]:
    """(status, log bytes, next offset); the next offset is where the bytes end, never before OFFSET."""
    reply = _object(host, "the poll reply", reply)
    chunk = reply.get("chunk")
    try:
        data = base64.b64decode(chunk, validate=True) if isinstance(chunk, str) else None
    except (binascii.Error, ValueError):
        data = None
    if data is None:
        raise malformed(host, "the log chunk", chunk)
    if reply.get("offset") != offset + len(data):
        raise malformed(host, f"the log offset (expected {offset + len(data)})", reply.get("offset"))
    return JobStatus.from_host(host, reply), data, offset + len(data)


def cancelled(host: str, reply: object) -> tuple[JobStatus, bool]:
    """(status after the cancel, whether processes of the job's group survived SIGKILL)."""
    reply = _object(host, "the cancel reply", reply)
    alive = reply.get("group_alive", False)
    if not isinstance(alive, bool):
        raise malformed(host, "group_alive", alive)
    return JobStatus.from_host(host, reply.get("job")), alive


@dataclass(frozen=True)
class CancelPreview:
    """``cancel_preview``'s answer: the job, and the process group a cancel would signal (none when the job is
    not running; ``processes`` None when the host cannot list them)."""
    job: JobStatus
    pgid: int | None
    processes: list[tuple[int, list[str]]] | None

    @classmethod
    def from_host(cls, host: str, reply: object) -> "CancelPreview":
        reply = _object(host, "the cancel preview", reply)
        members = reply.get("processes")
        processes: list[tuple[int, list[str]]] | None = None
        if members is not None:
            if not isinstance(members, list):
                raise malformed(host, "the job's processes", members)
            processes = []
            for member in members:
                member = _object(host, "a process of the job", member)
                pid = _int(host, "a process id", member.get("pid"), optional=False, minimum=1, maximum=PID_MAX)
                processes.append((pid or 0, _strings(host, "a process command", member.get("command"))))
        return cls(JobStatus.from_host(host, reply.get("job")),
                   _int(host, "the process group", reply.get("pgid"), minimum=1, maximum=PID_MAX), processes)

def results_listing(host: str, reply: object) -> tuple[JobStatus, Any]:
    """(status, the raw manifest: ``operation.checked_manifest`` checks its names, sizes and digests)."""
    reply = _object(host, "the results reply", reply)
    return JobStatus.from_host(host, reply.get("job")), reply.get("files")
