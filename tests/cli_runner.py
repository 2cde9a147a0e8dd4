"""How tests run the dfo CLI: ``dfo`` in this process, ``dfo_process`` as a real ``python -m orchestrator``.

Both take the same arguments and return a ``subprocess.CompletedProcess`` (returncode, stdout, stderr as
text). ``dfo`` calls ``orchestrator.cli.main.main``, the function the console script calls, so every call
gets a fresh ``AppContext`` (inventory, consoles, connector) from dfo's own option callback, and what a
separate process would see is set for the call and put back after it: the environment, the working
directory, ``sys.argv``, an empty stdin and standard streams of its own. An exception that escapes
``main`` is what Python does with it in a process: its traceback on stderr, exit code 1. A call costs no
interpreter start and no imports after the first.

Use ``dfo_process`` where a test needs a real process: signals, a terminal, a process left behind,
exit codes of the interpreter, or process-wide state a command keeps (the modules it imports, the
controller's ssh ciphers and uv found once per process, so a changed PATH).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

ORCHESTRATOR_MAIN = str(Path(__file__).resolve().parents[1] / "orchestrator" / "__main__.py")


def dfo_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def dfo_env(inventory: Path | None = None, **extra: str) -> dict:
    """The environment of a ``dfo_argv`` process a test starts itself (to signal it, say)."""
    return {**os.environ, **_overrides(inventory, extra)}


def _overrides(inventory: Path | None, extra: dict, runs: Path | None = None,
               payload: Path | None = None) -> dict[str, str]:
    """What a call sets on top of the caller's environment. COLUMNS=200: wide output, so tables are not
    wrapped in assertions."""
    env = {"COLUMNS": "200", **extra}
    if inventory is not None:
        env["DFO_INVENTORY"] = str(inventory)
    if runs is not None:
        env["DFO_RUNS_DIR"] = str(runs)
    if payload is not None:
        env["DFO_PAYLOAD_ROOT"] = str(payload)
    return env


def _split_box(args: tuple, inventory: Path | None) -> tuple[tuple, Path | None]:
    """A sandbox may come first (``dfo(box, "deploy")``): its inventory is used."""
    if args and not isinstance(args[0], str):
        return args[1:], inventory or args[0].inventory_path
    return args, inventory


def dfo_process(*args, inventory: Path | None = None, runs: Path | None = None, payload: Path | None = None,
                env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``dfo ARGS`` as a real process (``python -m orchestrator``), output captured."""
    args, inventory = _split_box(args, inventory)
    full_env = {**os.environ, **_overrides(inventory, env or {}, runs, payload)}
    return subprocess.run(dfo_argv(*args), env=full_env, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def dfo(*args, inventory: Path | None = None, runs: Path | None = None, payload: Path | None = None,
        env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``dfo ARGS`` in this process, output captured. ``timeout`` is kept for the signature of
    ``dfo_process``; here pytest's own timeout stops a call that hangs."""
    args, inventory = _split_box(args, inventory)
    argv = [str(a) for a in args]
    _register_all_commands()
    out, err = io.BytesIO(), io.BytesIO()
    with _as_a_process(_overrides(inventory, env or {}, runs, payload), cwd, argv, out, err), \
            _warnings_and_logs_on_stderr():
        code = _exit_code_of_main(argv)
    return subprocess.CompletedProcess(["dfo", *argv], code, _as_text(out.getvalue()), _as_text(err.getvalue()))


def _register_all_commands() -> None:
    # A process registers only the command it runs (all of them, in COMMAND_MODULES order, for `dfo --help`);
    # this one keeps every command it ever ran. All of them at the first call: the order of a process, unless
    # a test imported a command module before.
    from orchestrator.cli import main

    for module in main.COMMAND_MODULES.values():
        importlib.import_module(f"orchestrator.cli.{module}")


def _exit_code_of_main(argv: list[str]) -> int:
    from orchestrator.cli import main

    try:
        return main.main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - what the interpreter does with an exception that ends a process
        traceback.print_exc()
        return 1


@contextlib.contextmanager
def _as_a_process(env: dict[str, str], cwd: Path | None, argv: list[str], out: io.BytesIO, err: io.BytesIO):
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_streams, saved_argv = (sys.stdin, sys.stdout, sys.stderr), sys.argv
    # write_through: text and sys.stdout.buffer writes (`dfo jobs logs --raw`) stay in order.
    sys.stdin = io.TextIOWrapper(io.BytesIO(b""), encoding="utf-8")  # what /dev/null gives
    sys.stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.argv = [ORCHESTRATOR_MAIN, *argv]  # what `python -m orchestrator ARGV` sees (`dfo watch --detach` reads it)
    os.environ.update(env)
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            stream.detach()  # the caller reads the bytes; closing the wrapper would close them
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


# A fresh interpreter's warning filters (without -W or PYTHONWARNINGS), first match wins.
_PYTHON_DEFAULT_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                           ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                           ("ignore", ResourceWarning, ""))


@contextlib.contextmanager
def _warnings_and_logs_on_stderr():
    """Warnings and library log records reach stderr as in a process of their own, not pytest's capture:
    a test that wants a clean stderr sees them."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in _PYTHON_DEFAULT_FILTERS:
            warnings.filterwarnings(action, category=category, module=module, append=True)
        warnings.showwarning = _warning_to_stderr
        # logging's last resort in a process without handlers: WARNING and above, the bare message.
        last_resort = logging.StreamHandler(sys.stderr)
        last_resort.setLevel(logging.WARNING)
        logging.getLogger().addHandler(last_resort)
        try:
            yield
        finally:
            logging.getLogger().removeHandler(last_resort)


def _warning_to_stderr(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _as_text(data: bytes) -> str:
    """Bytes as ``subprocess.run(..., text=True)`` gives them: UTF-8, universal newlines."""
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
