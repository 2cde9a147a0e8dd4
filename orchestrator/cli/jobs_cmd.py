"""`dfo jobs`: detached remote jobs — run, list, status, logs [-f], cancel, pull.

A job is named ``HOST:JOB_ID`` (as `dfo jobs list` prints it); ``--host H JOB_ID`` works too, a bare id
is searched for on every host, an id prefix is enough when unique, and ``HOST:last`` is the newest job.
"""

from __future__ import annotations

import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.core.errors import InputError
from orchestrator.jobs.operation import (
    DEFAULT_LOCK,
    CancelPlan,
    JobStatus,
    LaunchPlan,
    cancel_job,
    default_pull_dest,
    follow_job,
    job_status,
    list_jobs,
    locate_job,
    plan_cancel,
    plan_launch,
    poll_job,
    pull_results,
    start_job,
)
from orchestrator.transport import for_each_host
from orchestrator.ui.progress_view import ProgressView

jobs_app = typer.Typer(
    help="Detached jobs on hosts: run, list, status, logs [-f], cancel, pull.\n\n"
    "JOB is HOST:JOB_ID (see `dfo jobs list`), or JOB_ID with --host; HOST:last is the newest job.",
    no_args_is_help=True,
)
app.add_typer(jobs_app, name="jobs")

HOST_OPT = typer.Option(None, "--host", "-H", metavar="HOST", help="Host of the job (or write JOB as HOST:JOB_ID).")
JOB_ARG = typer.Argument(..., metavar="JOB", help="HOST:JOB_ID as `dfo jobs list` prints it (an id prefix is enough; "
                         "HOST:last is the newest job), or JOB_ID with --host.")
STATE_STYLE = {"running": "cyan", "starting": "cyan", "succeeded": "green", "failed": "red", "cancelled": "yellow",
               "lost": "red", "refused": "yellow"}


# Job references, names, commands, states and log lines are the host's text: every line is built as rich
# ``Text`` (never markup), and the console strips control characters from it.


def _state(st: JobStatus) -> Text:
    text = st.state
    if st.state in ("failed", "cancelled") and st.exit_code is not None:
        text += f" (exit {st.exit_code}" + (f", {st.signal}" if st.signal else "") + ")"
    return Text(text, style=STATE_STYLE.get(st.state, "white"))


def _short_time(iso: str | None) -> str:
    return iso.replace("T", " ").rstrip("Z")[5:] if iso else ""


def _took(st: JobStatus) -> str:
    if not st.started:
        return ""
    end = datetime.fromisoformat(st.finished.rstrip("Z")) if st.finished else datetime.now(timezone.utc).replace(tzinfo=None)
    seconds = (end - datetime.fromisoformat(st.started.rstrip("Z"))).total_seconds()
    text = f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"
    return text + ("…" if not st.done else "")


def _report_end(app_ctx: AppContext, st: JobStatus) -> None:
    """Say how a finished job ended; a failure shows its last log lines and makes the command exit 1."""
    if st.ok:
        app_ctx.err.print(Text.assemble(f"{st.ref}: ", ("succeeded", "green"),
                                        f"; {st.results} result file(s) — dfo jobs pull {st.ref}"))
        return
    app_ctx.err.print(Text.assemble(f"{st.ref}: ", _state(st)))
    if st.log_tail:
        app_ctx.err.print(Text("last log lines:", style="dim"))
        for line in st.log_tail:
            app_ctx.err.print(Text("  " + line), highlight=False)
    raise typer.Exit(1)


