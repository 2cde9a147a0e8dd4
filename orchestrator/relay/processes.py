"""Host-side relay processes reached over bulk SSH streams (which cipher they use: ``cipher.py``).

Each process is ``python3 -c BOOT`` on a host; BOOT reads a 10-digit length and that much Python source
from stdin (the host program plus the call to make), so nothing is installed on the host and no path
reaches a remote shell. After that, stdin and stdout are the process's own protocol (protocol.py).

Two implementations of one small process interface:
- ``SshProcess``: a system ``ssh`` subprocess with argv from ``transport.bulk`` (the control plane's host
  key, key, port and jump settings); its stdin or stdout may be one end of an OS pipe that joins a
  reader to a writer, so bytes move through kernel pipes and ssh's C crypto only.
- ``ParamikoProcess``: a paramiko channel, for controllers without an ``ssh`` binary. Each stream gets its
  own SSH connection (one paramiko transport is one thread); a ``Bridge`` thread copies a reader's output
  into its writer (the one place where the controller's Python carries file bytes).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.errors import HostError
from orchestrator.transport.bulk import ssh_argv
from orchestrator.transport.resolve import ResolvedHost

if TYPE_CHECKING:
    from orchestrator.transport.control import HostSession

# One line (any login shell passes it), reading exactly the 10-digit length and the code with raw
# reads: nothing after the code is consumed, so the process can splice its stdin pipe directly.
BOOT = ('import os;b=b"";exec("while len(b)<10:b+=os.read(0,10-len(b)) or os._exit(3)");n=int(b);b=b"";'
        'exec("while len(b)<n:b+=os.read(0,n-len(b)) or os._exit(3)");exec(b)')
STDERR_KEEP = 64 * 1024
LINE_LIMIT = 64 << 20  # a directory's facts travel as one line
_HERE = Path(__file__).parent
_PRELUDE = _HERE.parent / "transport" / "host_prelude.py"
HOST_PARTS = (_PRELUDE, _HERE / "protocol.py", _HERE / "host_script.py", _HERE / "host_streams.py")
_HOST_SOURCE: bytes | None = None


def host_source() -> bytes:
    """The host program: shared prelude, wire protocol, one-shot functions, stream processes."""
    global _HOST_SOURCE
    if _HOST_SOURCE is None:
        _HOST_SOURCE = b"\n\n".join(p.read_bytes() for p in HOST_PARTS)
    return _HOST_SOURCE


def stream_prelude(kind: str, kwargs: dict) -> bytes:
    """What BOOT reads: the length, then the host program and the call to make."""
    call = f"\n_dfo_stream({kind!r}, json.loads({json.dumps(kwargs)!r}))\n".encode()
    code = host_source() + call
    return b"%010d" % len(code) + code


def bulk_argv(host: ResolvedHost, remote: str | list[str], cipher: str | None) -> list[str]:
    """transport.bulk's argv, but at LogLevel INFO: ssh reports "no matching cipher" (and other
    negotiation failures) at that level, and the relay must see it to fall back. ssh takes the first
    value given for an option, so this one, placed first, wins over bulk's LogLevel=ERROR."""
    argv = ssh_argv(host, remote, cipher=cipher)
    return [argv[0], "-o", "LogLevel=INFO", *argv[1:]]


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class RemoteProcess:
    """A host-side process; `what` names it in error messages. Its stdin or stdout may belong to a pipe
    (then write or readline is not available)."""

    host: str
    what: str

    def __init__(self) -> None:
        self._pending = bytearray()

    # Implementations provide these.
    def _recv_into(self, view: memoryview) -> int:
        raise NotImplementedError

    def write(self, data) -> None: ...
    def close_stdin(self) -> None: ...
    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int | None:
        raise NotImplementedError

    def error_text(self) -> str:
        raise NotImplementedError

    def close(self) -> None: ...

    def readline(self, limit: int = LINE_LIMIT) -> bytes:
        """One line (with its newline), or what is left at end of stream (b"" when nothing)."""
        view = memoryview(bytearray(1 << 16))
        start = 0
        while b"\n" not in self._pending[start:] and len(self._pending) < limit:
            start = len(self._pending)
            n = self._recv_into(view)
            if n == 0:
                line, self._pending = bytes(self._pending), bytearray()
                return line
            self._pending += view[:n]
        cut = self._pending.index(b"\n") + 1 if b"\n" in self._pending else len(self._pending)
        line = bytes(self._pending[:cut])
        del self._pending[:cut]
        return line

    def finish(self, timeout: float = 5.0) -> int | None:
        """Close stdin, wait for a clean exit; kill if it does not come."""
        try:
            self.close_stdin()
        except OSError:
            pass
        code = self.wait(timeout)
        if code is None:
            self.kill()
            code = self.wait(2.0)
        return code


