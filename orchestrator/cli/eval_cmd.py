"""`dfo eval`: the whole evaluation loop on the eval host(s), ending in a run folder under runs/."""

from __future__ import annotations

import json
import shlex
from typing import Optional

import typer
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.eval_options import DECLARED, read_prompts, with_eval_options
from orchestrator.cli.main import app
from orchestrator.cli.render import render_run
from orchestrator.core.errors import InputError
from orchestrator.core.local_checks import writable_folder
from orchestrator.core.units import human_duration
from orchestrator.evaluation.decode_cost import (
    TAIL_ESTIMATE,
    decode_rates,
    read_gpu_check,
    reference_cost,
    rows_per_host,
)
from orchestrator.evaluation.operation import Detached, follow_and_collect, reattach_hint, start_eval
from orchestrator.evaluation.plan import EvalRequest, card_prompts, eval_hosts, hosts_used, parse_drafter, plan_eval
from orchestrator.evaluation.runs import runs_root
from remote_payload.engines import registry as engine_registry
from remote_payload.eval.options import EVAL


# The command's own options here; the eval options are declared once (remote_payload/eval/options.py) and
# stand in at options=DECLARED.
@app.command("eval")
@with_eval_options(EVAL)
def eval_cmd(
    ctx: typer.Context,
    host: list[str] = typer.Option([], "--host", "-H", metavar="HOST",
                                   help="Eval host (repeatable: the prompts are sharded over the hosts). Default: "
                                   "every inventory host with the eval role (roles: [eval])."),
    drafter: list[str] = typer.Option(..., "--drafter", "-d", metavar="NAME=[HOST:]PATH",
                                      help="Drafter to evaluate (repeatable). A path on another host is relayed; "
                                      "a training checkpoint (*.pt) is stripped of optimizer state there first."),
    options: dict = DECLARED,
    detach: bool = typer.Option(False, "--detach", help="Return once the job runs; collect with `dfo runs pull`."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check every option and print the whole plan; connect to "
                                 "no host, change nothing anywhere."),
    json_out: bool = typer.Option(False, "--json", help="Print the run summary (or the plan) as JSON on stdout."),
    shards: int = typer.Option(1, "--shards", metavar="N", help="On a Slurm cluster host (slurm: in the inventory): "
                               "one array job of N tasks, each on its share of the prompts (docs/clusters.md)."),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", metavar="DIR", help="Where run folders go (default ./runs or $DFO_RUNS_DIR)."),
) -> None:
    """Evaluate drafters against a target on the eval host(s).

    Example: dfo eval --host ct129 --target /data/models/Qwen3.6-27B
    --drafter ours=kpro6:/ckpt/step_20000.pt --drafter zlab=/data/models/Qwen3.6-27B-DFlash
    """
    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    # Every check that needs no host comes first: a bad value never waits for a deploy or a relay.
    prompts = read_prompts(card_prompts(options.get("card"), options["prompts"]))
    request = EvalRequest(hosts=eval_hosts(host, inv), drafters=[parse_drafter(d, inv) for d in drafter],
                          **{**options, "prompts": prompts.spec})
    plan = plan_eval(request, inv, prompts_digest=prompts.digest, prompt_count=prompts.count)
    for name in hosts_used(request):
        inv.host_env(name)  # an unset ${VAR} in a host's env is refused now, not at job launch after a relay
    cluster = _cluster_host(inv, request, shards, prompts.count)
    writable_folder(runs_root(runs_dir), "--runs-dir")  # where the run folder goes: checked before anything moves
    if dry_run:
        _print_plan(app_ctx, plan, json_out, shards if cluster else None)
        if cluster and not json_out:
            app_ctx.out.print(Text(_cluster_script(inv, cluster, plan, shards, len(plan_steps(plan, shards)) + 1)))
        return
    console = app_ctx.err
    connector = app_ctx.connector
    run = start_eval(connector, plan, runs_dir=runs_root(runs_dir), events=app_ctx.events, prompts_file=prompts.file,
                     shards=shards)
    if detach:
        run.set(status="detached")
        console.print(Text.assemble(("detached", "green"), f": run folder {run.path}\n  {reattach_hint(run)}"))
        if json_out:
            app_ctx.print_json({"run": run.name, "path": str(run.path), "status": run.status,
                                "jobs": run.record["jobs"]})
        return
    try:
        follow_and_collect(connector, run, events=app_ctx.events)
    except Detached:
        console.print(Text.assemble("\n", ("detached", "yellow"), f" (Ctrl-C): {reattach_hint(run)}"))
        raise typer.Exit(130) from None
    render_run(app_ctx, run, json_out)


