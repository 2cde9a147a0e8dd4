"""The SSH control plane: verified Fabric/paramiko sessions that run commands and move small files.

Fabric's defaults are overridden where they are unsafe or slow: host keys are
checked against the inventory's known_hosts (unknown keys refused unless trust-on-first-use is asked
for, and then recorded), keepalive is on, every phase of the connect has a timeout, and commands are run
on raw paramiko channels (Fabric's ``run(in_stream=...)`` feeds stdin at ~100 B/s).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import paramiko
from fabric import Config, Connection

from orchestrator.core.errors import ConnectionLost, HostError, InputError
from orchestrator.core.inventory import ENV_KEY_RE
from orchestrator.transport.resolve import ResolvedHost

KEEPALIVE_SECONDS = 15
_KNOWN_HOSTS_LOCK = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown host keys, or (trust-on-first-use) record them in the known_hosts file."""

    def __init__(self, host: ResolvedHost, trust_new: bool, on_trust: Callable[[str], None] | None = None):
        self.host = host
        self.trust_new = trust_new
        self.on_trust = on_trust

    def missing_host_key(self, client, hostname, key):
        fp = f"{key.get_name()} {fingerprint(key)}"
        if not self.trust_new:
            raise HostError(
                self.host.name,
                f"unknown host key for {hostname} ({fp}); not in {self.host.known_hosts}",
                hint="check the fingerprint with the host's admin (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                "then re-run with --trust-new-host-keys to record it",
            )
        path = Path(self.host.known_hosts)
        with _KNOWN_HOSTS_LOCK:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        if self.on_trust:
            self.on_trust(f"{self.host.name}: trusted new host key {fp}, recorded in {path}")


@dataclass
class CommandResult:
    host: str
    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def err_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


def command_line(command: str | Sequence[str]) -> str:
    """A command for the remote shell: argv lists are quoted with shlex, strings pass as written."""
    return command if isinstance(command, str) else shlex.join(str(part) for part in command)


def env_prologue(env: dict[str, str]) -> tuple[str, bytes]:
    """(shell prologue, first stdin line) that export ``env`` on the host without putting a value in argv.

    The shell's `read` takes exactly one line from stdin (it reads a pipe byte by byte), so what follows
    is the command's own input. Keys are shell identifiers; values are quoted for the ``eval``."""
    for key, value in env.items():
        if not ENV_KEY_RE.match(key):
            raise InputError(f"environment variable name {key[:40]!r} is not a shell identifier")
        if "\n" in value or "\x00" in value:
            raise InputError(f"environment variable {key}: the value contains a newline or a NUL")
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + "\n"
    prologue = 'IFS= read -r _dfo_env || exit 97; eval "export $_dfo_env"; unset _dfo_env; '
    return prologue, line.encode()


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


