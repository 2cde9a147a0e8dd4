"""`dfo eval --host CLUSTER --shards N`: the eval's payload command as one Slurm array, one task per shard,
followed through the login node and merged into one run as SSH shards are.

The run's job record for the cluster host holds the array (job id, folder, the argv each task runs, the
shard count) and, once followed, each task's Slurm job id, node, state and exit code. Only tasks that
finished with exit code 0 and wrote their ``finished.json`` are merged; anything else fails the run with the
tasks' states, and `dfo runs pull RUN --resume` submits only those tasks again.
"""

from __future__ import annotations

import posixpath
import shutil
import time
from pathlib import Path
from typing import Any

from orchestrator.cluster.operation import (
    Submitted,
    cancel,
    follow,
    login_session,
    missing_tasks,
    submit,
    task_records,
    task_results,
)
from orchestrator.cluster.plan import BatchRequest, job_folder, task_dir
from orchestrator.cluster.replies import TaskState
from orchestrator.core.confine import check_component
from orchestrator.core.errors import HostError, InputError, OperationError
from orchestrator.core.events import Events
from orchestrator.core.host_text import decode_json
from orchestrator.core.slurm_section import SlurmSection, workdir_inside_shared
from orchestrator.executors.base import Detached, Finish
from orchestrator.jobs.operation import download_verified
from remote_payload.eval.options import ENGINES  # the serving engines (--engine, --reference ENGINE)

MAX_SHARDS = 1000
ENGINE_DIR = "engine"  # a task's engine server logs, under its results folder (as on an SSH host)


def eval_task_command(argv: list[str], shards: int) -> tuple[str, ...]:
    """The payload's argv for array task ``{task}``: results into the task's folder, shard ``{task}/N`` (pure)."""
    if "--shard" in argv:
        raise InputError("a cluster eval shards with --shards N, not a --shard payload option")
    command = [arg.replace("{results}", "{task_dir}/results") for arg in argv]
    return tuple(command + (["--shard", f"{{task}}/{shards}"] if shards > 1 else []))


def check_shards(shards: int, samples: int | None, prompt_count: int | None) -> None:
    if not 1 <= shards <= MAX_SHARDS:
        raise InputError(f"--shards {shards}: expected 1-{MAX_SHARDS}")
    sizes = [n for n in (samples, prompt_count) if n is not None]
    if sizes and min(sizes) < shards:
        raise InputError(f"--shards {shards} is more than the {min(sizes)} prompt(s) to evaluate",
                         hint="give fewer --shards or more prompts")


def check_cluster_eval(inventory: Any, host: str, shards: int, request: Any, prompt_count: int | None,
                       relays: bool = False) -> None:
    """What an eval on cluster HOST needs before anything connects (pure): a shard count that fits the prompts
    and, when drafters are relayed to it (RELAYS), a relay folder on the shared filesystem. The engine stage
    (--engine, --reference ENGINE) needs nothing more: each task's payload starts its own server on its compute
    node's loopback, on a port it picks free there, with a key it draws itself (never in the batch script, argv
    or the task's output), from the engine venv that `dfo provision --engine` built on the shared filesystem."""
    check_shards(shards, request.samples, prompt_count)
    h = inventory.hosts[host]
    engine = getattr(request, "engine", None) or (request.reference if request.reference in ENGINES else None)
    if engine and not workdir_inside_shared(h.engine_venv_for(engine), h.slurm.shared):
        raise InputError(f"{host}: the {engine} engine venv {h.engine_venv_for(engine)} is not inside slurm.shared "
                         f"{h.slurm.shared}: the compute nodes would not find it",
                         hint="set paths.engine_venv to a folder on the cluster's shared filesystem (or leave it "
                         "unset: <workdir>/engines/ENGINE)")
    folder = h.paths.checkpoints or posixpath.join(h.workdir, "checkpoints")
    if relays and not workdir_inside_shared(folder, h.slurm.shared):
        raise InputError(f"{host}: paths.checkpoints {folder} is not inside slurm.shared {h.slurm.shared}: the "
                         "relayed checkpoints would not reach the compute nodes",
                         hint="set paths.checkpoints to a folder on the cluster's shared filesystem")


