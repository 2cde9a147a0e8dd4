"""The relay's data plane: host-side processes reached over bulk SSH streams, and the pump between them.

Each process is ``python3 -c BOOT`` on a host; BOOT reads a 10-digit length and that much Python source
from stdin (relay_host.py plus the call to make), so nothing is installed on the host and no path
reaches a remote shell. The rest of stdin/stdout is the process's own protocol (see relay_host.py).

Two implementations of the same small process interface:
- ``SshProcess``: a system ``ssh`` subprocess with argv from ``transport.bulk`` (the control plane's
  host key, key, port and jump settings); bytes move through kernel pipes and ssh's C crypto.
- ``ParamikoProcess``: a paramiko channel, for controllers without an ``ssh`` binary. Each stream gets
  its own SSH connection (one paramiko transport is one thread), and paramiko's client-side rekey
  limits are raised so the OpenSSH server drives rekeying (client-initiated rekeys can deadlock
  multi-GB streams).

``DataPlane`` brings up N (reader, writer) pairs -- speculatively, while the controller is still
gathering facts -- and keeps them for every file of the relay. ``pump``/``acks`` move one file's
chunks through one pair; ``FileJob`` is the state the pairs share.
"""

from __future__ import annotations

import collections
import hashlib
import json
import shlex
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

from orchestrator.relay import plan as rp
from orchestrator.core.errors import HostError
from orchestrator.core.inventory import ResolvedHost
from orchestrator.transport import Connector
from orchestrator.transport.bulk import ssh_argv, ssh_binary
from orchestrator.transport.control import HostSession, connect

BUF_SIZE = 1 << 20
PROGRESS_STEP = 2 << 20
# One line (any login shell passes it), reading exactly the 10-digit length and the code with raw
# reads: nothing after the code is consumed, so the process can splice its stdin pipe directly.
BOOT = ('import os;b=b"";exec("while len(b)<10:b+=os.read(0,10-len(b)) or os._exit(3)");n=int(b);b=b"";'
        'exec("while len(b)<n:b+=os.read(0,n-len(b)) or os._exit(3)");exec(b)')
PIPE_SIZE = 1 << 20
STDERR_KEEP = 64 * 1024
_HOST_SOURCE: bytes | None = None


def host_source() -> bytes:
    global _HOST_SOURCE
    if _HOST_SOURCE is None:
        _HOST_SOURCE = Path(__file__).with_name("host_script.py").read_bytes()
    return _HOST_SOURCE


def stream_prelude(kind: str, kwargs: dict) -> bytes:
    """What BOOT reads: the length, then relay_host.py and the call to make."""
    call = f"\n_dfo_stream({kind!r}, json.loads({json.dumps(kwargs)!r}))\n".encode()
    code = host_source() + call
    return b"%010d" % len(code) + code


def remote_command(python: str) -> list[str]:
    return [python, "-c", BOOT]


def bulk_argv(host: ResolvedHost, remote: str | list[str], cipher: str | None) -> list[str]:
    """transport.bulk's argv, but at LogLevel INFO: ssh reports "no matching cipher" (and other
    negotiation failures) at that level, and the relay must see it to fall back. ssh takes the first
    value given for an option, so this one, placed first, wins over bulk's LogLevel=ERROR."""
    argv = ssh_argv(host, remote, cipher=cipher)
    return [argv[0], "-o", "LogLevel=INFO", *argv[1:]]


