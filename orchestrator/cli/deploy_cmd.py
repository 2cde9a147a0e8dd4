"""`dfo deploy`: py_compile, then upload only what changed, verify on the host, switch atomically."""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.deploy.manifest import default_payload_root
from orchestrator.deploy.operation import deploy, rollback


@app.command("deploy")
def deploy_cmd(
    ctx: typer.Context,
    host: list[str] = typer.Option([], "--host", "-H", metavar="HOST",
                                   help="Deploy to these hosts (repeatable; default: all)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be uploaded; change nothing."),
    rollback_: bool = typer.Option(False, "--rollback", help="Switch back to the previous release."),
    json_out: bool = typer.Option(False, "--json", help="Print per-host results as JSON on stdout."),
) -> None:
    """Deploy remote_payload/ to hosts: compile-check locally, upload changed files, verify, switch.

    A payload with a syntax error deploys nothing anywhere. A deploy with no change uploads 0 bytes.
    """
    app_ctx: AppContext = ctx.obj
    names = app_ctx.inventory.select(host)
    if rollback_:
        outcomes = rollback(app_ctx.connector, names, dry_run=dry_run)
    else:
        outcomes = deploy(app_ctx.connector, names, root=default_payload_root(), dry_run=dry_run, events=app_ctx.events)
    failed = [o for o in outcomes.values() if not o.ok]
    if json_out:
        app_ctx.print_json({
            "hosts": {n: (o.result.as_dict() if o.ok else {"status": "failed", "error": str(o.error)})
                      for n, o in outcomes.items()},
            "ok": not failed,
        })
    else:
        table = Table(title="dfo deploy" + (" (dry run)" if dry_run else ""), title_justify="left")
        for col in ("host", "status", "release", "uploaded", "detail"):
            table.add_column(col)
        # Errors, releases and file names may come from the host: Text cells, never markup.
        for n, o in outcomes.items():
            if not o.ok:
                message = o.error.message if o.error is not None else "failed"  # its hint follows, once, below
                table.add_row(Text(n), Text("failed", style="red"), "", "", Text(message))
                continue
            r = o.result
            detail = ""
            if r.plan and r.status == "would-deploy":
                detail = ", ".join(r.plan.changed[:8]) + (" …" if len(r.plan.changed) > 8 else "")
                if r.plan.removed:
                    detail += f" (remove {len(r.plan.removed)})"
            elif r.status == "deployed":
                detail = f"previous {r.previous or '-'}; {r.seconds:.1f}s"
            elif r.status in ("rolled-back", "would-roll-back"):
                detail = f"from {r.previous or '-'}"
            uploaded = (f"{r.plan.upload_bytes:,} B planned" if r.status == "would-deploy" and r.plan
                        else f"{r.uploaded_files} files, {r.uploaded_bytes:,} B")
            style = {"up-to-date": "green", "deployed": "green", "rolled-back": "yellow"}.get(r.status, "cyan")
            table.add_row(Text(n), Text(r.status, style=style), Text(str(r.release)), Text(uploaded), Text(detail))
        app_ctx.out.print(table)
        for o in failed:
            if o.error is not None and o.error.hint:
                app_ctx.err.print(Text(f"{o.host}: hint: {o.error.hint}", style="dim"))
    if failed:
        raise typer.Exit(1)