def eval_request(workdir: str, run_name: str, argv: list[str], cwd: str, shards: int,
                 env: dict[str, str] | None = None) -> BatchRequest:
    """The array of RUN_NAME's eval, its folder under the host's private WORKDIR (cluster/plan.py job_dir)."""
    name, job_dir = job_folder(workdir, f"dfo-eval-{run_name}")
    return BatchRequest(name, job_dir, tuple(range(shards)), eval_task_command(argv, shards), dict(env or {}), cwd)


def submit_eval(connector: Any, host: str, request: BatchRequest) -> dict:
    """Submit the array; the run's job record for HOST."""
    section = _section(connector, host)
    submitted_at = time.time()
    submitted = submit(login_session(connector, host), section, request)
    return {"slurm": {"array_job_id": submitted.array_job_id, "submitted_at": submitted_at,
                      "job_dir": request.job_dir, "name": request.name,
                      "shards": len(request.tasks), "command": list(request.command), "cwd": request.cwd,
                      "tasks": {}},
            "job_id": submitted.array_job_id, "state": "submitted"}


def follow_cluster(connector: Any, host: str, job: dict, events: Events) -> dict[int, TaskState]:
    """Follow the array to its end, telling EVENTS each task's changes (pending reason, node, end state)."""
    slurm = job["slurm"]
    login = login_session(connector, host)
    tasks = tuple(int(t) for t in slurm.get("pending_tasks") or range(slurm["shards"]))
    # A task whose folder already holds complete results is done, whatever Slurm still remembers of it.
    tasks = missing_tasks(task_records(login, slurm["job_dir"], tasks))
    if not tasks:
        return {}
    submitted = Submitted(slurm["array_job_id"], slurm["job_dir"], tasks, "")

    def tell(state: TaskState) -> None:
        where = f" on {state.node}" if state.node else ""
        why = f" ({state.reason})" if state.reason and state.state == "PENDING" else ""
        code = f", exit {state.exit_code}" if state.exit_code is not None and not state.active else ""
        events.info(f"  {host} task {state.task} (job {state.job_id}): {state.state}{why}{where}{code}")

    # No deadline of our own: a cluster eval takes as long as the queue and the time limit allow (Ctrl-C detaches).
    return follow(login, submitted, poll=1.0, timeout=30 * 86400, on_change=tell)


def record_tasks(job: dict, final: dict[int, TaskState]) -> list[TaskState]:
    """Write each task's Slurm facts into the job record; the tasks that did not complete."""
    tasks = job["slurm"].setdefault("tasks", {})
    for task, state in final.items():
        tasks[str(task)] = {"job_id": state.job_id, "node": state.node, "state": state.state,
                            "exit_code": state.exit_code, "reason": state.reason}
    return [s for s in final.values() if s.state != "COMPLETED" or s.exit_code not in (0, None)]


def failure_message(host: str, failed: list[TaskState]) -> str:
    parts = []
    for s in failed:
        what = "killed by the scheduler: " if s.killed_by_scheduler else ""
        parts.append(f"{host} task {s.task} (job {s.job_id}) {what}{s.state}"
                     + (f", exit {s.exit_code}" if s.exit_code is not None else "")
                     + (f" on {s.node}" if s.node else ""))
    return "; ".join(parts)


