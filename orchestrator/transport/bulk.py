"""The bulk data plane: argv for the system `ssh` binary, with the control plane's exact settings.

Bulk bytes go through `ssh` subprocesses (fast ciphers, no Python in the byte path). The options are
generated from the same ResolvedHost as the paramiko session — host key file, strict checking, key,
port, user, jump host — so both planes trust and reach exactly the same hosts.
"""

from __future__ import annotations

import shlex
import shutil
from typing import Sequence

from orchestrator.core.inventory import ResolvedHost

FAST_CIPHER = "aes128-gcm@openssh.com"


def ssh_binary() -> str | None:
    return shutil.which("ssh")


def ssh_options(host: ResolvedHost, *, cipher: str | None = None) -> list[str]:
    """Options (without the destination) that pin ssh to the inventory's view of ``host``."""
    opts = [
        # The inventory's ssh_config (or none at all), so ~/.ssh/config cannot change what we verified.
        "-F", host.ssh_config or "/dev/null",
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={host.known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={max(1, int(round(host.connect_timeout)))}",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
        "-o", "LogLevel=ERROR",
        "-p", str(host.port),
        "-l", host.user,
    ]
    if host.identity_files:
        for key in host.identity_files:
            opts += ["-i", key]
        opts += ["-o", "IdentitiesOnly=yes"]
    if cipher:
        opts += ["-c", cipher]
    if host.proxy_jump is not None:
        jump = ["ssh", *ssh_options(host.proxy_jump), "-W", "%h:%p", host.proxy_jump.hostname]
        opts += ["-o", "ProxyCommand=" + shlex.join(jump)]
    return opts


def ssh_argv(host: ResolvedHost, remote_command: str | Sequence[str], *, cipher: str | None = None) -> list[str]:
    """Full argv for ``ssh HOST REMOTE_COMMAND``; argv lists are quoted for the remote shell."""
    cmd = remote_command if isinstance(remote_command, str) else shlex.join(str(p) for p in remote_command)
    return [ssh_binary() or "ssh", *ssh_options(host, cipher=cipher), host.hostname, cmd]
