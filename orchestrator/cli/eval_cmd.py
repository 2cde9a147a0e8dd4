"""`dfo eval`: the whole evaluation loop on the eval host(s), ending in a run folder under runs/."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.cli.render import render_run
from orchestrator.core.errors import InputError
from orchestrator.evaluation.operation import Detached, follow_and_collect, reattach_hint, start_eval
from orchestrator.evaluation.plan import EvalRequest, parse_drafter, plan_eval
from orchestrator.evaluation.runs import runs_root


# One parameter per option (typer's style): a long signature, a short body.
@app.command("eval")
def eval_cmd(
    ctx: typer.Context,
    host: list[str] = typer.Option(..., "--host", "-H", metavar="HOST",
                                   help="Eval host (repeatable: the prompts are sharded over the hosts)."),
    target: str = typer.Option(..., "--target", metavar="PATH", help="Target model folder on the eval host(s) (HF format)."),
    drafter: list[str] = typer.Option(..., "--drafter", "-d", metavar="NAME=[HOST:]PATH",
                                      help="Drafter to evaluate (repeatable). A path on another host is relayed; "
                                      "a training checkpoint (*.pt) is stripped of optimizer state there first."),
    prompts: str = typer.Option("builtin", "--prompts", metavar="builtin|FILE", help="'builtin' or a local JSONL file of {id, messages|prompt}."),
    reference: str = typer.Option("target", "--reference", metavar="target|server|vllm|URL",
                                  help="Reference continuations: 'target' (greedy on the eval host), 'server' (the host's serve_url "
                                  "from the inventory, e.g. SGLang), 'vllm' (a vLLM server dfo starts on the eval host, from its "
                                  "engine venv) or an OpenAI-compatible URL as seen from the host."),
    engine: Optional[str] = typer.Option(None, "--engine", metavar="vllm",
                                         help="Also serve the target with each drafter as DFlash speculative config in vLLM "
                                         "on the eval host: engine τ next to offline τ, outputs, tokens/s plain vs dflash "
                                         "(needs `dfo provision --host H --engine vllm`)."),
    device: str = typer.Option("auto", "--device", metavar="auto|cuda|cpu", help="Where the payload runs the models."),
    dtype: str = typer.Option("bfloat16", "--dtype", metavar="DTYPE", help="bfloat16 (default) or float32; float16 is refused."),
    enable_thinking: bool = typer.Option(False, "--enable-thinking/--no-enable-thinking",
                                         help="Chat-template thinking mode; must match the drafter's training."),
    max_new_tokens: int = typer.Option(256, "--max-new-tokens", metavar="N", help="Reference continuation length."),
    samples: Optional[int] = typer.Option(None, "--samples", metavar="N", help="Use the first N prompts."),
    diagnose: bool = typer.Option(False, "--diagnose", help="Add diagnostics (hidden-state stats, pitfall warnings)."),
    online_check: bool = typer.Option(False, "--online-check",
                                      help="Also run the online draft/verify loop and compare it with the offline one."),
    strip_optimizer: Optional[bool] = typer.Option(
        None, "--strip-optimizer/--no-strip-optimizer",
        help="Strip optimizer state before relaying (default: for *.pt/*.pth/*.ckpt/*.bin)."),
    reference_model: Optional[str] = typer.Option(None, "--reference-model", metavar="NAME",
                                                  help="Model name at the endpoint (default: the one it serves). "
                                                  "An API key is read from $DFO_REFERENCE_API_KEY."),
    allow_insecure_reference: bool = typer.Option(
        False, "--allow-insecure-reference",
        help="Allow an http:// reference endpoint that is not on the eval host itself (key sent in clear text)."),
    diagnose_samples: Optional[int] = typer.Option(None, "--diagnose-samples", metavar="N",
                                                   help="Samples whose first rounds --diagnose decodes and probes."),
    expect_p1: list[str] = typer.Option([], "--expect-p1", metavar="[NAME=]P",
                                        help="Position-1 acceptance expected from training metrics; far below "
                                        "it is flagged (repeatable)."),
    tree_k: Optional[int] = typer.Option(None, "--tree-k", metavar="K", help="DDTree-K: top-K depth acceptance (default 8)."),
    tree_budget: Optional[int] = typer.Option(None, "--tree-budget", metavar="N",
                                              help="Budgeted DDTree size in nodes (default 16)."),
    payload_arg: list[str] = typer.Option([], "--payload-arg", metavar="ARG",
                                          help="Extra argument for `python -m remote_payload eval` (repeatable), "
                                          "e.g. --payload-arg=--reference-timeout=300."),
    threads: Optional[int] = typer.Option(None, "--threads", metavar="N",
                                          help="torch CPU threads on the eval host (small models on busy CPUs: 1)."),
    detach: bool = typer.Option(False, "--detach", help="Return once the job runs; collect with `dfo runs pull`."),
    force: bool = typer.Option(False, "--force", help="Start even if another job holds the eval host's GPU lock."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the whole plan; change nothing anywhere."),
    json_out: bool = typer.Option(False, "--json", help="Print the run summary (or the plan) as JSON on stdout."),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", metavar="DIR", help="Where run folders go (default ./runs or $DFO_RUNS_DIR)."),
) -> None:
    """Evaluate drafters against a target on the eval host(s).

    Example: dfo eval --host ct129 --target /data/models/Qwen3.6-27B
    --drafter ours=kpro6:/ckpt/step_20000.pt --drafter zlab=/data/models/Qwen3.6-27B-DFlash
    """
    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    prompts_file, digest = None, None
    if prompts != "builtin":
        prompts_file = Path(prompts)
        if not prompts_file.is_file():
            raise InputError(f"--prompts {prompts!r}: no such local file (or use 'builtin')")
        digest = hashlib.sha256(prompts_file.read_bytes()).hexdigest()
    request = EvalRequest(
        hosts=host, target=target, drafters=[parse_drafter(d, inv) for d in drafter], prompts=prompts,
        reference=reference, device=device, dtype=dtype, enable_thinking=enable_thinking,
        max_new_tokens=max_new_tokens, samples=samples, diagnose=diagnose, online_check=online_check,
        strip_optimizer=strip_optimizer, force=force, threads=threads, tree_k=tree_k, tree_budget=tree_budget,
        diagnose_samples=diagnose_samples, expect_p1=expect_p1, reference_model=reference_model,
        allow_insecure_reference=allow_insecure_reference, payload_args=payload_arg, engine=engine,
    )
    plan = plan_eval(request, inv, prompts_digest=digest)
    if dry_run:
        _print_plan(app_ctx, plan, json_out)
        return
    console = app_ctx.err
    connector = app_ctx.connector
    run = start_eval(connector, plan, runs_dir=runs_root(runs_dir), events=app_ctx.events, prompts_file=prompts_file)
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


def _print_plan(app_ctx: AppContext, plan, json_out: bool) -> None:
    if json_out:
        app_ctx.print_json({"dry_run": True, "plan": json.loads(json.dumps(plan.as_dict(), default=str))})
        return
    out = app_ctx.out
    out.print(Text.assemble(("dfo eval plan", "bold"), " (dry run: nothing is changed)"))
    lines = ["1. check on the hosts that these exist:"]
    lines += [f"     {h}: {p}" for h, paths in plan.checks.items() for p in paths]
    lines += [f"2. deploy remote_payload/ to {', '.join(plan.deploy_hosts)} (only changed files; "
              "`dfo deploy --dry-run` lists them)",
              f"3. provision the venv on {', '.join(plan.provision_hosts)} (skipped when up to date; "
              "`dfo provision --dry-run`)"]
    if plan.relays:
        lines.append("4. relay drafters:")
        lines += [f"     {r.drafter}: {r.source} → {r.destination}"
                  + (" (strip optimizer state on the source first)" if r.strip else "") + f" → {r.lands_at}"
                  for r in plan.relays]
    else:
        lines.append("4. relay: nothing (every drafter is already on the eval host)")
    if plan.request.prompts != "builtin":
        lines.append(f"5. upload prompts {plan.request.prompts}")
    lines.append("6. run as a detached job (then follow, pull, merge, report):")
    lines += [f"     {j.host} (shard {j.shard[0]}/{j.shard[1]}): python -m remote_payload " + " ".join(j.args)
              for j in plan.jobs]
    for line in lines + _engine_plan_lines(plan):
        out.print(Text(line))  # paths and names are printed as they are, never read as markup


def _engine_plan_lines(plan) -> list[str]:
    """The engine steps inside the job (--engine vllm / --reference vllm)."""
    req = plan.request
    if not plan.engine_pythons:
        return []
    venvs = ", ".join(f"{h}: {p}" for h, p in plan.engine_pythons.items())
    lines = [f"   vLLM engine inside the job (engine python {venvs}; must be provisioned: "
             "`dfo provision --host HOST --engine vllm`), servers on the eval host's loopback, stopped by PID:"]
    if req.reference == "vllm":
        lines.append("     - a plain vLLM server (no speculation), started before the target loads: the reference "
                     "continuations" + (" and the baseline tokens/s" if req.engine else ""))
    if req.engine:
        if req.reference != "vllm":
            lines.append("     - after the offline eval, the target freed: a plain vLLM server once (baseline outputs "
                         "and tokens/s)")
        names = ", ".join(d.name for d in req.drafters)
        lines.append(f"     - then one vLLM server per drafter ({names}) with it as DFlash speculative config "
                     "(exported to a z-lab folder when it is not one): engine acceptance vs offline (vllm convention)")
    lines.append("     - vLLM logs in the run folder (hosts/HOST/engine/, copied to logs/)")
    return lines