class RemoteProcess:
    """A host-side process with a byte pipe each way; `what` names it in error messages."""

    host: str
    what: str

    def __init__(self) -> None:
        self._pending = bytearray()

    # Implementations provide these.
    def _recv_into(self, view: memoryview) -> int: ...
    def write(self, data) -> None: ...
    def close_stdin(self) -> None: ...
    def kill(self) -> None: ...
    def wait(self, timeout: float | None = None) -> int | None: ...
    def error_text(self) -> str: ...

    def readinto(self, view: memoryview) -> int:
        """Some bytes (at least one) into view; 0 at end of stream."""
        if self._pending:
            n = min(len(view), len(self._pending))
            view[:n] = self._pending[:n]
            del self._pending[:n]
            return n
        return self._recv_into(view)

    def read_exact(self, n: int) -> bytes:
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            k = self.readinto(view[got:])
            if k == 0:
                raise EOFError(self.what)
            got += k
        return bytes(out)

    def readline(self, limit: int = 1 << 16) -> bytes:
        """One line (with its newline), or what is left at end of stream (b"" when nothing)."""
        buf = bytearray(4096)
        view = memoryview(buf)
        while b"\n" not in self._pending and len(self._pending) < limit:
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
    def __init__(self, host: ResolvedHost, python: str, kind: str, kwargs: dict, *, cipher: str | None, what: str):
        super().__init__()
        self.host = host.name
        self.what = what
        self._stderr = tempfile.TemporaryFile(prefix="dfo-relay-ssh-")
        argv = bulk_argv(host, remote_command(python), cipher)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, bufsize=0,
            pipesize=PIPE_SIZE,
            # Own session: a Ctrl-C in the terminal reaches dfo only, which then stops these cleanly.
            start_new_session=True,
        )
        self._stdin = self.proc.stdin
        self._stdout = self.proc.stdout
        self.write(stream_prelude(kind, kwargs))

    def _recv_into(self, view: memoryview) -> int:
        try:
            n = self._stdout.readinto(view)
        except (OSError, ValueError):
            return 0
        return n or 0

    def write(self, data) -> None:
        view = memoryview(data)
        try:
            while view:
                n = self._stdin.write(view)
                if n is None:
                    continue
                view = view[n:]
        except (BrokenPipeError, ValueError) as exc:
            raise EOFError(self.what) from exc

    def close_stdin(self) -> None:
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
                f.close()
            except (OSError, ValueError):
                pass


class ParamikoProcess(RemoteProcess):
    def __init__(self, session: HostSession, python: str, kind: str, kwargs: dict, *, what: str,
                 own_session: bool):
        super().__init__()
        self.host = session.name
        self.what = what
        self.session = session
        self._own_session = own_session
        self._err = bytearray()
        try:
            self.chan = session.transport.open_session(timeout=session.host.connect_timeout)
            self.chan.exec_command(shlex.join(remote_command(python)))
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
        except (OSError, EOFError, paramiko.SSHException):
            return

    def _recv_into(self, view: memoryview) -> int:
        try:
            data = self.chan.recv(min(len(view), 1 << 20))
        except (OSError, EOFError, paramiko.SSHException):
            return 0
        n = len(data)
        view[:n] = data
        return n

    def write(self, data) -> None:
        try:
            self.chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise EOFError(self.what) from exc

    def close_stdin(self) -> None:
        try:
            self.chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def kill(self) -> None:
        try:
            self.chan.close()
        except (OSError, EOFError, paramiko.SSHException):
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


# ----------------------------------------------------------------------------------- plane selection


def raise_paramiko_rekey_limits() -> None:
    """Let the OpenSSH server drive rekeying: paramiko's own rekey every 512 MiB can deadlock a busy
    stream (an open upstream issue); OpenSSH servers rekey on their own schedule, which paramiko answers."""
    big = 1 << 62
    paramiko.packet.Packetizer.REKEY_BYTES = big
    paramiko.packet.Packetizer.REKEY_PACKETS = big


_CLIENT_CIPHERS: list[str] | None = None


def client_ciphers() -> list[str]:
    global _CLIENT_CIPHERS
    if _CLIENT_CIPHERS is None:
        exe = ssh_binary()
        if exe is None:
            _CLIENT_CIPHERS = []
        else:
            proc = subprocess.run([exe, "-Q", "cipher"], capture_output=True, text=True, timeout=10)
            _CLIENT_CIPHERS = proc.stdout.split() if proc.returncode == 0 else []
    return _CLIENT_CIPHERS