@jobs_app.command("run")
def run_cmd(
    ctx: typer.Context,
    command: list[str] = typer.Argument(..., metavar="COMMAND", help="The command and its arguments (put them after --)."),
    host: str = typer.Option(..., "--host", "-H", metavar="HOST", help="Host to run on."),
    name: Optional[str] = typer.Option(None, "--name", metavar="LABEL", help="A label for the job."),
    cwd: Optional[str] = typer.Option(None, "--cwd", metavar="DIR", help="Working directory on the host (default: its workdir)."),
    env: list[str] = typer.Option([], "--env", "-e", metavar="KEY=VALUE", help="Extra environment (repeatable)."),
    lock: str = typer.Option(DEFAULT_LOCK, "--lock", metavar="NAME", help="Host lock to hold while running ('' for none)."),
    force: bool = typer.Option(False, "--force", help="Run although another live job holds the lock."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Follow the log until the job ends."),
    json_out: bool = typer.Option(False, "--json", help="Print the job as JSON (not with --follow)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run (host, command, folders, lock, "
                                 "environment keys); start nothing and connect to no host."),
) -> None:
    """Start COMMAND detached on a host; prints the job reference at once.

    The command gets DFO_RESULTS_DIR (its results folder), DFO_JOB_ID and DFO_JOB_DIR; the placeholders
    {results}, {job_dir} and {job_id} in its arguments are replaced. It keeps running when the
    controller disconnects: reattach with `dfo jobs logs HOST:JOB_ID -f`.
    """
    app_ctx: AppContext = ctx.obj
    app_ctx.inventory.select([host])
    extra = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--env expects KEY=VALUE, got {item!r}")
        extra[key] = value
    plan = plan_launch(app_ctx.connector, host, command, env=extra, cwd=cwd, job_name=name, force=force,
                       lock=lock or None)
    if dry_run:
        _print_launch_plan(app_ctx, plan, json_out)
        return
    handle = start_job(app_ctx.connector, plan)
    for notice in handle.notices:
        app_ctx.err.print(Text(f"{host}: {notice}", style="yellow"))
    if json_out and not follow:
        app_ctx.print_json(handle.status.as_dict() if handle.status else {"ref": handle.ref})
        return
    app_ctx.out.print(Text(handle.ref), highlight=False)
    if follow:
        st = follow_job(app_ctx.connector, host, handle.job_id, events=app_ctx.out_events())
        _report_end(app_ctx, st)
    else:
        app_ctx.err.print(Text(f"follow: dfo jobs logs {handle.ref} -f", style="dim"))


def _print_launch_plan(app_ctx: AppContext, plan: LaunchPlan, json_out: bool) -> None:
    if json_out:
        app_ctx.print_json({"dry_run": True, **plan.as_dict()})
        return
    out = app_ctx.out
    out.print(Text.assemble(("dry run", "bold"), f": would start on {plan.host}; nothing started, no host contacted"))
    lock = (f"{plan.lock} (" + ("--force: runs although a live job holds it" if plan.force else
                               "a live job holding it on the host refuses the launch") + ")") if plan.lock else "none"
    rows = [("job", f"{plan.ref}  (the id is new at each launch)"), ("name", plan.job_name or ""),
            ("command", shlex.join(plan.argv)), ("directory", plan.job_dir), ("cwd", plan.cwd), ("lock", lock),
            ("env", ", ".join(sorted(plan.env)) + "  (keys only)")]
    for key, value in rows:
        if value:
            out.print(Text(f"  {key:10} {value}"), highlight=False)


@jobs_app.command("list")
def list_cmd(
    ctx: typer.Context,
    host: list[str] = typer.Option([], "--host", "-H", metavar="HOST", help="Hosts to list (repeatable; default: all)."),
    limit: int = typer.Option(20, "--limit", "-n", metavar="N", min=1, help="Newest N jobs per host (-n as head's, never a dry run)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Jobs on hosts, newest first."""
    app_ctx: AppContext = ctx.obj
    names = app_ctx.inventory.select(host)
    outcomes = for_each_host(names, lambda n: list_jobs(app_ctx.connector, n, limit=limit))
    failed = [o for o in outcomes.values() if not o.ok]
    if json_out:
        app_ctx.print_json({"hosts": {n: ([j.as_dict() for j in o.result] if o.ok else {"error": str(o.error)})
                                      for n, o in outcomes.items()}, "ok": not failed})
    else:
        # Plain aligned lines (no table): job references stay whole and copy-pastable at any width.
        out = app_ctx.out
        out.print(Text(f"{'JOB':<28} {'STATE':<18} {'STARTED UTC':<15} {'TOOK':>6} {'FILES':>5}  NAME: COMMAND",
                       style="bold"))
        for n, o in outcomes.items():
            if not o.ok:
                out.print(Text.assemble(f"{n + ':':<28} ", (f"{'unreachable':<18}", "red"), f" {o.error}"))
                continue
            jobs = o.result
            if not jobs:
                out.print(Text(f"{n}: no jobs", style="dim"))
            for j in jobs:
                state = j.state + (f" ({j.exit_code})" if j.state == "failed" and j.exit_code is not None else "")
                label = (f"{j.name}: " if j.name else "") + " ".join(j.argv)
                label = label if len(label) <= 70 else label[:69] + "…"
                out.print(Text.assemble(f"{j.ref:<28} ", (f"{state:<18}", STATE_STYLE.get(j.state, "white")),
                                        f" {_short_time(j.started or j.created):<15} {_took(j):>6} {j.results:>5}  "
                                        f"{label}"), highlight=False)
    if failed:
        raise typer.Exit(1)


@jobs_app.command("status")
def status_cmd(
    ctx: typer.Context,
    job: str = JOB_ARG,
    host: Optional[str] = HOST_OPT,
    tail: int = typer.Option(10, "--tail", metavar="N", min=0, help="Log lines to show."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """State of one job: running / succeeded / failed (exit code) / cancelled / lost, and its last log lines.

    On a Slurm cluster host, JOB is the array job id (or ARRAY_TASK): each task's Slurm state, node and exit
    code, from squeue/scontrol, or from sacct once Slurm's controller has forgotten the job."""
    app_ctx: AppContext = ctx.obj
    if (ref := _cluster_ref(app_ctx, job, host)) is not None:
        return _cluster_status(app_ctx, ref, json_out)
    h, job_id = locate_job(app_ctx.connector, job, host)
    st = job_status(app_ctx.connector, h, job_id, tail=tail)
    if json_out:
        app_ctx.print_json(st.as_dict())
        return
    out = app_ctx.out
    out.print(Text.assemble((st.ref, "bold"), f"  ({st.name})" if st.name else "", "  ", _state(st)))
    rows = [("command", " ".join(st.argv)), ("directory", st.job_dir), ("cwd", st.cwd or ""),
            ("lock", st.lock or "-"), ("created", st.created), ("started", st.started), ("finished", st.finished),
            ("pid", st.pid), ("heartbeat", f"{st.heartbeat_age_s:.0f}s ago"
                                            if st.heartbeat_age_s is not None and not st.done else None), ("log", f"{st.log_size:,} bytes"), ("results", f"{st.results} file(s)")]
    for key, value in rows:
        if value not in (None, ""):
            out.print(Text(f"  {key:10} {value}"), highlight=False)
    if st.log_tail:
        out.print(Text.assemble("  ", ("last log lines:", "dim")))
        for line in st.log_tail:
            out.print(Text("    " + line), highlight=False)


@jobs_app.command("logs")
def logs_cmd(
    ctx: typer.Context,
    job: str = JOB_ARG,
    host: Optional[str] = HOST_OPT,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep following until the job ends (reattach)."),
    raw: bool = typer.Option(False, "--raw", help="Print the log bytes as they are (no progress rendering)."),
) -> None:
    """The job's log; progress lines from the payload are shown as progress bars.

    With -f it follows live until the job ends and exits 0 only if the job succeeded; it works after the
    controller that started the job disconnected or died.
    """
    app_ctx: AppContext = ctx.obj
    h, job_id = locate_job(app_ctx.connector, job, host)
    if raw:
        import sys

        def write(line: str) -> None:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

        if follow:
            st = follow_job(app_ctx.connector, h, job_id, on_line=write)
            _report_end(app_ctx, st)
            return
        offset = 0
        while True:
            st, chunk, offset = poll_job(app_ctx.connector, h, job_id, offset)
            sys.stdout.buffer.write(chunk)
            if not chunk:
                break
        sys.stdout.flush()
        return
    if follow:
        st = follow_job(app_ctx.connector, h, job_id, events=app_ctx.out_events())
        _report_end(app_ctx, st)
        return
    offset = 0
    with ProgressView(app_ctx.out, live=False, text_every=float("inf")) as view:
        while True:
            st, chunk, offset = poll_job(app_ctx.connector, h, job_id, offset)
            if not chunk:
                break
            view.feed(chunk)
        # Progress went to text at most once per stage: say where each stage stands now.
        for name, stage in view.stages.items():
            if not stage.finished and stage.total is not None and stage.done < stage.total:
                app_ctx.out.print(Text.assemble((name, "cyan"), f" {stage.done}/{stage.total} {stage.unit or ''}"))
    app_ctx.err.print(Text.assemble(f"{st.ref}: ", _state(st)))


@jobs_app.command("cancel")
def cancel_cmd(
    ctx: typer.Context,
    job: str = JOB_ARG,
    host: Optional[str] = HOST_OPT,
    grace: float = typer.Option(5.0, "--grace", metavar="SECONDS", min=0, help="Seconds between SIGTERM and SIGKILL."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the job's state and the processes a cancel would "
                                 "signal; signal nothing (the host is asked, nothing on it changes)."),
) -> None:
    """Stop a job: SIGTERM to its whole process group, SIGKILL after --grace seconds.

    On a Slurm cluster host, JOB is the array job id (or ARRAY_TASK for one task): scancel, then each
    cancelled task's state as Slurm shows it."""
    app_ctx: AppContext = ctx.obj
    if (ref := _cluster_ref(app_ctx, job, host)) is not None:
        return _cluster_cancel(app_ctx, ref, json_out, dry_run)
    h, job_id = locate_job(app_ctx.connector, job, host)
    if dry_run:
        _print_cancel_plan(app_ctx, plan_cancel(app_ctx.connector, h, job_id, grace=grace), json_out)
        return
    before = job_status(app_ctx.connector, h, job_id, tail=0)
    st = cancel_job(app_ctx.connector, h, job_id, grace=grace)
    if json_out:
        app_ctx.print_json(st.as_dict() | {"was": before.state})
        return
    if before.done:
        app_ctx.out.print(Text.assemble(f"{st.ref}: already ", _state(st), "; nothing to cancel"))
    else:
        app_ctx.out.print(Text.assemble(f"{st.ref}: ", _state(st)))


def _cluster_ref(app_ctx: AppContext, job: str, host: str | None):
    """The Slurm array JOB names when its host is a cluster host (slurm: in the inventory), else None."""
    from orchestrator.jobs.operation import parse_job_ref

    ref_host, job_id = parse_job_ref(job, host)
    inv = app_ctx.connector.inventory
    if ref_host is None or inv.hosts.get(ref_host) is None or inv.hosts[ref_host].slurm is None:
        return None
    from orchestrator.cluster.jobs import parse_array_ref

    return parse_array_ref(ref_host, job_id)


def _cluster_status(app_ctx: AppContext, ref, json_out: bool) -> None:
    from orchestrator.cluster.jobs import array_status, as_json, cluster_login, task_line

    states, source = array_status(*cluster_login(app_ctx.connector, ref), ref)
    if json_out:
        app_ctx.print_json(as_json(ref, states, source))
        return
    where = {"accounting": " (from sacct, the accounting database: Slurm's controller no longer lists it)",
             "completion": " (from sacct -c, the job completion log: Slurm's controller no longer lists it)"}
    app_ctx.out.print(Text.assemble((str(ref), "bold"), f"  Slurm array job {ref.array_job_id}",
                                    where.get(source, "")))
    for state in states.values():
        app_ctx.out.print(Text("  " + task_line(state)), highlight=False)


def _cluster_cancel(app_ctx: AppContext, ref, json_out: bool, dry_run: bool) -> None:
    from orchestrator.cluster.jobs import array_status, as_json, cancel_array, cluster_login, task_line

    login, root = cluster_login(app_ctx.connector, ref)
    if dry_run:
        states, source = array_status(login, root, ref)
        active = [s for s in states.values() if s.active]
        if json_out:
            app_ctx.print_json({"dry_run": True, "would_cancel": bool(active), **as_json(ref, states, source)})
            return
        app_ctx.out.print(Text.assemble(("dry run", "bold"), f": {ref}: " + (
            f"a cancel would run scancel {str(ref).split(':', 1)[1]} on the login node ({len(active)} active task(s))"
            if active else "nothing active; nothing to cancel") + "; nothing cancelled"))
        for state in states.values():
            app_ctx.out.print(Text("  " + task_line(state)), highlight=False)
        return
    before, after = cancel_array(login, root, ref)
    if json_out:
        app_ctx.print_json(as_json(ref, after, "queue") | {"cancelled": after is not before})
        return
    if after is before:
        app_ctx.out.print(Text(f"{ref}: nothing active; nothing to cancel"))
        for state in before.values():
            app_ctx.out.print(Text("  " + task_line(state)), highlight=False)
        return
    app_ctx.out.print(Text(f"{ref}: scancel sent; {len(after)} task(s) cancelled"))
    for state in after.values():
        app_ctx.out.print(Text("  " + task_line(state)), highlight=False)


def _print_cancel_plan(app_ctx: AppContext, plan: CancelPlan, json_out: bool) -> None:
    if json_out:
        app_ctx.print_json({"dry_run": True, **plan.as_dict()})
        return
    out, st = app_ctx.out, plan.status
    if not plan.would_signal:
        out.print(Text.assemble(("dry run", "bold"), f": {st.ref}: already ", _state(st), "; nothing to cancel"))
        return
    group = f"process group {plan.pgid}" if plan.pgid else "its process group once it has started"
    out.print(Text.assemble(("dry run", "bold"), f": {st.ref}: ", _state(st), f"; a cancel would send SIGTERM to "
                            f"{group}, then SIGKILL after {plan.grace:g} s" + (f", and release lock {st.lock!r}"
                                                                               if st.lock else "")
                            + "; nothing signalled"))
    if plan.processes is None:
        out.print(Text("  (the host cannot list the group's processes: no /proc)", style="dim"))
    for pid, argv in plan.processes or []:
        out.print(Text(f"  {pid:>8}  {shlex.join(argv)}"), highlight=False)


@jobs_app.command("pull")
def pull_cmd(
    ctx: typer.Context,
    job: str = JOB_ARG,
    dest: Optional[Path] = typer.Argument(None, metavar="DEST", help="Local folder (default: runs/<JOB_ID>-<HOST>)."),
    host: Optional[str] = HOST_OPT,
    force: bool = typer.Option(False, "--force", help="Replace DEST although it holds different results."),
    allow_running: bool = typer.Option(False, "--allow-running", help="Pull although the job still runs."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Fetch the job's results folder; every file is checked against the host's sha256."""
    app_ctx: AppContext = ctx.obj
    h, job_id = locate_job(app_ctx.connector, job, host)
    target = dest or default_pull_dest(h, job_id)
    res = pull_results(app_ctx.connector, h, job_id, target, force=force, allow_running=allow_running)
    if json_out:
        app_ctx.print_json(res.as_dict())
        return
    verb = "already up to date" if res.status == "up-to-date" else f"pulled {res.files} file(s), {res.bytes:,} bytes"
    app_ctx.out.print(Text(f"{h}:{job_id} -> {res.dest}: {verb} (sha256 verified)"))
