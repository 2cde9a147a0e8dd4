"""`dfo lint DRAFTER [--target TARGET]`: the silent τ killers in a drafter's configs and safetensors headers."""

from __future__ import annotations

from typing import Optional

import typer
from rich.text import Text  # fields and messages quote the hosts' files: Text, never markup

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.lint.operation import LintReport, lint_checkpoint, parse_place
from orchestrator.lint.rules import ERROR, INFO, WARNING

STYLE = {ERROR: "red", WARNING: "yellow", INFO: "dim"}


@app.command("lint")
def lint_cmd(
    ctx: typer.Context,
    drafter: str = typer.Argument(..., metavar="DRAFTER", help="The drafter: a z-lab/speculators/stripped folder, "
                                  "one of its .safetensors files, or a training checkpoint (*.pt: its spec.json "
                                  "sidecar is linted). A local path, or HOST:PATH on an inventory host."),
    target: Optional[str] = typer.Option(None, "--target", metavar="TARGET", help="The target model folder (local "
                                         "or HOST:PATH): layer ids, hidden size, vocabulary, mask token, embeddings "
                                         "and precision are checked against it."),
    deep: bool = typer.Option(False, "--deep", help="Also hash the data bytes of the embedding and lm_head tensors "
                              "(only their byte ranges) and compare the drafter's copies with the target's."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the info findings too."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Check a drafter checkpoint before anything moves: reads config JSONs and safetensors headers only.

    Layer ids (unique, in range, their convention against each engine's), fc width, block size, mask token,
    sliding-window keys, weight dtypes and quantization, embedding/lm_head copies, DFlash2 fields and training
    metadata; each finding has a stable code (docs/lint.md). Runs on the host that has the files, in seconds
    for a 17 GB checkpoint. Exit status 1 when a finding is an error.
    """
    app_ctx: AppContext = ctx.obj
    hosts = lambda: app_ctx.inventory.hosts  # noqa: E731 - the inventory is read only for HOST:PATH
    place = parse_place(drafter, hosts, "DRAFTER")
    against = parse_place(target, hosts, "--target") if target else None
    connector = app_ctx.connector if place.host or (against and against.host) else None
    report = lint_checkpoint(connector, place, against, deep=deep)
    if json_out:
        app_ctx.print_json(report.to_json())
    else:
        _render(app_ctx, report, verbose)
    if not report.ok:
        raise typer.Exit(1)


def _render(app_ctx: AppContext, report: LintReport, verbose: bool) -> None:
    out = app_ctx.out
    shown = [f for f in report.findings if verbose or f.severity != INFO]
    out.print(Text(f"dfo lint {report.drafter}" + (f" against {report.target}" if report.target else "")))
    for f in shown:
        line = Text(f"  {f.severity.upper():<7} ", style=STYLE[f.severity])
        line.append(Text(f"[{f.code}] {f.field}: {f.message}"))
        out.print(line)
        out.print(Text(f"          → {f.action}", style="dim"))
    infos = len(report.by(INFO))
    summary = (f"{len(report.by(ERROR))} error(s), {len(report.by(WARNING))} warning(s), {infos} info"
               + ("" if verbose or not infos else " (shown with --verbose)"))
    out.print(Text(summary, style="red" if not report.ok else "green"))
