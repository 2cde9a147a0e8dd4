"""`dfo demo`: the main job end to end on two local sandbox hosts (no real hosts needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.cli.render import render_run
from orchestrator.evaluation.runs import runs_root
from orchestrator.testing.sandbox import SandboxError


@app.command("demo")
def demo_cmd(
    ctx: typer.Context,
    keep: bool = typer.Option(False, "--keep", help="Leave the sandbox hosts running afterwards (prints how to stop them)."),
    root: Optional[Path] = typer.Option(None, "--root", help="Sandbox directory (default: a new temporary one)."),
    samples: int = typer.Option(6, "--samples", help="Prompts to evaluate."),
    max_new_tokens: int = typer.Option(96, "--max-new-tokens"),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", help="Where the run folder goes (default ./runs)."),
    json_out: bool = typer.Option(False, "--json", help="Print the run summary as JSON on stdout."),
    watch: bool = typer.Option(False, "--watch", help="Instead: a fake training run on kpro6 followed by `dfo watch` "
                               "(τ over training steps, runs/series/run7/)."),
) -> None:
    """Start sandbox hosts kpro6 and ct129 (real sshd, unable to reach each other), build a tiny target and
    drafters on them, and run `dfo eval --host ct129` with a checkpoint relayed from kpro6."""
    from orchestrator.demo.operation import run_demo

    app_ctx: AppContext = ctx.obj
    if watch:
        return _watch_demo(app_ctx, root, keep, samples, max_new_tokens, runs_dir)
    try:
        outcome = run_demo(events=app_ctx.events, runs_dir=runs_root(runs_dir), root=root, keep=keep,
                           samples=samples, max_new_tokens=max_new_tokens)
    except SandboxError as exc:
        from orchestrator.core.errors import OperationError

        raise OperationError(f"cannot start the sandbox hosts: {exc}",
                             hint="the demo needs root (network namespaces) or falls back to 127.0.0.x; "
                             "install openssh-server and iproute2 (scripts/setup.sh does)") from None
    app_ctx.err.print(f"\n[bold green]demo finished[/] in {outcome.seconds:.0f}s"
                      + (f"; sandbox kept in {outcome.sandbox_root}" if outcome.kept else "; sandbox hosts stopped"))
    render_run(app_ctx, outcome.run, json_out)


def _watch_demo(app_ctx: AppContext, root, keep, samples, max_new_tokens, runs_dir) -> None:
    from orchestrator.cli.series_cmd import render_series
    from orchestrator.demo.watch import run_watch_demo

    outcome = run_watch_demo(events=app_ctx.events, runs_dir=runs_root(runs_dir).resolve(), root=root, keep=keep,
                             samples=samples, max_new_tokens=max_new_tokens)
    app_ctx.err.print(f"\n[bold green]demo finished[/] in {outcome.seconds:.0f}s"
                      + (f"; sandbox kept in {outcome.sandbox_root}" if outcome.kept else "; sandbox hosts stopped"))
    render_series(app_ctx, outcome.folder, outcome.series)