def pull_tasks(connector: Any, host: str, job: dict, dest: Path, events: Events) -> dict[str, Path]:
    """Each complete task's results into DEST/<host>[<task>]; refuses a task without a successful record."""
    slurm = job["slurm"]
    tasks = tuple(range(int(slurm["shards"])))
    login = login_session(connector, host)
    missing = missing_tasks(task_records(login, slurm["job_dir"], tasks))
    if missing:
        raise OperationError(f"{host}: task(s) {', '.join(map(str, missing))} of job {slurm['array_job_id']} have "
                             "no complete results (no finished record with exit code 0): nothing is merged",
                             hint="re-run only those tasks with `dfo runs pull RUN --resume`")
    parts: dict[str, Path] = {}
    session = connector.session(host)
    logs = dest.parent / "logs"  # the engine logs beside the job logs, as an SSH host's are
    logs.mkdir(exist_ok=True)
    for task in tasks:
        local = dest / f"{host}[{task}]"
        local.mkdir(parents=True, exist_ok=True)
        results = posixpath.join(task_dir(slurm["job_dir"], task), "results")
        # As an SSH job's pull: the login node lists each file's sha256 and size, every download is checked.
        manifest = task_results(login, slurm["job_dir"], task)
        wanted = _wanted(host, task, manifest, ("results.json", "samples.jsonl"))
        download_verified(session, host, results, wanted, local)
        names = engine_logs(host, local / "results.json")
        download_verified(session, host, results, _wanted(host, task, manifest,
                                                          tuple(f"{ENGINE_DIR}/{n}" for n in names)), local)
        for name in names:
            shutil.copyfile(local / ENGINE_DIR / name, logs / f"{host}[{task}]-{name}")
        parts[f"{host}[{task}]"] = local
    events.info(f"  {host}: results of {len(tasks)} task(s) pulled")
    return parts


def _wanted(host: str, task: int, manifest: dict[str, dict], names: tuple[str, ...]) -> dict[str, dict]:
    """NAMES' entries of a task's results manifest; a name it lacks is a HostError (no partial merge)."""
    missing = [name for name in names if name not in manifest]
    if missing:
        raise HostError(host, f"task {task}'s results folder has no {', '.join(missing)} (a regular file)",
                        hint="its log is slurm.log in the task's folder")
    return {name: manifest[name] for name in names}


