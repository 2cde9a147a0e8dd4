"""Rendering shared by several commands (eval, runs, demo)."""

from __future__ import annotations

from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.evaluation.report import comparison_lines, engine_lines, summary_table


def render_run(app_ctx: AppContext, run, json_out: bool) -> None:
    results = run.results()
    if json_out:
        drafters = results.get("drafters") if isinstance(results.get("drafters"), dict) else {}
        app_ctx.print_json({"run": run.name, "path": str(run.path), "status": run.status,
                            "drafters": {n: d.get("metrics") if isinstance(d, dict) else None
                                         for n, d in drafters.items()},
                            "comparison": results.get("comparison")})
        return
    app_ctx.out.print(summary_table(results, title=f"run {run.name}"))
    for line in comparison_lines(results) + engine_lines(results):  # they quote the host's names: Text
        app_ctx.out.print(Text(f"  {line}"))
    app_ctx.out.print(Text(f"run folder: {run.path}  (report.md, results.json, samples.jsonl, plots, logs/)"))
