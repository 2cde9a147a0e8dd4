"""One file through the stream pairs: the requests the controller sends, the answers it reads.

A pump thread per pair asks its reader for chunks (one ahead of the one in flight) and reads its
writer's answers: progress inside a chunk, the ack with the digest of what was written, the reader's
digest of what it read (passed on through the pipe), errors. The bytes themselves go from the reader's
ssh to the writer's ssh through the pipe, never through here.

Integrity: a sequential file (one stream, fresh) is hashed whole by the reader as it reads and by the
writer as it writes; in parallel mode each chunk is hashed by both (the digests must agree), and the
whole file by a source-side hasher and a destination-side follower (``operation``).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Callable

from orchestrator.core.errors import HostError
from orchestrator.core.host_text import decode_json
from orchestrator.relay import protocol as wire
from orchestrator.relay.plan import FilePlan, first_gap
from orchestrator.relay.plane import Pair, StreamEnded
from orchestrator.relay.processes import RemoteProcess
from orchestrator.relay.transfer_monitor import TransferMonitor


class SourceChanged(Exception):
    pass


class Stalled(Exception):
    def __init__(self, host: str, seconds: float, activity: str):
        super().__init__(activity)
        self.host, self.seconds, self.activity = host, seconds, activity


class DigestMismatch(Exception):
    pass


@dataclass
class Ends:
    """Names for messages: the two hosts of the relay."""
    src: str
    dst: str


class FileJob:
    """Shared state of one file's transfer across its stream threads."""

    def __init__(self, plan: FilePlan, sending: list[int], good: list[int], sequential: bool,
                 follower: RemoteProcess | None, streams: int):
        chunks = plan.chunks
        self.plan = plan
        self.queue = collections.deque((i, chunks[i][0], chunks[i][1]) for i in sending)
        self.sequential = sequential
        self.lock = threading.Lock()
        self.read: dict[int, str] = {}      # parallel mode: chunk -> sha256 the reader read
        self.written: dict[int, str] = {}   # parallel mode: chunk -> sha256 the writer wrote
        self.done: set[int] = set(good)
        self.frontier = first_gap(self.done, 0)
        self.follower = follower
        self.checked = 0
        self.reader_digest: list[str | None] = [None] * streams
        self.writer_digest: list[str | None] = [None] * streams
        self.error: BaseException | None = None
        self.source_digest: str | None = None  # whole-file sha256 from the source (reader or hasher)
        self.dest_digest: str | None = None    # whole-file sha256 from the destination (writer or follower)
        self.fail_hook: Callable[[], None] = lambda: None
        self.open_pending = False  # pair 0's writer was asked to open the file; its answer is still to be read
        if follower is not None:
            self._tell_follower()

    def take(self) -> tuple[int, int, int] | None:
        with self.lock:
            return self.queue.popleft() if self.queue else None

    def record(self, idx: int, *, read: str | None = None, written: str | None = None) -> None:
        with self.lock:
            if self.sequential:
                if written is not None:
                    self.done.add(idx)
                return
            if read is not None:
                self.read[idx] = read
            if written is not None:
                self.written[idx] = written
            if idx in self.read and idx in self.written:
                a, b = self.read.pop(idx), self.written.pop(idx)
                if a != b:
                    raise DigestMismatch(
                        f"chunk {idx} (offset {self.plan.chunks[idx][0]}): the source read sha256 {a[:16]}… but "
                        f"the destination wrote {b[:16]}…")
                self.checked += 1
                self.done.add(idx)
                if idx == self.frontier:
                    self.frontier = first_gap(self.done, idx)
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


# ----------------------------------------------------------------------------------- requests outside a file


def ask_facts(pair: Pair, source: dict | None, dest: dict) -> tuple[dict | None, dict]:
    """(source facts when asked, destination facts) through one pair: both hosts work at once."""
    pair.command("facts", dest)
    if source is not None:
        pair.reader.write(wire.frame(wire.FACTS, source))
    dest_reply = pair.reply("facts")
    return (reader_reply(pair) if source is not None else None), dest_reply


def reader_reply(pair: Pair) -> dict:
    reply = pair.reply("reader")
    if not isinstance(reply, dict):
        raise HostError(pair.reader.host, f"malformed answer from the {pair.reader.what}: {str(reply)[:200]}")
    return reply


def open_writer(pair: Pair, plan: FilePlan, root: str, sequential: bool, prepare: dict | None = None) -> None:
    args = {"root": root, "rel": plan.rel, "size": plan.size, "chunk_size": plan.chunk_size,
            "hash": "file" if sequential else "chunk"}
    if prepare is not None:
        args["prepare"] = prepare
    pair.command("open", args)


def publish(pair: Pair, args: dict) -> dict:
    """Ask a writer to rename a verified partial into place and/or write the sidecar manifest."""
    pair.command("publish", args)
    return pair.reply("published")


def close_unsent(pair: Pair) -> None:
    """Everything was already there: just close the opened partial."""
    pair.command("finish", {})
    pair.reply("end")


# ----------------------------------------------------------------------------------- one pair's pump


