"""`dfo demo`: the main job end to end on two local sandbox hosts (no real hosts needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.cli.render import render_run
from orchestrator.evaluation.runs import runs_root
from orchestrator.testing.sandbox import SandboxError


@app.command("demo")
def demo_cmd(
    ctx: typer.Context,
    keep: bool = typer.Option(False, "--keep", help="Leave the sandbox hosts running afterwards (prints how to stop them)."),
    root: Optional[Path] = typer.Option(None, "--root", metavar="DIR", help="Sandbox directory (default: a new temporary one)."),
    samples: int = typer.Option(6, "--samples", metavar="N", min=1, help="HumanEval problems to evaluate beside the built-in prompts (z-lab's selection; --engine: the built-in prompts alone)."),
    max_new_tokens: int = typer.Option(96, "--max-new-tokens", metavar="N", min=1,
                                       help="Length of each reference continuation, in tokens."),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", metavar="DIR", envvar="DFO_RUNS_DIR",
                                           help="Where the run folder goes (default ./runs)."),
    json_out: bool = typer.Option(False, "--json", help="Print the run summary as JSON on stdout."),
    watch: bool = typer.Option(False, "--watch", help="Instead: a fake training run on kpro6 followed by `dfo watch` "
                               "(τ over training steps, runs/series/run7/)."),
    engine: Optional[str] = typer.Option(None, "--engine", metavar="NAME", help="Also serve the relayed drafter in this engine on "
                                         "ct129 (vllm: its venv provisioned there, ~650 MiB of wheels once) and show "
                                         "offline and engine τ side by side."),
    cluster: Optional[str] = typer.Option(None, "--cluster", metavar="KIND", help="Run the demo's eval on a sandbox "
                                          "cluster instead (slurm: a real Slurm with ct129 as login node, the eval "
                                          "as a two-task sbatch array, merged, beside the same eval on ct129 alone; "
                                          "needs root and Debian's slurm-wlm and munge)."),
) -> None:
    """Run the whole loop on two local sandbox hosts, no real host needed.

    Starts sandbox hosts kpro6 and ct129 (real sshd, unable to reach each other), builds a tiny target and
    drafters on them, and runs `dfo eval --host ct129` with a checkpoint relayed from kpro6."""
    from orchestrator.core.errors import InputError
    from orchestrator.demo.cluster_story import CLUSTERS
    from orchestrator.demo.engine_story import ENGINES
    from orchestrator.demo.operation import run_demo

    app_ctx: AppContext = ctx.obj
    if engine is not None and engine not in ENGINES:
        raise InputError(f"--engine {engine}: unknown engine", hint=f"choose from {', '.join(ENGINES)}")
    if cluster is not None:
        if cluster not in CLUSTERS:
            raise InputError(f"--cluster {cluster}: unknown cluster kind", hint=f"choose from {', '.join(CLUSTERS)}")
        if engine or watch:
            raise InputError("--cluster with --engine or --watch: choose one demo")
        from orchestrator.testing.slurm import missing_reason

        if reason := missing_reason():
            raise InputError(f"--cluster slurm: {reason}", hint="run as root after scripts/setup.sh")
    if watch:
        if engine:
            raise InputError("--engine and --watch: choose one demo")
        return _watch_demo(app_ctx, root, keep, samples, max_new_tokens, runs_dir)
    try:
        outcome = run_demo(events=app_ctx.events, runs_dir=runs_root(runs_dir), root=root, keep=keep,
                           samples=samples, max_new_tokens=max_new_tokens, engine=engine, cluster=cluster)
    except SandboxError as exc:
        from orchestrator.core.errors import OperationError

        raise OperationError(f"cannot start the sandbox hosts: {exc}",
                             hint="the demo needs root (network namespaces) or falls back to 127.0.0.x; "
                             "install openssh-server and iproute2 (scripts/setup.sh does)") from None
    _finished(app_ctx, outcome)
    render_run(app_ctx, outcome.run, json_out)
    if not json_out:  # τ at T = 0 beside τ at T = 1 (the demo's second, sampled eval); the cards; the cluster's tasks
        for line in (outcome.temperature_lines() + outcome.card_lines()
                     + (outcome.cluster.lines() if outcome.cluster else [])):
            app_ctx.out.print(Text(line))
    if engine and not json_out:
        from orchestrator.demo.engine_story import side_by_side

        for line in side_by_side(outcome.run.results()):
            app_ctx.out.print(Text(line))


def _watch_demo(app_ctx: AppContext, root, keep, samples, max_new_tokens, runs_dir) -> None:
    from orchestrator.cli.series_cmd import render_series
    from orchestrator.demo.watch import run_watch_demo

    outcome = run_watch_demo(events=app_ctx.events, runs_dir=runs_root(runs_dir).resolve(), root=root, keep=keep,
                             samples=samples, max_new_tokens=max_new_tokens)
    _finished(app_ctx, outcome)
    render_series(app_ctx, outcome.folder, outcome.series)


SLURM_NOT_KEPT = ("the sandbox Slurm was stopped (--keep keeps the hosts, not Slurm's daemons): host hpc answers "
                  "over SSH, but its partition is down, so `dfo inventory check --connect` reports it and an eval on "
                  "hpc fails; run `dfo demo --cluster slurm` again for a cluster")


def _finished(app_ctx: AppContext, outcome) -> None:
    app_ctx.err.print(Text.assemble("\n", ("demo finished", "bold green"), f" in {outcome.seconds:.0f}s",
                                    f"; sandbox kept in {outcome.sandbox_root}" if outcome.kept
                                    else "; sandbox hosts stopped"))
    if outcome.kept and getattr(outcome, "cluster", None) is not None:
        # Slurm's daemons live only while the demo runs: the kept hosts answer, the cluster's partition does not.
        app_ctx.err.print(Text(f"  {SLURM_NOT_KEPT}"))
