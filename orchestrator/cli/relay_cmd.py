"""`dfo relay-checkpoint SRC_HOST:PATH DST_HOST:PATH`: verified, resumable relay through this machine."""

from __future__ import annotations

from typing import Optional

import typer
from rich.text import Text  # names, reasons and notes may come from the hosts: Text, never markup

from orchestrator.cli.context import AppContext
from orchestrator.cli.main import app
from orchestrator.core.units import RATE_HELP, human_bytes, parse_rate
from orchestrator.relay.operation import RelayOptions, RelayResult, relay


@app.command("relay-checkpoint")
def relay_checkpoint_cmd(
    ctx: typer.Context,
    source: str = typer.Argument(..., metavar="SRC_HOST:PATH",
                                 help="File or directory on the source host (relative paths: under paths.checkpoints). "
                                 "A directory with a trailing '/' means its contents (they land in DST itself)."),
    destination: str = typer.Argument(..., metavar="DST_HOST:PATH",
                                      help="Destination file or directory; a trailing '/' (or an existing directory, "
                                      "for a file) puts the source's name inside it."),
    streams: Optional[int] = typer.Option(None, "--streams", min=1, max=16, metavar="N",
                                          help="Parallel SSH streams (default: by size and this machine's cores)."),
    cipher: Optional[str] = typer.Option(None, "--cipher", metavar="NAME", help="SSH cipher for the data streams "
                                         "(default: aes128-gcm@openssh.com when both ends offer it)."),
    strip_optimizer: bool = typer.Option(False, "--strip-optimizer", help="Strip the training checkpoint to drafter "
                                         "weights (safetensors + config) on the source host first; relay only those."),
    wait_stable: float = typer.Option(0.0, "--wait-stable", metavar="SECONDS",
                                      help="Wait until the source has not changed for SECONDS before starting."),
    bwlimit: Optional[str] = typer.Option(None, "--bwlimit", metavar="RATE",
                                          help="Limit the relay to RATE over all streams, " + RATE_HELP),
    stall_timeout: float = typer.Option(60.0, "--stall-timeout", metavar="SECONDS",
                                        help="Fail when no byte has moved for SECONDS (link down, host hung)."),
    data_plane: str = typer.Option("auto", "--data-plane", metavar="auto|ssh|paramiko",
                                   help="Bulk transport: the system ssh (default when present) or paramiko."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would move (and check space); move nothing."),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
) -> None:
    """Relay a checkpoint between two hosts through this machine, verified and resumable.

    Parallel streams, sha256 verified on the source and on the destination, atomic (NAME.dfo-partial,
    then rename).

    Re-run the same command after an interruption: verified chunks are kept and only the rest moves.
    """
    app_ctx: AppContext = ctx.obj
    options = RelayOptions(
        streams=streams, cipher=cipher, strip_optimizer=strip_optimizer, dry_run=dry_run,
        wait_stable=wait_stable, data_plane=data_plane, bwlimit=parse_rate(bwlimit), stall_timeout=stall_timeout,
    )
    result = relay(app_ctx.connector, source, destination, options, events=app_ctx.events)
    if json_out:
        app_ctx.print_json(result.as_dict())
    else:
        _render(app_ctx, result)


def _render(app_ctx: AppContext, r: RelayResult) -> None:
    from rich.table import Table  # only for this table (--json does without)

    out = app_ctx.out
    title = f"dfo relay-checkpoint {r.source} → {r.destination}" + (" (dry run)" if r.dry_run else "")
    table = Table(title=Text(title), title_justify="left")
    for col in ("file", "size", "status", "sha256", "detail"):
        table.add_column(col, overflow="fold")
    for f in r.files:
        detail = []
        if f.resumed_bytes:
            detail.append(f"resumed {human_bytes(f.resumed_bytes)}")
        if f.bad_chunks:
            detail.append(f"{f.bad_chunks} bad chunk(s) re-sent")
        if f.mode:
            detail.append(f"{f.mode}, {f.streams} stream(s)")
        if f.reason and f.status.startswith(("would", "skipped")):
            detail.append(f.reason)
        style = {"sent": "green", "resumed": "green", "skipped": "dim"}.get(f.status, "cyan")
        table.add_row(Text(f.rel or f.final.rsplit("/", 1)[-1]), human_bytes(f.size), Text(f.status, style=style),
                      Text((f.sha256 or "")[:16]), Text("; ".join(detail)))
    out.print(table)
    if r.dry_run:
        out.print(Text(f"streams {r.streams}, cipher {r.cipher or 'ssh default'} ({r.cipher_reason}), "
                       f"data plane {r.data_plane}; space needed {human_bytes(r.space_needed)}, "
                       f"free {human_bytes(r.space_free)}"))
    else:
        out.print(Text(f"moved {human_bytes(r.sent_bytes)} in {r.seconds:.1f}s ({r.mib_per_s:.0f} MiB/s), "
                       f"resumed {human_bytes(r.resumed_bytes)}, skipped {human_bytes(r.skipped_bytes)}; "
                       f"{r.streams} stream(s), cipher {r.cipher or 'ssh default'}, {r.data_plane}"))
        if r.manifest:
            out.print(Text(f"manifest: {r.destination.split(':', 1)[0]}:{r.manifest}"))
    for note in r.notes:
        app_ctx.err.print(Text.assemble(("note:", "yellow"), f" {note}"))
