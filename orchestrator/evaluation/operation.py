"""`dfo eval`: the whole loop on the eval host(s), from inputs to a run folder you can read.

validate → check inputs on the hosts (before anything heavy) → deploy the payload → provision the venv
→ relay drafters that live elsewhere → submit the eval's job per host (prompts sharded) where the inventory
says the host runs jobs (orchestrator/executors/) → follow its progress → collect the results (hash-verified)
→ merge → report. Ctrl-C while following detaches: the remote job keeps running and `dfo runs pull RUN` picks
it up later.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.core.atomic_file import write_text_atomic
from orchestrator.core.errors import DfoError, HostError, InputError, OperationError
from orchestrator.core.events import Events
from orchestrator.core.host_text import decode_json
from orchestrator.deploy.manifest import default_payload_root
from orchestrator.deploy.operation import deploy
from orchestrator.evaluation.engine_merge import merge_engine
from orchestrator.evaluation.k_schedule import k_plans
from orchestrator.evaluation.merge import merge_host_results
from orchestrator.evaluation.plan import EvalPlan
from orchestrator.evaluation.prepare import (
    HOST_SCRIPT,
    jsonable,
    raise_failures,
    relay_drafters,
    upload_datasets,
    upload_prompts,
)
from orchestrator.evaluation.profile import write_profiles
from orchestrator.evaluation.report import drafter_rows, write_report
from orchestrator.evaluation.runs import Run, new_run, write_json_atomic
from orchestrator.executors import registry as executors
from orchestrator.executors.base import Detached, reattach_hint  # noqa: F401 (the CLI knows them as the eval's)
from orchestrator.jobs.operation import (
    DEFAULT_LOCK,
    JobRefused,
    lock_status,
)
from orchestrator.lint.operation import lint_before_eval
from orchestrator.provision.operation import provision_hosts
from orchestrator.relay.strip import Stripper
from orchestrator.transport import Connector, for_each_host, hostcall
from orchestrator.transport.hostlock import host_lock
from remote_payload.eval.options import parse_named

MIN_FREE_BYTES = 2 * 2**30  # results are small, but the feature cache of a real target is not
# What the pre-flight found in a --dataset-file that holds no rows (host_script.py's codes), as the error says it.
NO_ROWS = {
    "folder-empty": "is a folder with no rows file in it (.jsonl, .json, .jsonl.gz, .json.gz, .parquet or .arrow; "
                    "also looked in its subfolders: CONFIG/, snapshots/REV/)",
    "gzip-unreadable": "is not a readable gzip file",
    "gzip-empty": "holds no rows: a gzip file that decompresses to nothing but whitespace",
    "blank": "holds no rows: only blank lines",
    "empty-array": "holds no rows: an empty JSON array",
}


# ------------------------------------------------------------------------------ pre-flight


def preflight(connector: Connector, plan: EvalPlan) -> dict[str, dict]:
    """Check every input path exists where it should, free disk, and GPUs when --device cuda.

    Runs before any upload or relay. Missing inputs are bad input (exit 2); unreachable hosts fail the
    operation (exit 1).
    """
    eval_hosts = set(plan.provision_hosts)
    datasets = {posixpath.normpath(path): name for name, path in parse_named(plan.request.dataset_files,
                                                                              "--dataset-file")}

    def check(host: str) -> dict[str, Any]:
        inv_host = connector.inventory.hosts[host]
        paths = plan.checks.get(host, [])
        reply = hostcall.call(connector.session(host), HOST_SCRIPT, "input_facts", python=inv_host.python,
                              timeout=120, paths=paths, workdir=inv_host.workdir if host in eval_hosts else None,
                              list_gpus=host in eval_hosts and plan.request.device == "cuda",
                              rows=[p for p in paths if p in datasets])
        return _input_facts(host, reply, paths)

    outcomes = for_each_host(list(plan.checks), check)
    failures = [o for o in outcomes.values() if not o.ok]
    if failures:
        raise OperationError("cannot check the inputs on every host:\n" +
                             "\n".join(f"  {o.error}" for o in failures))
    problems = []
    role = {plan.request.target: "target"}
    for d in plan.request.drafters:
        role[d.path] = f"drafter '{d.name}'"
    role.update({path: f"--dataset-file {name}" for path, name in datasets.items()})
    for host, o in outcomes.items():
        facts = o.result
        for path in facts["missing"]:
            if path == plan.engine_pythons.get(host):
                problems.append(f"{host}: the vLLM engine venv is not provisioned ({path} does not exist); build it "
                                f"with `dfo provision --host {host} --engine vllm`")
                continue
            problems.append(f"{host}: {role.get(path, 'input')} {path} does not exist")
        for path in facts["empty"]:  # an empty rows file would fail only after the deploy
            if path in datasets:
                problems.append(f"{host}: {role[path]} {path} is empty")
        for path, found in facts["no_rows"].items():
            problems.append(f"{host}: {role[path]} {path} {NO_ROWS[found]}")
        free = facts.get("free_bytes")
        if free is not None and free < MIN_FREE_BYTES:
            problems.append(f"{host}: only {free / 2**30:.1f} GiB free at {connector.inventory.hosts[host].workdir} "
                            f"(need at least {MIN_FREE_BYTES / 2**30:.0f} GiB)")
        if plan.request.device == "cuda" and host in eval_hosts and not facts.get("gpus"):
            problems.append(f"{host}: --device cuda but nvidia-smi lists no GPU")
    if problems:
        raise InputError("inputs are not ready; nothing was uploaded or relayed:\n" +
                         "\n".join(f"  {p}" for p in problems),
                         hint="fix the paths (they are paths on the named host) and run again")
    return {h: o.result for h, o in outcomes.items()}


def _input_facts(host: str, reply: object, paths: list[str]) -> dict[str, Any]:
    """input_facts's reply, checked: a host names only paths it was asked about, counts are counts."""
    if not isinstance(reply, dict) or not isinstance(reply.get("missing"), list):
        raise HostError(host, f"input_facts: unexpected reply from the host: {str(reply)[:200]}")
    facts: dict[str, Any] = {"missing": [p for p in paths if p in reply["missing"]]}
    empty = reply.get("empty")
    facts["empty"] = [p for p in paths if p in empty] if isinstance(empty, list) else []
    no_rows = reply.get("no_rows")  # codes only: the host's words never reach the message
    facts["no_rows"] = {p: no_rows[p] for p in paths if isinstance(no_rows, dict) and no_rows.get(p) in NO_ROWS}
    if "free_bytes" in reply:
        free = reply["free_bytes"]
        facts["free_bytes"] = free if isinstance(free, int) and not isinstance(free, bool) and free >= 0 else None
    if "gpus" in reply:
        gpus = reply["gpus"]
        facts["gpus"] = [g[:200] for g in gpus if isinstance(g, str)] if isinstance(gpus, list) else []
    return facts


