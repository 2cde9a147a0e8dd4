"""The bulk data plane: argv for the system `ssh` binary, with the control plane's exact settings.

Bulk bytes go through `ssh` subprocesses (fast ciphers, no Python in the byte path). The options are
generated from the same ResolvedHost as the paramiko session — host key file, strict checking, key,
port, user, jump host — so both planes trust and reach exactly the same hosts.
"""

from __future__ import annotations

import shlex
import shutil
from typing import Sequence

from orchestrator.core.errors import InputError
from orchestrator.transport.resolve import ResolvedHost

FAST_CIPHER = "aes128-gcm@openssh.com"


def ssh_binary() -> str | None:
    return shutil.which("ssh")


def _conf_value(path: str) -> str:
    """A file path as an ssh -o value: ssh splits values at spaces (double quotes group) and expands
    %-tokens in these paths, so '%' is doubled and the path double-quoted."""
    if any(c in path for c in '"\n\r'):
        raise InputError(f"path {path!r} cannot be passed to ssh (it contains a quote or a newline)")
    return '"' + path.replace("%", "%%") + '"'


def ssh_options(host: ResolvedHost, *, cipher: str | None = None) -> list[str]:
    """Options (without the destination) that pin ssh to the inventory's view of ``host``.

    ssh is given the ssh_config alias as its destination (``destination(host)``), so it reads the same
    ssh_config block paramiko did; every value dfo resolved is then set explicitly here (the command line
    wins over the file), so both planes reach the same address, port, user, key and jump chain."""
    opts = [
        # The inventory's ssh_config (or none at all), so ~/.ssh/config cannot change what we verified.
        "-F", host.ssh_config or "/dev/null",
        "-o", "HostName=" + host.hostname.replace("%", "%%"),
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={_conf_value(host.known_hosts)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"ConnectTimeout={max(1, int(round(host.connect_timeout)))}",
        "-o", "ServerAliveInterval=15",
        "-o", "ServerAliveCountMax=4",
        "-o", "LogLevel=ERROR",
        # Nothing of the controller's reaches the hosts, whatever a `Host *` block says.
        "-o", "ForwardAgent=no",
        "-o", "ForwardX11=no",
        "-o", "ClearAllForwardings=yes",
        "-o", "PermitLocalCommand=no",
        "-p", str(host.port),
        "-l", host.user,
    ]
    if host.identity_files:
        for key in host.identity_files:
            opts += ["-i", key.replace("%", "%%")]
        opts += ["-o", "IdentitiesOnly=yes"]
    if cipher:
        opts += ["-c", cipher]
    opts += ["-o", "ProxyCommand=" + _proxy_command(host)]
    return opts


def _proxy_command(host: ResolvedHost) -> str:
    """ssh to the previous hop with ``-W`` to the next one. The target is written out (not %h:%p), and the
    whole command has its '%' doubled: the ssh running it expands %-tokens once, and a nested hop's own
    ProxyCommand (inside this one) must reach its ssh unexpanded. ``none`` when there is no hop (a
    ProxyCommand from ssh_config must not add a path that paramiko does not take)."""
    jump = host.proxy_jump
    if jump is None:
        return "none"
    target = f"[{host.hostname}]" if ":" in host.hostname else host.hostname
    argv = [ssh_binary() or "ssh", *ssh_options(jump), "-W", f"{target}:{host.port}", "--", destination(jump)]
    return shlex.join(argv).replace("%", "%%")


def destination(host: ResolvedHost) -> str:
    return host.alias or host.hostname


def ssh_argv(host: ResolvedHost, remote_command: str | Sequence[str], *, cipher: str | None = None) -> list[str]:
    """Full argv for ``ssh HOST REMOTE_COMMAND``; argv lists are quoted for the remote shell.

    ``--`` ends the options: nothing after it (the destination, the command) can be read as one."""
    cmd = remote_command if isinstance(remote_command, str) else shlex.join(str(p) for p in remote_command)
    return [ssh_binary() or "ssh", *ssh_options(host, cipher=cipher), "--", destination(host), cmd]


def untar_argv(host: ResolvedHost, folder: str, *, cipher: str | None = None) -> list[str]:
    """argv of ``ssh HOST`` unpacking the tar stream on its stdin into FOLDER (created): bulk uploads go as
    one stream through the system ssh, no Python in the byte path. FOLDER reaches the shell quoted."""
    return ssh_argv(host, f"mkdir -p {shlex.quote(folder)} && tar -x -f - -C {shlex.quote(folder)}", cipher=cipher)
