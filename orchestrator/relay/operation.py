"""`dfo relay-checkpoint`: move a checkpoint (file or directory) between two hosts that cannot reach
each other, through the controller: fast, verified, resumable, atomic.

How one file moves:
1. Facts: the source's identity (size, mtime, inode) -- after `--wait-stable` quiet time if asked --
   and the destination's state (final file, partial, journal, free space), both asked through the first
   stream pair, which is already connecting while the controller starts (``plane.DataPlane``).
   ``plan`` decides; every name from the source is confined first.
2. The first destination writer preallocates ``NAME.dfo-partial``; the journal
   ``NAME.dfo-partial.state`` gets a line per chunk written. On resume, every journaled chunk is hashed
   on BOTH hosts and only chunks whose digests agree are kept; the rest is sent again.
3. N streams, each a reader on the source whose ssh writes into an OS pipe that the writer's ssh on
   the destination reads: the controller only sends requests and reads answers (``pump``).
4. Integrity, on the hosts:
   - sequential files (one stream, fresh): the reader hashes the whole file as it reads it, the writer
     as it writes it; the two sha256 must agree;
   - parallel or resumed files: the reader hashes each chunk it reads, the writer each chunk it wrote
     (they must agree); a source-side process hashes the source file beside the transfer and a
     destination-side follower hashes the partial as its done prefix grows; those must agree too.
   The destination digest is reported after fsync. Any mismatch fails loudly and keeps the partial.
5. The first writer fsyncs, renames the partial over NAME and writes the sidecar
   ``NAME.dfo-manifest.json`` (for a directory: ``DIR.dfo-manifest.json`` once every file is in place).
   The source identity is checked at every chunk and at the end: a growing source stops the relay.
"""

from __future__ import annotations

import gc
import hashlib
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable

from orchestrator.core.errors import DfoError, HostError, InputError, OperationError
from orchestrator.core.events import Events, QuietEvents, QuietRelayProgress
from orchestrator.core.host_text import decode_json
from orchestrator.relay import pump
from orchestrator.relay.cipher import check_paramiko_cipher, cipher_reason, dry_run_cipher, plane_choice
from orchestrator.relay.plan import (
    Endpoint,
    FilePlan,
    check_space,
    choose_streams,
    destination_path,
    human_bytes,
    is_sequential,
    journal_header,
    manifest_path,
    parse_endpoint,
    plan_file,
    resume_verdict,
    space_needed,
    to_send,
)
from orchestrator.relay.plane import DataPlane, Pair, StreamEnded, WriterFailed
from orchestrator.relay.processes import HOST_PARTS, RemoteProcess, last_lines
from orchestrator.relay.replies import DestFacts, Hashes, SourceFacts
from orchestrator.relay.result import FileOutcome, RelayOptions, RelayResult
from orchestrator.relay.strip import strip_on_source
from orchestrator.relay.transfer_monitor import TransferMonitor
from orchestrator.transport import Connector, hostcall

HOST_SCRIPT = HOST_PARTS[1:]  # protocol + one-shot functions + streams, behind hostcall's prelude
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
__all__ = ["RelayOptions", "RelayResult", "FileOutcome", "relay"]


