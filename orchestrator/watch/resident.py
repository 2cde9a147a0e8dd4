"""The resident eval worker of a watch session: one job on the eval host that keeps the target, references and
features loaded, and a small handover job per checkpoint (remote_payload/eval/worker.py is the host side).

Per checkpoint the watcher then pays the relay, the handover job's launch, the drafter's load and the eval
itself, not a Python + torch start, a target load and the cache reads. The handover job is an ordinary
detached job of an ordinary run folder (launched without the GPU lock: the worker holds it), so following,
pulling, reattaching after a crash and the orphan check work as for a one-off eval job.

The worker is a detached job too: it outlives a watcher that dies and a restarted watcher reuses it (its job
id, key and interpreter are in ``worker.json`` in the series folder). The key is the eval's arguments and the
payload release: another setting or a redeployed payload starts a new worker (the old one is cancelled). It
stops by itself after ``idle`` seconds without a drafter. When it cannot start (the GPU lock is held by
another job) or stops under a handover (exit ``WORKER_GONE``), the watcher runs a one-off eval job instead.

``ResidentStrip`` is its counterpart on the training host: a strip worker with torch imported, so the strip of
each checkpoint costs no Python + torch start either (the same job, record and fallback machinery).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import time
from dataclasses import asdict
from pathlib import Path

from orchestrator.core.errors import DfoError
from orchestrator.core.events import Events
from orchestrator.core.host_text import decode_json
from orchestrator.deploy.manifest import default_payload_root
from orchestrator.deploy.operation import deploy, payload_dir
from orchestrator.evaluation.plan import EvalPlan, relay_dir
from orchestrator.evaluation.prepare import (
    jsonable,
    raise_failures,
    relay_drafters,
    upload_datasets,
    upload_prompts,
)
from orchestrator.evaluation.runs import Run, new_run, write_json_atomic
from orchestrator.jobs.operation import JobHandle, JobRefused, cancel_job, job_status, launch_job, new_job_id
from orchestrator.provision.operation import provision_hosts
from orchestrator.relay.operation import HOST_SCRIPT as RELAY_HOST_SCRIPT
from orchestrator.relay.strip import STRIP_DIR, Stripper
from orchestrator.transport import Connector, hostcall
from remote_payload.eval.options import ENGINES
from remote_payload.resident import TEST_EXIT_ENV, WORKER_GONE

RECORD = "worker.json"
STRIP_RECORD = "strip-worker.json"
# Payload arguments a worker does not serve.
UNSUPPORTED = ("--diagnose", "--online-check")
# A drafter spec is keyed by the checkpoint's name, which the worker's settings (fixed when it starts) cannot know:
# it travels with each handover instead (and stays out of the worker's arguments and key).
SPEC_FLAG = "--drafter-spec"


def supported(plan: EvalPlan) -> str | None:
    """Why PLAN's eval cannot go through a resident worker, or None when it can."""
    req = plan.request
    if len(plan.jobs) != 1:
        return "the eval is sharded over several hosts"
    if req.engine or req.reference in ENGINES:
        return "an engine runs in one-off eval jobs"
    if any(a.split("=", 1)[0] in UNSUPPORTED for a in req.payload_args):
        return "--diagnose / --online-check run in one-off eval jobs"
    return None


def worker_args(eval_args: list[str], *, drafter_root: str, jobs_root: str, idle: float,
                worker_dir: str = "{job_dir}/worker") -> list[str]:
    """`eval-worker …` from a checkpoint's `eval …` arguments: the same options without the drafter, its spec
    and the output folder (each handover brings its own), and the worker's folders."""
    out, skip = ["eval-worker"], False
    for arg in eval_args[1:]:
        if skip:
            skip = False
            continue
        if arg in ("--drafter", "--out", SPEC_FLAG):
            skip = True
            continue
        if arg.startswith(SPEC_FLAG + "="):
            continue
        out.append(arg)
    return out + ["--worker-dir", worker_dir, "--drafter-root", drafter_root, "--jobs-root", jobs_root,
                  "--idle-exit", f"{idle:g}"]