def probe_cipher(host: ResolvedHost, cipher: str, timeout: float) -> bool:
    """Does `host` accept `cipher`? Also proves the bulk ssh settings work before any byte moves."""
    argv = bulk_argv(host, "true", cipher)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise HostError(host.name, f"bulk ssh connection did not answer within {timeout:.0f}s") from None
    if proc.returncode == 0:
        return True
    err = proc.stderr.strip()
    if "no matching cipher" in err.lower():
        return False
    raise HostError(host.name, f"bulk ssh connection failed: {err or f'exit {proc.returncode}'}",
                    hint=f"the command was: {shlex.join(argv[:1] + ['...', host.hostname, 'true'])}")


def paramiko_ciphers(transport: paramiko.Transport) -> list[str]:
    return list(transport.get_security_options().ciphers)


def prefer_cipher(session: HostSession, cipher: str | None) -> str:
    """Re-key a paramiko connection so `cipher` is first choice; returns the cipher in use."""
    t = session.transport
    if cipher:
        opts = t.get_security_options()
        names = list(opts.ciphers)
        if cipher in names and t.remote_cipher != cipher:
            opts.ciphers = [cipher] + [c for c in names if c != cipher]
            t.renegotiate_keys()
    return t.remote_cipher


def open_paramiko_session(resolved: ResolvedHost, trust_new: bool, cipher: str | None) -> tuple[HostSession, str]:
    session = connect(resolved, trust_new=trust_new)
    try:
        used = prefer_cipher(session, cipher)
    except (paramiko.SSHException, OSError, EOFError) as exc:
        session.close()
        raise HostError(resolved.name, f"cannot negotiate cipher {cipher} for a data stream: {exc}") from None
    return session, used


def have_ssh() -> bool:
    return shutil.which("ssh") is not None



# ----------------------------------------------------------------------------------- failures inside the pump


class SourceChanged(Exception):
    pass


class StreamEnded(Exception):
    def __init__(self, proc: RemoteProcess):
        super().__init__(proc.what)
        self.proc = proc


class WriterFailed(Exception):
    def __init__(self, host: str, kind: str, message: str):
        super().__init__(message)
        self.host, self.kind, self.message = host, kind, message


class Stalled(Exception):
    def __init__(self, host: str, seconds: float, activity: str):
        super().__init__(activity)
        self.host, self.seconds, self.activity = host, seconds, activity


class DigestMismatch(Exception):
    pass


# ----------------------------------------------------------------------------------- progress and flow


class Flow:
    """Shared by the pump threads: progress display, bandwidth limit and the stall watchdog's clock."""

    def __init__(self, console: Console, total: int, done: int, streams: int, label: str,
                 bwlimit: float | None, enabled: bool):
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True),
            TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=True,
            disable=not enabled,
        )
        self.total = total
        self.main: TaskID = self.progress.add_task(label, total=max(total, 1), completed=done)
        self.streams: list[TaskID] = []
        if streams > 1:
            self.streams = [self.progress.add_task(f"  stream {k + 1}", total=None) for k in range(streams)]
        self._unreported = [0] * max(streams, 1)
        self._lock = threading.Lock()
        self.bwlimit = bwlimit
        self._next_slot = time.monotonic()
        self.activity: dict[int, list] = {}  # stream -> [host, what, since]; mutated in place (no garbage)

    def __enter__(self) -> "Flow":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def status(self, text: str) -> None:
        self.progress.update(self.main, description=text)

    def set_total(self, total: int, done: int) -> None:
        self.progress.update(self.main, total=max(total, 1), completed=done)

    def doing(self, k: int, host: str, what: str) -> None:
        slot = self.activity.get(k)
        if slot is None:
            self.activity[k] = [host, what, time.monotonic()]
        elif slot[1] is not what:
            slot[0], slot[1], slot[2] = host, what, time.monotonic()

    def idle(self, k: int) -> None:
        self.activity.pop(k, None)

    def moved(self, k: int, n: int) -> None:
        if self.bwlimit:
            with self._lock:
                now = time.monotonic()
                self._next_slot = max(self._next_slot, now) + n / self.bwlimit
                delay = self._next_slot - now - 0.05  # allow a 50 ms burst
            if delay > 0:
                time.sleep(delay)
        slot = self.activity.get(k)
        if slot is not None:
            slot[2] = time.monotonic()
        slot = k if k < len(self._unreported) else 0
        self._unreported[slot] += n
        if self._unreported[slot] >= PROGRESS_STEP:
            self.flush(slot)

    def flush(self, k: int | None = None) -> None:
        for slot in ([k] if k is not None else range(len(self._unreported))):
            n, self._unreported[slot] = self._unreported[slot], 0
            if n:
                self.progress.advance(self.main, n)
                if self.streams:
                    self.progress.advance(self.streams[slot], n)

    def stalled(self, timeout: float) -> tuple[str, float, str] | None:
        now = time.monotonic()
        for host, what, since in list(self.activity.values()):
            if now - since > timeout:
                return host, now - since, what
        return None


