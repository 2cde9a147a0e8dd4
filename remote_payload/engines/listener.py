"""Who listens on a loopback port, read from /proc (Linux): the engine this run started, or another process.

The engine's port is chosen free and released, then bound by vLLM seconds later (after its imports), and
it is in vLLM's argv, which every local user can read: anyone may bind it first. The kernel lists the
listening sockets of this network namespace in /proc/net/tcp{,6} with their inode and owner uid; the
sockets a process holds are its fds that link to ``socket:[inode]``. The engine runs in its own session
(start_new_session), so "ours" is every socket open in a process of that session: the server and the
children it forks. Where /proc/net/tcp cannot be read (not Linux), ``check_port`` returns None and the
caller relies on the API key alone.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"  # the TCP state column of /proc/net/tcp
# The local addresses a connection to 127.0.0.1:PORT can land on.
LANDS_ON = {socket.AF_INET: {"127.0.0.1", "0.0.0.0"},
            socket.AF_INET6: {"::", "::ffff:127.0.0.1", "::ffff:0.0.0.0"}}
TABLES = (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6))


@dataclass(frozen=True)
class Listener:
    inode: int
    uid: int  # the socket owner's uid, as the kernel reports it


@dataclass(frozen=True)
class PortCheck:
    listening: bool  # something listens where a connection to 127.0.0.1:PORT lands
    foreign: tuple[Listener, ...]  # those sockets no process of the session holds


def _address(hexaddr: str, family: int) -> str:
    # The kernel prints each 32-bit word of the address in host byte order.
    words = [int(hexaddr[i:i + 8], 16) for i in range(0, len(hexaddr), 8)]
    return socket.inet_ntop(family, struct.pack(f"={len(words)}I", *words))


def listeners(port: int, proc: Path = PROC) -> list[Listener] | None:
    """The sockets listening where a connection to 127.0.0.1:port lands; None: no table could be read."""
    found: list[Listener] = []
    readable = False
    for name, family in TABLES:
        try:
            rows = (proc / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            cols = row.split()
            try:
                addr, hexport = cols[1].split(":")
                if cols[3] == LISTEN and int(hexport, 16) == port and _address(addr, family) in LANDS_ON[family]:
                    found.append(Listener(inode=int(cols[9]), uid=int(cols[7])))
            except (IndexError, ValueError, OSError):
                continue
    return found if readable else None


def session_sockets(session: int, proc: Path = PROC) -> set[int]:
    """The inodes of the sockets open in the processes of one session."""
    inodes: set[int] = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and ")", so split after the last ")"
            if int((entry / "stat").read_text().rpartition(")")[2].split()[3]) != session:
                continue
            for fd in (entry / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(int(link[len("socket:["):-1]))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read (then not in our session either)
    return inodes


def check_port(port: int, session: int, proc: Path = PROC) -> PortCheck | None:
    """Whether 127.0.0.1:port is listened on, and by which sockets outside the session; None: cannot tell."""
    found = listeners(port, proc)
    if found is None:
        return None
    # Listeners first, then our fds: a socket of ours listed in the table is already in its process's fd table.
    ours = session_sockets(session, proc) if found else set()
    return PortCheck(listening=bool(found), foreign=tuple(lst for lst in found if lst.inode not in ours))
