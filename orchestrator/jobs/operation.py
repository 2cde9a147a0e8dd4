"""Detached remote jobs: launch, watch, reattach, cancel, and fetch results verified by sha256.

Public API (every function takes the Connector and an inventory host name, so a dropped connection can
be reopened; the host side lives in jobs/host_script.py, where the job-directory layout is
documented):

    plan_launch(connector, host, argv, *, env=None, cwd=None, job_name=None, force=False, lock="gpu",
                job_id=None) -> LaunchPlan      (pure: checks the inputs, connects to nothing; `jobs run --dry-run`)
    start_job(connector, plan) -> JobHandle
    launch_job(connector, host, argv, …same…) -> JobHandle   (plan_launch, then start_job)
        Start ``argv`` detached (`setsid nohup … >log 2>&1 </dev/null &` around a small supervisor) in
        ``<workdir>/jobs/<job id>/`` and return at once. The command gets ``DFO_RESULTS_DIR`` (its
        ``results/`` folder), ``DFO_JOB_ID``, ``DFO_JOB_DIR``; the argv placeholders ``{results}``,
        ``{job_dir}`` and ``{job_id}`` are replaced. ``lock`` (default "gpu"; None for none) refuses a
        second concurrent job holding the same lock unless ``force``; a stale lock is cleared with a
        notice (``handle.notices``). Raises JobRefused, HostError.
    job_status(connector, host, job_id, *, tail=20) -> JobStatus
    list_jobs(connector, host, *, limit=50) -> list[JobStatus]   (newest first)
    follow_job(connector, host, job_id, *, events=None, from_offset=0, on_line=None, poll_interval=0.5,
               reconnect_timeout=60) -> JobStatus
        Stream the log until the job ends (progress lines rendered by the events' job output), reconnecting when
        the SSH connection drops. Works just as well after the launching controller died (reattach).
    cancel_job(connector, host, job_id, *, grace=5.0) -> JobStatus   (SIGTERM the process group, then SIGKILL)
    plan_cancel(connector, host, job_id, *, grace=5.0) -> CancelPlan  (what cancel would signal; changes nothing)
    pull_results(connector, host, job_id, dest, *, force=False, allow_running=False) -> PullResult
        Copy ``results/`` into ``dest`` through a temporary sibling folder, check every sha256 against the
        host's, then rename: ``dest`` is either complete and verified or absent.
    parse_job_ref(ref, host=None) / locate_job(connector, ref, host=None) -> (host, job id)
        References: ``HOST:ID``, ``ID`` with --host, an id prefix, or ``last``; a bare id is searched for
        on every inventory host.

States: starting, running, succeeded, failed (non-zero exit), cancelled, lost (the supervisor vanished
without recording an exit, e.g. a host reboot), refused.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from orchestrator.core.confine import check_component, check_name, confine
from orchestrator.core.errors import ConnectionLost, HostError, InputError, OperationError
from orchestrator.core.events import Events, OutputSink, QuietEvents
from orchestrator.core.hashing import sha256_file
from orchestrator.core.host_text import decode_json, whole_number
from orchestrator.jobs import replies
from orchestrator.jobs.replies import FINAL_STATES, JobStatus
from orchestrator.transport import Connector, for_each_host, hostcall
from orchestrator.transport.hostlock import host_lock

DEFAULT_LOCK = "gpu"
HOST_SCRIPT = Path(__file__).with_name("host_script.py")


class JobRefused(OperationError):
    """The host's job lock is held by a live job (run with force to ignore it)."""

    def __init__(self, host: str, holder: dict, lock: str):
        self.host, self.holder, self.lock = host, holder, lock
        super().__init__(
            f"{host}: lock {lock!r} is held by running job {host}:{holder.get('job_id')} ({holder.get('state')}); "
            "refusing to start a second job",
            hint=f"wait for it (dfo jobs logs {host}:{holder.get('job_id')} -f), cancel it "
            f"(dfo jobs cancel {host}:{holder.get('job_id')}), or use --force",
        )