class HostSession:
    """One open SSH connection to one inventory host."""

    def __init__(self, host: ResolvedHost, connection: Connection, auth: str, connect_seconds: float):
        self.host = host
        self.connection = connection
        self.auth = auth
        self.connect_seconds = connect_seconds
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def transport(self) -> paramiko.Transport:
        return self.connection.transport

    # -- commands

    def run(
        self,
        command: str | Sequence[str],
        *,
        stdin: bytes | None = None,
        check: bool = True,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
    ) -> CommandResult:
        """Run a command; stdin is sent whole, stdout/stderr are collected concurrently (no deadlock).

        ``env`` is exported for the whole command (every process it starts), its values sent on stdin
        ahead of the command's own input: never in the command line (``ps`` on the host shows that) nor
        in an error message."""
        cmd = command_line(command)
        if env:
            prologue, line = env_prologue(env)
            cmd, stdin = prologue + cmd, line + (stdin or b"")
        try:
            channel = self.transport.open_session(timeout=self.host.connect_timeout)
            channel.exec_command(cmd)
            if stdin:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = self._collect(channel, timeout)
            code = channel.recv_exit_status()
            channel.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(self.name, f"connection lost while running `{_short(cmd)}`: {exc}") from None
        result = CommandResult(self.name, cmd, code, out, err)
        if check and not result.ok:
            detail = tail(result.err_text) or tail(result.text)
            raise HostError(self.name, f"`{_short(cmd)}` exited with {code}" + (f":\n{detail}" if detail else ""))
        return result

    def round_trip_seconds(self) -> float:
        """One SSH round trip, nothing run on the host: a session channel opened (and closed)."""
        started = time.monotonic()
        try:
            self.transport.open_session(timeout=self.host.connect_timeout).close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise ConnectionLost(self.name, f"connection lost while measuring the round trip: {exc}") from None
        return time.monotonic() - started

    def _collect(self, channel: paramiko.Channel, timeout: float | None) -> tuple[bytes, bytes]:
        # stderr drains in its own thread: an unread stream stops the channel's window from moving.
        out, err = bytearray(), bytearray()
        channel.settimeout(timeout)

        def drain_stderr() -> None:
            try:
                while chunk := channel.recv_stderr(65536):
                    err.extend(chunk)
            except (socket.timeout, OSError):
                pass

        reader = threading.Thread(target=drain_stderr, daemon=True)
        reader.start()
        try:
            while chunk := channel.recv(65536):
                out.extend(chunk)
        except socket.timeout:
            channel.close()
            raise ConnectionLost(self.name, f"command did not finish within {timeout:.0f}s") from None
        reader.join(timeout)
        return bytes(out), bytes(err)

    def python(self, script: str, *args: str, python: str = "python3", **kwargs) -> CommandResult:
        """Run a Python script on the host (sent on stdin, so nothing is left behind)."""
        return self.run([python, "-", *args], stdin=script.encode(), **kwargs)

    # -- files

    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.connection.sftp()
        return self._sftp

    def put(self, local: str | os.PathLike, remote: str, progress: Callable[[int, int], None] | None = None) -> None:
        try:
            self.sftp.put(str(local), remote, callback=progress, confirm=True)
        except (OSError, paramiko.SSHException) as exc:
            raise HostError(self.name, f"upload of {local} to {remote} failed: {exc}") from None

    def put_bytes(self, data: bytes, remote: str) -> None:
        try:
            with self.sftp.open(remote, "wb") as fh:
                fh.set_pipelined(True)
                fh.write(data)
        except (OSError, paramiko.SSHException) as exc:
            raise HostError(self.name, f"writing {remote} failed: {exc}") from None

    def get(self, remote: str, local: str | os.PathLike, progress: Callable[[int, int], None] | None = None) -> None:
        try:
            self.sftp.get(remote, str(local), callback=progress)
        except (OSError, paramiko.SSHException) as exc:
            raise HostError(self.name, f"download of {remote} failed: {exc}") from None

    def raise_rekey_limits(self) -> None:
        """Let the OpenSSH server drive rekeying on this session only (for dfo's own bulk streams).

        paramiko's client-side rekey every 512 MiB can deadlock a busy stream; OpenSSH servers rekey on
        their own schedule, which paramiko answers. Set on this transport's packetizer (an instance
        attribute), never on the class: other paramiko connections in the process keep their limits."""
        big = 1 << 62
        packetizer = self.transport.packetizer
        packetizer.REKEY_BYTES = packetizer.REKEY_PACKETS = big

    def close(self) -> None:
        try:
            if self._sftp is not None:
                self._sftp.close()
            self.connection.close()
        except Exception:  # closing a dead connection must not mask the real error
            pass


BANNER_FAILURES = ("Error reading SSH protocol banner", "Indecipherable protocol version")  # paramiko's words
SEEN_BYTES = 200


def _banner_error(host: ResolvedHost, exc: Exception, bannerless: bool) -> HostError | None:
    """A port that accepted the connection but did not greet as an SSH server: closed, not SSH, or silent.

    paramiko reports all three as one banner error (or, when the client's own timeout ends first, as "no existing
    session"); the cause it chained (a timeout, an end of stream) and, for an end of stream, one more look at the
    port say which it was."""
    text = str(exc)
    if not isinstance(exc, paramiko.SSHException) or not bannerless:
        return None
    where = f"{host.hostname}:{host.port}"
    port_hint = f"check 'address' and 'port' of {host.name} in the inventory (or its ssh_config entry)"
    if text.startswith(BANNER_FAILURES[1]):  # lines were read, none of them an SSH banner
        line = text.split('"', 1)[1].rstrip('"') if '"' in text else text
        return ConnectionLost(host.name, f"{where} is not SSH: it answered {_printable(line)}", hint=port_hint)
    silent = ConnectionLost(
        host.name, f"{where} is silent: it accepted the connection but sent no SSH banner within "
        f"{host.connect_timeout:g}s", hint=port_hint + "; if the host is only slow, raise --connect-timeout")
    # The client stopped waiting before the banner read did, or the banner read timed out.
    if not text.startswith(BANNER_FAILURES[0]) or isinstance(exc.__context__, (socket.timeout, TimeoutError)):
        return silent
    # An end of stream: the peer closed, or this side did (another connection's failure ended the command).
    seen = _first_bytes(host) if host.proxy_jump is None else b""
    if seen is None:
        return silent
    if seen and not seen.startswith(b"SSH-"):  # an SSH banner now: the first connection was refused
        return ConnectionLost(host.name, f"{where} is not SSH: it answered {_printable(seen)}", hint=port_hint)
    return ConnectionLost(host.name, f"{where} closed the connection before sending an SSH banner (closed)",
                          hint=port_hint + "; sshd may also be refusing this client (MaxStartups, "
                          "AllowUsers, tcp wrappers, fail2ban)")


def _first_bytes(host: ResolvedHost) -> bytes | None:
    """What the port sends first when connected to directly: b"" when it closes (or cannot be reached), None
    when it says nothing within the connect timeout."""
    try:
        with socket.create_connection((host.hostname, host.port), timeout=host.connect_timeout) as sock:
            return sock.recv(SEEN_BYTES)
    except (socket.timeout, TimeoutError):
        return None
    except OSError:
        return b""