def handover_args(name: str, path: str, worker_dir: str, relayed_files: list[dict],
                  spec: str | None = None) -> list[str]:
    args = ["eval-handover", "--worker-dir", worker_dir, "--drafter", f"{name}={path}"]
    for f in relayed_files:
        args += ["--sha256", f"{f.get('rel') or ''}={f.get('sha256')}"]
    return args + ([SPEC_FLAG, spec] if spec else [])


def drafter_spec_of(eval_args: list[str], name: str) -> str | None:
    """The spec file an eval's arguments give drafter NAME (`--drafter-spec NAME=FILE`, either form), or None."""
    for i, arg in enumerate(eval_args):
        value = arg[len(SPEC_FLAG) + 1:] if arg.startswith(SPEC_FLAG + "=") else \
            eval_args[i + 1] if arg == SPEC_FLAG and i + 1 < len(eval_args) else None
        if value is not None and value.partition("=")[0] == name:
            return value.partition("=")[2]
    return None


class _ResidentJob:
    """A resident worker's detached job as the watcher knows it: its record in the series folder (host, job id
    and folder, key, interpreter), whether it runs, and stopping it."""

    holds_gpu_lock = True  # an eval job of the same host would be refused while it runs

    def __init__(self, connector: Connector, folder: Path, events: Events, record: str):
        self.connector, self.folder, self.events, self.record_file = connector, folder, events, folder / record
        self.record: dict | None = self._read()
        self._checked = False  # this process saw the worker's job run (and deployed, to know the release)
        self.disabled: str | None = None  # why this process does without the worker from now on

    def _read(self) -> dict | None:
        try:
            doc = decode_json(self.record_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and all(isinstance(doc.get(k), str) for k in
                                                    ("host", "job_id", "job_dir", "key", "python")) else None

    def _remember(self, host: str, handle: JobHandle, key: str, python: str) -> None:
        for notice in handle.notices:
            self.events.warn(f"  {notice}")
        self._keep({"host": host, "job_id": handle.job_id, "job_dir": handle.job_dir, "key": key, "python": python})

    def _keep(self, record: dict) -> None:
        self.record = record
        write_json_atomic(self.record_file, self.record)
        self._checked = True

    def _forget(self) -> None:
        self.record, self._checked = None, False
        self.record_file.unlink(missing_ok=True)

    def running(self) -> bool:
        """The worker's job runs (one look at the host)."""
        if self.record is None:
            return False
        try:
            return job_status(self.connector, self.record["host"], self.record["job_id"], tail=0).state in \
                ("starting", "running")
        except DfoError:
            return False

    def stop(self) -> None:
        """Cancel the worker's job (nothing when none is recorded)."""
        if self.record is None:
            return
        try:
            cancel_job(self.connector, self.record["host"], self.record["job_id"])
        except DfoError as exc:
            self.events.warn(f"could not stop the resident worker {self.record['job_id']}: {exc.message}")
        self._forget()


class Resident(_ResidentJob):
    worker_dir = "{job_dir}/worker"  # the worker's folder, in the job launcher's placeholders
    def __init__(self, connector: Connector, folder: Path, runs_dir: Path, events: Events, *, idle: float,
                 prompts_file: Path | None = None):
        super().__init__(connector, folder, events, RECORD)
        self.runs_dir, self.idle, self.prompts_file = runs_dir, idle, prompts_file

    def ensure(self, stand_in: EvalPlan) -> bool:
        """A worker serves STAND_IN's settings (started now when none runs); False: use one-off jobs this time."""
        if self.disabled or supported(stand_in) is not None:
            if not self.disabled:
                self.stop()  # a worker an earlier watcher of this series left would hold the GPU lock
            return False
        if self._checked and self.record is not None:
            return self._usable()
        host = stand_in.jobs[0].host
        python, release = self._prepare(stand_in)
        args = self._args(stand_in)
        key = hashlib.sha256(json.dumps([host, args, release]).encode()).hexdigest()[:16]
        if self.record is not None and self.record["key"] == key and self.running():
            self._checked = True
            return self._usable()
        self.stop()  # another key, or a worker that is gone
        return self._start(stand_in, host, python, key, args) and self._usable()

    def _usable(self) -> bool:
        """The recorded worker can take a checkpoint now (a queued Slurm worker is waited for first)."""
        return True

    def _args(self, plan: EvalPlan) -> list[str]:
        job = plan.jobs[0]
        inv_host = self.connector.inventory.hosts[job.host]
        root = relay_dir(self.connector.inventory, job.host, plan.request.drafters[0].host or job.host)
        return worker_args(job.args, drafter_root=root, jobs_root=posixpath.join(inv_host.workdir, "jobs"),
                           idle=self.idle, worker_dir=self.worker_dir)

    def _prepare(self, plan: EvalPlan) -> tuple[str, str]:
        """Deploy and provision, once per watcher process: (the venv's python, the payload release, which is
        part of the worker's key)."""
        host = plan.jobs[0].host
        deployed = deploy(self.connector, [host], root=default_payload_root(), events=self.events)
        raise_failures("deploy", deployed)
        provisioned = provision_hosts(self.connector, [host], events=self.events)
        raise_failures("provision", provisioned)
        return provisioned[host].result.python, deployed[host].result.release

    def fell_through(self, why: str) -> None:
        """The worker stopped under a handover: one-off jobs for the rest of this watcher's life."""
        self.disabled = why
        self.events.warn(f"the resident worker stopped ({why}); one eval job per checkpoint from now on")
        self._forget()

    def _upload_inputs(self, plan: EvalPlan) -> None:
        if self.prompts_file is not None:
            upload_prompts(self.connector, plan, self.prompts_file)
        if plan.jobs[0].uploads:
            upload_datasets(self.connector, plan)

    def _start(self, plan: EvalPlan, host: str, python: str, key: str, args: list[str]) -> bool:
        self._upload_inputs(plan)
        try:
            handle = launch_job(self.connector, host, [python, "-m", "remote_payload", *args],
                                cwd=payload_dir(self.connector.inventory.hosts[host].workdir),
                                job_name="dfo watch resident eval worker", job_id=new_job_id(),
                                env=kill_point_env("worker-"))
        except JobRefused as exc:
            self.events.warn(f"no resident worker: {exc.message}; one eval job per checkpoint meanwhile")
            return False
        self._remember(host, handle, key, python)
        self.events.step(f"resident eval worker {host}:{handle.job_id} started (target, references and features "
                         f"loaded once; stops after {self.idle:g}s without a checkpoint)", tag="watch")
        return True

    def hand_over(self, plan: EvalPlan, stripper: Stripper | None = None) -> Run:
        """Relay the checkpoint (stripped by STRIPPER when given), then a handover job for it: the run (status
        running), as start_eval returns it."""
        assert self.record is not None
        relays = relay_drafters(self.connector, plan, self.events, stripper)
        job, host = plan.jobs[0], self.record["host"]
        name, path = next(iter(job.drafters.items()))
        run = new_run(self.runs_dir, [host], {"request": jsonable(asdict(plan.request)),
                                              "plan": jsonable(plan.as_dict()), "relays": relays, "jobs": {},
                                              "resident_worker": dict(self.record)})
        files = relays[0]["files"] if relays else []
        argv = [self.record["python"], "-m", "remote_payload",
                *handover_args(name, path, posixpath.join(self.record["job_dir"], "worker"), files,
                               drafter_spec_of(job.args, name)), *self._handover_extra()]
        try:
            handle = launch_job(self.connector, host, argv, lock=None, job_name=f"dfo eval {run.name} (resident)",
                                cwd=payload_dir(self.connector.inventory.hosts[host].workdir))
        except DfoError as exc:
            run.set(status="failed", error=str(exc))
            raise
        run.set(jobs={host: {"job_id": handle.job_id, "job_dir": handle.job_dir, "shard": list(job.shard),
                             "argv": argv, "state": "running"}}, status="running")
        return run

    def _handover_extra(self) -> list[str]:
        """More `eval-handover` arguments (how the client judges a worker elsewhere)."""
        return []

class ResidentStrip(_ResidentJob):
    """The resident strip worker of a watch session: one job on the training host with torch imported, that
    strips each checkpoint the watcher relays (remote_payload/models/strip_worker.py is the host side).

    Given to the relay as ``RelayOptions.stripper`` (orchestrator/relay/strip.py): a checkpoint inside
    the watched folder is handed to it by a small ``strip-handover`` command over SSH (no torch start); when
    it is not running, or stops under a handover, the one-shot ``strip-checkpoint`` runs. It holds no lock
    (the training host's GPU is the trainer's), outlives a watcher that dies (``strip-worker.json`` in the
    series folder; a restarted watcher reuses it), is replaced when the deployed payload changes and stops
    after ``idle`` seconds without a checkpoint."""

    def __init__(self, connector: Connector, folder: Path, events: Events, *, host: str, source_root: str,
                 idle: float):
        super().__init__(connector, folder, events, STRIP_RECORD)
        self.host, self.source_root, self.idle = host, source_root.rstrip("/") or "/", idle
        self.used = 0.0  # when this process last handed it a checkpoint or saw it run (monotonic)

    def ensure(self) -> bool:
        """The worker runs (started now when none does, or it may have idled out); False: strip one-shot."""
        if self.disabled:
            return False
        if self._checked and self.record is not None and time.monotonic() - self.used < self.idle / 2:
            return True
        inv_host = self.connector.inventory.hosts[self.host]
        deployed = deploy(self.connector, [self.host], root=default_payload_root(), events=self.events)
        raise_failures("deploy", deployed)
        python = hostcall.call(self.connector.session(self.host), RELAY_HOST_SCRIPT, "python_for",
                               python=inv_host.python, venv=inv_host.venv, fallback=inv_host.python)["python"]
        args = strip_worker_args(self.source_root, posixpath.join(inv_host.workdir, STRIP_DIR), self.idle)
        key = hashlib.sha256(json.dumps([self.host, args, python, deployed[self.host].result.release])
                             .encode()).hexdigest()[:16]
        if self.record is not None and self.record["key"] == key and self.running():
            self._checked, self.used = True, time.monotonic()
            return True
        self.stop()  # another key, or a worker that is gone
        try:
            handle = launch_job(self.connector, self.host, [python, "-m", "remote_payload", *args], lock=None,
                                cwd=payload_dir(inv_host.workdir), job_name="dfo watch resident strip worker",
                                job_id=new_job_id(), env=kill_point_env("strip-"))
        except DfoError as exc:
            self.disabled = exc.message
            self.events.warn(f"no resident strip worker on {self.host}: {exc.message}; one strip process per "
                             "checkpoint")
            return False
        self._remember(self.host, handle, key, python)
        self.used = time.monotonic()
        self.events.step(f"resident strip worker {self.host}:{handle.job_id} started (torch imported once; stops "
                         f"after {self.idle:g}s without a checkpoint)", tag="watch")
        return True

    def worker_for(self, path: str) -> tuple[str, str] | None:
        """(interpreter, worker folder) for the relay's ``strip-handover`` of PATH, or None: strip it one-shot
        (PATH is not in the watched folder, or no worker runs)."""
        inside = posixpath.normpath(path).startswith(self.source_root.rstrip("/") + "/")
        if not inside or not self.ensure():
            return None
        assert self.record is not None
        self.used = time.monotonic()
        return self.record["python"], posixpath.join(self.record["job_dir"], "worker")

    def gone(self, why: str) -> None:
        """The worker stopped under a handover: one strip process per checkpoint for the rest of this watcher."""
        self.disabled = why
        self.events.warn(f"the resident strip worker stopped ({why}); one strip process per checkpoint from now on")
        self._forget()


def strip_worker_args(source_root: str, strip_root: str, idle: float) -> list[str]:
    return ["strip-worker", "--worker-dir", "{job_dir}/worker", "--source-root", source_root, "--strip-root",
            strip_root, "--idle-exit", f"{idle:g}"]


def kill_point_env(prefix: str) -> dict[str, str]:
    """A test's kill point meant for a worker (named PREFIX…) travels with it (never set in production)."""
    point = os.environ.get(TEST_EXIT_ENV, "")
    return {TEST_EXIT_ENV: point} if point.startswith(prefix) else {}


def worker_gone(run: Run) -> bool:
    """The handover job of RUN ended with WORKER_GONE: the worker stopped before it took the checkpoint."""
    return any(j.get("exit_code") == WORKER_GONE for j in (run.record.get("jobs") or {}).values())
