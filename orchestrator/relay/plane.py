"""The data plane of one relay: stream pairs (a reader on the source joined to a writer on the destination)
brought up early, in the background, and reused for every file.

With the system ssh a pair is two ssh processes and one OS pipe: the reader's ssh writes into it, the
writer's ssh reads from it, and this process only holds the reader's stdin (requests) and the writer's
stdout (answers). The writer's bootstrap, including the key that seals its commands, is written into the
pipe by the controller before the reader starts, so the source host never sees it.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import termios
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from orchestrator.core.errors import HostError
from orchestrator.core.host_text import decode_json
from orchestrator.relay import protocol as wire
from orchestrator.relay.processes import (
    Bridge,
    ParamikoProcess,
    RemoteProcess,
    SshProcess,
    last_lines,
    open_paramiko_session,
    stream_prelude,
    write_all,
)
from orchestrator.transport import Connector

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class StreamEnded(Exception):
    def __init__(self, proc: RemoteProcess):
        super().__init__(proc.what)
        self.proc = proc


class WriterFailed(Exception):
    def __init__(self, host: str, kind: str, message: str):
        super().__init__(message)
        self.host, self.kind, self.message = host, kind, message


@dataclass
class Pair:
    reader: RemoteProcess
    writer: RemoteProcess
    key: bytes
    pipe: int | None = None          # our copy of the pipe's read end: only to see how full it is
    bridge: Bridge | None = None     # paramiko: the thread that carries the bytes instead of the pipe
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def command(self, op: str, args: dict) -> None:
        """A sealed command for the writer, through the reader (which passes it on unread)."""
        with self.lock:
            sealed = wire.seal(self.key, self.seq, op, args)
            self.seq += 1
        self.reader.write(wire.forward(sealed))

    def line(self) -> tuple[str, str]:
        """The writer's next line as (word, rest); a closed stream raises StreamEnded (naming the culprit)."""
        raw = self.writer.readline()
        if not raw.endswith(b"\n"):
            raise StreamEnded(self.culprit())
        word, _, rest = raw.decode("utf-8", "replace").rstrip("\n").partition(" ")
        if word == "error":
            kind, _, message = rest.partition(" ")
            raise WriterFailed(self.writer.host, kind, message)
        return word, rest

    def reply(self, expect: str) -> dict:
        """The next line, which must be `expect` (with a JSON body)."""
        word, rest = self.line()
        if word != expect:
            raise StreamEnded(self.writer)
        return decode_json(rest) if rest.startswith("{") else {"value": rest}

    def culprit(self) -> RemoteProcess:
        """Which end stopped the pair: the writer sees the end of its input when the reader (or its link)
        dies, so a reader that exited with an error, or left one on stderr, is named first."""
        code = self.reader.wait(1.0)
        if code not in (None, 0, wire.EXIT_ABORTED) or (code is not None and self.reader.error_text()
                                                         and not self.writer.error_text()):
            return self.reader
        return self.writer

    def stuck(self) -> str:
        """"source" or "destination": which side holds up a stalled stream (a full pipe: the destination)."""
        if self.bridge is not None:
            return "destination" if self.bridge.sending else "source"
        if self.pipe is None:
            return "destination"
        try:
            buf = bytearray(4)
            fcntl.ioctl(self.pipe, termios.FIONREAD, buf)
            queued = int.from_bytes(buf, "little")
        except OSError:
            return "destination"
        return "destination" if queued > 0 else "source"

    def processes(self) -> tuple[RemoteProcess, RemoteProcess]:
        return self.reader, self.writer

    def close_pipe(self) -> None:
        if self.pipe is not None:
            os.close(self.pipe)
            self.pipe = None


