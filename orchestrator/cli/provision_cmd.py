"""`dfo provision`: build or check the payload's uv venv on hosts (idempotent; --dry-run shows the plan)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.core.errors import InputError
from orchestrator.core.units import human_bytes
from orchestrator.provision.engine_venv import ENGINES, engine_version
from orchestrator.provision.operation import provision_hosts


# One parameter per option (typer's style): a long signature, a short body.
@app.command("provision")
def provision_cmd(
    ctx: typer.Context,
    host: list[str] = typer.Option(
        [], "--host", "-H", metavar="HOST",
        help="Provision these hosts (repeatable; default: all, or with --engine the hosts with the eval role).",
    ),
    engine: Optional[str] = typer.Option(
        None, "--engine", metavar="NAME[@VERSION]",
        help="Build a serving engine's own venv instead (" + ", ".join(ENGINES) + "; at paths.engine_venv, default "
        "<workdir>/engines/vllm, from remote_payload/requirements-<engine>-<flavour>.lock). NAME@VERSION "
        "(vllm@0.31.0): that release in a venv of its own (<workdir>/engines/vllm@0.31.0), from "
        "requirements-<engine>-<flavour>-<version>.lock.",
    ),
    offline: Optional[bool] = typer.Option(
        None, "--offline/--online",
        help="--offline: build a wheelhouse on the controller, push it, install with no index. "
        "--online: the host downloads from the index itself. Default: offline when the host cannot reach it.",
    ),
    rebuild: bool = typer.Option(False, "--rebuild", help="Recreate the venv and sync even when it is up to date."),
    # --force once meant --rebuild; it stays for scripts, hidden: --force elsewhere overrides a safety refusal.
    force: bool = typer.Option(False, "--force", hidden=True, help="Old name of --rebuild."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be done; change nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print per-host results as JSON on stdout."),
) -> None:
    """Make each host's payload venv match its lock file, remote_payload/requirements-<flavour>.lock.

    With --engine vllm: the vLLM engine venv and requirements-vllm-<flavour>.lock. The flavour (cpu or cuda) comes from the inventory's gpu / torch_backend, else from nvidia-smi.
    A venv whose marker matches the lock, Python, flavour and uv version is left alone ("up-to-date").
    """
    app_ctx: AppContext = ctx.obj
    if force:
        app_ctx.err.print(Text("note: provision --force is now --rebuild (--force elsewhere overrides a refusal)",
                               style="yellow"))
        rebuild = True
    if engine is not None and engine.partition("@")[0] not in ENGINES:
        raise InputError(f"--engine {engine!r}: unknown engine", hint=f"known engines: {', '.join(ENGINES)}")
    names = app_ctx.inventory.select(host) if host or not engine else _eval_hosts(app_ctx)
    outcomes = provision_hosts(app_ctx.connector, names, offline=offline, force=rebuild, dry_run=dry_run,
                               events=None if json_out else app_ctx.events, engine=engine)
    failed = [o for o in outcomes.values() if not o.ok]
    if json_out:
        app_ctx.print_json({
            "hosts": {n: (o.result.as_dict() if o.ok else {"status": "failed", "error": str(o.error)})
                      for n, o in outcomes.items()},
            "ok": not failed,
        })
    else:
        title = "dfo provision" + (f" --engine {engine}" if engine else "") + (" (dry run)" if dry_run else "")
        table = Table(title=title, title_justify="left")
        for col in ("host", "status", "flavour", "torch", "detail"):
            table.add_column(col)
        plans = []
        for n, o in outcomes.items():
            if o.error is not None:
                table.add_row(n, Text("failed", style="red"), "", "", Text(o.error.message.removeprefix(f"{n}: ")))
                continue
            r = o.result
            mode = "offline" if r.offline else "online" if r.offline is False else ""
            if r.status == "would-install":
                detail = "; ".join(r.reasons)
                plans.append((n, r))
            elif r.status == "installed":
                detail = (f"{mode}; uv {r.uv_version} ({r.uv_source}); pushed {r.pushed_files} files "
                          f"({human_bytes(r.pushed_bytes)}); {r.seconds:.1f}s")
            else:
                detail = f"{r.lock} {r.lock_sha256[:12]}; uv {r.uv_version}"
            if r.engine and r.status != "would-install":
                version = engine_version(r.engine, r.packages)
                detail = f"{r.engine} {version}; {detail}"
            flavour = r.flavour + (f" ({r.torch_backend})" if r.torch_backend and r.torch_backend != r.flavour else "")
            style = {"up-to-date": "green", "installed": "green"}.get(r.status, "cyan")
            table.add_row(n, Text(r.status, style=style), Text(flavour), Text(r.packages.get("torch") or ""), Text(detail))
        app_ctx.out.print(table)
        for n, r in plans:
            app_ctx.out.print(Text(f"{n}: would, in {r.venv} ({'offline' if r.offline else 'online'}):"))
            for step in r.steps:
                app_ctx.out.print(Text(f"  - {step}"))
        for n, o in outcomes.items():
            if o.ok and o.result.status != "would-install":
                app_ctx.out.print(Text(f"{n}: python {o.result.python}"), highlight=False)
        for o in failed:
            if o.error is not None and o.error.hint:
                app_ctx.err.print(Text(f"{o.host}: hint: {o.error.hint}", style="dim"))
    if failed:
        raise typer.Exit(1)


def _eval_hosts(app_ctx: AppContext) -> list[str]:
    """An engine serves next to the eval: the hosts with the eval role (all when no host has roles)."""
    inv = app_ctx.inventory
    chosen = [n for n, h in inv.hosts.items() if "eval" in h.roles]
    if chosen:
        return chosen
    if any(h.roles for h in inv.hosts.values()):
        raise InputError(f"no host has the eval role in {inv.source}: name one with --host",
                         hint="add 'roles: [eval]' to the hosts that run dfo eval")
    return inv.select(None)