def _cluster_host(inv, request, shards: int, prompt_count: int | None) -> str | None:
    """The Slurm cluster host the eval runs on (alone), or None; --shards is for a cluster host only."""
    hosts = request.hosts
    clusters = [h for h in hosts if inv.hosts[h].slurm is not None]
    if not clusters:
        if shards != 1:
            raise InputError(f"--shards {shards}: none of {', '.join(hosts)} is a Slurm cluster (no slurm: section)",
                             hint="to shard over SSH hosts, repeat --host")
        return None
    if len(hosts) > 1:
        raise InputError(f"{clusters[0]} is a Slurm cluster: evaluate on it alone (--host {clusters[0]} --shards N)")
    from orchestrator.cluster.eval_run import check_cluster_eval

    check_cluster_eval(inv, clusters[0], shards, request, prompt_count,
                       relays=any(d.host and d.host != clusters[0] for d in request.drafters))
    return clusters[0]


def _cluster_script(inv, host: str, plan, shards: int, step: int) -> str:
    """The batch script `dfo eval --dry-run` shows for a cluster host (the run's name is known at submission)."""
    from orchestrator.cluster.eval_run import eval_request
    from orchestrator.cluster.plan import batch_script
    from orchestrator.deploy.operation import payload_dir

    h = inv.hosts[host]
    argv = [f"{h.venv}/bin/python", "-m", "remote_payload", *plan.jobs[0].args]
    request = eval_request(h.workdir, "RUN", argv, payload_dir(h.workdir), shards)
    engine = ("   each task starts its own engine server on its compute node's loopback: the port picked free "
              "there, the key drawn there (neither is in this script)\n") if plan.engine_pythons else ""
    return f"{step}. on {host}: sbatch this batch script ({shards} array task(s)):\n{engine}" + batch_script(h.slurm, request)


def _print_plan(app_ctx: AppContext, plan, json_out: bool, cluster_shards: int | None = None) -> None:
    if json_out:
        app_ctx.print_json({"dry_run": True, "plan": json.loads(json.dumps(plan.as_dict(), default=str))})
        return
    out = app_ctx.out
    out.print(Text.assemble(("dfo eval plan", "bold"), " (dry run: nothing is changed)"))
    for line in plan_lines(plan, cluster_shards) + _cost_lines(app_ctx, plan):
        out.print(Text(line))  # paths and names are printed as they are, never read as markup


def plan_steps(plan, cluster_shards: int | None = None) -> list[list[str]]:
    """The plan's steps (each a title line and its detail lines), in order; a step that does not apply is left
    out, so the numbers never skip. ``cluster_shards``: the eval is one Slurm array of that many tasks, whose
    batch script is the step after these."""
    steps: list[list[str]] = [["check on the hosts that these exist:",
                               *[f"     {h}: {p}" for h, paths in plan.checks.items() for p in paths]],
                              [f"deploy remote_payload/ to {', '.join(plan.deploy_hosts)} (only changed files; "
                               "`dfo deploy --dry-run` lists them)"],
                              [f"provision the venv on {', '.join(plan.provision_hosts)} (skipped when up to date; "
                               "`dfo provision --dry-run`)"]]
    if plan.relays:
        steps.append(["relay drafters:", *[f"     {r.drafter}: {r.source} → {r.destination}"
                                           + (" (strip optimizer state on the source first)" if r.strip else "")
                                           + f" → {r.lands_at}" for r in plan.relays]])
    else:
        steps.append(["relay: nothing (every drafter is already on the eval host)"])
    if plan.request.prompts != "builtin":
        steps.append([f"upload prompts {plan.request.prompts}"])
    if cluster_shards is not None:
        steps.append([f"run as one Slurm array of {cluster_shards} task(s) on {plan.jobs[0].host}, each task on its "
                      f"share of the prompts, by the batch script of step {len(steps) + 2} (then follow, pull, "
                      "merge, report)"])
    else:
        steps.append(["run as a detached job (then follow, pull, merge, report):",
                      *[f"     {j.host} (shard {j.shard[0]}/{j.shard[1]}): python -m remote_payload "
                        + shlex.join(j.args) for j in plan.jobs]])
    steps[-1] += [f"   per drafter and sample: {BY_K_PASSES}", *[f"   {line}" for line in plan.card]]
    return steps


