"""--on-result CMD: a local command run after each checkpoint with the result JSON on stdin.

For a chat webhook or a mail, e.g. ``--on-result 'curl -sS -H content-type:application/json -d @- $HOOK'``
or ``--on-result 'mail -s "dfo watch" me@example.org'``. The command runs through ``sh -c`` on the
controller (it is the user's own command line), with DFO_SERIES, DFO_CHECKPOINT, DFO_STEP and DFO_STATUS
in its environment. Its failure is reported and recorded, never stops the watcher: ``run_hook`` never
raises, so a hook that cannot run for a checkpoint (e.g. a name an older series recorded with a NUL,
which no environment can carry) is recorded as failed once instead of failing every restart.
"""

from __future__ import annotations

import json
import os
import subprocess

HOOK_TIMEOUT = 120.0


def run_hook(command: str, result: dict, *, timeout: float = HOOK_TIMEOUT) -> dict:
    """Returns {"ok", "exit_code", "detail"}."""
    env = {**os.environ, "DFO_SERIES": str(result.get("series", "")),
           "DFO_CHECKPOINT": str(result.get("checkpoint", "")), "DFO_STEP": str(result.get("step", "")),
           "DFO_STATUS": str(result.get("status", ""))}
    try:
        proc = subprocess.run(["sh", "-c", command], input=json.dumps(result, indent=2, default=str),
                              capture_output=True, text=True, errors="replace", timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "exit_code": None, "detail": f"--on-result did not finish within {timeout:.0f}s"}
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the environment or the command
        return {"ok": False, "exit_code": None, "detail": f"--on-result could not start: {exc}"}
    detail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"ok": proc.returncode == 0, "exit_code": proc.returncode, "detail": " | ".join(detail)}