class DataPlane:
    """The stream processes of one relay.

    With the system ssh and no --cipher, streams first ask for aes128-gcm; if a host does not offer it
    (ssh: "no matching cipher") or the local ssh lacks it ("unknown cipher type"), they come up again with
    ssh's default. So the cipher in use is known without a probe connection or an `ssh -Q` beforehand.
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

    def _track(self, *procs: RemoteProcess) -> None:
        with self._lock:
            self._spawned.extend(procs)

    def _ssh_pair(self, k: int) -> Pair:
        key = secrets.token_bytes(32)
        r, w = os.pipe()
        try:
            try:
                fcntl.fcntl(w, F_SETPIPE_SZ, wire.PIPE_SIZE)
            except OSError:
                pass
            writer = SshProcess(self.connector.resolved(self.dst), self._python(self.dst), "writer", {},
                                cipher=self.cipher, what=f"writer {k + 1} on {self.dst}", stdin=r)
            self._track(writer)
            write_all(w, stream_prelude("writer", {"key": key.hex()}))  # before any byte of the source's
            reader = SshProcess(self.connector.resolved(self.src), self._python(self.src), "reader", {},
                                cipher=self.cipher, what=f"reader {k + 1} on {self.src}", stdout=w)
            self._track(reader)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)
        return Pair(reader, writer, key, pipe=r)

    def _paramiko_pair(self, k: int) -> Pair:
        key = secrets.token_bytes(32)
        procs = []
        for host, kind, kwargs in ((self.dst, "writer", {"key": key.hex()}), (self.src, "reader", {})):
            session, used = open_paramiko_session(self.connector.resolved(host), self.connector.trust_new_host_keys,
                                                  self.cipher)
            self.cipher = used  # what paramiko and the server agreed on
            procs.append(ParamikoProcess(session, self._python(host), kind, kwargs, what=f"{kind} {k + 1} on {host}",
                                         own_session=True))
            self._track(procs[-1])
        writer, reader = procs
        bridge = Bridge(reader, writer)
        bridge.start()
        return Pair(reader, writer, key, bridge=bridge)

    def _make_pairs(self, first: int, last: int) -> list[Pair]:
        make = self._ssh_pair if self.kind == "ssh" else self._paramiko_pair
        if self.kind == "paramiko" and last - first > 1:
            with ThreadPoolExecutor(max_workers=last - first) as pool:  # paramiko connects block: do them at once
                return list(pool.map(make, range(first, last)))
        return [make(k) for k in range(first, last)]

    @staticmethod
    def _greet(pairs: list[Pair]) -> None:
        """Read both hellos of every pair (the writer's, then the reader's passed on): proves the streams,
        the pipe and both Pythons are up."""
        for pair in pairs:
            try:
                first, second = pair.line(), pair.line()
                ok = first[0] == "hello" and second[0] == "reader" and decode_json(second[1]).get("hello")
            except (ValueError, WriterFailed):
                ok = False
            if not ok:
                raise StreamEnded(pair.culprit())

    def _bring_up(self, n: int, made: list[Pair] | None = None) -> None:
        """Pairs up to n, greeted; `made`: pairs already spawned for this (start() spawns them at once)."""
        first = len(self.pairs)
        if n <= first:
            return
        for attempt in (1, 2):
            try:
                made = made or self._make_pairs(first, n)
                self._greet(made)
                break
            except StreamEnded as exc:
                text = exc.proc.error_text().lower()
                for pair in made or []:
                    self._discard(pair)
                made = None
                fallback = attempt == 1 and self.kind == "ssh" and self.cipher and not self.explicit
                if fallback and "no matching cipher" in text:
                    self.cipher_note = f"{exc.proc.host} does not offer {self.cipher}: using ssh's default cipher"
                elif fallback and "unknown cipher type" in text:
                    self.cipher_note = f"ssh default ({self.cipher} not supported by the local ssh)"
                else:
                    detail = last_lines(exc.proc.error_text()) or "the stream closed before it started"
                    raise HostError(exc.proc.host, f"cannot start a relay stream ({exc.proc.what}): {detail}",
                                    hint="check that the host runs sshd and that 'python:' in the inventory names "
                                    "an interpreter present there") from None
                self.cipher = None
        with self._lock:
            self.pairs.extend(made or [])

    def _discard(self, pair: Pair) -> None:
        for proc in pair.processes():
            proc.kill()
            proc.wait(2.0)
            proc.close()
            with self._lock:
                if proc in self._spawned:
                    self._spawned.remove(proc)
        pair.close_pipe()

    def start(self, n: int) -> None:
        """Bring up n pairs in the background (their SSH handshakes overlap the controller's planning).
        The system ssh's processes of the first start are spawned right here: the handshakes begin now,
        not when the background thread first gets the interpreter."""
        previous = self._bringing
        made: list[Pair] | None = None
        if previous is None and self.kind == "ssh" and self._bring_error is None and n > len(self.pairs):
            try:
                made = self._make_pairs(len(self.pairs), n)
            except BaseException as exc:  # noqa: BLE001 - reported by the next ensure(), as from the thread
                self._bring_error = exc
                return

        def body() -> None:
            if previous is not None:
                previous.join()
            if self._bring_error is not None:
                return
            try:
                self._bring_up(n, made)
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
        """A helper process with its own stdin/stdout to us (the whole-file hashers of parallel mode)."""
        proc: RemoteProcess
        if self.kind == "ssh":
            proc = SshProcess(self.connector.resolved(host), self._python(host), kind, kwargs, cipher=self.cipher,
                              what=what)
        else:
            proc = ParamikoProcess(self.connector.session(host), self._python(host), kind, kwargs, what=what,
                                   own_session=False)
        self._track(proc)
        with self._lock:
            self.aux.append(proc)
        return proc

    def release_aux(self, proc: RemoteProcess) -> None:
        proc.finish(timeout=5.0)
        proc.close()
        with self._lock:
            if proc in self.aux:
                self.aux.remove(proc)
            if proc in self._spawned:
                self._spawned.remove(proc)

    def abort(self) -> None:
        """Kill every stream (a failure elsewhere must unblock the threads waiting on them)."""
        with self._lock:
            procs = list(self._spawned)
        for proc in procs:
            proc.kill()

    def close(self) -> None:
        if self._bringing is not None:
            self._bringing.join()
            self._bringing = None
        with self._lock:
            procs, pairs = list(self._spawned), list(self.pairs)
        for proc in procs:  # readers first: their end of stdin ends the pipe, which ends the writers
            proc.close_stdin()
        for proc in procs:
            if proc.wait(5.0) is None:
                proc.kill()
                proc.wait(2.0)
            proc.close()
        for pair in pairs:
            pair.close_pipe()
        with self._lock:
            self.pairs, self.aux, self._spawned = [], [], []
