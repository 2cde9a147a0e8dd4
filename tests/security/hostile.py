"""The hostile-host kit: a sandbox host whose answers are tampered with, as a compromised host would.

``HostileHost`` gives a copy of the sandbox inventory in which one host's ``python`` is a wrapper around
the real interpreter. Host scripts run as ``python -`` (program on stdin, see transport/hostcall.py); the
wrapper runs them with the real interpreter, then hands the decoded reply of the called function to a
``tamper(func, reply)`` hook written by the test, and prints what the hook returns (as JSON; a string
that starts with ``RAW`` is sent as it is after that prefix: JSON no encoder writes, nested 200 000
deep). Everything else the host runs passes through untouched. The host's sshd, keys and files are the
sandbox's own: only its answers lie.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

WRAPPER = r'''#!{real}
import json, os, re, subprocess, sys
REAL, HOOK, MARKER, RAW = {real!r}, {hook!r}, "@@dfo-result@@", "@@raw@@"
if sys.argv[1:2] != ["-"]:
    os.execv(REAL, [REAL] + sys.argv[1:])
program = sys.stdin.buffer.read()
proc = subprocess.run([REAL] + sys.argv[1:], input=program, capture_output=True)
out = proc.stdout.decode("utf-8", "replace")
called = re.search(r'_result = \{{"ok": (\w+)\(', program.decode("utf-8", "replace"))
at = out.rfind(MARKER)
if called and at >= 0:
    reply = json.loads(out[at + len(MARKER):].strip().splitlines()[0])
    scope = {{}}
    exec(open(HOOK).read(), scope)
    reply = scope["tamper"](called.group(1), reply)
    with open(HOOK + ".log", "a") as log:
        log.write(called.group(1) + "\n")
    text = reply[len(RAW):] if isinstance(reply, str) and reply.startswith(RAW) else json.dumps(reply)
    out = out[:at] + MARKER + text + "\n"
sys.stdout.write(out)
sys.stderr.write(proc.stderr.decode("utf-8", "replace"))
sys.exit(proc.returncode)
'''


RAW = "@@raw@@"


class HostileHost:
    """One sandbox host made to lie. ``tamper(source)`` sets the hook (Python defining ``tamper``)."""

    def __init__(self, box, name: str, folder: Path):
        self.box, self.name = box, name
        folder.mkdir(parents=True, exist_ok=True)
        self.hook = folder / "tamper.py"
        self.tamper("def tamper(func, reply):\n    return reply\n")
        self.wrapper = folder / "hostile-python"
        self.wrapper.write_text(WRAPPER.format(real=sys.executable, hook=str(self.hook)))
        self.wrapper.chmod(self.wrapper.stat().st_mode | stat.S_IXUSR)
        self.inventory = folder / "inventory.yaml"
        self.inventory.write_text(_with_python(box.inventory_path.read_text(), name, str(self.wrapper)))

    def tamper(self, source: str) -> None:
        self.hook.write_text(source)

    def called(self) -> list[str]:
        """Host-script functions whose replies went through the hook."""
        log = Path(str(self.hook) + ".log")
        return log.read_text().split() if log.exists() else []


def _with_python(inventory: str, host: str, python: str) -> str:
    """The inventory text with HOST's ``python:`` replaced (the sandbox writes one per host)."""
    block = re.search(rf"(?ms)^  {re.escape(host)}:\n.*?(?=^  \S|\Z)", inventory)
    assert block, f"host {host} not in the sandbox inventory"
    new_block = re.sub(r"(?m)^    python: .*$", f"    python: {json.dumps(python)}", block.group(0))
    return inventory[: block.start()] + new_block + inventory[block.end():]


def tree(root: Path) -> set[str]:
    """Every path under ROOT (relative), to assert that nothing appeared outside an allowed folder."""
    return {os.path.relpath(os.path.join(base, n), root) for base, dirs, files in os.walk(root)
            for n in dirs + files}
