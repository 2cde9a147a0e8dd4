"""`dfo runs …`: the local run folders: list, show, compare, pull (reattach to) a detached run, and export a
drafter's speculation profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.cli.render import render_run
from orchestrator.core.errors import InputError
from orchestrator.core.host_text import fmt_number
from orchestrator.core.local_checks import writable_file
from orchestrator.evaluation.compare import compare_runs, dataset_lines
from orchestrator.evaluation.operation import Detached, reattach_hint, wait_and_collect
from orchestrator.evaluation.profile import (
    PROFILE_SUFFIX,
    build_profile,
    compare_profiles,
    load_profile,
    write_profiles,
)
from orchestrator.evaluation.report import drafter_rows
from orchestrator.evaluation.runs import find_run, named_runs_root, runs_root, scan_runs
from orchestrator.ui.fold import Folded

runs_app = typer.Typer(help="Run folders under ./runs (or $DFO_RUNS_DIR): list, show, compare, pull, profile.",
                       no_args_is_help=True)
app.add_typer(runs_app, name="runs")

RunsDir = typer.Option(None, "--runs-dir", metavar="DIR", envvar="DFO_RUNS_DIR",
                       help="Where run folders are (default ./runs).")
RUN_ARG = typer.Argument("last", metavar="RUN", help="Run name, prefix, folder or 'last'.")


@runs_app.command("list")
def list_cmd(ctx: typer.Context, runs_dir: Optional[str] = RunsDir,
             json_out: bool = typer.Option(False, "--json", help="Print the list as JSON on stdout.")) -> None:
    """All runs, oldest first, with their status and headline τ.

    A run whose run.json or results.json cannot be read is listed as such, with its path and what is wrong."""
    app_ctx: AppContext = ctx.obj
    runs, unreadable = scan_runs(named_runs_root(runs_dir))
    rows: list[dict] = [{"run": path.name, "status": "unreadable", "hosts": None, "tau_macro": {}, "error": why}
                        for path, why in unreadable]
    for run in runs:
        row: dict = {"run": run.name, "status": run.status, "hosts": run.record.get("hosts"), "tau_macro": {}}
        if run.has_results():
            try:
                row["tau_macro"] = {r["drafter"]: r["tau_macro"] for r in drafter_rows(run.results())}
            except InputError as exc:
                row["error"] = exc.message
        rows.append(row)
    rows.sort(key=lambda r: r["run"])
    if json_out:
        app_ctx.print_json({"runs": rows})
        return
    table = Table(title=Text(str(runs_root(runs_dir))), title_justify="left")
    for col in ("run", "status", "hosts", "τ macro (committed)"):  # a run id is never cut (it is what one types)
        table.add_column(col, no_wrap=col == "run")
    for r in rows:  # drafter names and figures are the eval host's: Text cells, "?" for a τ that is no number
        hosts = r["hosts"] if isinstance(r["hosts"], list) else []
        status = Text(str(r["status"]))
        if "error" in r and r["status"] != "unreadable":
            status.append(" (results unreadable)", style="red")
        table.add_row(Text(str(r["run"])), status, Text(",".join(map(str, hosts))),
                      Text("\n".join(f"{n} {_f(t)}" for n, t in r["tau_macro"].items())))
    app_ctx.out.print(Folded(table))
    for r in rows:
        if "error" in r:
            app_ctx.err.print(Text.assemble(("unreadable:", "red"), f" {r['error']}"))


@runs_app.command("show")
def show_cmd(ctx: typer.Context, run: str = RUN_ARG, runs_dir: Optional[str] = RunsDir,
             json_out: bool = typer.Option(False, "--json", help="Print the run's figures as JSON on stdout.")) -> None:
    """The comparison table of one run and where its files are."""
    app_ctx: AppContext = ctx.obj
    found = find_run(runs_root(runs_dir), run)
    if not found.has_results():
        msg = f"run {found.name}: status {found.status}"
        if found.record.get("error"):
            msg += f"\n  error: {found.record['error']}"
        if json_out:
            app_ctx.print_json({"run": found.name, "status": found.status, "error": found.record.get("error")})
        else:
            app_ctx.out.print(Text(msg))  # the error may quote a host
            if found.status in ("running", "detached"):
                app_ctx.out.print(Text(reattach_hint(found)))
        raise typer.Exit(0 if found.status in ("running", "detached") else 1)
    render_run(app_ctx, found, json_out)


@runs_app.command("pull")
def pull_cmd(ctx: typer.Context, run: str = RUN_ARG, runs_dir: Optional[str] = RunsDir,
             json_out: bool = typer.Option(False, "--json", help="Print the run's figures as JSON on stdout."),
             resume: bool = typer.Option(False, "--resume", help="A run on a Slurm cluster: first submit again only "
                                         "the array tasks without complete results.")) -> None:
    """Reattach to a detached run: follow its jobs to the end, pull, merge and report."""
    app_ctx: AppContext = ctx.obj
    found = find_run(runs_root(runs_dir), run)
    try:
        wait_and_collect(app_ctx.connector, found, events=app_ctx.events, resume=resume)
    except Detached:
        app_ctx.err.print(Text.assemble("\n", ("detached", "yellow"), f" (Ctrl-C): {reattach_hint(found)}"))
        raise typer.Exit(130) from None
    render_run(app_ctx, found, json_out)


@runs_app.command("profile")
def profile_cmd(ctx: typer.Context, run: str = RUN_ARG, runs_dir: Optional[str] = RunsDir,
                drafter: Optional[str] = typer.Option(None, "--drafter", metavar="NAME",
                                                      help="Only this drafter (default: every drafter of the run)."),
                out: Optional[Path] = typer.Option(None, "--out", metavar="FILE",
                                                   help="Write the profile here (needs one drafter: --drafter or a "
                                                        "run with one)."),
                json_out: bool = typer.Option(False, "--json", help="Print the profile(s) as JSON on stdout.")) -> None:
    """Export each drafter's speculation_profile.json (schema 1.0): acceptance rates, accept length per K,
    per dataset, and the conditions they were measured under. Written to runs/<run>/profiles/ as well."""
    app_ctx: AppContext = ctx.obj
    out = writable_file(out, "--out") if out is not None else None  # before any work: a folder it cannot write
    found = find_run(runs_root(runs_dir), run)
    if not found.has_results():
        raise InputError(f"run {found.name} has no results.json (status {found.status})",
                         hint="wait for it with `dfo runs pull`, or pick a finished run")
    results, samples = found.results(), found.samples()
    names = list(results.get("drafters") or {})
    if drafter is not None and drafter not in names:
        raise InputError(f"run {found.name} has no drafter {drafter!r}", hint=f"its drafters: {', '.join(names)}")
    chosen = [drafter] if drafter else names
    if out is not None and len(chosen) != 1:
        raise InputError(f"--out writes one profile; run {found.name} has {len(chosen)} drafters",
                         hint="name one with --drafter")
    write_profiles(found.path, results, samples)
    profiles = {name: build_profile(results, samples, name) for name in chosen}
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(profiles[chosen[0]], indent=2) + "\n", encoding="utf-8")
        tmp.replace(out)
    if json_out:
        app_ctx.print_json(profiles[chosen[0]] if out is not None or len(chosen) == 1 else profiles)
        return
    for name, p in profiles.items():
        v = p["validation"]
        path = out if out is not None else found.path / "profiles" / f"{name}{PROFILE_SUFFIX}"
        app_ctx.out.print(Text(f"{name}: mean accept length {p['mean_accept_length']} (per request "
                               f"{p['mean_accept_length_per_request']}), validation "
                               f"{'passed' if v['passed'] else 'FAILED'} → {path}"))
        by_k = p.get("accept_length_by_k") or {}
        if by_k:
            app_ctx.out.print(Text("  accept length by K: " + "  ".join(f"{k}:{fmt_number(t)}"
                                                                       for k, t in by_k.items())))


@runs_app.command("compare")
def compare_cmd(ctx: typer.Context,
                run_a: str = typer.Argument(..., metavar="RUN_A", help="The earlier run (name, prefix, folder or 'last')."),
                run_b: str = typer.Argument(..., metavar="RUN_B", help="The run compared with it."),
                runs_dir: Optional[str] = RunsDir,
                across_rules: bool = typer.Option(False, "--across-rules", help="Compare two runs at T > 0 that "
                                                  "follow different draft rules (refused otherwise: the rules give "
                                                  "different τ)."),
                across_temperatures: bool = typer.Option(False, "--across-temperatures", help="Compare two runs "
                                                         "whose continuations were drawn at different temperatures "
                                                         "(refused otherwise: Δτ would include the temperature's "
                                                         "effect)."),
                json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON on stdout.")) -> None:
    """Compare two runs drafter by drafter: Δτ (B − A) with a paired bootstrap CI over their common prompts.

    For example the checkpoints of step 20k and step 25k of one training run, evaluated on the same prompts (two
    runs of one drafter each, such as a watched run's checkpoints, pair those drafters whatever their names).
    Δτ is in the committed convention: zlab = committed, z-lab's loop since August 2026. The zlab-2604 column is
    z-lab's April 2026 loop (drafts accepted past the end token counted); a run from before that name reads its
    old zlab figure there, so an old run and a new one compare like with like.

    Two speculation_profile.json files (dfo's or another tool's, schema 1.0) compare their accept length per K."""
    app_ctx: AppContext = ctx.obj
    if run_a.endswith(".json") and run_b.endswith(".json"):
        _compare_profile_files(app_ctx, Path(run_a), Path(run_b), json_out)
        return
    root = runs_root(runs_dir)
    a, b = find_run(root, run_a), find_run(root, run_b)
    report = compare_runs(a, b, across_rules=across_rules, across_temperatures=across_temperatures)
    if json_out:
        app_ctx.print_json(report)
        return
    conv = report.get("convention", "committed")
    rules = report.get("draft_rule") or {}
    rule = rules.get("a") if rules.get("a") == rules.get("b") else f"{rules.get('a')} → {rules.get('b')}"
    table = Table(title=Text(f"{a.name} → {b.name}  (τ macro, {conv} convention, draft rule {rule}; zlab = committed; "
                             "zlab-2604: τ macro, vllm: τ micro)"),
                  title_justify="left")
    for col in ("drafter", f"{conv} τ A", "τ B", "Δτ (B−A)", "95% CI", "pairs", "zlab-2604 A→B", "vllm A→B", "note"):
        table.add_column(col, justify="left" if col in ("drafter", "note") else "right",
                         min_width=len(conv) if col.startswith(conv) else None)
    for row in report["drafters"]:
        ci = row.get("ci")
        other = row.get("conventions") or {}
        cells = [row["drafter"], _f(row.get("tau_a")), _f(row.get("tau_b")), _f(row.get("delta"), sign=True),
                 f"[{_f(ci[0])}, {_f(ci[1])}]" if ci else "–", str(row.get("paired_samples", 0)),
                 *[f"{_f((other.get(c) or {}).get('a'))}→{_f((other.get(c) or {}).get('b'))}"
                   for c in ("zlab-2604", "vllm")], row.get("note", "")]
        table.add_row(*(Text(str(cell)) for cell in cells))  # drafter names are the hosts': never markup
    app_ctx.out.print(Folded(table))
    for line in dataset_lines(report) + report.get("notes", []):
        app_ctx.out.print(Text(f"  {line}"))


def _compare_profile_files(app_ctx: AppContext, a: Path, b: Path, json_out: bool) -> None:
    report = compare_profiles(load_profile(a), load_profile(b))
    if json_out:
        app_ctx.print_json(report)
        return
    if report.get("methods_differ"):
        app_ctx.err.print(Text(f"warning: {report['methods_differ']}"))
    table = Table(title=Text(f"{a.name} → {b.name}  (mean accept length per step at K drafts)"), title_justify="left")
    for col in ("K", "A", "B", "Δ (B−A)"):
        table.add_column(col, justify="right")
    for row in report["by_k"]:
        table.add_row(str(row["k"]), _f(row["accept_length_a"]), _f(row["accept_length_b"]),
                      _f(row["delta"], sign=True))
    app_ctx.out.print(table)
    if report["conditions_differ"]:
        app_ctx.out.print(Text("  measured under different conditions: " + ", ".join(report["conditions_differ"])))


def _f(x, sign: bool = False) -> str:
    return fmt_number(x, "+.2f" if sign else ".2f")
