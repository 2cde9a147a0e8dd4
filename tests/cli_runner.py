"""The one way tests run the dfo CLI: a real subprocess (`python -m orchestrator`), output captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def dfo_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def dfo_env(inventory: Path | None = None, **extra: str) -> dict:
    env = {**os.environ, "COLUMNS": "200", **extra}
    if inventory is not None:
        env["DFO_INVENTORY"] = str(inventory)
    return env


def dfo(*args, inventory: Path | None = None, runs: Path | None = None, payload: Path | None = None,
        env: dict | None = None, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``dfo ARGS``. A sandbox may come first (``dfo(box, "deploy")``): its inventory is used.

    The output is wide (COLUMNS=200) so tables are not wrapped in assertions.
    """
    if args and not isinstance(args[0], str):
        box, args = args[0], args[1:]
        inventory = inventory or box.inventory_path
    full_env = dfo_env(inventory, **(env or {}))
    if runs is not None:
        full_env["DFO_RUNS_DIR"] = str(runs)
    if payload is not None:
        full_env["DFO_PAYLOAD_ROOT"] = str(payload)
    return subprocess.run(dfo_argv(*args), env=full_env, capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)