def engine_logs(host: str, results_json: Path) -> list[str]:
    """The engine servers' log names a task's results list (``engine.logs``: --engine / --reference ENGINE),
    each one plain name component (the names come from the cluster: data until checked)."""
    try:
        results = decode_json(results_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # the merge names the unreadable file
    engine = results.get("engine") if isinstance(results, dict) else None
    names = engine.get("logs") if isinstance(engine, dict) else None
    if not isinstance(names, list):
        return []
    return [check_component(name, host=host, what="engine log name") for name in names[:100]]


def part_jobs(host: str, job: dict) -> dict[str, dict]:
    """merge_host_results' job records, one per task part (its Slurm job id and shard)."""
    slurm = job["slurm"]
    shards = int(slurm["shards"])
    return {f"{host}[{task}]": {"job_id": (slurm["tasks"].get(str(task)) or {}).get("job_id"),
                                "shard": [task, shards], "slurm": slurm["tasks"].get(str(task))}
            for task in range(shards)}


def resume_eval(connector: Any, host: str, job: dict) -> tuple[int, ...]:
    """Submit again the tasks without complete results; the tasks submitted (none: nothing missing)."""
    slurm = job["slurm"]
    tasks = tuple(range(int(slurm["shards"])))
    request = BatchRequest(slurm["name"], slurm["job_dir"], tasks, tuple(slurm["command"]), {}, slurm.get("cwd"))
    login = login_session(connector, host)
    missing = missing_tasks(task_records(login, slurm["job_dir"], tasks))
    if not missing:
        return ()
    again = submit(login, _section(connector, host), BatchRequest(request.name, request.job_dir, missing,
                                                                 request.command, request.env, request.cwd),
                   resume=True)
    slurm["array_job_id"], slurm["pending_tasks"] = again.array_job_id, list(missing)
    slurm["submitted_at"] = time.time()
    job["job_id"] = again.array_job_id
    return missing


def cancel_eval(connector: Any, host: str, job: dict) -> None:
    cancel(login_session(connector, host), job["slurm"]["array_job_id"])


def _section(connector: Any, host: str) -> SlurmSection:
    section = connector.inventory.hosts[host].slurm
    if section is None:
        raise InputError(f"{host} has no slurm: section in {connector.inventory.source}")
    return section


def submit_cluster_eval(connector: Any, host: str, run_name: str, argv: list[str], shards: int,
                        env: dict[str, str], events: Events) -> dict:
    """The eval launch on a cluster host (evaluation/operation.py's launch step for it)."""
    if env:
        # A batch script is kept on the shared filesystem and shown by `scontrol show job`: no secret in it.
        raise InputError(f"{host}: {', '.join(sorted(env))} is not passed to cluster jobs (the batch script would "
                         "hold it)", hint="use --reference target on a cluster, or an endpoint without a key")
    from orchestrator.deploy.operation import payload_dir

    inv_host = connector.inventory.hosts[host]
    _section(connector, host)  # a cluster host
    request = eval_request(inv_host.workdir, run_name, argv, payload_dir(inv_host.workdir), shards)
    job = submit_eval(connector, host, request)
    events.info(f"  {host}: Slurm array job {job['job_id']} submitted ({shards} task(s), folder {request.job_dir})")
    return job


def follow_and_collect_cluster(connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
    """Follow each cluster host's array, record every task's Slurm facts, pull the complete tasks and FINISH
    (the eval's merge and report)."""
    jobs = run.record["jobs"]
    run.set(status="running")
    events.step("follow the Slurm array" + (" (Ctrl-C detaches; the job stays queued)" if events.is_terminal else ""))
    failed: list[str] = []
    try:
        for host, job in jobs.items():
            bad = record_tasks(job, follow_cluster(connector, host, job, events))
            _record_times(connector, host, job)
            job["state"] = "failed" if bad else "succeeded"
            if bad:
                failed.append(failure_message(host, bad))
            run.set(jobs=jobs)
    except KeyboardInterrupt:
        run.set(status="detached")
        raise Detached(run) from None
    if failed:
        run.set(status="failed", error="; ".join(failed))
        raise OperationError("; ".join(failed), hint=f"re-run only the failed task(s) with `dfo runs pull {run.name} "
                             "--resume`; each task's log is slurm.log in its folder")
    run.set(status="pulling")
    events.step("pull the tasks' results")
    parts: dict[str, Path] = {}
    merged_jobs: dict[str, dict] = {}
    for host, job in jobs.items():
        parts.update(pull_tasks(connector, host, job, run.path / "hosts", events))
        merged_jobs.update(part_jobs(host, job))
    return finish(run, parts, merged_jobs, jobs, events)


def resume_cluster_run(connector: Any, run: Any, events: Events) -> None:
    """`dfo runs pull RUN --resume`: each cluster job's tasks without complete results, submitted again."""
    jobs = run.record["jobs"]
    for host, job in jobs.items():
        again = resume_eval(connector, host, job)
        events.info(f"  {host}: " + (f"task(s) {', '.join(map(str, again))} submitted again as job {job['job_id']}"
                                     if again else "every task has complete results"))
    run.set(jobs=jobs, status="running", error=None)


def _record_times(connector: Any, host: str, job: dict) -> None:
    """Each task's start and end (its own clock) and its wait since submission, into the job record."""
    slurm = job["slurm"]
    records = task_records(login_session(connector, host), slurm["job_dir"], tuple(range(int(slurm["shards"]))))
    for task, record in records.items():
        entry = slurm["tasks"].get(str(task))
        if entry is None or record.started_at is None:
            continue
        if "started_at" not in entry or entry.get("started_at") != record.started_at:
            entry["queued_s"] = round(record.started_at - float(slurm.get("submitted_at") or record.started_at), 3)
        entry["started_at"], entry["finished_at"] = record.started_at, record.finished_at
