"""`dfo inventory …`: validate, show, check connectivity, and edit the inventory in place."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.core.errors import InputError
from orchestrator.core.inventory_edit import add_host, cli_value, remove_host, set_field, write_inventory
from orchestrator.core.units import human_bytes
from orchestrator.ui.fold import Folded

inventory_app = typer.Typer(help="Validate, inspect and edit inventory.yaml (comments and order are kept).",
                            no_args_is_help=True)
app.add_typer(inventory_app, name="inventory")
HIDDEN = "(hidden)"  # what `show --json` prints for an env value: the keys are shown, never the values


@inventory_app.command("check")
def check(
    ctx: typer.Context,
    connect: bool = typer.Option(False, "--connect", help="Also reach every host in parallel and report facts."),
    host: list[str] = typer.Option([], "--host", "-H", help="Only these hosts (repeatable)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Validate the inventory as every command would (jump chains, ssh_config, keys, known_hosts, env
    references); with --connect, also reach each host and show what dfo found there."""
    from orchestrator.transport.inventory_rules import inventory_problems

    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    names = inv.select(host)
    problems = inventory_problems(inv, names, trust_new_host_keys=app_ctx.trust_new_host_keys)
    if problems:
        if json_out:
            app_ctx.print_json({"inventory": str(inv.source), "valid": False, "hosts": names, "problems": problems})
        raise InputError(f"{inv.source}: {len(problems)} problem(s) a command would refuse:\n"
                         + "\n".join(f"  {p}" for p in problems))
    if not connect:
        if json_out:
            app_ctx.print_json({"inventory": str(inv.source), "valid": True, "hosts": names})
        else:
            app_ctx.out.print(f"{inv.source}: valid, {len(names)} host(s): {', '.join(names)}")
        return
    from orchestrator.transport.facts import gather_facts

    facts = gather_facts(app_ctx.connector, names)
    clusters = _cluster_facts(app_ctx, [n for n in names if facts[n].reachable and inv.hosts[n].slurm])
    if json_out:
        app_ctx.print_json({"inventory": str(inv.source), "hosts": {
            n: {**f.as_dict(), **({"slurm": clusters[n].as_dict()} if n in clusters else {})} for n, f in facts.items()}})
    else:
        table = Table(title=f"{inv.source}", title_justify="left")
        for col in ("host", "reachable", "auth", "python", "GPUs", "free disk", "latency"):
            table.add_column(col)
        for name, f in facts.items():
            if not f.reachable:
                table.add_row(name, Text("no", style="red"), "", "", "", "", "")
                continue
            table.add_row(
                name, Text("yes", style="green"), Text(f.auth), Text(f.python) if f.python else Text("missing", style="red"),
                Text("\n".join(f.gpus) if f.gpus else "none"), _disk_summary(inv.hosts[name], f.free_disk),
                f"{f.latency_ms:.0f} ms",
            )
        app_ctx.out.print(table)
        for name, f in facts.items():
            if not f.reachable:
                app_ctx.out.print(Text.assemble((name, "red"), f": {f.error or 'unreachable'}"))
                if f.hint:
                    app_ctx.out.print(Text(f"  hint: {f.hint}", style="dim"))
        for name, c in clusters.items():
            app_ctx.out.print(Text(cluster_line(name, c), style="green" if c.shared_visible else "yellow"))
    if not all(f.reachable for f in facts.values()):
        raise typer.Exit(1)


def _cluster_facts(app_ctx: AppContext, names: list[str]) -> dict:
    """Slurm version, partition state and the shared folder seen from a compute node, per cluster host."""
    if not names:
        return {}
    from orchestrator.cluster.operation import login_session
    from orchestrator.cluster.probe import probe_cluster
    from orchestrator.transport.pool import for_each_host

    sections = {n: section for n in names if (section := app_ctx.inventory.hosts[n].slurm) is not None}
    outcomes = for_each_host(list(sections),
                             lambda n: probe_cluster(login_session(app_ctx.connector, n), sections[n]))
    # .result raises a login node's malformed answer as the HostError naming it
    return {name: outcome.result for name, outcome in outcomes.items()}


def cluster_line(name: str, facts) -> str:
    visible = {True: "visible from a compute node", False: "NOT visible from a compute node",
               None: "not probed"}[facts.shared_visible]
    return (f"{name}: Slurm {facts.version or '(none)'}, partition {facts.partition} "
            f"{facts.partition_state or 'unknown'}"
            + ("" if facts.gpus is None else f", GPUs per node {facts.gpus or 'none'}")
            + f", shared folder {visible}"
            + (f" ({facts.detail})" if facts.detail else ""))


def _disk_summary(host, free: dict[str, int | None]) -> str:
    """Free space per role path, one line each (same filesystem or not: each path's own figure)."""
    labels = {host.workdir: "workdir", host.venv: "venv", host.paths.checkpoints: "checkpoints",
              host.paths.models: "models"}
    return "\n".join(f"{labels.get(p, p)}: {human_bytes(b)}" for p, b in free.items())


