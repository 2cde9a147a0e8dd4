"""ROOT/sandbox.json: what a running sandbox holds, so that one left running (keep=True) can be found,
refused as a new root, and torn down later by another process (`... sandbox down ROOT`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.testing.errors import SandboxError
from orchestrator.testing.host import SandboxFacts
from orchestrator.testing.network import ROUTE_METRIC, delete_netns, delete_veth, release_subnet
from orchestrator.testing.processes import command_line_has, descendants, kill_pids

STATE_FILE = "sandbox.json"


def state_of(box: SandboxFacts) -> dict[str, Any]:
    return {
        "created_by": "orchestrator.testing.sandbox",
        "run_id": box.run_id,
        "controller_pid": os.getpid(),
        "isolated": box.isolated,
        "hosts": {
            h.name: {"sshd_pid": h.pid, "sshd_config": str(h.sshd_config), "netns": h.netns,
                     "veth": h.veth, "subnet": h.subnet}
            for h in box.hosts.values()
        },
    }


def sshd_still_running(h: dict) -> bool:
    """Is the state file's sshd PID (one host's entry) still our sshd (same config on its command line)?"""
    pid = h.get("sshd_pid")
    if not pid:
        return False
    return command_line_has(pid, h.get("sshd_config", ""))


def holds_running_sandbox(path: Path) -> bool:
    """Does the state file at path describe a sandbox whose sshd still runs? (unreadable: no)"""
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return any(sshd_still_running(h) for h in state.get("hosts", {}).values())


def manual_cleanup(state: dict) -> list[str]:
    """The shell commands that would tear the state's sandbox down by hand."""
    steps = []
    for h in state.get("hosts", {}).values():
        if h.get("sshd_pid"):
            steps.append(f"kill {h['sshd_pid']}")
        if h.get("netns"):
            steps.append(f"ip netns del {h['netns']}")
        if h.get("subnet"):
            steps.append(f"ip route del unreachable {h['subnet']} metric {ROUTE_METRIC}")
    return steps


def teardown_state(root: str | os.PathLike) -> list[str]:
    """Tear down a sandbox left running (keep=True) from ROOT/sandbox.json. Returns what was done."""
    path = Path(root) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise SandboxError(f"no running sandbox in {root} ({STATE_FILE} not found)") from None
    except ValueError as exc:
        raise SandboxError(f"{path} is not valid JSON: {exc}") from None
    done = []
    for name, h in state.get("hosts", {}).items():
        if sshd_still_running(h):
            pid = h["sshd_pid"]
            left = kill_pids([*descendants(pid), pid])
            done.append(f"{name}: stopped sshd {pid}" + (f" (survivors: {left})" if left else ""))
        if h.get("veth"):
            delete_veth(h["veth"])
        if h.get("netns"):
            delete_netns(h["netns"])
            done.append(f"{name}: deleted namespace {h['netns']}")
        if h.get("subnet"):
            release_subnet(h["subnet"])
    path.unlink()
    return done