class _Relay:
    def __init__(self, connector: Connector, src: Endpoint, dst: Endpoint, options: RelayOptions,
                 events: Events):
        self.connector = connector
        self.inv = connector.inventory
        self.src, self.dst = src, dst
        self.opts = options
        self.events = events
        self.plane: DataPlane | None = None
        self.streams = 1
        self.root = dst.path  # where the relay lands (decided by _plan)
        self._skip_digest: dict[str, str] = {}
        self._remove_manifest = False
        self._single = False
        self._stripped_from: dict | None = None
        self._job: pump.FileJob | None = None
        self._open_pending = False  # the first writer's "opened" is read by the first pump

    # -- helpers

    def call(self, host: str, func: str, **kwargs) -> Any:
        return hostcall.call(self.connector.session(host), HOST_SCRIPT, func, python=self.inv.hosts[host].python,
                             **kwargs)

    def concurrently(self, a: Callable[[], Any], b: Callable[[], Any]) -> tuple[Any, Any]:
        """Both results; the two calls (one per host, usually) run at the same time."""
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dfo-relay") as pool:
            fa, fb = pool.submit(a), pool.submit(b)
            return fa.result(), fb.result()

    def say(self, text: str) -> None:
        if self.events.is_terminal:  # a notice for a person watching; logs keep only the summary
            self.events.info(text)

    # -- the whole operation

    def run(self) -> RelayResult:
        started = time.monotonic()
        o = self.opts
        result = RelayResult(source=str(self.src), destination=str(self.dst), kind="file", dry_run=o.dry_run)
        kind, cipher, explicit = plane_choice(self.opts)
        result.data_plane = kind
        self.plane = DataPlane(self.connector, self.src.host, self.dst.host, kind, cipher, explicit)
        try:
            return self._run(result, started, explicit)
        except BaseException:
            self.plane.abort()
            raise
        finally:
            self.plane.close()

    def _run(self, result: RelayResult, started: float, explicit: bool) -> RelayResult:
        o = self.opts
        assert self.plane is not None
        if not o.dry_run and not o.strip_optimizer:
            # Speculative: most relays move bytes, and the first pair's SSH handshakes then overlap the
            # imports, the control connections and the planning below.
            self.plane.start(1)
        _freeze_heap()  # while the handshakes run
        if o.dry_run or o.strip_optimizer:
            # Both control sessions: a host that cannot be reached fails here, before any work. (A relay
            # that moves bytes asks its facts through the streams and opens these only when needed.)
            self.concurrently(lambda: self.connector.session(self.src.host),
                              lambda: self.connector.session(self.dst.host))
        if self.plane.kind == "paramiko":
            check_paramiko_cipher(self.connector.session(self.src.host).transport, o.cipher)

        source_path, strip_dir = self.src.path, None
        if o.strip_optimizer:
            stripped = strip_on_source(self.connector, self.src.host, self.src.path, o.wait_stable, o.dry_run,
                                       self.call, o.stripper)
            source_path, result.stripped_from = stripped.folder, stripped.stripped_from
            self._stripped_from = stripped.stripped_from
            if o.dry_run:
                result.notes.append(stripped.note)
                result.kind = "dir"
                result.seconds = time.monotonic() - started
                return result
            strip_dir = stripped.folder
            self.plane.start(1)
        plans, dest = self._plan(source_path, result)
        todo = [p for p in plans if p.action != "skip"]
        self.streams = choose_streams(max((p.size for p in todo), default=0), o.streams)
        result.streams = self.streams
        if o.check_space:
            msg = check_space(self.dst.host, self.root, result.space_needed, result.space_free)
            if msg:
                raise OperationError(msg + f" (measured at {dest.free_measured_at})",
                                     hint="free some space there or relay to another path; nothing was written")
        result.manifest = manifest_path(self.root)
        if todo and not o.dry_run:
            # More streams for the largest file come up while the destination prepares and verifies.
            self.plane.start(max(1, min(self.streams, max(len(p.chunks) for p in todo))))
        if o.dry_run:
            result.cipher, result.cipher_reason = dry_run_cipher(self.plane, self.connector, self.src.host,
                                                                            self.dst.host, o.cipher)
            result.files = [self._dry_run_outcome(p) for p in plans]
            result.seconds = time.monotonic() - started
            return result
        self._move(result, plans, todo)
        result.cipher = self.plane.cipher if todo else None
        result.cipher_reason = cipher_reason(self.plane, explicit) if todo else "nothing to send"
        self.plane.close()
        if strip_dir:
            self.call(self.src.host, "remove_paths", paths=[], trees=[strip_dir])
        result.seconds = time.monotonic() - started
        return result

    def _move(self, result: RelayResult, plans: list[FilePlan], todo: list[FilePlan]) -> None:
        """Every file in turn, then the manifest of a directory (a single file's is written on publish)."""
        assert self.plane is not None
        self._single = result.kind == "file"
        self._remove_manifest = bool(todo)  # a stale manifest must not vouch for new bytes
        label = posixpath.basename(self.root) or self.root
        with TransferMonitor(self.events.relay_progress() if todo else QuietRelayProgress(),
                             sum(p.size for p in todo), self.streams if todo else 0, label) as monitor:
            done_before = 0
            for p in plans:
                if p.action == "skip":
                    result.files.append(FileOutcome(p.rel, p.final, p.size, "skipped",
                                                    sha256=self._skip_digest.get(p.final), chunks=len(p.chunks),
                                                    chunk_size=p.chunk_size, reason=p.reason))
                    continue
                result.files.append(self._relay_file(p, monitor, done_before))
                done_before += p.size
        if result.kind == "dir" or not todo:
            doc = self._manifest_doc(result.kind, result.files)
            if self.plane.pairs:
                pump.publish(self.plane.pairs[0], {"root": self.root, "manifest": doc})
            else:
                self.call(self.dst.host, "write_json", path=manifest_path(self.root), obj=doc)

    # -- planning

    def _facts(self, source_path: str, dest_path: str, rels: list[str] | None) -> tuple[dict | None, dict]:
        """(source facts unless rels is given, destination facts), both hosts asked at once. A relay that
        moves bytes asks its stream pair (already connected), and with the destination also asks about
        DEST/NAME, where a single file lands in a folder: one round trip per host; a dry run asks the
        control plane."""
        o = self.opts
        wait = {"wait_stable": o.wait_stable, "poll": min(1.0, max(0.1, o.wait_stable / 5)) if o.wait_stable else 1.0}
        if o.wait_stable > 0 and rels is None:
            self.say(f"waiting until {self.src.host}:{source_path} has been quiet for {o.wait_stable:g}s…")
        dest_args: dict = {"path": dest_path, "rels": rels or [""]}
        if not o.dry_run:
            if rels is None and not o.strip_optimizer:
                dest_args["inside"] = posixpath.basename(self.src.path.rstrip("/"))
            pair = self._first_pair()
            try:
                return pump.ask_facts(pair, dict(path=source_path, **wait) if rels is None else None, dest_args)
            except (StreamEnded, EOFError, WriterFailed, ValueError) as exc:
                proc = getattr(exc, "proc", None)
                where = proc.host if proc else self.dst.host
                raise HostError(where, "a relay stream stopped while gathering facts: "
                                f"{last_lines(proc.error_text()) if proc else exc}") from None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfo-relay-facts") as pool:
            future = pool.submit(self.call, self.dst.host, "dest_facts", **dest_args)
            facts = self.call(self.src.host, "source_facts", path=source_path, **wait) if rels is None else None
            return facts, future.result()

    def _first_pair(self) -> Pair:
        assert self.plane is not None
        try:
            return self.plane.ensure(1)[0]
        except HostError as exc:
            # The control plane explains connection trouble best (host key mismatch, auth, refused):
            # let it have a go at the same host, and report its diagnosis when it has one.
            try:
                self.connector.session(exc.host)
            except DfoError as better:
                raise better from None
            raise

    def _plan(self, source_path: str, result: RelayResult) -> tuple[list[FilePlan], DestFacts]:
        o = self.opts
        raw, raw_dest = self._facts(source_path, self.dst.path, None)
        facts = SourceFacts.parse(raw, self.src.host)  # names from the source are confined here
        dest = DestFacts.parse(raw_dest, self.dst.host)
        self._check_source(facts, source_path)
        rels = [f.rel for f in facts.files]
        self.root = destination_path(self.dst, self.src.path, facts.kind, dest.kind,
                                        strip=o.strip_optimizer, source_slash=self.src.trailing_slash)
        if facts.kind == "dir" and dest.kind == "file" and self.root == self.dst.path:
            raise InputError(f"destination {self.dst.host}:{self.root} is a file, but the source is a directory")
        landing = posixpath.join(self.dst.path, posixpath.basename(self.src.path))
        if rels == [""] and dest.inside is not None and self.root == landing:
            dest = dest.inside
        elif self.root != self.dst.path or rels != [""]:
            dest = DestFacts.parse(self._facts(source_path, self.root, rels)[1], self.dst.host)
        result.kind = facts.kind
        result.destination = f"{self.dst.host}:{self.root}"
        if not dest.writable:
            raise HostError(self.dst.host, f"cannot write in {dest.writable_checked_at} (permission denied)",
                            hint="choose a destination the SSH user may write, or fix its permissions")
        if len(dest.files) != len(facts.files):
            raise HostError(self.dst.host, "malformed destination facts: one entry per file expected")
        plans = []
        for f, d in zip(facts.files, dest.files, strict=True):
            p = plan_file(f.rel, self.src.host, posixpath.join(source_path, f.rel) if f.rel else source_path,
                             f.identity, posixpath.join(self.root, f.rel) if f.rel else self.root, d)
            p.source_root = source_path if f.rel else None
            plans.append(p)
        for s in facts.skipped:
            result.notes.append(f"not relayed: {s.get('rel')} ({s.get('why')})")
        if not o.dry_run:
            self._compare(plans)
        result.space_needed = space_needed(plans)
        result.space_free = dest.free_bytes
        return plans, dest

    def _check_source(self, facts: SourceFacts, path: str) -> None:
        where = f"{self.src.host}:{path}"
        if facts.kind == "missing":
            raise InputError(f"source {where} does not exist")
        if facts.kind not in ("file", "dir"):
            raise InputError(f"source {where} is neither a regular file nor a directory")
        facts.refuse_escapes(self.src.host)
        if facts.kind == "dir" and not facts.files:
            raise InputError(f"source directory {where} holds no regular files")

    def _compare(self, plans: list[FilePlan]) -> None:
        """Same-size files already at the destination: identical ones (sha256 on both hosts) are skipped."""
        for p in plans:
            if p.action != "compare":
                continue
            raw_s, raw_d = self.concurrently(
                partial(self.call, self.src.host, "hash_file", path=p.source, expect=p.identity),
                partial(self.call, self.dst.host, "hash_file", path=p.final))
            s = Hashes.parse(raw_s, self.src.host)
            if s.changed:
                raise self._changed_error(p, s.changed)
            there = raw_d.get("sha256") if isinstance(raw_d, dict) else None
            if there == s.digests[0]:
                p.action, p.reason = "skip", "identical file already present (same sha256)"
                self._skip_digest[p.final] = there
                if p.claimed or p.reset or p.partial_allocated:
                    self.call(self.dst.host, "remove_paths", paths=[p.partial, p.journal])
            else:
                p.replaces = True
                p.action = "resume" if p.claimed else "send"
                p.reason = "a different file of the same size is present: it is replaced"

    def _dry_run_outcome(self, p: FilePlan) -> FileOutcome:
        status = {"send": "would-send", "resume": "would-resume", "compare": "would-compare",
                  "skip": "skipped"}[p.action]
        return FileOutcome(p.rel, p.final, p.size, status, chunks=len(p.chunks), chunk_size=p.chunk_size,
                           resumed_bytes=p.claimed_bytes if p.action == "resume" else 0,
                           streams=min(self.streams, max(1, len(p.chunks))), reason=p.reason)

    # -- one file

    def _changed_error(self, p: FilePlan, detail: str) -> OperationError:
        return OperationError(
            f"source {self.src.host}:{p.source} changed during the relay: {detail}. It is probably still being "
            "written (a trainer saving a checkpoint).",
            hint="wait until it is complete, or re-run with --wait-stable SECONDS to wait for it to be quiet first; "
            "the next run starts this file over, since the source is a different file now",
        )

    def _resume_hint(self, p: FilePlan) -> str:
        job = self._job if self._job is not None and self._job.plan is p else None
        done = job.done_bytes() if job else 0
        return (f"the partial {self.dst.host}:{p.partial} is kept ({human_bytes(done)} of "
                f"{human_bytes(p.size)} done); re-run the same command to resume")

    def _relay_file(self, p: FilePlan, monitor: TransferMonitor, done_before: int) -> FileOutcome:
        started = time.monotonic()
        try:
            outcome, job = self._send_file(p, monitor, done_before)
        except pump.SourceChanged as exc:
            raise self._changed_error(p, str(exc)) from None
        except pump.Stalled as exc:
            raise HostError(exc.host, f"no data moved for {exc.seconds:.0f}s while {exc.activity} "
                            "(network down or host unresponsive?)", hint=self._resume_hint(p)) from None
        except WriterFailed as exc:
            if exc.kind == "nospace":
                raise HostError(exc.host, exc.message,
                                hint=f"free space there and re-run the same command to resume, or delete "
                                f"{p.partial} and {p.journal}; no final file was written") from None
            if exc.kind == "busy":
                raise HostError(exc.host, exc.message, hint="wait for the other relay to finish") from None
            raise HostError(exc.host, exc.message, hint=self._resume_hint(p)) from None
        except StreamEnded as exc:
            detail = last_lines(exc.proc.error_text()) or "the connection closed"
            raise HostError(exc.proc.host, f"the {exc.proc.what} stopped: {detail}",
                            hint=self._resume_hint(p)) from None
        except (EOFError, ValueError) as exc:
            raise OperationError(f"a data stream ({exc}) closed unexpectedly", hint=self._resume_hint(p)) from None
        except pump.DigestMismatch as exc:
            raise OperationError(f"integrity check failed for {p.final}: {exc}", hint=self._resume_hint(p)) from None
        self._verify(p, outcome, job)
        self._publish(p, outcome, monitor)
        outcome.seconds = time.monotonic() - started
        return outcome

    def _send_file(self, p: FilePlan, monitor: TransferMonitor, done_before: int) -> tuple[FileOutcome, pump.FileJob]:
        assert self.plane is not None
        name = p.rel or posixpath.basename(p.final)
        wanted = max(1, min(self.streams, len(p.chunks)))
        resuming = bool(p.claimed) and not p.reset
        sequential = not resuming and p.size > 0 and is_sequential(p, list(range(len(p.chunks))), wanted)
        pairs = self.plane.ensure(wanted)
        # The first writer creates/keeps the preallocated partial and its journal, then opens it.
        pump.open_writer(pairs[0], p, self.root, sequential, prepare={
            "header": journal_header(self.src.host, p.source, p.identity, p.chunk_size),
            "reset": p.reset, "preallocate": self.opts.preallocate, "remove_manifest": self._remove_manifest})
        # A fresh file over one stream: the answer is read by the pump, after it has sent the reader its
        # requests (one round trip fewer). Other writers must not open the partial before it exists, and
        # resuming hashes it first: those wait for the answer here.
        self._open_pending = not resuming and wanted == 1 and bool(to_send(p, []))
        if not self._open_pending:
            pairs[0].reply("opened")
        self._remove_manifest = False
        good: list[int] = []
        bad: list[int] = []
        if resuming:
            monitor.status(f"verifying {len(p.claimed)} resumed chunks of {name} on both hosts")
            ranges = [p.chunks[i] for i in p.claimed]
            s, d = self._hash_on_both_hosts(p, ranges)
            if s.changed:
                raise pump.SourceChanged(s.changed)
            good, bad = resume_verdict(p.claimed, s.digests, d.digests)
        sending = to_send(p, good)
        resumed = sum(p.chunks[i][1] for i in good)
        monitor.set_done(done_before + resumed)
        streams = max(1, min(wanted, len(sending)))
        outcome = FileOutcome(p.rel, p.final, p.size, "resumed" if good else "sent", chunks=len(p.chunks),
                              chunk_size=p.chunk_size, resumed_bytes=resumed, bad_chunks=len(bad),
                              mode="sequential" if sequential else "parallel", streams=streams if sending else 0,
                              reason=p.reason)
        monitor.status(name + (f" (resuming; {len(bad)} bad chunk(s) sent again)" if bad else
                            " (resuming)" if good else ""))
        job = self._transfer(p, pairs[:streams], sending, good, sequential, monitor)
        outcome.sent_bytes = sum(p.chunks[i][1] for i in sending)
        return outcome, job

    def _transfer(self, p: FilePlan, pairs: list[Pair], sending: list[int], good: list[int],
                  sequential: bool, monitor: TransferMonitor) -> pump.FileJob:
        assert self.plane is not None
        plane = self.plane
        follower = src_hash = None
        if not sequential and p.size > 0:
            src_hash = plane.spawn_aux(self.src.host, "hash", {"path": p.source, "expect": p.identity},
                                       f"source hasher on {self.src.host}")
            follower = plane.spawn_aux(self.dst.host, "follow", {"root": self.root, "rel": p.rel, "size": p.size},
                                       f"destination hasher on {self.dst.host}")
        job = pump.FileJob(p, sending, good, sequential, follower, len(pairs))
        job.open_pending = self._open_pending
        job.fail_hook = plane.abort
        self._job = job  # for the resume hint, should this transfer fail
        try:
            if sending:
                rate = self.opts.bwlimit / len(pairs) if self.opts.bwlimit else None
                pump.move_chunks(job, pairs, monitor, pump.Ends(self.src.host, self.dst.host),
                                 (self.opts.stall_timeout, rate, self.root))
            else:
                pump.close_unsent(pairs[0])
            missing = [i for i in range(len(p.chunks)) if i not in job.done]
            if missing:
                raise OperationError(f"{len(missing)} chunks of {p.final} were not confirmed by the destination",
                                     hint=self._resume_hint(p))
            if sequential:
                job.source_digest, job.dest_digest = job.reader_digest[0], job.writer_digest[0]
            elif follower is not None and src_hash is not None:
                monitor.status(f"comparing whole-file sha256 of {p.rel or posixpath.basename(p.final)}")
                job.dest_digest = self._aux_digest(follower, p, b"end\n")
                job.source_digest = self._aux_digest(src_hash, p, None)
            return job
        finally:
            for proc in (follower, src_hash):
                if proc is not None:
                    plane.release_aux(proc)

    def _aux_digest(self, proc: RemoteProcess, p: FilePlan, send: bytes | None) -> str:
        if send:
            proc.write(send)
        line = proc.readline()
        try:
            reply = decode_json(line)
            if reply.get("error") == "changed":
                raise pump.SourceChanged(reply["detail"])
            return str(reply["sha256"])
        except (ValueError, KeyError, AttributeError):
            raise HostError(proc.host, f"the {proc.what} stopped: {last_lines(proc.error_text()) or 'no answer'}",
                            hint=self._resume_hint(p)) from None

    def _verify(self, p: FilePlan, outcome: FileOutcome, job: pump.FileJob) -> None:
        outcome.source_sha256, outcome.destination_sha256 = job.source_digest, job.dest_digest
        outcome.chunks_checked_in_flight = job.checked
        agree = job.source_digest is not None and job.source_digest == job.dest_digest
        if p.size == 0:
            outcome.source_sha256 = outcome.destination_sha256 = EMPTY_SHA256
            agree = True
        if not agree:
            self._mismatch(p, outcome)
        outcome.sha256 = outcome.destination_sha256

    def _publish(self, p: FilePlan, outcome: FileOutcome, monitor: TransferMonitor) -> None:
        assert self.plane is not None
        monitor.status(f"publishing {p.rel or posixpath.basename(p.final)}")
        args = {"root": self.root, "rel": p.rel, "size": p.size, "mode": p.identity.get("mode")}
        if self._single:
            args["manifest"] = self._manifest_doc("file", [outcome])
        try:
            pump.publish(self.plane.pairs[0], args)
        except WriterFailed as exc:
            raise HostError(exc.host, exc.message, hint=self._resume_hint(p)) from None
        except StreamEnded as exc:
            raise HostError(exc.proc.host, f"the {exc.proc.what} stopped while publishing {p.final}",
                            hint=self._resume_hint(p)) from None

    def _hash_on_both_hosts(self, p: FilePlan, ranges: list[tuple[int, int]]) -> tuple[Hashes, Hashes]:
        """sha256 of the same ranges of the source file and of the destination partial, on each host."""
        s, d = self.concurrently(
            partial(self.call, self.src.host, "hash_ranges", path=p.source, ranges=ranges, expect=p.identity),
            partial(self.call, self.dst.host, "hash_ranges", path=p.partial, ranges=ranges))
        return Hashes.parse(s, self.src.host), Hashes.parse(d, self.dst.host)

    def _mismatch(self, p: FilePlan, outcome: FileOutcome) -> None:
        """Whole-file digests disagree: find the chunks that differ, forget them, and fail loudly."""
        s, d = self._hash_on_both_hosts(p, p.chunks)
        bad = [i for i, (a, b) in enumerate(zip(s.digests, d.digests, strict=False)) if a != b]
        if bad:
            self.call(self.dst.host, "journal_drop", final=p.final, indices=bad)
        raise OperationError(
            f"integrity check failed for {self.dst.host}:{p.final}: sha256 source {outcome.source_sha256}, "
            f"destination {outcome.destination_sha256}; {len(bad)} chunk(s) differ",
            hint=f"the partial {p.partial} is kept without the bad chunks; re-run the same command to re-send them",
        )

    def _manifest_doc(self, kind: str, outcomes: list[FileOutcome]) -> dict:
        files = {f.rel or posixpath.basename(self.root): {"size": f.size, "sha256": f.sha256} for f in outcomes}
        doc = {
            "dfo_relay_manifest": 1,
            "source": f"{self.src.host}:{self.src.path}",
            "destination": f"{self.dst.host}:{self.root}",
            "kind": kind,
            "relayed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files,
        }
        if kind == "file" and outcomes:
            doc["sha256"] = outcomes[0].sha256
        if self._stripped_from:
            doc["stripped_from"] = self._stripped_from
        return doc


