"""Shell completion: the script for bash, zsh or fish (`dfo --show-completion SHELL`), and the values options
and arguments complete to: hosts from the inventory, datasets, engines, run ids and series names.

Typer's own --show-completion is a flag for the shell it detects; a shell named after it is read here so that
`--show-completion zsh` prints zsh's script and an unsupported shell is refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from orchestrator.core.errors import InputError

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_DFO_COMPLETE"


def requested_script(argv: list[str]) -> str | None:
    """The completion script when ARGV asks for one with a shell named (None: not asked, typer's flag applies)."""
    for i, arg in enumerate(argv):
        if arg.startswith("--show-completion="):
            shell = arg.partition("=")[2]
        elif arg == "--show-completion" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            shell = argv[i + 1]
        else:
            continue
        if shell not in SHELLS:
            raise InputError(f"--show-completion {shell!r}: dfo completes in {', '.join(SHELLS)} only",
                             hint="e.g. dfo --show-completion zsh > ~/.zfunc/_dfo (see docs/completion-and-checks.md)")
        from typer._completion_shared import get_completion_script

        return get_completion_script(prog_name="dfo", complete_var=COMPLETE_VAR, shell=shell)
    return None


# ------------------------------------------------------------------------------ values


def _hosts(ctx: Any) -> list[str]:
    from orchestrator.core.inventory import inventory_path, load_inventory

    root = ctx.find_root()
    given = (root.params or {}).get("inventory") if root is not None else None
    return sorted(load_inventory(inventory_path(given)).hosts)


def _runs_dir(ctx: Any) -> Path:
    from orchestrator.evaluation.runs import runs_root

    return runs_root((ctx.params or {}).get("runs_dir"))


def _runs(ctx: Any) -> list[str]:
    root = _runs_dir(ctx)
    return ["last"] + sorted((p.name for p in root.iterdir() if (p / "run.json").is_file()), reverse=True)


def _series(ctx: Any) -> list[str]:
    root = _runs_dir(ctx) / "series"
    return sorted(p.name for p in root.iterdir() if (p / "series.json").is_file())


def _datasets(ctx: Any) -> list[str]:
    from remote_payload.inputs.datasets.registry import ADAPTERS

    return [name for a in ADAPTERS.values() for name in (a.name, *(f"{a.name}:{s}" for s in a.splits))]


def _engines(ctx: Any) -> list[str]:
    from remote_payload.engines.registry import NAMES

    return list(NAMES)


def _completer(values: Callable[[Any], list[str]]) -> Callable:
    def complete(ctx: Any, param: Any, incomplete: str) -> list[str]:
        try:
            found = values(ctx)
        except Exception:  # noqa: BLE001 - a missing inventory or runs folder completes to nothing, never a trace
            return []
        return [v for v in found if v.startswith(incomplete)]

    return complete


_BY_OPTION = {"--host": _hosts, "--dataset": _datasets, "--engine": _engines, "--series": _series}
_BY_ARGUMENT = {"RUN": _runs, "RUN_A": _runs, "RUN_B": _runs}


def attach(command: Any, path: tuple[str, ...] = ()) -> None:
    """Gives every option and argument that names a host, dataset, engine, run or series its completer."""
    for param in command.params:
        opts = getattr(param, "opts", [])
        values = next((_BY_OPTION[o] for o in opts if o in _BY_OPTION), None)
        if values is None and param.param_type_name == "argument":
            values = _BY_ARGUMENT.get(param.metavar or "")
            if values is None and path[:1] == ("series",) and (param.metavar or "") == "NAME":
                values = _series
        if values is not None and getattr(param, "_custom_shell_complete", None) is None:
            param._custom_shell_complete = _completer(values)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        attach(sub, (*path, name))