# ----------------------------------------------------------------------------------- the pairs of one relay


@dataclass
class Pair:
    reader: RemoteProcess
    writer: RemoteProcess


class DataPlane:
    """The stream processes of one relay: brought up early (in the background), reused for every file.

    With the system ssh and no --cipher, streams first ask for aes128-gcm; if a host does not offer it
    (ssh: "no matching cipher"), they come up again with ssh's default. So the cipher in use is known
    without a separate probe connection.
    """

    def __init__(self, connector: Connector, src: str, dst: str, kind: str, cipher: str | None, explicit: bool):
        self.connector = connector
        self.src, self.dst = src, dst
        self.kind = kind
        self.cipher = cipher
        self.explicit = explicit
        self.cipher_note = ""
        self.pairs: list[Pair] = []
        self.aux: list[RemoteProcess] = []
        self._spawned: list[RemoteProcess] = []  # every process ever started: abort() must reach them all
        self._lock = threading.Lock()
        self._bringing: threading.Thread | None = None
        self._bring_error: BaseException | None = None

    def _python(self, host: str) -> str:
        return self.connector.inventory.hosts[host].python

    def _spawn(self, host: str, kind: str, kwargs: dict, what: str, own: bool) -> RemoteProcess:
        proc: RemoteProcess
        if self.kind == "ssh":
            proc = SshProcess(self.connector.resolved(host), self._python(host), kind, kwargs, cipher=self.cipher,
                              what=what)
        elif own:
            session, used = open_paramiko_session(self.connector.resolved(host), self.connector.trust_new_host_keys,
                                                  self.cipher)
            self.cipher = used  # what paramiko and the server agreed on
            proc = ParamikoProcess(session, self._python(host), kind, kwargs, what=what, own_session=True)
        else:
            proc = ParamikoProcess(self.connector.session(host), self._python(host), kind, kwargs, what=what,
                                   own_session=False)
        with self._lock:
            self._spawned.append(proc)
        return proc

    def _make_pairs(self, first: int, last: int) -> list[Pair]:
        def make(k: int) -> Pair:
            reader = self._spawn(self.src, "reader", {}, f"reader {k + 1} on {self.src}", own=True)
            writer = self._spawn(self.dst, "writer", {}, f"writer {k + 1} on {self.dst}", own=True)
            return Pair(reader, writer)

        if self.kind == "paramiko" and last - first > 1:
            with ThreadPoolExecutor(max_workers=last - first) as pool:  # paramiko connects block: do them at once
                return list(pool.map(make, range(first, last)))
        return [make(k) for k in range(first, last)]

    def _greet(self, pairs: list[Pair]) -> None:
        """Read every process's hello: proves its SSH stream and Python are up."""
        for pair in pairs:
            for proc in (pair.reader, pair.writer):
                try:
                    if proc is pair.reader:
                        ok = proc.read_exact(1) == b"K" and json.loads(
                            proc.read_exact(struct.unpack(">I", proc.read_exact(4))[0])).get("hello")
                    else:
                        ok = proc.readline().startswith(b"hello ")
                except (EOFError, ValueError):
                    ok = False
                if not ok:
                    raise StreamEnded(proc)

    def _bring_up(self, n: int) -> None:
        first = len(self.pairs)
        if n <= first:
            return
        for attempt in (1, 2):
            made = self._make_pairs(first, n)
            try:
                self._greet(made)
                break
            except StreamEnded as exc:
                text = exc.proc.error_text()
                for pair in made:
                    for proc in (pair.reader, pair.writer):
                        proc.kill()
                        proc.wait(2.0)
                        _close(proc)
                        self._forget(proc)
                fallback = (attempt == 1 and self.kind == "ssh" and self.cipher and not self.explicit
                            and "no matching cipher" in text.lower())
                if fallback:
                    self.cipher_note = f"{exc.proc.host} does not offer {self.cipher}: using ssh's default cipher"
                    self.cipher = None
                    continue
                detail = tail(text) or "the stream closed before it started"
                raise HostError(exc.proc.host, f"cannot start a relay stream ({exc.proc.what}): {detail}",
                                hint="check that the host runs sshd and that 'python:' in the inventory names an "
                                "interpreter present there") from None
        with self._lock:
            self.pairs.extend(made)

    def start(self, n: int) -> None:
        """Bring up n pairs in the background (their SSH handshakes overlap the controller's planning)."""
        previous = self._bringing

        def body() -> None:
            if previous is not None:
                previous.join()
            if self._bring_error is not None:
                return
            try:
                self._bring_up(n)
            except BaseException as exc:  # noqa: BLE001 - reported by the next ensure()
                self._bring_error = exc

        self._bringing = threading.Thread(target=body, daemon=True, name="dfo-relay-bringup")
        self._bringing.start()

    def ensure(self, n: int) -> list[Pair]:
        if self._bringing is not None:
            self._bringing.join()
            self._bringing = None
        if self._bring_error is not None:
            error, self._bring_error = self._bring_error, None
            raise error
        self._bring_up(n)
        return self.pairs[:n]

    def spawn_aux(self, host: str, kind: str, kwargs: dict, what: str) -> RemoteProcess:
        proc = self._spawn(host, kind, kwargs, what, own=False)
        with self._lock:
            self.aux.append(proc)
        return proc

    def release_aux(self, proc: RemoteProcess) -> None:
        proc.finish(timeout=5.0)
        _close(proc)
        with self._lock:
            if proc in self.aux:
                self.aux.remove(proc)
        self._forget(proc)

    def _forget(self, proc: RemoteProcess) -> None:
        with self._lock:
            if proc in self._spawned:
                self._spawned.remove(proc)

    def abort(self) -> None:
        """Kill every stream (a failure elsewhere must unblock the threads waiting on them)."""
        for proc in self._all():
            proc.kill()

    def close(self) -> None:
        if self._bringing is not None:
            self._bringing.join()
            self._bringing = None
        with self._lock:
            procs = list(self._spawned)
        for proc in procs:
            proc.close_stdin()
        for proc in procs:
            if proc.wait(5.0) is None:
                proc.kill()
                proc.wait(2.0)
            _close(proc)
        with self._lock:
            self.pairs, self.aux, self._spawned = [], [], []

    def _all(self) -> list[RemoteProcess]:
        with self._lock:
            return list(self._spawned)


