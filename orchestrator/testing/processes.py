"""Local processes of a sandbox: short checked commands, and finding and killing what we started.

Everything here works by PID (read from /proc), never by process name: other sshd run on this machine.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, Sequence

from orchestrator.testing.errors import SandboxError


def run(argv: Sequence[str], what: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a short local command; a failure becomes a SandboxError naming the step and the command."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SandboxError(f"{what}: command not found: {argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{what}: timed out after {timeout}s: {shlex.join(argv)}") from None
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout).strip()
        raise SandboxError(f"{what} failed (exit {proc.returncode}): {shlex.join(argv)}\n    {out}")
    return proc


def proc_state(pid: int) -> str | None:
    """The process state letter from /proc, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def alive(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z")  # a zombie is dead, just not yet reaped


def descendants(pid: int) -> list[int]:
    """All processes below pid (e.g. an sshd's per-connection processes and their commands)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def pids_with_env(entry: bytes) -> list[int]:
    """Processes (that we may inspect) whose environment holds `entry`, e.g. b"DFO_SANDBOX_RUN=ab12cd"."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if entry in env.split(b"\0"):
            found.append(int(pid))
    return found


def command_line(pid: int) -> str | None:
    """The process's command line, its arguments joined by spaces (a title it set itself, as sshd and vLLM do,
    reads as one); None when it is gone or not ours to read."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def command_line_has(pid: int, word: str) -> bool:
    """Does the live process pid have `word` as a whole word on its command line?"""
    cmdline = command_line(pid)
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CONF [listener] ..."): match words.
    return cmdline is not None and f" {word} " in f" {cmdline} " and alive(pid)


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def kill_pids(pids: Iterable[int], grace: float = 2.0) -> list[int]:
    """SIGTERM, wait up to `grace`, then SIGKILL. Returns the PIDs still alive afterwards."""
    pids = [p for p in pids if alive(p)]
    _signal_all(pids, signal.SIGTERM)
    _wait_gone(pids, grace)
    _signal_all([p for p in pids if alive(p)], signal.SIGKILL)
    _wait_gone(pids, 2.0)
    return [p for p in pids if alive(p)]