def plan_lines(plan, cluster_shards: int | None = None) -> list[str]:
    """The plan as numbered lines, then the engine's steps inside the job."""
    lines = [f"{n}. {line}" if i == 0 else line
             for n, step in enumerate(plan_steps(plan, cluster_shards), 1) for i, line in enumerate(step)]
    return lines + _engine_plan_lines(plan)


def _cost_lines(app_ctx: AppContext, plan) -> list[str]:
    """The reference stage's expected cost on each eval host, from its GPU check's figures (inventory
    ``gpu_check:``), or why there is none."""
    req = plan.request
    if req.reference != "target":
        return []
    inv = app_ctx.inventory
    rows = rows_per_host(plan.prompt_count, len(plan.jobs), req.samples_per_prompt)
    what = "draws" if (req.temperature or 0) > 0 else "references"
    lines = [f"   expected cost of the reference stage ({what}, --decode-batch {req.decode_batch or 'auto'}):"]
    for job in plan.jobs:
        figures, problem = read_gpu_check(inv, job.host)
        cost = reference_cost(decode_rates(figures), rows or 0, req.max_new_tokens, TAIL_ESTIMATE,
                              req.decode_batch) if figures is not None else None
        if cost is None:
            lines.append(f"     {job.host}: {problem or 'its GPU check measured no decode rate'}")
            continue
        lines.append(f"     {job.host}: at most {human_duration(cost['seconds'])} ({cost['rows']} rows × "
                     f"{req.max_new_tokens} + {TAIL_ESTIMATE} tokens at {cost['tokens_per_s']:,.0f} tok/s, batch "
                     f"{cost['batch']}, from its GPU check; every answer at max-new, prefills left out)")
    return lines


# What accept_length_by_k costs beside the full-block draft pass (docs/profiles.md, benchmarks/by_k_cost.py).
BY_K_PASSES = ("one batched draft pass at the full block B, then B - 2 more at K + 1 rows (K = 1 .. B - 2, the block "
               "an engine plans at K drafts) for accept_length_by_k: 3.4x the rows at B = 8, 7.4x at B = 16 "
               "(measured on the CPU fixtures: 2.3-3.7x the full pass's time)")


def _engine_plan_lines(plan) -> list[str]:
    """The engine steps inside the job (--engine vllm / --reference vllm)."""
    req = plan.request
    if not plan.engine_pythons:
        return []
    venvs = ", ".join(f"{h}: {p}" for h, p in plan.engine_pythons.items())
    engine = req.engine or req.reference
    title = engine_registry.get(engine_registry.split_engine(engine)[0]).title  # vllm@0.31.0: vllm's
    lines = [f"   {title} engine inside the job (engine python {venvs}; must be provisioned: "
             f"`dfo provision --host HOST --engine {engine}`), servers on the eval host's loopback, stopped by PID:"]
    if req.reference == engine:
        lines.append(f"     - a plain {title} server (no speculation), started before the target loads: the reference "
                     "continuations" + (" and the baseline tokens/s" if req.engine else ""))
    if req.engine:
        if req.reference != engine:
            lines.append(f"     - after the offline eval, the target freed: a plain {title} server once (baseline "
                         "outputs and tokens/s)")
        names = ", ".join(d.name for d in req.drafters)
        lines.append(f"     - then one {title} server per drafter ({names}) with it as DFlash speculative config "
                     "(exported to a z-lab folder when it is not one): engine acceptance vs offline (vllm convention)")
        if req.engine_k:
            lines.append(f"     - one more {title} server per drafter and --engine-k K ({req.engine_k}): tokens/s at K "
                         "and the engine's acceptance at K beside the profile's accept_length_by_k[K] and its CI")
    lines.append(f"     - {title} logs in the run folder (hosts/HOST/engine/, copied to logs/)")
    return lines
