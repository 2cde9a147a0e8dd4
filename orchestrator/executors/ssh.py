"""An SSH host's detached jobs (orchestrator/jobs/): one job per host and shard of the prompts, followed
through its log, its results pulled hash-verified; `dfo watch`'s resident worker is one more detached job
(watch/resident.py). Every inventory host without another place is this one."""

from __future__ import annotations

import posixpath
import shutil
import threading
from pathlib import Path
from typing import Any

from orchestrator.core.errors import DfoError, InputError, OperationError, payload_error_text
from orchestrator.core.events import Events
from orchestrator.deploy.operation import payload_dir
from orchestrator.executors.base import Detached, Finish, reattach_hint
from orchestrator.jobs.operation import (
    FINAL_STATES,
    JobStatus,
    cancel_job,
    follow_job,
    job_status,
    launch_job,
    pull_results,
)

ENGINE_DIR = "engine"  # the payload's engine logs, inside a host's pulled results


class SshExecutor:
    name = "ssh"

    def runs_on(self, inv_host: Any) -> bool:
        return True  # the default place: the host itself, over SSH

    def owns(self, job: dict) -> bool:
        return True  # the default: a job no other place owns is a detached job on its host

    def submit(self, connector: Any, job: Any, run_name: str, argv: list[str], *, shards: int,
               env: dict[str, str], events: Events, force: bool) -> dict:
        host = job.host
        inv_host = connector.inventory.hosts[host]
        handle = launch_job(connector, host, argv, cwd=payload_dir(inv_host.workdir),
                            job_name=f"dfo eval {run_name}", force=force, env=env)
        for notice in handle.notices:
            events.warn(f"  {notice}")
        record = {"job_id": handle.job_id, "job_dir": handle.job_dir, "shard": list(job.shard), "argv": argv,
                  "state": "running"}
        events.info(f"  {host}: job {handle.job_id} started")
        return record

    def follow_and_collect(self, connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
        jobs = run.record.get("jobs", {})
        run.set(status="running")
        events.step("follow progress" + (" (Ctrl-C detaches; the job keeps running)" if events.is_terminal else ""))
        finals: dict[str, JobStatus] = {}
        errors: dict[str, DfoError] = {}
        try:
            if len(jobs) == 1:
                (host, job), = jobs.items()
                finals[host] = follow_job(connector, host, job["job_id"], events=events)
            else:
                _follow_many(connector, jobs, events, finals, errors)
        except KeyboardInterrupt:
            run.set(status="detached")
            raise Detached(run) from None
        if errors:
            run.set(status="failed", error="; ".join(str(e) for e in errors.values()))
            raise OperationError("lost track of job(s):\n" + "\n".join(f"  {e}" for e in errors.values()),
                                 hint=reattach_hint(run))
        return collect(connector, run, finals, events=events, finish=finish)

    def reattach(self, connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
        statuses = {h: job_status(connector, h, j["job_id"]) for h, j in run.record.get("jobs", {}).items()}
        if all(s.done for s in statuses.values()):
            return collect(connector, run, statuses, events=events, finish=finish)
        return self.follow_and_collect(connector, run, events=events, finish=finish)

    def resume(self, connector: Any, run: Any, *, events: Events) -> None:
        raise InputError(f"run {run.name}: --resume is for runs on a Slurm cluster host",
                         hint=f"`dfo runs pull {run.name}` follows and collects an SSH run")

    def cancel(self, connector: Any, host: str, job: dict) -> None:
        cancel_job(connector, host, job["job_id"])

    def part_facts(self, part_job: dict) -> dict:
        return {}

    def resident_worker(self, connector: Any, cfg: Any, folder: Path, events: Events) -> Any | None:
        if not cfg.resident or cfg.shards is not None:
            return None
        from orchestrator.watch.resident import Resident

        return Resident(connector, folder, cfg.runs_dir, events, idle=cfg.idle_exit, prompts_file=cfg.prompts_file)

    def open_watch(self, connector: Any, cfg: Any, folder: Path, events: Events) -> None:
        return None


def _follow_many(connector, jobs, events, finals, errors) -> None:
    # One thread per host with a text view each (one live display per console); the main thread only
    # waits, so Ctrl-C reaches it at once.
    def one(host: str, job_id: str) -> None:
        view = events.job_output(prefix=f"{host}: ", live=False)
        try:
            finals[host] = follow_job(connector, host, job_id, output=view)
        except DfoError as exc:
            errors[host] = exc
        finally:
            view.close()

    threads = [threading.Thread(target=one, args=(h, j["job_id"]), daemon=True) for h, j in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)


def collect(connector: Any, run: Any, finals: dict[str, JobStatus] | None = None, *, events: Events,
            finish: Finish) -> Any:
    """Pull logs and results of finished jobs into the run folder, then FINISH (merge, report)."""
    jobs = run.record["jobs"]
    finals = dict(finals or {})
    for host, job in jobs.items():
        if host not in finals:
            finals[host] = job_status(connector, host, job["job_id"], tail=20)
    running = [f"{h}:{s.job_id} ({s.state})" for h, s in finals.items() if s.state not in FINAL_STATES]
    if running:
        raise InputError(f"run {run.name}: job(s) still running: {', '.join(running)}",
                         hint=f"wait with `dfo runs pull {run.name}` (it follows them) or `dfo jobs logs … -f`")
    run.set(status="pulling")
    (run.path / "logs").mkdir(exist_ok=True)
    failures = []
    for host, status in finals.items():
        job = jobs[host]
        job["state"] = status.state
        job["exit_code"] = status.exit_code
        log_path = run.path / "logs" / f"{host}.log"
        try:
            connector.session(host).get(posixpath.join(job["job_dir"], "log"), log_path)
        except DfoError as exc:
            events.warn(f"{host}: could not fetch the job log: {exc.message}")
        if not status.ok:
            failures.append((host, status, _payload_error(log_path, status)))
    run.set(jobs=jobs)
    if failures:
        msg = "; ".join(f"{h}: eval job {s.job_id} {s.state}"
                        + (f" (exit {s.exit_code})" if s.exit_code is not None else "") + f": {err}"
                        for h, s, err in failures)
        run.set(status="failed", error=msg)
        raise OperationError(msg, hint=f"log(s) in {run.path / 'logs'}; run folder {run.path} is marked failed")
    events.step("pull results (sha256-verified)")
    parts = {}
    for host, job in jobs.items():
        dest = run.path / "hosts" / host
        pulled = pull_results(connector, host, job["job_id"], dest, force=True)
        events.info(f"  {host}: {pulled.files} file(s), {pulled.bytes:,} B {pulled.status}")
        parts[host] = dest
        _copy_engine_logs(dest, run.path / "logs", host)
    return finish(run, parts, jobs, jobs, events)


def _copy_engine_logs(pulled: Path, logs: Path, host: str) -> None:
    """The engine servers' logs (``--engine``/``--reference vllm``) next to the job log: logs/HOST-vllm-*.log."""
    for log in sorted((pulled / ENGINE_DIR).glob("*.log")):
        shutil.copyfile(log, logs / f"{host}-{log.name}")


def _payload_error(log_path: Path, status: JobStatus) -> str:
    """The payload's own one-line error, else the last log lines."""
    lines = []
    try:
        lines = log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = status.log_tail
    said = payload_error_text("\n".join(lines))  # its own line, or a traceback's exception line only
    if said is not None:
        return said
    tail = [line for line in lines if line.strip()][-5:]
    return " | ".join(tail) if tail else "no output"
