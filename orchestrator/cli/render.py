"""Rendering shared by several commands (eval, runs, demo)."""

from __future__ import annotations

from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.core import plotting
from orchestrator.evaluation.card_report import card_lines
from orchestrator.evaluation.report import comparison_lines, engine_lines, summary_table
from orchestrator.ui.fold import Folded

RUN_FILES = ("report.md", "results.json", "samples.jsonl", "acceptance.png", "tau_histogram.png", "tau_by_depth.png",
             "logs/")


def render_run(app_ctx: AppContext, run, json_out: bool) -> None:
    results = run.results()
    if json_out:
        drafters = results.get("drafters") if isinstance(results.get("drafters"), dict) else {}
        app_ctx.print_json({"run": run.name, "path": str(run.path), "status": run.status,
                            "drafters": {n: d.get("metrics") if isinstance(d, dict) else None
                                         for n, d in drafters.items()},
                            "comparison": results.get("comparison")})
        return
    app_ctx.out.print(Folded(summary_table(results, title=f"run {run.name}")))  # folds on a narrow terminal
    for line in card_lines(results) + comparison_lines(results) + engine_lines(results):  # host names: Text
        app_ctx.out.print(Text(f"  {line}"))
    # The files that are there: without matplotlib there are no PNGs, and the summary says so once.
    made = [f for f in RUN_FILES if (run.path / f.rstrip("/")).exists()]
    app_ctx.out.print(Text(f"run folder: {run.path}  ({', '.join(made)})"))
    if not any(f.endswith(".png") for f in made) and not plotting.available():
        app_ctx.err.print(Text.assemble(("note:", "yellow"), f" {plotting.MISSING}; install it: {plotting.install_line()}"))