# ------------------------------------------------------------------------------ preparation


def _prepare_hosts(connector: Connector, plan: EvalPlan, events: Events) -> dict[str, str]:
    """Deploy + provision the eval hosts; returns host -> venv python."""
    events.step(f"deploy the payload to {', '.join(plan.deploy_hosts)}")
    outcomes = deploy(connector, plan.deploy_hosts, root=default_payload_root(), events=events)
    raise_failures("deploy", outcomes)
    for h, o in outcomes.items():
        r = o.result
        events.info(f"  {h}: {r.status} ({r.release}, {r.uploaded_files} file(s) uploaded)")
    events.step(f"provision the venv on {', '.join(plan.provision_hosts)}")
    prov = provision_hosts(connector, plan.provision_hosts, events=events)
    raise_failures("provision", prov)
    for h, p in prov.items():
        events.info(f"  {h}: {p.result.status} ({p.result.flavour}, {p.result.python})")
    return {h: p.result.python for h, p in prov.items()}


# ------------------------------------------------------------------------------ the run


def start_eval(
    connector: Connector,
    plan: EvalPlan,
    *,
    runs_dir: Path,
    events: Events,
    prompts_file: Path | None = None,
    stripper: Stripper | None = None,
    shards: int = 1,
) -> Run:
    """Everything up to and including the launch of the remote jobs; returns the run (status running).
    STRIPPER: a resident strip worker that strips the drafters relayed with --strip-optimizer (dfo watch)."""
    events.step("check inputs on the hosts")
    preflight(connector, plan)
    lint_before_eval(connector, plan, events)  # errors stop here: nothing deployed, relayed or started yet
    with contextlib.ExitStack() as held:
        # Each host's lock for the whole start (deploy, provision, launch), and a GPU lock that a running
        # job holds refuses the run before the payload or the venv changes under that job.
        for host in sorted(set(plan.deploy_hosts) | set(plan.provision_hosts)):
            for notice in held.enter_context(host_lock(connector, host, "start an eval")):
                events.warn(notice)
        _refuse_busy_hosts(connector, plan)
        return _start_locked(connector, plan, runs_dir=runs_dir, events=events, prompts_file=prompts_file,
                             stripper=stripper, shards=shards)


def _refuse_busy_hosts(connector: Connector, plan: EvalPlan) -> None:
    if plan.request.force:
        return
    for job in plan.jobs:
        status = lock_status(connector, job.host, DEFAULT_LOCK)
        if status.get("holder") and status.get("state") in ("starting", "running"):
            raise JobRefused(job.host, dict(status["holder"], state=status["state"]), DEFAULT_LOCK)


