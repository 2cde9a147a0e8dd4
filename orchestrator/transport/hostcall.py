"""Run a function of a host script on a host: stdlib-only programs run with the host's own interpreter.

A host script lives in its feature's folder (``deploy/host_script.py``, ``jobs/host_script.py``, …). It is
sent on stdin behind the shared prelude (``host_prelude.py``) — nothing to install, nothing left behind —
with its arguments embedded as a JSON literal, so no value ever passes through a remote shell.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.core.errors import ConnectionLost, HostError
from orchestrator.core.host_text import decode_json

PRELUDE = Path(__file__).with_name("host_prelude.py")
RESULT_MARKER = "@@dfo-result@@"

_WRAPPER = """
import json as _json, sys as _sys
try:
    _result = {{"ok": {func}(**_json.loads({kwargs!r}))}}
except RuntimeError as _exc:  # expected failures: the message is the whole story
    _result = {{"error": str(_exc)}}
except Exception as _exc:
    _result = {{"error": "%s: %s" % (type(_exc).__name__, _exc)}}
_sys.stdout.write("\\n{marker}" + _json.dumps(_result) + "\\n")
"""


def program_source(script: Path | tuple[Path, ...]) -> str:
    """The prelude and the feature's script (or its parts, in order), as one self-contained program."""
    parts = (script,) if isinstance(script, Path) else script
    return "\n\n".join(p.read_text(encoding="utf-8") for p in (PRELUDE, *parts))


def script_source(script: Path | tuple[Path, ...], func: str, kwargs: dict) -> str:
    return program_source(script) + _WRAPPER.format(func=func, kwargs=json.dumps(kwargs), marker=RESULT_MARKER)


def call(session, script: Path | tuple[Path, ...], func: str, python: str = "python3", timeout: float | None = None,
         host_env: dict[str, str] | None = None, **kwargs):
    """Run ``func(**kwargs)`` from SCRIPT on the host and return its result (a host error names the feature).
    HOST_ENV is exported for the script (its values sent on stdin, e.g. a cluster's SLURM_CONF)."""
    where = f"{(script if isinstance(script, Path) else script[-1]).parent.name}.{func}"
    extra = {"env": host_env} if host_env else {}
    result = session.python(script_source(script, func, kwargs), python=python, check=False, timeout=timeout,
                            **extra)
    marker = result.text.rfind(RESULT_MARKER)
    if marker < 0:
        detail = (result.err_text or result.text).strip()[-1500:]
        if result.exit_code == 127 or "not found" in detail:
            raise HostError(session.name, f"cannot run the host's Python ({python!r}): {detail}",
                            hint="set 'python:' for this host in the inventory to an interpreter that exists")
        if result.exit_code == -1:  # the channel closed without an exit status: the link, not the script
            raise ConnectionLost(session.name, f"{where}: the connection closed before the host answered: {detail}")
        raise HostError(session.name, f"{where} failed on the host (exit {result.exit_code}): {detail}")
    try:
        payload = decode_json(result.text[marker + len(RESULT_MARKER):].strip().splitlines()[0])
    except (ValueError, IndexError) as exc:
        raise HostError(session.name, f"{where}: the host's reply is not valid JSON ({exc})") from None
    if not isinstance(payload, dict) or not ("ok" in payload or "error" in payload):
        raise HostError(session.name, f"{where}: unexpected reply from the host: {str(payload)[:200]}")
    if "error" in payload:
        raise HostError(session.name, f"{where}: {payload['error']}")
    return payload["ok"]