class SshProcess(RemoteProcess):
    """``ssh HOST python3 -c BOOT``. ``stdin``/``stdout`` given as file descriptors are one end of a pipe
    to another process; then its bootstrap is written into that pipe by the caller, not here.
    (Eight parameters: where, with which interpreter and cipher, what to run, its name, and the pipe ends.)"""

    def __init__(self, host: ResolvedHost, python: str, kind: str, kwargs: dict, *, cipher: str | None, what: str,
                 stdin: int | None = None, stdout: int | None = None):
        super().__init__()
        self.host = host.name
        self.what = what
        self._stderr = tempfile.TemporaryFile(prefix="dfo-relay-ssh-")
        argv = bulk_argv(host, [python, "-c", BOOT], cipher)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin is None else stdin,
            stdout=subprocess.PIPE if stdout is None else stdout, stderr=self._stderr, bufsize=0,
            # Own session: a Ctrl-C in the terminal reaches dfo only, which then stops these cleanly.
            start_new_session=True,
        )
        self._stdin = self.proc.stdin
        self._stdout: Any = self.proc.stdout  # a raw FileIO (bufsize=0): readinto is there
        if self._stdin is not None:
            try:
                self.write(stream_prelude(kind, kwargs))
            except EOFError:  # ssh ended already (no connection): the stream reads as ended, its stderr says why
                pass

    def _recv_into(self, view: memoryview) -> int:
        try:
            n = self._stdout.readinto(view) if self._stdout is not None else 0
        except (OSError, ValueError):
            return 0
        return n or 0

    def write(self, data) -> None:
        if self._stdin is None:
            raise EOFError(self.what)
        try:
            write_all(self._stdin.fileno(), data)
        except (BrokenPipeError, ValueError, OSError) as exc:
            raise EOFError(self.what) from exc

    def close_stdin(self) -> None:
        if self._stdin is not None:
            try:
                self._stdin.close()
            except (OSError, ValueError):
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def error_text(self) -> str:
        try:
            self._stderr.seek(0, 2)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - STDERR_KEEP))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        for f in (self._stdin, self._stdout, self._stderr):
            try:
                if f is not None:
                    f.close()
            except (OSError, ValueError):
                pass


class ParamikoProcess(RemoteProcess):
    def __init__(self, session: HostSession, python: str, kind: str, kwargs: dict, *, what: str,
                 own_session: bool):
        import paramiko

        super().__init__()
        self.host = session.name
        self.what = what
        self.session = session
        self._own_session = own_session
        self._err = bytearray()
        session.raise_rekey_limits()  # this session's bulk stream only (see HostSession.raise_rekey_limits)
        try:
            self.chan = session.transport.open_session(timeout=session.host.connect_timeout)
            self.chan.exec_command(shlex.join([python, "-c", BOOT]))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostError(self.host, f"cannot open a data stream: {exc}") from None
        self._drain = threading.Thread(target=self._drain_stderr, daemon=True, name=f"dfo-stderr-{what}")
        self._drain.start()
        self.write(stream_prelude(kind, kwargs))

    def _drain_stderr(self) -> None:
        try:
            while True:
                chunk = self.chan.recv_stderr(65536)
                if not chunk:
                    return
                self._err += chunk
                if len(self._err) > STDERR_KEEP:
                    del self._err[:-STDERR_KEEP]
        except Exception:  # noqa: BLE001 - the channel is gone; whatever was read is kept
            return

    def recv(self, n: int) -> bytes:
        try:
            return self.chan.recv(n)
        except Exception:  # noqa: BLE001 - paramiko raises several types for a closed channel
            return b""

    def _recv_into(self, view: memoryview) -> int:
        data = self.recv(min(len(view), 1 << 20))
        view[:len(data)] = data
        return len(data)

    def write(self, data) -> None:
        try:
            self.chan.sendall(data)
        except Exception as exc:  # noqa: BLE001 - paramiko raises several types for a closed channel
            raise EOFError(self.what) from exc

    def close_stdin(self) -> None:
        try:
            self.chan.shutdown_write()
        except Exception:  # noqa: BLE001
            pass

    def kill(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass

    def wait(self, timeout: float | None = None) -> int | None:
        if not self.chan.status_event.wait(timeout):
            return None
        return self.chan.exit_status

    def error_text(self) -> str:
        return bytes(self._err).decode("utf-8", "replace").strip()

    def close(self) -> None:
        self.kill()
        if self._own_session:
            self.session.close()


class Bridge(threading.Thread):
    """Paramiko data plane: copies a reader's output into its writer (what the OS pipe does for ssh).
    ``sending`` tells the stall watchdog which side holds things up."""

    def __init__(self, reader: ParamikoProcess, writer: ParamikoProcess):
        super().__init__(daemon=True, name=f"dfo-bridge-{reader.what}")
        self.reader, self.writer = reader, writer
        self.sending = False

    def run(self) -> None:
        while True:
            data = self.reader.recv(1 << 20)
            if not data:
                self.writer.close_stdin()
                return
            self.sending = True
            try:
                self.writer.write(data)
            except EOFError:
                self.reader.kill()
                return
            self.sending = False


def open_paramiko_session(resolved: ResolvedHost, trust_new: bool, cipher: str | None) -> tuple[HostSession, str]:
    """A new control-plane connection re-keyed so `cipher` is first choice; returns it and the cipher in use."""
    import paramiko

    from orchestrator.transport.control import connect

    session = connect(resolved, trust_new=trust_new)
    t = session.transport
    try:
        if cipher:
            opts = t.get_security_options()
            names = list(opts.ciphers)
            if cipher in names and t.remote_cipher != cipher:
                opts.ciphers = [cipher] + [c for c in names if c != cipher]
                t.renegotiate_keys()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        session.close()
        raise HostError(resolved.name, f"cannot negotiate cipher {cipher} for a data stream: {exc}") from None
    return session, t.remote_cipher


def last_lines(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