@dataclass
class JobHandle:
    host: str
    job_id: str
    job_dir: str
    name: str | None = None
    notices: list[str] = field(default_factory=list)
    status: "JobStatus | None" = None

    @property
    def ref(self) -> str:
        return f"{self.host}:{self.job_id}"

    @property
    def results_dir(self) -> str:
        return posixpath.join(self.job_dir, "results")


@dataclass
class PullResult:
    host: str
    job_id: str
    dest: str
    status: str               # "pulled" | "up-to-date"
    files: int
    bytes: int
    manifest: dict[str, dict]

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------ helpers


def new_job_id(now: float | None = None) -> str:
    """Sortable and short: UTC ``YYYYMMDD-HHMMSS-xxxx``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


def parse_job_ref(ref: str, host: str | None = None) -> tuple[str | None, str]:
    """``HOST:ID`` -> (HOST, ID); ``ID`` -> (host, ID). A host in both places must agree."""
    ref = ref.strip()
    if not ref:
        raise InputError("empty job reference", hint="use HOST:JOB_ID (see dfo jobs list --host HOST)")
    if ":" in ref:
        ref_host, _, job = ref.partition(":")
        if host and host != ref_host:
            raise InputError(f"job reference {ref!r} names host {ref_host!r} but --host says {host!r}")
        if not job:
            raise InputError(f"job reference {ref!r} has no job id after ':'")
        return ref_host, job
    return host, ref


LOCK_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def check_lock_name(lock: str | None) -> None:
    """A lock name becomes a file name on the host (locks/<name>.lock): one plain component."""
    if lock is not None and (not LOCK_NAME_RE.match(lock) or ".." in lock):
        raise InputError(f"--lock {lock!r}: expected a name of letters, digits, '.', '_' or '-' (e.g. gpu)")


def substitute(argv: Sequence[str], values: dict[str, str]) -> list[str]:
    """Replace ``{results}``/``{job_dir}``/``{job_id}`` inside arguments (other braces are left alone)."""
    out = []
    for arg in argv:
        arg = str(arg)
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        out.append(arg)
    return out


def _host(connector: Connector, name: str):
    if name not in connector.inventory.hosts:
        raise InputError(f"unknown host {name!r} in {connector.inventory.source}",
                         hint=f"known hosts: {', '.join(connector.inventory.hosts) or '(none)'}")
    return connector.inventory.hosts[name]


def _call(connector: Connector, host: str, func: str, *, call_timeout: float | None = None, **kwargs):
    inv_host = _host(connector, host)
    try:
        return hostcall.call(connector.session(host), HOST_SCRIPT, func, python=inv_host.python,
                                   timeout=call_timeout, **kwargs)
    except HostError as exc:
        # Lookup failures on the host are bad input (unknown job), not a failed operation.
        if "LookupError: " in exc.message:
            raise InputError(exc.message.replace("jobs_host." + func + ": LookupError: ", ""),
                             hint=f"list jobs with: dfo jobs list --host {host}") from None
        raise


# ------------------------------------------------------------------------------------ launch


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch would start, decided from the inventory and the request alone (no host asked)."""
    host: str
    job_id: str
    job_dir: str
    argv: list[str]               # placeholders replaced
    cwd: str
    lock: str | None
    force: bool
    job_name: str | None
    env: dict[str, str] = field(repr=False)  # values may be secrets: never printed, only their keys

    @property
    def ref(self) -> str:
        return f"{self.host}:{self.job_id}"

    def as_dict(self) -> dict:
        return {"host": self.host, "job_id": self.job_id, "ref": self.ref, "job_dir": self.job_dir,
                "argv": self.argv, "cwd": self.cwd, "lock": self.lock, "force": self.force, "name": self.job_name,
                "env_keys": sorted(self.env)}


