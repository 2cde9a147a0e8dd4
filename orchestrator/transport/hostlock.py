"""One lock per host around everything that changes what a job runs: deploy, provision and job launch.

The lock is ``<workdir>/locks/host.lock``, created with O_EXCL by a small process on the host that holds
it for as long as the controller keeps its SSH channel open: when dfo finishes, fails or is killed, the
channel closes, the process sees end-of-input and removes the lock. A lock whose process is gone (host
rebooted, process killed) is stale and cleared by the next dfo, under the same flock guard the job locks
use, so two controllers can never both clear it. A second dfo that finds the lock held is refused at once
with who holds it and since when. Nested uses within one dfo (``dfo eval`` deploys, provisions and
launches) share the outer lock.

Every host that dfo uses reads the holder record, so it names a holder without naming the operator: a
random token drawn once per dfo process and that process's pid on its controller (no user name, no
controller host name). The pid tells the operator which of their dfo runs holds it; the token tells two
controllers' runs with the same pid apart.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from orchestrator.core.errors import ConnectionLost, HostError, OperationError
from orchestrator.core.host_text import decode_json
from orchestrator.transport.hostcall import program_source

if TYPE_CHECKING:
    import paramiko

HOST_LOCK = "host"
_HOLDER = Path(__file__).with_name("host_script.py")
# The program arrives as one JSON line on stdin; the rest of stdin stays open: its end releases the lock.
_BOOT = "import json, sys; exec(compile(json.loads(sys.stdin.readline()), '<dfo host lock>', 'exec'))"


class HostLocked(OperationError):
    """Another dfo holds the host lock."""

    def __init__(self, host: str, holder: dict, op: str):
        self.host, self.holder = host, holder
        super().__init__(
            f"{host}: another dfo ({holder.get('owner', '?')}, {holder.get('op', '?')}) has held the host lock "
            f"since {_when(holder.get('since'))}; refusing to {op} now",
            hint="wait for it to finish (the lock is released when that dfo ends, also when it is killed); "
            "the pid is that dfo's process on its controller (ps -p PID there)",
        )


def _when(since: object) -> str:
    """The holder's start as the host recorded it ("?" when that is not a time: the host may answer anything)."""
    if not isinstance(since, (int, float)) or isinstance(since, bool):
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since))
    except (ValueError, OverflowError, OSError):  # NaN, or beyond what the platform's time can hold
        return "?"


_TOKEN = secrets.token_hex(4)  # one per dfo process: identifies a holder without identifying its operator


def _owner() -> str:
    return f"dfo {_TOKEN} pid {os.getpid()}"


@contextlib.contextmanager
def host_lock(connector, host: str, op: str, python: str | None = None) -> Iterator[list[str]]:
    """Hold ``host``'s lock for the block; yields notices (e.g. a stale lock that was cleared).

    ``python``: the host interpreter to run the holder with (default: the inventory's). Re-entrant per
    connector: an inner ``host_lock`` for a host already held by this dfo is a no-op."""
    with connector._guard:
        depth = connector.host_locks.get(host, 0)
        connector.host_locks[host] = depth + 1
    try:
        if depth:
            yield []
            return
        channel, notices = _acquire(connector, host, op, python)
        try:
            yield notices
        finally:
            _release(channel)
    finally:
        with connector._guard:
            connector.host_locks[host] -= 1


def _acquire(connector, host: str, op: str, python: str | None) -> tuple[paramiko.Channel, list[str]]:
    import paramiko  # loads with the first connection anyway (see transport/__init__.py)

    inv_host = connector.inventory.hosts[host]
    session = connector.session(host)
    program = program_source(_HOLDER) + "\nhold(%r, %r, %r)\n" % (inv_host.workdir, _owner(), op)
    try:
        channel = session.transport.open_session(timeout=session.host.connect_timeout)
        channel.exec_command(shlex.join([python or inv_host.python, "-c", _BOOT]))
        channel.sendall(json.dumps(program).encode() + b"\n")
        reply = _read_line(channel, timeout=60)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise ConnectionLost(host, f"connection lost while taking the host lock: {exc}") from None
    try:
        answer = decode_json(reply)
        if not isinstance(answer, dict):
            raise ValueError("not an object")
    except ValueError:
        err = channel.recv_stderr(65536) if channel.recv_stderr_ready() else b""
        channel.close()
        detail = (err.decode("utf-8", "replace").strip() or reply)[-800:]
        raise HostError(host, f"cannot take the host lock: {detail or 'no answer'}") from None
    if "error" in answer:
        channel.close()
        raise HostError(host, f"cannot take the host lock: {answer['error']}")
    if "held_by" in answer:
        channel.close()
        raise HostLocked(host, answer["held_by"] if isinstance(answer["held_by"], dict) else {}, op)
    return channel, [f"{host}: {answer['notice']}"] if answer.get("notice") else []


def _read_line(channel: paramiko.Channel, timeout: float) -> str:
    channel.settimeout(timeout)
    data = b""
    while b"\n" not in data:
        chunk = channel.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").split("\n", 1)[0]


def _release(channel: paramiko.Channel) -> None:
    """End of input: the holder removes the lock and exits; wait briefly so the next dfo finds it free."""
    import paramiko

    try:
        channel.shutdown_write()
        channel.settimeout(10)
        while channel.recv(4096):
            pass
    except (OSError, paramiko.SSHException, EOFError):
        pass  # a dead connection ends the holder too
    finally:
        channel.close()
