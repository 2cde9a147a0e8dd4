"""`dfo` entry point: global options, sub-command registration, help conventions and the error/exit-code policy.

Exit codes: 0 success, 1 an operation failed, 2 bad input (inventory, arguments), 130 interrupted.
Expected failures print one clear message (no traceback); set DFO_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any, Optional

import typer
import typer.core
from rich.text import Text

# dfo uses no pydantic plugins; looking for them reads every installed distribution's metadata (~25 ms of
# each start, before the inventory's models are built).
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from orchestrator.cli.context import AppContext  # noqa: E402 - after the line above
from orchestrator.core.errors import DfoError, InputError  # noqa: E402

app = typer.Typer(
    name="dfo",
    help="Run and verify the DFlash drafter evaluation loop across SSH hosts.\n\n"
    "Hosts come from inventory.yaml (see `dfo inventory show`). Commands that plan before they change a host "
    "(deploy, relay-checkpoint, provision, eval, watch, jobs run, jobs cancel) have --dry-run; commands whose "
    "output feeds scripts have --json. --force always means: do it although a safety check refused (a held lock, different results at the "
    "destination, a host others jump through).",
    epilog="Environment: DFO_INVENTORY (--inventory), DFO_CONNECT_TIMEOUT (--connect-timeout), DFO_RUNS_DIR "
    "(--runs-dir), DFO_DEBUG=1 (tracebacks). Exit codes: 0 done, 1 an operation failed, 2 bad input, "
    "130 interrupted.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"dfo {version('dfo')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("dfo (not installed: no version recorded)")
        raise typer.Exit()


def _finite_timeout(ctx: typer.Context, value: float) -> float:
    """--connect-timeout in dfo's own words, naming where the value came from: the option, or the variable."""
    source = ctx.get_parameter_source("connect_timeout")
    given = f"DFO_CONNECT_TIMEOUT={value:g}" if source is not None and source.name == "ENVIRONMENT" \
        else f"--connect-timeout {value:g}"
    if value != value or value in (float("inf"), float("-inf")):  # nan or inf: no socket takes it
        raise InputError(f"{given}: not a finite number of seconds", hint="give e.g. 10 or 30")
    if value < 0.1:
        raise InputError(f"{given}: expected at least 0.1 seconds", hint="give e.g. 10 or 30")
    return value


@app.callback()
def _global(
    ctx: typer.Context,
    inventory: Optional[str] = typer.Option(
        None, "--inventory", "-i", metavar="PATH", envvar="DFO_INVENTORY",
        help="Inventory file (default ./inventory.yaml).",
    ),
    # No DFO_ variable on purpose: trusting unknown host keys is a choice made per command, never left on.
    trust_new_host_keys: bool = typer.Option(
        False, "--trust-new-host-keys",
        help="Trust-on-first-use: accept host keys not yet in known_hosts and record them there. "
        "Mismatching keys are always refused.",
    ),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout", metavar="SECONDS",
                                          callback=_finite_timeout, envvar="DFO_CONNECT_TIMEOUT",
                                          help="SSH connect timeout."),
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="Print dfo's version and exit."),
) -> None:
    ctx.obj = AppContext(inventory_arg=inventory, trust_new_host_keys=trust_new_host_keys,
                         connect_timeout=connect_timeout)
    ctx.call_on_close(ctx.obj.close)


# Command name -> the module that adds it to `app`, in `dfo --help` order (commands, then groups). Only the
# module of the command being run is imported (a relay never loads paramiko, an inventory edit never loads
# rich's progress). tests/test_cli_conventions.py checks it against orchestrator/cli/<name>_cmd.py.
COMMAND_MODULES = {
    "deploy": "deploy_cmd", "relay-checkpoint": "relay_cmd", "provision": "provision_cmd", "eval": "eval_cmd",
    "demo": "demo_cmd", "watch": "watch_cmd", "lint": "lint_cmd", "inventory": "inventory_cmd", "jobs": "jobs_cmd",
    "runs": "runs_cmd", "series": "series_cmd",
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


# ------------------------------------------------------------------------------ help conventions

# A sentence ends at a full stop followed by one that starts a new sentence (so "e.g. step 20k" goes on).
_SENTENCE_END = re.compile(r"\.(?=\s+[A-Z`'\"(]|\s*\Z)")


def first_sentence(text: str) -> str:
    """The first sentence of a help text's first paragraph, whole: the summary `dfo --help` lists."""
    words = " ".join(text.split("\n\n", 1)[0].replace("\b", "").split())
    end = _SENTENCE_END.search(words)
    return words[: end.end()] if end else words


class _ArgumentByMetavar(typer.core.TyperArgument):
    """An argument listed by its metavar alone: typer would add a Python type to it (`NAME <str>`)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _apply_help_conventions(command: Any) -> None:
    """What every command's --help shows, whoever declared it: the first sentence whole in the command lists
    (click cuts it at 45 characters or at "e.g."), a metavar for every value (argparse's: the option's name in
    capitals, never a Python type name like <list[str]>), arguments named by their metavar."""
    if command.help and not command.short_help:
        command.short_help = first_sentence(command.help)
    for param in command.params:
        if isinstance(param, typer.core.TyperArgument):
            param.metavar = param.metavar or param.name.upper()
            param.__class__ = _ArgumentByMetavar
        elif isinstance(param, typer.core.TyperOption) and not param.is_flag and not param.metavar:
            param.metavar = max(param.opts, key=len).lstrip("-").replace("-", "_").upper()
    for sub in (getattr(command, "commands", None) or {}).values():
        _apply_help_conventions(sub)


def command() -> Any:
    """The click command typer builds from `app` (with the commands registered so far), help conventions applied."""
    from orchestrator.cli.completion import attach

    built = typer.main.get_command(app)
    _apply_help_conventions(built)
    attach(built)
    return built


# ------------------------------------------------------------------------------ entry


def run(argv: list[str] | None = None) -> int:
    """Console-script entry: returns (and exits with) dfo's exit code."""
    code = main(argv)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    from remote_payload.eval.options import flag_words  # `--enable-thinking both`: typer's flags take no value

    argv = flag_words(list(sys.argv[1:] if argv is None else argv))
    _register(argv)
    debug = os.environ.get("DFO_DEBUG") == "1"
    err = AppContext().err
    try:
        from orchestrator.cli.completion import requested_script

        script = requested_script(argv)
        if script is not None:
            sys.stdout.write(script + "\n")
            return 0
        result = command().main(args=argv, prog_name="dfo", standalone_mode=False)
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