def plan_launch(
    connector: Connector,
    host: str,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    job_name: str | None = None,
    force: bool = False,
    lock: str | None = DEFAULT_LOCK,
    job_id: str | None = None,
) -> LaunchPlan:
    """The launch of ``argv`` on ``host``, every input checked (the host, the lock name, the inventory's
    ``${VAR}`` references); connects to nothing. A new job id unless ``job_id`` is given."""
    if not argv:
        raise InputError("no command to run")
    check_lock_name(lock)
    inv_host = _host(connector, host)
    job_id = job_id or new_job_id()
    job_dir = posixpath.join(inv_host.workdir, "jobs", job_id)
    results = posixpath.join(job_dir, "results")
    values = {"results": results, "job_dir": job_dir, "job_id": job_id}
    full_env = {**connector.inventory.host_env(host), **(env or {}), "DFO_RESULTS_DIR": results, "DFO_JOB_ID": job_id,
                "DFO_JOB_DIR": job_dir, "PYTHONUNBUFFERED": "1"}
    return LaunchPlan(host, job_id, job_dir, substitute(argv, values), cwd or inv_host.workdir, lock, force, job_name,
                      full_env)


def launch_job(
    connector: Connector,
    host: str,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    job_name: str | None = None,
    force: bool = False,
    lock: str | None = DEFAULT_LOCK,
    job_id: str | None = None,
    heartbeat_s: float = 5.0,
) -> JobHandle:
    plan = plan_launch(connector, host, argv, env=env, cwd=cwd, job_name=job_name, force=force, lock=lock,
                       job_id=job_id)
    return start_job(connector, plan, heartbeat_s=heartbeat_s)


def start_job(connector: Connector, plan: LaunchPlan, *, heartbeat_s: float = 5.0) -> JobHandle:
    """Start what ``plan_launch`` planned (under the host lock; the job lock is taken on the host)."""
    host = plan.host
    with host_lock(connector, host, "launch a job") as lock_notices:  # not while another dfo deploys/provisions
        res = _call(connector, host, "launch", workdir=_host(connector, host).workdir, job_id=plan.job_id,
                    argv=plan.argv, env=plan.env, cwd=plan.cwd, job_name=plan.job_name, lock=plan.lock,
                    force=plan.force, supervisor_source=hostcall.program_source(HOST_SCRIPT), heartbeat_s=heartbeat_s)
    launched = replies.Launched.from_host(host, res)
    if not launched.ok:
        raise JobRefused(host, launched.refused, plan.lock or "")
    return JobHandle(host, plan.job_id, plan.job_dir, plan.job_name, notices=lock_notices + launched.notices,
                     status=launched.job)


# ------------------------------------------------------------------------------ inspection


def job_status(connector: Connector, host: str, job_id: str, *, tail: int = 20) -> JobStatus:
    _host(connector, host)
    return JobStatus.from_host(host, _call(connector, host, "status", workdir=_host(connector, host).workdir,
                                           job_id=job_id, tail=tail))


def list_jobs(connector: Connector, host: str, *, limit: int = 50) -> list[JobStatus]:
    return replies.job_list(host, _call(connector, host, "list_jobs", workdir=_host(connector, host).workdir,
                                        limit=limit))


def resolve_job(connector: Connector, host: str, ref: str) -> str:
    """The full job id for ``ref`` (exact id, unique prefix, or "last") on ``host``.

    The id is the host's answer: it becomes a local folder name (runs/<id>-<host>), so it is checked
    to be one plain name component before anything uses it."""
    job_id = _call(connector, host, "resolve", workdir=_host(connector, host).workdir, ref=ref)
    return check_component(job_id, host=host, what="job id")