_FROZEN = False


def _freeze_heap() -> None:
    """Modules and objects that exist now live as long as the process: move them out of the collector's
    sight (once per process), so the pumps' small allocations do not trigger walks over the whole heap.
    No collection first: the little garbage of the imports is not worth a walk over the heap at start-up."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.freeze()


def relay(connector: Connector, source: str, destination: str, options: RelayOptions | None = None,
          events: Events | None = None) -> RelayResult:
    """Relay SOURCE (``HOST:PATH``) to DESTINATION (``HOST:PATH``) through this machine.

    Progress and notices go to ``events`` (``relay_progress`` for the bytes; default: nothing).
    Raises InputError for bad arguments, OperationError/HostError when the relay fails (the partial is
    kept for resume). Returns a RelayResult (``as_dict()`` is the --json summary).
    """
    options = options or RelayOptions()
    inv = connector.inventory
    src = parse_endpoint(source, inv, "source")
    dst = parse_endpoint(destination, inv, "destination")
    if options.bwlimit is not None and options.bwlimit <= 0:
        raise InputError("--bwlimit must be positive")
    if options.stall_timeout <= 0:
        raise InputError("--stall-timeout must be positive")
    if options.wait_stable < 0:
        raise InputError("--wait-stable must be zero or more seconds")
    return _Relay(connector, src, dst, options, events or QuietEvents()).run()
