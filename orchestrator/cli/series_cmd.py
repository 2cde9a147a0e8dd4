"""`dfo series …`: the series `dfo watch` keeps under runs/series/: list, show, plot."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.core import plotting
from orchestrator.core.errors import InputError
from orchestrator.core.host_text import fmt_number
from orchestrator.evaluation.runs import named_runs_root, runs_root
from orchestrator.watch import series as series_state
from orchestrator.watch import supervisor
from orchestrator.watch.plot import write_plot
from orchestrator.watch.proxy_step import source_text
from orchestrator.watch.render import alert_texts, fmt_ci, proxy_value, series_markdown, summary_text, verdict_cell

SHOW_LAST = 30  # rows `series show` prints unless --all / --last N

series_app = typer.Typer(help="Series of checkpoint evals kept by `dfo watch` (runs/series/NAME/).",
                         no_args_is_help=True)
app.add_typer(series_app, name="series")

RunsDir = typer.Option(None, "--runs-dir", metavar="DIR", envvar="DFO_RUNS_DIR",
                       help="Where run folders are; series are under DIR/series (default ./runs).")
NAME_ARG = typer.Argument(..., metavar="NAME", help="The series (its folder's name under runs/series/).")


def _load(runs_dir: Optional[str], name: str) -> tuple:
    folder = series_state.series_dir(runs_root(runs_dir), name)
    found = series_state.load_series(folder)
    if found is None:
        known = [p.name for p in sorted(series_state.series_root(runs_root(runs_dir)).glob("*")) if (p / "series.json").is_file()]
        raise InputError(f"no series {name!r} in {folder.parent}/",
                         hint=("known series: " + ", ".join(known)) if known else "start one with `dfo watch`")
    return folder, found


@series_app.command("list")
def list_cmd(ctx: typer.Context, runs_dir: Optional[str] = RunsDir,
             json_out: bool = typer.Option(False, "--json", help="Print the list as JSON on stdout.")) -> None:
    """Every series with its source, checkpoints evaluated/failed and the latest τ.

    A series whose series.json cannot be read is listed as unreadable, with its path and what is wrong."""
    app_ctx: AppContext = ctx.obj
    rows: list[dict] = []
    for folder in sorted(series_state.series_root(named_runs_root(runs_dir)).glob("*")):
        try:
            doc = series_state.load_series(folder) if (folder / "series.json").is_file() else None
        except InputError as exc:  # one damaged series: say so and list the others
            rows.append({"series": folder.name, "error": exc.message})
            continue
        if doc is None:
            continue
        pts = series_state.points(doc)
        rows.append({"series": doc["name"], "source": doc["source"], "eval_host": doc["eval_host"],
                     "evaluated": len(pts), "failed": len(series_state.failures(doc)),
                     "last_step": pts[-1]["step"] if pts else None,
                     "last_tau_macro": pts[-1]["tau_macro"]["value"] if pts else None,
                     "watcher": supervisor.running_pid(folder), "updated_utc": doc["updated_utc"]})
    if json_out:
        app_ctx.print_json({"series": rows})
        return
    table = Table("series", "source", "eval host", "evaluated", "failed", "last step", "τ macro", "supervisor")
    for r in rows:
        if "error" in r:
            table.add_row(Text(r["series"]), Text("unreadable", style="red"), *[""] * 6)
            continue
        cells = (r["series"], r["source"], r["eval_host"], r["evaluated"], r["failed"], r["last_step"] or "–",
                 fmt_number(r["last_tau_macro"]), r["watcher"] or "–")
        table.add_row(*(Text(str(cell)) for cell in cells))
    app_ctx.out.print(table)
    for r in rows:
        if "error" in r:
            app_ctx.err.print(Text.assemble(("unreadable:", "red"), f" {r['error']}"))


@series_app.command("show")
def show_cmd(ctx: typer.Context, name: str = NAME_ARG, runs_dir: Optional[str] = RunsDir,
             last: int = typer.Option(SHOW_LAST, "--last", metavar="N", min=1,
                                      help="Rows for the latest N checkpoints (the summary covers all)."),
             show_all: bool = typer.Option(False, "--all", help="A row for every checkpoint."),
             json_out: bool = typer.Option(False, "--json", help="Print the whole series (series.json with its "
                                           "journal replayed) on stdout.")) -> None:
    """One series: a summary (counts, best, latest), then the latest checkpoints by step with τ, DDTree-8, CIs
    and the verdict; baselines; failures."""
    app_ctx: AppContext = ctx.obj
    folder, doc = _load(runs_dir, name)
    if json_out:
        app_ctx.print_json(series_state.public(doc))
        return
    render_series(app_ctx, folder, doc, last=None if show_all else last)


def render_series(app_ctx: AppContext, folder, doc: dict, *, last: int | None = None) -> None:
    """The summary, the series table (one row per checkpoint by step, the latest LAST), the baselines and where
    the files are.

    Checkpoint names and errors came from the training and eval hosts: every cell and line is ``Text``."""
    out = app_ctx.out
    entries = sorted(doc["checkpoints"].values(), key=lambda e: e["step"])
    shown = entries[-last:] if last else entries
    for line in summary_text(doc):
        out.print(Text(line))
    title = f"series {doc['name']}: {doc['source']} on {doc['eval_host']}"
    if len(shown) < len(entries):
        title += f" (the latest {len(shown)} of {len(entries)}; --all for every one)"
    proxy = next((e["proxy"] for e in reversed(entries) if e.get("proxy")), None)
    table = Table("step", "checkpoint", "τ macro [95% CI]", "τ micro", "DDTree-8 [95% CI]", "p1", "verdict",
                  *(["proxy"] if proxy else []), title=Text(title))
    for e in shown:
        if e["status"] == "done":
            m = e["measures"]
            p1 = next((p["value"] for p in m["p"] if p["k"] == 1 and p["value"] is not None), None)
            cells = [e["step"], e["name"], fmt_ci(m["tau_macro"]), fmt_ci(m["tau_micro"]), fmt_ci(m["ddtree"]),
                     fmt_number(p1), verdict_cell(e)]
        else:
            detail = e.get("error") if e["status"] == "failed" else "in progress"
            cells = [e["step"], e["name"], e["status"], "", "", "", detail]
        if proxy:
            cells.append(proxy_value(e))
        table.add_row(*(Text(str(cell)) for cell in cells))
    out.print(table)
    if proxy:
        out.print(Text(f"proxy: {source_text(proxy)} ('!': τ more than 2.5 SE below what the proxy predicts)"))
        for line in alert_texts(entries):
            out.print(Text.assemble(("alert ", "bold red"), line))
    for bname, m in ((doc.get("baselines") or {}).get("drafters") or {}).items():
        out.print(Text(f"  baseline {bname}: τ macro {fmt_ci(m['tau_macro'])}, DDTree-8 {fmt_ci(m['ddtree'])}"))
    pid = supervisor.running_pid(folder)
    files = ", ".join(f for f in ("series.json", "series.md", "tau_vs_step.png") if (folder / f).is_file())
    out.print(Text(f"folder: {folder} ({files})" + (f"; supervisor pid {pid}" if pid else "")))


@series_app.command("plot")
def plot_cmd(ctx: typer.Context, name: str = NAME_ARG, runs_dir: Optional[str] = RunsDir,
             last: Optional[int] = typer.Option(None, "--last", metavar="N", min=2,
                                                help="Draw only the latest N evaluated checkpoints.")) -> None:
    """Redraw tau_vs_step.png and rewrite series.md from series.json."""
    app_ctx: AppContext = ctx.obj
    folder, doc = _load(runs_dir, name)
    path = write_plot(folder, doc, last=last)
    tmp = folder / ".series.md.tmp"
    tmp.write_text(series_markdown(doc, plotted=path is not None), encoding="utf-8")
    tmp.replace(folder / "series.md")
    if path is None and not plotting.available():
        raise InputError(f"series {name!r}: series.md rewritten; {plotting.MISSING}", hint=plotting.install_line())
    if path is None:
        raise InputError(f"series {name!r}: nothing to plot yet (no evaluated checkpoint); series.md rewritten")
    app_ctx.out.print(Text(str(path)))