def locate_job(connector: Connector, ref: str, host: str | None = None) -> tuple[str, str]:
    """(host, job id) for a job reference; a bare id is looked for on every host of the inventory."""
    ref_host, job = parse_job_ref(ref, host)
    if ref_host:
        return ref_host, resolve_job(connector, ref_host, job)
    if job in ("last", "latest"):
        raise InputError(f"{job!r} needs a host: use HOST:{job} or --host HOST")
    names = list(connector.inventory.hosts)
    outcomes = for_each_host(names, lambda n: _call(connector, n, "find", workdir=_host(connector, n).workdir,
                                                    ref=job))
    found = [(n, check_component(o.value, host=n, what="job id")) for n, o in outcomes.items() if o.ok and o.value]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        raise InputError(f"job {job!r} exists on several hosts: {', '.join(f'{n}:{j}' for n, j in found)}",
                         hint="name the host: HOST:JOB_ID")
    unreachable = [n for n, o in outcomes.items() if not o.ok]
    raise InputError(f"no job {job!r} on any host" + (f" (could not ask {', '.join(unreachable)})" if unreachable
                                                       else ""), hint="dfo jobs list --host HOST")


def poll_job(connector: Connector, host: str, job_id: str, offset: int, *, max_bytes: int = 262144,
             tail: int = 0, timeout: float | None = None) -> tuple[JobStatus, bytes, int]:
    """(status, new log bytes, next offset): one round trip (``timeout``: give up on a stalled link)."""
    info = _call(connector, host, "poll", workdir=_host(connector, host).workdir, job_id=job_id, offset=offset,
                 max_bytes=max_bytes, tail=tail, call_timeout=timeout)
    return replies.polled(host, info, offset)


def follow_job(
    connector: Connector,
    host: str,
    job_id: str,
    *,
    events: Events | None = None,
    from_offset: int = 0,
    on_line: Callable[[str], None] | None = None,
    poll_interval: float = 0.5,
    poll_timeout: float = 30.0,
    reconnect_timeout: float = 120.0,
    output: OutputSink | None = None,
) -> JobStatus:
    """Follow the log until the job has ended and every byte was read; returns the final status (with the
    last log lines). ``on_line`` receives every complete log line (e.g. to collect result records).

    A poll that gets no answer within ``poll_timeout`` (a stalled link) or a dropped connection is retried
    on a fresh connection for up to ``reconnect_timeout`` seconds; the job itself is never affected."""
    events = events or QuietEvents()
    own_output = output is None
    view = output if output is not None else events.job_output()
    offset, partial = from_offset, b""
    lost_since: float | None = None
    try:
        while True:
            try:
                status, chunk, offset = poll_job(connector, host, job_id, offset, timeout=poll_timeout)
                if lost_since is not None:
                    events.success(f"{host}: reconnected")
                lost_since = None
            except ConnectionLost:  # the link, not the job: reconnect (anything else propagates)
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    events.warn(f"{host}: connection lost; reconnecting (the job keeps running)…")
                if now - lost_since > reconnect_timeout:
                    raise HostError(host, f"connection lost for {reconnect_timeout:.0f}s while following job {job_id}",
                                    hint=f"the job keeps running on the host; reattach with: dfo jobs logs "
                                    f"{host}:{job_id} -f") from None
                connector.drop(host)
                time.sleep(min(2.0, poll_interval * 2))
                continue
            if chunk:
                view.feed(chunk)
                if on_line is not None:
                    partial += chunk
                    *lines, partial = partial.split(b"\n")
                    for line in lines:
                        on_line(line.decode("utf-8", "replace"))
            if status.done and not chunk:
                if on_line is not None and partial:
                    on_line(partial.decode("utf-8", "replace"))
                return job_status(connector, host, job_id, tail=20)
            if not chunk:
                time.sleep(poll_interval)
    finally:
        if own_output:
            view.close()


# ---------------------------------------------------------------------------------- control


def cancel_job(connector: Connector, host: str, job_id: str, *, grace: float = 5.0) -> JobStatus:
    reply = _call(connector, host, "cancel", workdir=_host(connector, host).workdir, job_id=job_id, grace=grace)
    status, group_alive = replies.cancelled(host, reply)
    if group_alive:
        raise HostError(host, f"job {job_id}: processes of its group survived SIGKILL",
                        hint="check the host with ps -g <pgid>")
    return status