def _printable(seen: bytes | str) -> str:
    """The first line a port sent, as a quoted string a terminal shows safely (it came from another machine)."""
    text = seen.decode("utf-8", "replace") if isinstance(seen, bytes) else seen
    line = (text.strip().splitlines() or [""])[0][:80]
    return repr(line)


def _short(cmd: str, limit: int = 160) -> str:
    return cmd if len(cmd) <= limit else cmd[: limit - 1] + "…"


def connect(
    host: ResolvedHost,
    *,
    trust_new: bool = False,
    on_trust: Callable[[str], None] | None = None,
) -> HostSession:
    """Open a verified SSH session to ``host``; every failure becomes a HostError that says why."""
    quiet_paramiko()
    gateway = None
    if host.proxy_jump is not None:
        gateway = connect(host.proxy_jump, trust_new=trust_new, on_trust=on_trust).connection
    keys = [k for k in host.identity_files if os.path.exists(k)]
    conn = Connection(
        host=host.hostname,
        user=host.user,
        port=host.port,
        config=Config(overrides={"load_ssh_configs": False}),
        connect_timeout=max(1, int(round(host.connect_timeout))),
        connect_kwargs={
            "key_filename": keys,
            "look_for_keys": not keys,
            "allow_agent": not keys,
            "banner_timeout": host.connect_timeout,
            "auth_timeout": host.connect_timeout,
        },
        gateway=gateway or False,
    )
    # Fabric installs AutoAddPolicy and loads no known_hosts: replace both before open().
    client = conn.client
    client.set_missing_host_key_policy(HostKeyPolicy(host, trust_new, on_trust))
    if os.path.exists(host.known_hosts):
        try:
            client.load_host_keys(host.known_hosts)
        except (OSError, paramiko.SSHException) as exc:
            raise HostError(host.name, f"cannot read known_hosts {host.known_hosts}: {exc}") from None
    started = time.monotonic()
    try:
        conn.open()
    except HostError:
        raise
    except (paramiko.SSHException, OSError) as exc:  # socket errors and timeouts are OSErrors
        transport = conn.client.get_transport()  # without a server banner, its remote_version stays empty
        raise _open_error(host, keys, exc, bannerless=transport is not None and not transport.remote_version) from None
    elapsed = time.monotonic() - started
    conn.transport.set_keepalive(KEEPALIVE_SECONDS)
    auth = conn.transport.auth_handler.auth_method if conn.transport.auth_handler else "?"
    return HostSession(host, conn, auth, elapsed)


def quiet_paramiko() -> None:
    """Keep paramiko's own log (a failed handshake is logged with its traceback) off the terminal: dfo says what
    happened once, in its words. With DFO_DEBUG=1 the log stays on, as paramiko writes it."""
    log = logging.getLogger("paramiko")
    debug = os.environ.get("DFO_DEBUG") == "1"
    log.propagate = debug
    if not debug and not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())


def _open_error(host: ResolvedHost, keys: list[str], exc: Exception, bannerless: bool = False) -> HostError:
    """Why a connection could not be opened, for a person (checked from the most specific case down)."""
    where = f"{host.hostname}:{host.port}"
    banner = _banner_error(host, exc, bannerless)
    if banner is not None:
        return banner
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostError(
            host.name,
            f"HOST KEY MISMATCH for {known_hosts_name(host.hostname, host.port)}: the server offered "
            f"{exc.key.get_name()} {fingerprint(exc.key)} but {host.known_hosts} records "
            f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}. Refusing to connect.",
            hint="if the host was reinstalled, confirm the new fingerprint with its admin, then remove the old line "
            f"(ssh-keygen -R '{known_hosts_name(host.hostname, host.port)}' -f {host.known_hosts}) and re-run "
            "with --trust-new-host-keys; otherwise this may be an attack",
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return HostError(
            host.name, f"authentication failed for {host.label} ({exc})",
            hint=f"keys tried: {', '.join(keys) or 'agent and ~/.ssh defaults'}; set identity_file in the inventory",
        )
    if isinstance(exc, socket.gaierror):
        return HostError(host.name, f"cannot resolve host name {host.hostname!r} ({exc.strerror})",
                         hint="check 'address' in the inventory or the HostName in ssh_config")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return ConnectionLost(host.name, f"connection refused by {where} (is sshd running?)",
                              hint=f"check that sshd listens there, and 'address' and 'port' of {host.name} in the "
                              "inventory (or its ssh_config entry)")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return ConnectionLost(host.name, f"no answer from {where} within {host.connect_timeout:g}s "
                              "(host down or firewalled)")
    if isinstance(exc, OSError):
        reason = {errno.ENETUNREACH: "network unreachable", errno.EHOSTUNREACH: "host unreachable",
                  errno.ECONNREFUSED: "connection refused (is sshd running?)"}.get(exc.errno or 0, str(exc))
        return ConnectionLost(host.name, f"cannot connect to {where}: {reason}")
    return ConnectionLost(host.name, f"SSH handshake with {where} failed: {exc}")