@inventory_app.command("show")
def show(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print the validated inventory as JSON."),
) -> None:
    """Show the hosts as dfo understands them (defaults and ssh_config applied)."""
    from orchestrator.transport.resolve import resolve_host

    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    if json_out:
        app_ctx.print_json({
            "inventory": str(inv.source),
            "hosts": {n: {**h.model_dump(), "venv": h.venv, "ssh": resolve_host(inv, n).label,
                          "env": {key: HIDDEN for key in h.env}}  # env values are never printed (docs/security.md)
                      for n, h in inv.hosts.items()},
        })
        return
    table = Table(title=str(inv.source), title_justify="left")
    for col in ("host", "ssh", "roles", "workdir", "venv", "paths", "gpu", "reaches"):
        table.add_column(col, no_wrap=col == "host")  # a host name is what one types: never cut
    for name, h in inv.hosts.items():
        r = resolve_host(inv, name)
        table.add_row(
            name, escape(r.label + (f" via {r.proxy_jump.label}" if r.proxy_jump else "")), ",".join(h.roles),
            h.workdir, h.venv,
            "\n".join(f"{k}: {v}" for k, v in h.paths.model_dump().items() if v and k != "venv"),
            {True: "yes", False: "no", None: "detect"}[h.gpu], ", ".join(h.reaches) or "-",
        )
    app_ctx.out.print(Folded(table))  # a narrow terminal: the columns fold under each other, nothing is cut


@inventory_app.command("set")
def set_cmd(
    ctx: typer.Context,
    target: str = typer.Argument(..., metavar="HOST.FIELD", help="e.g. ct129.port or ct129.paths.models"),
    value: str = typer.Argument(..., metavar="VALUE",
                                help="Typed by the field: a string field takes VALUE as written ('eval host: A6000', "
                                "1, ${HF_TOKEN} for env); other fields read it as YAML: 2222, true, [eval]"),
) -> None:
    """Set one field of one host, keeping everything else in the file byte-for-byte."""
    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    host, _, dotted = target.partition(".")
    if not dotted:
        raise InputError(f"expected HOST.FIELD (e.g. ct129.port), got {target!r}")
    path = app_ctx.inventory_path
    old = path.read_text(encoding="utf-8")
    field_path = dotted.split(".")
    try:
        new = set_field(old, host, field_path, cli_value(field_path, value), list(inv.hosts))
    except InputError as exc:
        unchanged = f"nothing was written: {path} is unchanged"
        raise InputError(exc.message, hint=f"{exc.hint}; {unchanged}" if exc.hint else unchanged) from None
    write_inventory(path, new, old)
    app_ctx.err.print(f"{path}: set hosts.{host}.{dotted} = {escape(value)}")


@inventory_app.command("add-host")
def add_host_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Name used on the command line, e.g. ct130."),
    address: str = typer.Option(..., "--address", help="Hostname, IP or ssh_config alias."),
    user: Optional[str] = typer.Option(None, "--user", help="SSH user (default: ssh_config's, else yours)."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="SSH port (default: ssh_config's, else 22)."),
    workdir: str = typer.Option("/data/dfo", "--workdir", help="Where dfo keeps its files on the host."),
    identity_file: Optional[str] = typer.Option(None, "--identity-file", metavar="PATH",
                                                help="Private key for this host (default: ssh_config's IdentityFile)."),
    role: list[str] = typer.Option([], "--role", help="train or eval (repeatable)."),
) -> None:
    """Add a host at the end of `hosts:`."""
    app_ctx: AppContext = ctx.obj
    _ = app_ctx.inventory  # validate the current file first: never edit a broken inventory blindly
    path = app_ctx.inventory_path
    fields = {"address": address, "user": user, "port": port, "identity_file": identity_file,
              "workdir": workdir, "roles": role or None}
    old = path.read_text(encoding="utf-8")
    write_inventory(path, add_host(old, name, fields), old)
    app_ctx.err.print(f"{path}: added host {name} (check it with `dfo inventory check --connect -H {name}`)")


@inventory_app.command("remove-host")
def remove_host_cmd(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The host to remove."),
    force: bool = typer.Option(False, "--force",
                               help="Remove it even though other hosts jump through it (they would then reach "
                               "NAME as a plain host name or ssh_config alias)."),
) -> None:
    """Remove a host and its block (refused while another host lists it in `reaches` or jumps through it)."""
    from orchestrator.transport.resolve import hosts_jumping_through

    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    inv.select([name])
    path = app_ctx.inventory_path
    referrers = [n for n, h in inv.hosts.items() if name in h.reaches]
    if referrers:
        raise InputError(f"host {name!r} is listed in 'reaches' of {', '.join(referrers)}",
                         hint="remove it there first (dfo inventory set HOST.reaches [...])")
    jumpers = hosts_jumping_through(inv, name)
    if jumpers and not force:
        raise InputError(f"host {name!r} is a jump host of {', '.join(jumpers)} (proxy_jump or ssh_config ProxyJump)",
                         hint=f"change their proxy_jump first (dfo inventory set {jumpers[0]}.proxy_jump ...), or "
                         f"pass --force to remove it anyway")
    old = path.read_text(encoding="utf-8")
    write_inventory(path, remove_host(old, name, list(inv.hosts)), old)
    app_ctx.err.print(f"{path}: removed host {name}")
    if jumpers:
        app_ctx.err.print(Text(f"warning: the jump chain of {', '.join(jumpers)} still names {name!r}, which now "
                               "means a plain host name or ssh_config alias, not an inventory host", style="yellow"))