@dataclass(frozen=True)
class CancelPlan:
    """What ``cancel_job`` would do to a job now: nothing when it has ended, else SIGTERM to its process
    group (the processes listed), SIGKILL after ``grace`` seconds, and its lock released."""
    status: JobStatus
    pgid: int | None
    processes: list[tuple[int, list[str]]] | None   # None: the host could not list them
    grace: float

    @property
    def would_signal(self) -> bool:
        return not self.status.done

    def as_dict(self) -> dict:
        return {"ref": self.status.ref, "state": self.status.state, "would_signal": self.would_signal,
                "pgid": self.pgid, "grace_s": self.grace, "lock": self.status.lock,
                "processes": None if self.processes is None else [{"pid": pid, "command": argv}
                                                                  for pid, argv in self.processes]}


def plan_cancel(connector: Connector, host: str, job_id: str, *, grace: float = 5.0) -> CancelPlan:
    """What cancelling the job would signal, read from the host without changing anything there."""
    preview = replies.CancelPreview.from_host(host, _call(connector, host, "cancel_preview",
                                                          workdir=_host(connector, host).workdir, job_id=job_id))
    return CancelPlan(preview.job, preview.pgid, preview.processes, grace)

def lock_status(connector: Connector, host: str, lock: str = DEFAULT_LOCK) -> dict:
    check_lock_name(lock)
    return replies.lock_state(host, _call(connector, host, "lock_status", workdir=_host(connector, host).workdir,
                                          lock=lock))


# ------------------------------------------------------------------------------------- pull


PULL_RECORD = ".dfo-pull.json"


