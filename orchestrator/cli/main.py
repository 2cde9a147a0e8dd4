"""`dfo` entry point: global options, sub-command registration, and the error/exit-code policy.

Exit codes: 0 success, 1 an operation failed, 2 bad input (inventory, arguments), 130 interrupted.
Expected failures print one clear message (no traceback); set DFO_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer
from rich.text import Text

# dfo uses no pydantic plugins; looking for them reads every installed distribution's metadata (~25 ms of
# each start, before the inventory's models are built).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from orchestrator.cli.context import AppContext  # noqa: E402 - after the line above
from orchestrator.core.errors import DfoError  # noqa: E402

app = typer.Typer(
    name="dfo",
    help="Run and verify the DFlash drafter evaluation loop across SSH hosts.\n\n"
    "Hosts come from inventory.yaml (see `dfo inventory show`). Every command that changes a host "
    "has --dry-run; commands whose output feeds scripts have --json.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    ctx: typer.Context,
    inventory: Optional[str] = typer.Option(
        None, "--inventory", "-i", metavar="PATH", envvar="DFO_INVENTORY",
        help="Inventory file (default ./inventory.yaml; env DFO_INVENTORY).",
    ),
    trust_new_host_keys: bool = typer.Option(
        False, "--trust-new-host-keys",
        help="Trust-on-first-use: accept host keys not yet in known_hosts and record them there. "
        "Mismatching keys are always refused.",
    ),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", metavar="SECONDS", help="SSH connect timeout."),
) -> None:
    ctx.obj = AppContext(inventory_arg=inventory, trust_new_host_keys=trust_new_host_keys,
                         connect_timeout=connect_timeout)
    ctx.call_on_close(ctx.obj.close)


# Command name -> the module that adds it to `app`, in `dfo --help` order. Only the module of the command
# being run is imported (a relay never loads paramiko, an inventory edit never loads rich's progress).
COMMAND_MODULES = {
    "deploy": "deploy_cmd", "relay-checkpoint": "relay_cmd", "provision": "provision_cmd", "eval": "eval_cmd",
    "demo": "demo_cmd", "inventory": "inventory_cmd", "jobs": "jobs_cmd", "runs": "runs_cmd",
    "watch": "watch_cmd", "series": "series_cmd",
}
_OPTIONS_WITH_VALUES = {"-i", "--inventory", "--connect-timeout"}


def _command_name(argv: list[str]) -> str | None:
    """The sub-command in ARGV, skipping dfo's own options (None for `dfo --help` and the like)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _OPTIONS_WITH_VALUES:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _register(argv: list[str]) -> None:
    wanted = COMMAND_MODULES.get(_command_name(argv) or "")
    for module in ([wanted] if wanted else COMMAND_MODULES.values()):
        __import__(f"{__package__}.{module}")


def run(argv: list[str] | None = None) -> int:
    """Console-script entry: returns (and exits with) dfo's exit code."""
    code = main(argv)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _register(argv)
    debug = os.environ.get("DFO_DEBUG") == "1"
    err = AppContext().err
    try:
        result = app(args=argv, prog_name="dfo", standalone_mode=False)
        if result == 130:  # typer turns Ctrl-C into this exit code
            err.print("interrupted")
        return result if isinstance(result, int) else 0
    except DfoError as exc:
        if debug:
            raise
        # The message may quote a host (its error, a name it sent): text, never markup.
        err.print(Text.assemble(("error:", "bold red"), " ", exc.message))
        if exc.hint:
            err.print(Text.assemble("  ", ("hint:", "dim"), " ", exc.hint))
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:  # usage errors (typer vendors click; exit code 2)
        exc.show()  # type: ignore[attr-defined]  # click's exception API, re-exported by typer
        return getattr(exc, "exit_code", 2)
    except (KeyboardInterrupt, typer.Abort):
        err.print("interrupted")
        return 130