def _close(proc: RemoteProcess) -> None:
    close = getattr(proc, "close", None)
    if close:
        close()


def tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ----------------------------------------------------------------------------------- one file through the pairs


def _frame(tag: bytes, obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return tag + struct.pack(">I", len(body)) + body


class FileJob:
    """Shared state of one file's transfer across its stream threads."""

    def __init__(self, plan: rp.FilePlan, sending: list[int], good: list[int], sequential: bool,
                 follower: RemoteProcess | None, streams: int):
        chunks = plan.chunks
        self.plan = plan
        self.queue = collections.deque((i, chunks[i][0], chunks[i][1]) for i in sending)
        self.sequential = sequential
        self.whole = hashlib.sha256() if sequential else None
        self.lock = threading.Lock()
        self.inflight: dict[int, str] = {}
        self.written: dict[int, str] = {}
        self.done: set[int] = set(good)
        self.frontier = rp.first_gap(self.done, 0)
        self.follower = follower
        self.checked = 0
        self.reader_digest: list[str | None] = [None] * streams
        self.writer_digest: list[str | None] = [None] * streams
        self.error: BaseException | None = None
        self.source_digest: str | None = None  # parallel mode: whole-file sha256 from the source hasher
        self.dest_digest: str | None = None    # parallel mode: whole-file sha256 from the destination follower
        self.fail_hook: Callable[[], None] = lambda: None
        if follower is not None:
            self._tell_follower()

    def take(self) -> tuple[int, int, int] | None:
        with self.lock:
            return self.queue.popleft() if self.queue else None

    def record(self, idx: int, *, inflight: str | None = None, written: str | None = None) -> None:
        with self.lock:
            if self.sequential:
                if written is not None:
                    self.done.add(idx)
                return
            if inflight is not None:
                self.inflight[idx] = inflight
            if written is not None:
                self.written[idx] = written
            if idx in self.inflight and idx in self.written:
                a, b = self.inflight.pop(idx), self.written.pop(idx)
                if a != b:
                    raise DigestMismatch(
                        f"chunk {idx} (offset {self.plan.chunks[idx][0]}): sha256 in flight {a[:16]}… but the "
                        f"destination wrote {b[:16]}…")
                self.checked += 1
                self.done.add(idx)
                if idx == self.frontier:
                    self.frontier = rp.first_gap(self.done, idx)
                    self._tell_follower()

    def _tell_follower(self) -> None:
        if self.follower is None:
            return
        chunks = self.plan.chunks
        offset = self.plan.size if self.frontier >= len(chunks) else chunks[self.frontier][0]
        self.follower.write(b"%d\n" % offset)

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            first = self.error is None
            if first:
                self.error = exc
        if first:
            self.fail_hook()

    def done_bytes(self) -> int:
        chunks = self.plan.chunks
        return sum(chunks[i][1] for i in self.done)


def writer_open_frame(plan: rp.FilePlan, sequential: bool, prepare: dict | None = None) -> bytes:
    spec = {"final": plan.final, "size": plan.size, "hash": "file" if sequential else "chunk"}
    if prepare is not None:
        spec["prepare"] = prepare
    return _frame(b"O", spec)


def writer_reply(writer: RemoteProcess, expect: str) -> dict:
    """The writer's next line, which must be `expect` (with a JSON body); its errors become WriterFailed."""
    line = writer.readline()
    if not line.endswith(b"\n"):
        raise StreamEnded(writer)
    word, _, rest = line.decode("utf-8", "replace").rstrip("\n").partition(" ")
    if word == "error":
        kind, _, message = rest.partition(" ")
        raise WriterFailed(writer.host, kind, message)
    if word != expect:
        raise StreamEnded(writer)
    return json.loads(rest) if rest.startswith("{") else {"value": rest}


def ask_source_facts(reader: RemoteProcess, **kwargs) -> Callable[[], dict]:
    """Send a facts request to a reader now; the returned function reads the answer (so a reader and a
    writer on two hosts can be asked at once)."""
    reader.write(_frame(b"S", kwargs))
    return lambda: _read_reply(reader)


def ask_dest_facts(writer: RemoteProcess, **kwargs) -> Callable[[], dict]:
    writer.write(_frame(b"Q", kwargs))
    return lambda: writer_reply(writer, "facts")


def publish(writer: RemoteProcess, request: dict) -> dict:
    """Ask a writer to rename a verified partial into place and/or write the sidecar manifest."""
    writer.write(_frame(b"P", request))
    return writer_reply(writer, "published")


def pump(job: FileJob, k: int, pair: Pair, flow: Flow, src: str, dst: str, open_writer: bool) -> None:
    """Move chunks from the job's queue through one pair until the queue is empty, then close the file."""
    reader, writer = pair.reader, pair.writer
    plan = job.plan
    view = memoryview(bytearray(BUF_SIZE))
    ident = plan.identity
    reader.write(_frame(b"O", {"path": plan.source, "size": ident["size"], "mtime_ns": ident["mtime_ns"],
                               "ino": ident.get("ino"), "hash": job.sequential}))
    if open_writer:
        writer.write(writer_open_frame(plan, job.sequential))
    reading, writing = f"reading from {src}", f"writing to {dst}"
    flow.doing(k, src, f"opening {plan.source} on {src}")
    _expect_ok(reader, _read_reply(reader))
    cur = job.take()
    if cur:
        reader.write(struct.pack(">cQQ", b"R", cur[1], cur[2]))
    while cur and job.error is None:
        nxt = job.take()
        if nxt:  # one request ahead, so the reader never waits for us
            reader.write(struct.pack(">cQQ", b"R", nxt[1], nxt[2]))
        idx, offset, length = cur
        flow.doing(k, src, reading)
        tag = reader.read_exact(1)
        if tag == b"E":
            raise SourceChanged(reader.read_exact(struct.unpack(">I", reader.read_exact(4))[0]).decode())
        if tag != b"D" or struct.unpack(">Q", reader.read_exact(8))[0] != length:
            raise StreamEnded(reader)
        writer.write(struct.pack(">cQQQ", b"W", idx, offset, length))
        h = job.whole if job.sequential else hashlib.sha256()
        remaining = length
        while remaining:
            flow.doing(k, src, reading)
            n = reader.readinto(view[:min(BUF_SIZE, remaining)])
            if n == 0:
                raise StreamEnded(reader)
            piece = view[:n]
            h.update(piece)
            flow.doing(k, dst, writing)
            writer.write(piece)
            remaining -= n
            flow.moved(k, n)
        if not job.sequential:
            job.record(idx, inflight=h.hexdigest())
        cur = nxt
    if job.error is not None:
        return
    flow.doing(k, src, f"finishing {plan.source} on {src}")
    reader.write(b"F")
    reply = _read_reply(reader)
    _expect_ok(reader, reply)
    job.reader_digest[k] = reply.get("sha256")
    writer.write(b"F")
    flow.idle(k)


def _read_reply(proc: RemoteProcess) -> dict:
    tag = proc.read_exact(1)
    if tag != b"K":
        raise StreamEnded(proc)
    return json.loads(proc.read_exact(struct.unpack(">I", proc.read_exact(4))[0]))


def _expect_ok(proc: RemoteProcess, reply: dict) -> None:
    if reply.get("error") == "changed":
        raise SourceChanged(reply["detail"])
    if "error" in reply:
        raise HostError(proc.host, reply.get("detail") or reply["error"])


def acks(job: FileJob, k: int, writer: RemoteProcess) -> None:
    """Read one writer's acknowledgements (digest of each chunk written) until it closes the file."""
    while True:
        line = writer.readline()
        if not line.endswith(b"\n"):
            raise StreamEnded(writer)
        parts = line.decode("utf-8", "replace").rstrip("\n").split(" ", 2)
        if parts[0] == "opened":
            continue
        if parts[0] == "ack" and len(parts) == 3:
            job.record(int(parts[1]), written=parts[2])
        elif parts[0] == "end":
            job.writer_digest[k] = None if parts[1] == "-" else parts[1]
            return
        elif parts[0] == "error":
            raise WriterFailed(writer.host, parts[1] if len(parts) > 1 else "io", parts[2] if len(parts) > 2 else "")
        else:
            raise StreamEnded(writer)



def move_chunks(job: FileJob, pairs: list[Pair], flow: Flow, src: str, dst: str, stall_timeout: float) -> None:
    """Run one pump and one ack reader per pair until the job's queue is drained and every writer has
    closed the file; a stall (no byte moved for stall_timeout while a stream is busy) fails the job.
    Pair 0's writer has already been opened (it prepared the partial). Raises the job's first error."""
    def guarded(fn: Callable, *args) -> Callable[[], None]:
        def body() -> None:
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - every failure ends the file's transfer
                job.fail(exc)
        return body

    threads = []
    for k, pair in enumerate(pairs):
        threads.append(threading.Thread(target=guarded(pump, job, k, pair, flow, src, dst, k != 0),
                                        daemon=True, name=f"dfo-pump-{k}"))
        threads.append(threading.Thread(target=guarded(acks, job, k, pair.writer), daemon=True, name=f"dfo-acks-{k}"))
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            stall = flow.stalled(stall_timeout)
            if stall and job.error is None:
                job.fail(Stalled(*stall))
    except BaseException as exc:  # Ctrl-C: stop the streams so the threads end, then re-raise
        job.fail(exc)
        raise
    finally:
        flow.flush()
    if job.error is not None:
        raise job.error