def _start_locked(connector: Connector, plan: EvalPlan, *, runs_dir: Path, events: Events,
                  prompts_file: Path | None, stripper: Stripper | None, shards: int = 1) -> Run:
    pythons = _prepare_hosts(connector, plan, events)
    relays = relay_drafters(connector, plan, events, stripper)
    if prompts_file is not None:
        events.step(f"upload prompts {prompts_file}")
        upload_prompts(connector, plan, prompts_file)
    if any(j.uploads for j in plan.jobs):
        events.step("upload dataset files (rows the packages ship, read here)")
        upload_datasets(connector, plan)
    run = new_run(runs_dir, plan.provision_hosts, {
        "request": jsonable(asdict(plan.request)), "plan": jsonable(plan.as_dict()), "relays": relays,
        "jobs": {},
    })
    events.step(f"launch the eval job on {', '.join(plan.provision_hosts)}")
    jobs: dict[str, dict] = {}
    try:
        for job in plan.jobs:
            argv = [pythons[job.host], "-m", "remote_payload", *job.args]
            place = executors.for_host(connector.inventory.hosts[job.host])  # an SSH host's job, a cluster's array
            jobs[job.host] = place.submit(connector, job, run.name, argv, shards=shards, env=_job_env(),
                                          events=events, force=plan.request.force)
            run.set(jobs=jobs, status="running")
    except DfoError as exc:
        run.set(jobs=jobs, status="failed", error=str(exc))
        raise
    return run


def _job_env() -> dict[str, str]:
    # The endpoint's API key travels in the job's environment (a 0600 file on the host), never in argv,
    # run.json or logs.
    key = os.environ.get("DFO_REFERENCE_API_KEY")
    return {"DFO_REFERENCE_API_KEY": key} if key else {}


def follow_and_collect(connector: Connector, run: Run, *, events: Events) -> Run:
    """Follow every job of ``run`` to its end, pull and merge the results, write the report.

    Raises Detached on Ctrl-C (jobs keep running), OperationError when a job failed (the run folder is
    marked failed and holds the log).
    """
    jobs = run.record.get("jobs", {})
    if not jobs:
        raise InputError(f"run {run.name} has no remote jobs to follow (status {run.status})")
    return executors.for_run(run).follow_and_collect(connector, run, events=events, finish=finish_run)


def finish_run(run: Run, parts: dict[str, Path], part_jobs: dict[str, dict], jobs: dict, events: Events) -> Run:
    """Merge the pulled parts (one per host, or per cluster task) into the run folder and report it."""
    results, samples = merge_host_results(parts, part_jobs)
    for key, job in part_jobs.items():  # what the place recorded of each part (a cluster task: its job id, node)
        results["hosts"][key].update(executors.for_job(job).part_facts(job))
    if len(parts) > 1:
        _merge_engine(results, parts, samples)
    body = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in samples)
    write_text_atomic(run.path / "samples.jsonl", body)
    results["run"] = {"name": run.name, "hosts": list(jobs), "request": run.record.get("request"),
                      "relays": run.record.get("relays"), "jobs": jobs}
    results["k_plans"] = k_plans(results, samples)
    write_report(run.path, results, samples)
    no_profile: list[str] = []
    write_profiles(run.path, results, samples, no_profile)
    for reason in no_profile:
        events.warn(f"no speculation profile: {reason}")
    write_json_atomic(run.results_path, results)  # last: its presence means the run is complete
    run.set(status="succeeded", error=None)
    events.success(result_line(results, run.path))
    return run


def result_line(results: dict, run_path: Path) -> str:
    """The run in one line for the progress output: each drafter's headline τ and the run folder."""
    taus = [f"{r['drafter']} τ {_tau(r['tau_macro'])}" for r in drafter_rows(results)]
    try:
        shown = run_path.relative_to(Path.cwd())
    except ValueError:
        shown = run_path
    return f"result: {', '.join(taus) or 'no drafter figures'} → {shown}"


def _tau(value: Any) -> str:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # NaN: not a figure
    return f"{value:.2f}" if ok else "?"


def _merge_engine(results: dict, parts: dict[str, Path], samples: list[dict]) -> None:
    """A sharded run's engine figures over all samples (each host ran its own servers)."""
    host_results = {h: decode_json((p / "results.json").read_text(encoding="utf-8")) for h, p in parts.items()}
    run, drafters = merge_engine(host_results, samples)
    if run is None:
        return
    results["engine"] = run
    for name, block in drafters.items():
        results.setdefault("drafters", {}).setdefault(name, {})["engine"] = block


def wait_and_collect(connector: Connector, run: Run, *, events: Events, resume: bool = False) -> Run:
    """`dfo runs pull`: follow what is still running, then collect. RESUME: first submit again the parts without
    complete results (where the place can)."""
    place = executors.for_run(run)
    if resume:
        place.resume(connector, run, events=events)
        return follow_and_collect(connector, run, events=events)
    return place.reattach(connector, run, events=events, finish=finish_run)
