"""Small stdlib-only Python programs that run on hosts with the host's own interpreter.

They are sent on stdin (nothing to install, nothing left behind) with their arguments embedded as a
Python literal, so no value ever passes through a remote shell unquoted.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import HostError

_WRAPPER = """
import json as _json, sys as _sys
try:
    _result = {{"ok": {func}(**_json.loads({kwargs!r}))}}
except RuntimeError as _exc:  # expected failures: the message is the whole story
    _result = {{"error": str(_exc)}}
except Exception as _exc:
    _result = {{"error": "%s: %s" % (type(_exc).__name__, _exc)}}
_sys.stdout.write("\\n@@dfo-result@@" + _json.dumps(_result) + "\\n")
"""


def script_source(name: str, func: str, kwargs: dict) -> str:
    text = (Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8")
    return text + _WRAPPER.format(func=func, kwargs=json.dumps(kwargs))


def call(session, name: str, func: str, python: str = "python3", timeout: float | None = None, **kwargs):
    """Run ``func(**kwargs)`` from ``remote_scripts/<name>.py`` on the host and return its result."""
    result = session.python(script_source(name, func, kwargs), python=python, check=False, timeout=timeout)
    marker = result.text.rfind("@@dfo-result@@")
    if marker < 0:
        detail = (result.err_text or result.text).strip()[-1500:]
        if result.exit_code == 127 or "not found" in detail:
            raise HostError(session.name, f"cannot run the host's Python ({python!r}): {detail}",
                            hint="set 'python:' for this host in the inventory to an interpreter that exists")
        raise HostError(session.name, f"{name}.{func} failed on the host (exit {result.exit_code}): {detail}")
    payload = json.loads(result.text[marker + len("@@dfo-result@@"):].strip().splitlines()[0])
    if "error" in payload:
        raise HostError(session.name, f"{name}.{func}: {payload['error']}")
    return payload["ok"]
