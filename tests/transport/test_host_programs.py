"""One way to run code on a host: a function of its feature's host_script.py, sent through transport/hostcall.py.

A source scan of the controller: outside transport/ no module sends a host a command line (a session's
``run``/``python``/``exec_command``, a bulk ``ssh_argv``) or holds a program for one (``-c`` argv, a string
that is Python or shell). The host programs themselves (host_script.py, the prelude, the relay's host-side
modules) are what is sent, so they are not scanned; testing/ runs local processes for the sandbox."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ORCHESTRATOR = Path(__file__).resolve().parents[2] / "orchestrator"
PRELUDE = ORCHESTRATOR / "transport" / "host_prelude.py"
RELAY_HOST_SIDE = ("relay/protocol.py", "relay/host_streams.py")  # sent behind the prelude with relay/host_script.py
# What still sends a command line from outside transport/, each with why; an entry that no longer does fails the
# test, so the list only shrinks.
STILL_SENDING = {
    "relay/processes.py": "the relay's stream processes start as `python -c BOOT` (their program follows on stdin) "
                          "over the bulk ssh or a paramiko channel: to move behind transport with the relay split",
    "relay/cipher.py": "`true` over the bulk ssh probes whether the host accepts a cipher",
    "relay/strip.py": "starts the deployed payload's strip-checkpoint command through the host's shell",
    "demo/operation.py": "a port probe inside a sandbox host's network namespace: a local process, not sent over SSH",
}
_SENDS = {"run", "python", "exec_command"}  # HostSession / paramiko channel methods (subprocess.* is local)
_BULK = {"ssh_argv", "bulk_argv", "untar_argv"}
_PROGRAM = re.compile(r"(^|\n|;\s*)(import |from \S+ import |def |exec\()")
_SHELL = re.compile(r"&&|\|\||\$\([a-z]|\bthen\b[\s\S]*\bfi\b|(^|\s)exec\s")


def _host_side(rel: str, path: Path) -> bool:
    return path.name in ("host_script.py", "host_prelude.py") or rel in RELAY_HOST_SIDE


def _controller_modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ORCHESTRATOR.rglob("*.py")):
        rel = path.relative_to(ORCHESTRATOR).as_posix()
        if not rel.startswith(("transport/", "testing/")) and not _host_side(rel, path):
            out[rel] = path
    return out


def _findings(source: str) -> list[str]:
    tree = ast.parse(source)
    local: set[int] = set()  # nodes inside subprocess.*(...) calls: those run on the controller
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"):
            local.update(id(sub) for sub in ast.walk(node))
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            docstrings.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        if id(node) in local:
            continue
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if (name in _SENDS and isinstance(func, ast.Attribute) and node.args) or name in _BULK:
                found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
        elif isinstance(node, (ast.List, ast.Tuple)) and any(
                isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts):
            found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and (_PROGRAM.search(node.value) or _SHELL.search(node.value))):
            found.append(f"line {node.lineno}: {node.value[:80]!r}")
    return found


def test_no_module_outside_transport_sends_a_host_a_command_line_or_a_program():
    findings = {rel: f for rel, path in _controller_modules().items() if (f := _findings(path.read_text()))}
    unexpected = {rel: f for rel, f in findings.items() if rel not in STILL_SENDING}
    assert not unexpected, "run it as a host_script.py function through hostcall (or a transport primitive)"
    stale = sorted(set(STILL_SENDING) - set(findings))
    assert not stale, f"no longer sends anything: remove from STILL_SENDING: {stale}"


def test_the_scan_sees_each_way_of_sending():
    """The scan is not blind: each kind of send it must catch, and what it must leave alone."""
    caught = {
        'session.run(["rm", "-rf", path])': 1,
        'connector.session(h).python("print(1)")': 1,
        'chan.exec_command(cmd)': 1,
        'ssh_argv(host, "true")': 1,
        'argv = [python, "-c", BOOT]': 1,
        'CHECK = "import json\\nprint(1)"': 1,
        "CMD = 'cd /x && exec python -m y'": 1,
        "PROBE = 'p=$(dirname \"$p\")'": 1,
    }
    for source, count in caught.items():
        assert len(_findings(source)) == count, source
    for source in ('subprocess.run(["sh", "-c", "a && b"])', 'watcher.run()', '"""import x; docstring"""',
                   'hostcall.call(session, HOST_SCRIPT, "f", x=1)', 'RE = r"\\$(\\$?)\\{"'):
        assert _findings(source) == [], source


def test_pid_alive_is_defined_once_in_the_prelude():
    host_side = [p for p in ORCHESTRATOR.rglob("*.py") if _host_side(p.relative_to(ORCHESTRATOR).as_posix(), p)]
    defining = [p for p in host_side if re.search(r"(?m)^def _pid_alive\b", p.read_text())]
    assert defining == [PRELUDE]
    # No host script tells a live pid by itself (kill(pid, 0), /proc/PID/stat or cmdline): the prelude does.
    probing = [p.name for p in host_side if p != PRELUDE
               and re.search(r"os\.kill\([^,]+, 0\)|/proc/%d/(stat|cmdline)", p.read_text())]
    assert probing == []