def pull_results(
    connector: Connector,
    host: str,
    job_id: str,
    dest: str | os.PathLike,
    *,
    force: bool = False,
    allow_running: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> PullResult:
    """Fetch the job's ``results/`` into ``dest``, every file checked against the host's sha256.

    ``dest`` appears only complete (download into a temporary sibling, verify, rename). An existing
    ``dest`` with the same manifest is left as is ("up-to-date"); a different one is refused unless
    ``force``. A job that is still running is refused unless ``allow_running``.
    """
    dest = Path(dest)
    workdir = _host(connector, host).workdir
    status, files = replies.results_listing(host, _call(connector, host, "results", workdir=workdir, job_id=job_id))
    if not status.done and not allow_running:
        raise InputError(f"job {host}:{job_id} is still {status.state}; its results may be incomplete",
                         hint="wait for it (dfo jobs logs -f) or pass --allow-running")
    manifest = checked_manifest(host, files)
    if dest.exists():
        if _already_pulled(dest, job_id, manifest) and not force:
            return PullResult(host, job_id, str(dest), "up-to-date", len(manifest), 0, manifest)
        if not force:
            raise InputError(f"{dest} already exists and differs from {host}:{job_id}'s results",
                             hint="choose another destination or pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        # The folder is the one dfo made for the job (the id was checked), not a path the host names.
        root = posixpath.join(workdir, "jobs", check_component(job_id, host=host, what="job id"), "results")
        done = download_verified(connector.session(host), host, root, manifest, tmp, progress)
        (tmp / PULL_RECORD).write_text(json.dumps(
            {"host": host, "job_id": job_id, "job_dir": status.job_dir, "state": status.state,
             "exit_code": status.exit_code, "pulled": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
             "files": manifest}, indent=1, sort_keys=True))
        _publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PullResult(host, job_id, str(dest), "pulled", len(manifest), done, manifest)


def _already_pulled(dest: Path, job_id: str, manifest: dict[str, dict]) -> bool:
    """DEST holds exactly these results already (its pull record and every file agree)."""
    try:
        previous = decode_json((dest / PULL_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(previous, dict) and previous.get("files") == manifest and previous.get("job_id") == job_id
            and all(_matches(dest / rel, meta) for rel, meta in manifest.items()))


def download_verified(session, host: str, root: str, manifest: dict[str, dict], tmp: Path,
                      progress: Callable[[int, int], None] | None = None) -> int:
    """Download every file of MANIFEST into TMP (names confined to it), each checked; returns the bytes."""
    total = sum(m["size"] for m in manifest.values())
    done = 0
    for rel, meta in sorted(manifest.items()):
        local = confine(tmp, rel, host=host, what="results file name")
        try:
            local.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HostError(host, f"results file name {rel!r} does not fit the results folder: {exc}") from None

        def advance(n: int, _total: int, base: int = done, listed: int = meta["size"], name: str = rel) -> None:
            if n > listed:  # the host serves more than it listed: stop now, not at the end of the stream
                raise HostError(host, f"results file {name} is larger than the {listed:,} bytes the host listed")
            if progress:
                progress(base + n, total)

        session.get(posixpath.join(root, rel), local, progress=advance)
        got = sha256_file(local)
        if got != meta["sha256"] or local.stat().st_size != meta["size"]:
            raise HostError(host, f"results file {rel} failed verification after download "
                            f"(sha256 {got[:16]}…, host says {meta['sha256'][:16]}…)",
                            hint="the file may have changed during the pull; run the pull again")
        done += meta["size"]
    return done


def _publish(tmp: Path, dest: Path) -> None:
    """Put the verified TMP in DEST's place with renames (an existing DEST is moved aside, then removed)."""
    mode = 0o777 & ~_umask()
    for folder in [tmp, *(p for p in tmp.rglob("*") if p.is_dir())]:
        folder.chmod(mode)  # mkdtemp made it private; the pulled folder is an ordinary one
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{secrets.token_hex(3)}")
        os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, dest)


MAX_RESULTS_BYTES = 16 << 30  # one pull's results at most: an eval writes megabytes; a host may claim anything
MAX_RESULTS_FILES = 10_000


def checked_manifest(host: str, files: object, max_bytes: int = MAX_RESULTS_BYTES) -> dict[str, dict]:
    """The host's results manifest, checked: names confined to the results folder, sizes and digests typed, at
    most MAX_RESULTS_FILES files and MAX_BYTES in all (before anything is downloaded).

    A compromised host may answer anything here; a malformed answer is a clear error, never a traceback."""
    if not isinstance(files, dict):
        raise HostError(host, "malformed results manifest from the host "
                        f"(expected a mapping, got {type(files).__name__})")
    if len(files) > MAX_RESULTS_FILES:
        raise HostError(host, f"the results list {len(files)} files, more than the {MAX_RESULTS_FILES} dfo pulls")
    for rel, meta in files.items():
        check_name(rel, host=host, what="results file name")
        if not (isinstance(meta, dict) and whole_number(meta.get("size")) and isinstance(meta.get("sha256"), str)
                and re.fullmatch(r"[0-9a-f]{64}", meta["sha256"])):
            raise HostError(host, f"malformed results manifest entry for {rel!r}: {str(meta)[:120]}")
    total = sum(meta["size"] for meta in files.values())
    if total > max_bytes:
        raise HostError(host, f"the results hold {total:,} bytes, more than the {max_bytes:,} dfo pulls: nothing "
                        "was downloaded", hint="look at the results folder on the host: an eval writes megabytes")
    return files


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def _matches(path: Path, meta: dict) -> bool:
    try:
        return path.stat().st_size == meta["size"] and sha256_file(path) == meta["sha256"]
    except OSError:
        return False


def default_pull_dest(host: str, job_id: str, root: str | os.PathLike = "runs") -> Path:
    """``root/<job id>-<host>``; the id came from the host, so the folder is confined under ``root``."""
    check_component(job_id, host=host, what="job id")
    return Path(root) / confine(root, f"{job_id}-{host}", host=host, what="job id").name


__all__ = [
    "FINAL_STATES", "CancelPlan", "JobHandle", "JobRefused", "JobStatus", "LaunchPlan", "PullResult", "cancel_job",
    "checked_manifest", "default_pull_dest", "download_verified", "follow_job", "job_status", "launch_job",
    "list_jobs", "locate_job", "lock_status", "new_job_id", "parse_job_ref", "plan_cancel", "plan_launch",
    "poll_job", "pull_results", "resolve_job", "start_job", "substitute",
]