def _check_reader(pair: Pair, reply: dict) -> None:
    if reply.get("error") == "changed":
        raise SourceChanged(reply.get("detail", "changed"))
    if "error" in reply:
        raise HostError(pair.reader.host, str(reply.get("detail") or reply["error"]))


def pump(job: FileJob, k: int, pair: Pair, monitor: TransferMonitor, open_it: bool, rate: float | None,
         root: str) -> None:
    """Move chunks from the job's queue through one pair until the queue is empty, then close the file.
    (Seven parameters: the job, this stream and its pair, and the settings it runs under.)"""
    plan = job.plan
    ident = plan.identity
    pair.reader.write(wire.frame(wire.OPEN, {
        "path": plan.source, "root": plan.source_root, "size": ident["size"], "mtime_ns": ident["mtime_ns"],
        "ino": ident.get("ino"), "hash": "file" if job.sequential else "chunk", "rate": rate}))
    if open_it:
        open_writer(pair, plan, root, job.sequential)
    inflight: collections.deque = collections.deque()
    moved = 0  # bytes of the chunk in flight already reported

    def request() -> None:
        nxt = job.take()
        if nxt:
            inflight.append(nxt)
            pair.reader.write(wire.range_frame(wire.RANGE, *nxt))

    # The first requests go out with the opens, not a round trip later: the reader answers OPEN before it
    # reads them, and the writer opens the file before their data reaches it, so a failed open is still
    # the first answer read here.
    request()
    request()  # one ahead, so the reader never waits for us
    if k == 0 and job.open_pending:
        pair.reply("opened")  # the first writer's open (it prepared the partial), sent before this pump
    _check_reader(pair, reader_reply(pair))
    if open_it:
        pair.reply("opened")
    while inflight and job.error is None:
        monitor.busy(k, "moving bytes")
        word, rest = pair.line()
        if word == "at":
            idx, n = (int(x) for x in rest.split())
            if idx == inflight[0][0] and n > moved:
                monitor.moved(k, n - moved)
                moved = n
        elif word == "ack":
            fields = rest.split()
            acked = tuple(int(x) for x in fields[:3])
            if len(fields) != 4 or acked != inflight[0]:
                raise HostError(pair.writer.host, f"the {pair.writer.what} acknowledged {rest[:80]!r}, but chunk "
                                f"{inflight[0][0]} at offset {inflight[0][1]} was requested")
            inflight.popleft()
            monitor.moved(k, acked[2] - moved)
            moved = 0
            job.record(acked[0], written=fields[3])  # "-" in sequential mode: the writer hashes the whole file
            request()
        elif word == "reader":
            reply = decode_json(rest)
            _check_reader(pair, reply)
            if "chunk" in reply:
                job.record(int(reply["chunk"]), read=str(reply["sha256"]))
        else:
            raise StreamEnded(pair.writer)
    if job.error is not None:
        return
    monitor.idle(k)
    _finish(job, k, pair)


def _finish(job: FileJob, k: int, pair: Pair) -> None:
    """Close the file on both ends: the reader's whole-file digest, then the writer's (after fsync)."""
    pair.reader.write(wire.FINISH)
    pair.command("finish", {})
    while True:
        word, rest = pair.line()
        if word == "reader":
            reply = decode_json(rest)
            _check_reader(pair, reply)
            if "chunk" in reply:
                job.record(int(reply["chunk"]), read=str(reply["sha256"]))
            elif reply.get("finished"):
                job.reader_digest[k] = reply.get("sha256")
        elif word == "end":
            job.writer_digest[k] = None if rest == "-" else rest
            return
        else:
            raise StreamEnded(pair.writer)


def move_chunks(job: FileJob, pairs: list[Pair], monitor: TransferMonitor, ends: Ends,
                settings: tuple[float, float | None, str]) -> None:
    """Run one pump per pair until the job's queue is drained and every writer has closed the file; a
    stall (no byte moved for stall_timeout while a stream waits) fails the job. Pair 0's writer is already
    open (it prepared the partial). settings: (stall timeout, bytes/s per stream or None, destination root).
    Raises the job's first error."""
    stall_timeout, rate, root = settings

    def guarded(k: int, pair: Pair) -> Callable[[], None]:
        def body() -> None:
            try:
                pump(job, k, pair, monitor, k != 0, rate, root)
            except BaseException as exc:  # noqa: BLE001 - every failure ends the file's transfer
                job.fail(exc)
        return body

    threads = [threading.Thread(target=guarded(k, pair), daemon=True, name=f"dfo-pump-{k}")
               for k, pair in enumerate(pairs)]
    for t in threads:
        t.start()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
            stall = monitor.stalled(stall_timeout)
            if stall and job.error is None:
                k, seconds, _ = stall
                side = pairs[k].stuck()
                host, what = (ends.dst, f"writing to {ends.dst}") if side == "destination" else \
                    (ends.src, f"reading from {ends.src}")
                job.fail(Stalled(host, seconds, what))
    except BaseException as exc:  # Ctrl-C: stop the streams so the threads end, then re-raise
        job.fail(exc)
        raise
    finally:
        monitor.flush()
    if job.error is not None:
        raise job.error
