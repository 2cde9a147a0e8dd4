"""`dfo relay-checkpoint`: move a checkpoint (file or directory) between two hosts that cannot reach
each other, through the controller: fast, verified, resumable, atomic.

How one file moves:
1. Facts: the source's identity (size, mtime, inode) -- after `--wait-stable` quiet time if asked --
   and the destination's state (final file, partial, journal, free space). `relay_plan` decides.
   Meanwhile the first stream pair is already connecting (relay_streams.DataPlane).
2. The first destination writer preallocates ``NAME.dfo-partial``; the journal
   ``NAME.dfo-partial.state`` gets a line per chunk written. On resume, every journaled chunk is hashed
   on BOTH hosts and only chunks whose digests agree are kept; the rest is sent again.
3. N streams, each a pair of bulk ssh processes (reader on the source, writer on the destination)
   with a pump in the controller, pull chunks from one queue and write them at their offsets.
4. Integrity, three points:
   - sequential files (one stream, fresh): the source reader, the controller (in flight) and the
     destination writer each hash the whole file as it passes; all three sha256 must agree;
   - parallel or resumed files: the controller hashes each chunk in flight and the writer hashes what
     it wrote, per chunk (they must agree); a source-side process hashes the source file beside the
     transfer and a destination-side follower hashes the partial as its done prefix grows; those two
     whole-file sha256 must agree.
   The destination digest is reported after fsync. Any mismatch fails loudly and keeps the partial.
5. The first writer fsyncs, renames the partial over NAME and writes the sidecar
   ``NAME.dfo-manifest.json`` (for a directory: ``DIR.dfo-manifest.json`` once every file is in place).
   The source identity is checked at every chunk and at the end: a growing source stops the relay.
"""

from __future__ import annotations

from pathlib import Path

import gc
import hashlib
import json
import posixpath
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from rich.console import Console
from rich.markup import escape

from orchestrator.relay import plan as rp
from orchestrator.relay import streams as rs
from orchestrator.transport import hostcall
from orchestrator.core.errors import DfoError, HostError, InputError, OperationError
from orchestrator.transport import Connector

HOST_SCRIPT = Path(__file__).with_name("host_script.py")  # sent to the host on stdin, see transport.hostcall

STRIP_DIR = "relay-strip"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass
class RelayOptions:
    streams: int | None = None          # None: chosen by size (relay_plan.choose_streams)
    cipher: str | None = None           # None: aes128-gcm when both ends offer it
    strip_optimizer: bool = False
    dry_run: bool = False
    wait_stable: float = 0.0            # seconds of quiet required before starting
    data_plane: str = "auto"            # "auto" | "ssh" | "paramiko"
    bwlimit: float | None = None        # bytes per second over all streams
    stall_timeout: float = 60.0         # no byte moved for this long -> fail (link down, host hung)
    # For tests of the mid-way full-disk path only: skip the up-front checks that normally catch it.
    check_space: bool = True
    preallocate: bool = True


@dataclass
class FileOutcome:
    rel: str
    final: str
    size: int
    status: str                          # sent | resumed | skipped | would-send | would-resume | would-compare
    sha256: str | None = None
    source_sha256: str | None = None     # computed on the source host
    destination_sha256: str | None = None  # computed on the destination host after fsync
    in_flight_sha256: str | None = None  # computed by the controller (sequential mode)
    chunks: int = 0
    chunk_size: int = 0
    chunks_checked_in_flight: int = 0    # parallel mode: chunks whose in-flight and written digests agreed
    sent_bytes: int = 0
    resumed_bytes: int = 0
    bad_chunks: int = 0                  # journaled chunks that failed verification and were re-sent
    mode: str = ""                       # sequential | parallel
    streams: int = 0
    seconds: float = 0.0
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RelayResult:
    source: str
    destination: str
    kind: str
    dry_run: bool
    files: list[FileOutcome] = field(default_factory=list)
    streams: int = 1
    cipher: str | None = None
    cipher_reason: str = ""
    data_plane: str = ""
    seconds: float = 0.0
    manifest: str | None = None
    stripped_from: dict | None = None
    space_needed: int = 0
    space_free: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def sent_bytes(self) -> int:
        return sum(f.sent_bytes for f in self.files)

    @property
    def resumed_bytes(self) -> int:
        return sum(f.resumed_bytes for f in self.files)

    @property
    def skipped_bytes(self) -> int:
        return sum(f.size for f in self.files if f.status == "skipped")

    @property
    def mib_per_s(self) -> float:
        return self.sent_bytes / rp.MiB / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        single = self.files[0] if self.kind == "file" and self.files else None
        return {
            "ok": True,
            "dry_run": self.dry_run,
            "source": self.source,
            "destination": self.destination,
            "kind": self.kind,
            "bytes": self.total_bytes,
            "sent_bytes": self.sent_bytes,
            "resumed_bytes": self.resumed_bytes,
            "skipped_bytes": self.skipped_bytes,
            "seconds": round(self.seconds, 3),
            "mib_per_s": round(self.mib_per_s, 1),
            "streams": self.streams,
            "cipher": self.cipher,
            "cipher_reason": self.cipher_reason,
            "data_plane": self.data_plane,
            "sha256": single.sha256 if single else None,
            "digests": ({"source": single.source_sha256, "destination": single.destination_sha256,
                         "in_flight": single.in_flight_sha256,
                         "chunks_checked_in_flight": single.chunks_checked_in_flight} if single else None),
            "manifest": self.manifest,
            "stripped_from": self.stripped_from,
            "space_needed": self.space_needed,
            "space_free": self.space_free,
            "files": [f.as_dict() for f in self.files],
            "notes": self.notes,
        }


# ----------------------------------------------------------------------------------- the relay


class _Relay:
    def __init__(self, connector: Connector, src: rp.Endpoint, dst: rp.Endpoint, options: RelayOptions,
                 console: Console):
        self.connector = connector
        self.inv = connector.inventory
        self.src, self.dst = src, dst
        self.opts = options
        self.console = console
        self.plane: rs.DataPlane | None = None
        self.streams = 1
        self._skip_digest: dict[str, str] = {}
        self._stale_manifest: list[str] = []
        self._manifest_single: str | None = None
        self._stripped_from: dict | None = None
        self._job: rs.FileJob | None = None

    # -- helpers

    def call(self, host: str, func: str, **kwargs) -> Any:
        return hostcall.call(self.connector.session(host), HOST_SCRIPT, func,
                                   python=self.inv.hosts[host].python, **kwargs)

    def both(self, a: Callable[[], Any], b: Callable[[], Any]) -> tuple[Any, Any]:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dfo-relay") as pool:
            fa, fb = pool.submit(a), pool.submit(b)
            return fa.result(), fb.result()

    def say(self, text: str) -> None:
        if self.console.is_terminal:
            self.console.print(f"[dim]{escape(text)}[/]")

    # -- the whole operation

    def run(self) -> RelayResult:
        started = time.monotonic()
        o = self.opts
        result = RelayResult(source=str(self.src), destination=str(self.dst), kind="file", dry_run=o.dry_run)
        kind, cipher, explicit = self._plane_choice()
        result.data_plane = kind
        if kind == "paramiko":
            rs.raise_paramiko_rekey_limits()
        self.plane = rs.DataPlane(self.connector, self.src.host, self.dst.host, kind, cipher, explicit)
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
            # control connections, the facts and the planning below.
            self.plane.start(1)
        if o.dry_run or o.strip_optimizer:
            # Both control sessions: a host that cannot be reached fails here, before any work. (A relay
            # that moves bytes asks its facts through the streams and opens these only when needed.)
            self.both(lambda: self.connector.session(self.src.host), lambda: self.connector.session(self.dst.host))
        if self.plane.kind == "paramiko":
            self._check_paramiko_cipher(o.cipher)

        source_path = self.src.path
        strip_dir = None
        if o.strip_optimizer:
            source_path, result.stripped_from, strip_dir = self._strip(result)
            self._stripped_from = result.stripped_from
            if o.dry_run:
                result.seconds = time.monotonic() - started
                return result
            self.plane.start(1)
        plans, final_root, dest, facts = self._plan(source_path, result)
        todo = [p for p in plans if p.action != "skip"]
        self.streams = rp.choose_streams(max((p.size for p in todo), default=0), o.streams)
        result.streams = self.streams
        if o.check_space:
            msg = rp.check_space(self.dst.host, final_root, result.space_needed, result.space_free)
            if msg:
                raise OperationError(msg + f" (measured at {dest['free_measured_at']})",
                                     hint="free some space there or relay to another path; nothing was written")
        manifest = rp.manifest_path(final_root)
        result.manifest = manifest
        if todo and not o.dry_run:
            # More streams for the largest file come up while the destination prepares and verifies.
            self.plane.start(max(1, min(self.streams, max(len(p.chunks) for p in todo))))
        if o.dry_run:
            self._dry_cipher(result)
            result.files = [self._would(p) for p in plans]
            result.seconds = time.monotonic() - started
            return result
        self._manifest_single = manifest if result.kind == "file" else None
        self._stale_manifest = [manifest] if todo else []  # a stale manifest must not vouch for new bytes
        label = posixpath.basename(final_root) or final_root
        with rs.Flow(self.console, sum(p.size for p in todo), 0, self.streams if todo else 0, label,
                     o.bwlimit, enabled=self.console.is_terminal and bool(todo)) as flow:
            done_before = 0
            for p in plans:
                if p.action == "skip":
                    result.files.append(FileOutcome(p.rel, p.final, p.size, "skipped",
                                                    sha256=self._skip_digest.get(p.final), chunks=len(p.chunks),
                                                    chunk_size=p.chunk_size, reason=p.reason))
                    continue
                result.files.append(self._relay_file(p, flow, done_before))
                done_before += p.size
        if result.kind == "dir" or not todo:
            doc = self._manifest_doc(result.kind, result.files, final_root)
            if self.plane.pairs:
                rs.publish(self.plane.pairs[0].writer, {"manifest_path": manifest, "manifest": doc})
            else:
                self.call(self.dst.host, "write_json", path=manifest, obj=doc)
        result.cipher = self.plane.cipher if todo else None
        result.cipher_reason = self._cipher_reason(explicit) if todo else "nothing to send"
        self.plane.close()
        if strip_dir:
            self.call(self.src.host, "remove_paths", paths=[], trees=[strip_dir])
        result.seconds = time.monotonic() - started
        return result

    # -- planning

    def _facts(self, source_path: str, dest_path: str, rels: list[str] | None) -> tuple[dict | None, dict]:
        """(source facts unless rels is given, destination facts), both hosts asked at once. A relay that
        moves bytes asks its stream processes (already connected); a dry run the control plane."""
        o = self.opts
        wait = {"wait_stable": o.wait_stable, "poll": min(1.0, max(0.1, o.wait_stable / 5)) if o.wait_stable else 1.0}
        if o.wait_stable > 0 and rels is None:
            self.say(f"waiting until {self.src.host}:{source_path} has been quiet for {o.wait_stable:g}s…")
        if not o.dry_run:
            pair = self._first_pair()
            try:
                dest_reply = rs.ask_dest_facts(pair.writer, path=dest_path, rels=rels or [""])
                if rels is None:
                    facts = rs.ask_source_facts(pair.reader, path=source_path, **wait)()
                return (facts if rels is None else None), dest_reply()
            except (rs.StreamEnded, EOFError, rs.WriterFailed) as exc:
                proc = getattr(exc, "proc", None)
                where = proc.host if proc else self.dst.host
                raise HostError(where, "a relay stream stopped while gathering facts: "
                                f"{rs.tail(proc.error_text()) if proc else exc}") from None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dfo-relay-facts") as pool:
            future = pool.submit(self.call, self.dst.host, "dest_facts", path=dest_path, rels=rels or [""])
            facts = self.call(self.src.host, "source_facts", path=source_path, **wait) if rels is None else None
            return facts, future.result()

    def _first_pair(self) -> rs.Pair:
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

    def _plan(self, source_path: str, result: RelayResult) -> tuple[list[rp.FilePlan], str, dict, dict]:
        o = self.opts
        facts, dest = self._facts(source_path, self.dst.path, None)
        assert facts is not None
        self._check_source(facts, source_path)
        entries = facts["files"] if facts["kind"] == "dir" else [dict(facts, rel="")]
        rels = [e["rel"] for e in entries]
        final_root = rp.destination_path(self.dst, self.src.path, facts["kind"], dest["kind"], strip=o.strip_optimizer,
                                         source_slash=self.src.trailing_slash)
        if facts["kind"] == "dir" and dest["kind"] == "file" and final_root == self.dst.path:
            raise InputError(f"destination {self.dst.host}:{final_root} is a file, but the source is a directory")
        if final_root != self.dst.path or rels != [""]:
            dest = self._facts(source_path, final_root, rels)[1]
        result.kind = facts["kind"]
        result.destination = f"{self.dst.host}:{final_root}"
        if not dest["writable"]:
            raise HostError(self.dst.host, f"cannot write in {dest['writable_checked_at']} (permission denied)",
                            hint="choose a destination the SSH user may write, or fix its permissions")
        plans = [
            rp.plan_file(e["rel"], self.src.host, posixpath.join(source_path, e["rel"]) if e["rel"] else source_path,
                         {k: e[k] for k in ("size", "mtime_ns", "ino", "mode")},
                         posixpath.join(final_root, e["rel"]) if e["rel"] else final_root, d)
            for e, d in zip(entries, dest["files"])
        ]
        for s in facts.get("skipped", []):
            result.notes.append(f"not relayed: {s['rel']} ({s['why']})")
        if not o.dry_run:
            self._compare(plans)
        result.space_needed = rp.space_needed(plans)
        result.space_free = dest["free_bytes"]
        return plans, final_root, dest, facts

    def _check_source(self, facts: dict, path: str) -> None:
        where = f"{self.src.host}:{path}"
        if facts["kind"] == "missing":
            raise InputError(f"source {where} does not exist")
        if facts["kind"] == "other":
            raise InputError(f"source {where} is neither a regular file nor a directory")
        if facts["kind"] == "dir" and not facts["files"]:
            raise InputError(f"source directory {where} holds no regular files")

    def _compare(self, plans: list[rp.FilePlan]) -> None:
        """Same-size files already at the destination: identical ones (sha256 on both hosts) are skipped."""
        for p in plans:
            if p.action != "compare":
                continue
            s, d = self.both(
                lambda: self.call(self.src.host, "hash_file", path=p.source, expect=p.identity),
                lambda: self.call(self.dst.host, "hash_file", path=p.final),
            )
            if s.get("error") == "changed":
                raise self._changed_error(p, s["detail"])
            if "error" in s:
                raise HostError(self.src.host, s["detail"])
            if d.get("sha256") == s["sha256"]:
                p.action, p.reason = "skip", "identical file already present (same sha256)"
                self._skip_digest[p.final] = s["sha256"]
                if p.claimed or p.reset or p.partial_allocated:
                    self.call(self.dst.host, "remove_paths", paths=[p.partial, p.journal])
            else:
                p.replaces = True
                p.action = "resume" if p.claimed else "send"
                p.reason = "a different file of the same size is present: it is replaced"

    def _would(self, p: rp.FilePlan) -> FileOutcome:
        status = {"send": "would-send", "resume": "would-resume", "compare": "would-compare", "skip": "skipped"}[p.action]
        return FileOutcome(p.rel, p.final, p.size, status, chunks=len(p.chunks), chunk_size=p.chunk_size,
                           resumed_bytes=p.claimed_bytes if p.action == "resume" else 0,
                           streams=min(self.streams, max(1, len(p.chunks))), reason=p.reason)

    # -- plane and cipher

    def _plane_choice(self) -> tuple[str, str | None, bool]:
        """(data plane kind, cipher to ask for first, whether --cipher fixed it)."""
        o = self.opts
        if o.data_plane not in ("auto", "ssh", "paramiko"):
            raise InputError(f"--data-plane {o.data_plane!r}: expected auto, ssh or paramiko")
        kind = o.data_plane if o.data_plane != "auto" else ("ssh" if rs.have_ssh() else "paramiko")
        if kind == "ssh" and not rs.have_ssh():
            raise InputError("--data-plane ssh: there is no `ssh` binary on this machine",
                             hint="install openssh-client, or use --data-plane paramiko")
        if kind == "paramiko":
            return kind, o.cipher or rp.FAST_CIPHER, bool(o.cipher)
        clients = rs.client_ciphers()
        cipher, _ = rp.cipher_choice(o.cipher, clients, {"": True})
        return kind, cipher, bool(o.cipher)

    def _check_paramiko_cipher(self, cipher: str | None) -> None:
        supported = rs.paramiko_ciphers(self.connector.session(self.src.host).transport)
        if cipher and cipher not in supported:
            raise InputError(f"--cipher {cipher!r} is not supported by paramiko", hint="supported: " + ", ".join(supported))

    def _cipher_reason(self, explicit: bool) -> str:
        assert self.plane is not None
        if explicit:
            return "as requested with --cipher"
        if self.plane.cipher_note:
            return self.plane.cipher_note
        if self.plane.kind == "paramiko":
            return "paramiko data plane (the cipher both ends agreed on)"
        if self.plane.cipher == rp.FAST_CIPHER:
            return "offered by both ends (about twice as fast as the default chacha20)"
        return "ssh default"

    def _dry_cipher(self, result: RelayResult) -> None:
        """A dry run asks each host (one short ssh each) whether it offers the fast cipher."""
        assert self.plane is not None
        o = self.opts
        if self.plane.kind == "paramiko":
            result.cipher, result.cipher_reason = self.plane.cipher, "paramiko data plane (preferred cipher)"
            return
        wanted = self.plane.cipher
        if wanted is None:
            result.cipher, result.cipher_reason = None, "ssh default (the local ssh lacks aes128-gcm)"
            return
        timeout = self.connector.connect_timeout + 10
        offers = dict(zip((self.src.host, self.dst.host), self.both(
            lambda: rs.probe_cipher(self.connector.resolved(self.src.host), wanted, timeout),
            lambda: rs.probe_cipher(self.connector.resolved(self.dst.host), wanted, timeout))))
        if o.cipher:
            refused = [h for h, ok in offers.items() if not ok]
            if refused:
                raise InputError(f"--cipher {o.cipher}: not offered by {', '.join(refused)}")
            result.cipher, result.cipher_reason = o.cipher, "as requested with --cipher"
            return
        result.cipher, result.cipher_reason = rp.cipher_choice(None, rs.client_ciphers(), offers)

    # -- one file

    def _changed_error(self, p: rp.FilePlan, detail: str) -> OperationError:
        return OperationError(
            f"source {self.src.host}:{p.source} changed during the relay: {detail}. It is probably still being "
            "written (a trainer saving a checkpoint).",
            hint="wait until it is complete, or re-run with --wait-stable SECONDS to wait for it to be quiet first; "
            "the next run starts this file over, since the source is a different file now",
        )

    def _resume_hint(self, p: rp.FilePlan, job: rs.FileJob | None) -> str:
        job = job or (self._job if self._job is not None and self._job.plan is p else None)
        done = job.done_bytes() if job else 0
        return (f"the partial {self.dst.host}:{p.partial} is kept ({rp.human_bytes(done)} of "
                f"{rp.human_bytes(p.size)} done); re-run the same command to resume")

    def _relay_file(self, p: rp.FilePlan, flow: rs.Flow, done_before: int) -> FileOutcome:
        assert self.plane is not None
        started = time.monotonic()
        name = p.rel or posixpath.basename(p.final)
        wanted = max(1, min(self.streams, len(p.chunks)))
        resuming = bool(p.claimed) and not p.reset
        sequential = not resuming and p.size > 0 and rp.is_sequential(p, list(range(len(p.chunks))), wanted)
        pairs = self.plane.ensure(wanted)
        writer0 = pairs[0].writer
        job: rs.FileJob | None = None
        try:
            # The first writer creates/keeps the preallocated partial and its journal, then opens it.
            writer0.write(rs.writer_open_frame(p, sequential, prepare={
                "header": rp.journal_header(self.src.host, p.source, p.identity, p.chunk_size),
                "reset": p.reset, "preallocate": self.opts.preallocate, "remove": self._stale_manifest}))
            rs.writer_reply(writer0, "opened")
            self._stale_manifest = []
            good: list[int] = []
            bad: list[int] = []
            if resuming:
                flow.status(f"verifying {len(p.claimed)} resumed chunks of {name} on both hosts")
                ranges = [p.chunks[i] for i in p.claimed]
                s, d = self.both(
                    lambda: self.call(self.src.host, "hash_ranges", path=p.source, ranges=ranges, expect=p.identity),
                    lambda: self.call(self.dst.host, "hash_ranges", path=p.partial, ranges=ranges),
                )
                if s.get("error") == "changed":
                    raise rs.SourceChanged(s["detail"])
                good, bad = rp.resume_verdict(p.claimed, s["digests"], d["digests"])
            sending = rp.to_send(p, good)
            resumed = sum(p.chunks[i][1] for i in good)
            flow.set_total(flow.total, done_before + resumed)
            streams = max(1, min(wanted, len(sending)))
            outcome = FileOutcome(p.rel, p.final, p.size, "resumed" if good else "sent", chunks=len(p.chunks),
                                  chunk_size=p.chunk_size, resumed_bytes=resumed, bad_chunks=len(bad),
                                  mode="sequential" if sequential else "parallel", streams=streams if sending else 0,
                                  reason=p.reason)
            flow.status(name + (f" (resuming; {len(bad)} bad chunk(s) sent again)" if bad else
                                " (resuming)" if good else ""))
            job = self._transfer(p, pairs[:streams], sending, good, sequential, flow)
            outcome.sent_bytes = sum(p.chunks[i][1] for i in sending)
        except rs.SourceChanged as exc:
            raise self._changed_error(p, str(exc)) from None
        except rs.Stalled as exc:
            raise HostError(exc.host, f"no data moved for {exc.seconds:.0f}s while {exc.activity} "
                            "(network down or host unresponsive?)", hint=self._resume_hint(p, job)) from None
        except rs.WriterFailed as exc:
            if exc.kind == "nospace":
                raise HostError(exc.host, exc.message,
                                hint=f"free space there and re-run the same command to resume, or delete "
                                f"{p.partial} and {p.journal}; no final file was written") from None
            if exc.kind == "busy":
                raise HostError(exc.host, exc.message, hint="wait for the other relay to finish") from None
            raise HostError(exc.host, exc.message, hint=self._resume_hint(p, job)) from None
        except rs.StreamEnded as exc:
            detail = rs.tail(exc.proc.error_text()) or "the connection closed"
            raise HostError(exc.proc.host, f"the {exc.proc.what} stopped: {detail}",
                            hint=self._resume_hint(p, job)) from None
        except EOFError as exc:
            raise OperationError(f"a data stream ({exc}) closed unexpectedly", hint=self._resume_hint(p, job)) from None
        except rs.DigestMismatch as exc:
            raise OperationError(f"integrity check failed for {p.final}: {exc}",
                                 hint=self._resume_hint(p, job)) from None

        if sequential:
            reader, inflight, written = job.reader_digest[0], job.whole.hexdigest(), job.writer_digest[0]
            outcome.source_sha256, outcome.in_flight_sha256, outcome.destination_sha256 = reader, inflight, written
            agree = reader is not None and reader == inflight == written
        else:
            outcome.source_sha256, outcome.destination_sha256 = job.source_digest, job.dest_digest
            outcome.chunks_checked_in_flight = job.checked
            agree = job.source_digest is not None and job.source_digest == job.dest_digest
        if p.size == 0:
            outcome.source_sha256 = outcome.destination_sha256 = EMPTY_SHA256
            agree = True
        if not agree:
            self._mismatch(p, outcome)
        outcome.sha256 = outcome.destination_sha256
        flow.status(f"publishing {name}")
        request = {"final": p.final, "size": p.size, "mode": p.identity.get("mode")}
        if self._manifest_single:
            request.update(manifest_path=self._manifest_single,
                           manifest=self._manifest_doc("file", [outcome], p.final))
        try:
            rs.publish(writer0, request)
        except rs.WriterFailed as exc:
            raise HostError(exc.host, exc.message, hint=self._resume_hint(p, job)) from None
        except rs.StreamEnded as exc:
            raise HostError(exc.proc.host, f"the {exc.proc.what} stopped while publishing {p.final}",
                            hint=self._resume_hint(p, job)) from None
        outcome.seconds = time.monotonic() - started
        return outcome

    def _transfer(self, p: rp.FilePlan, pairs: list[rs.Pair], sending: list[int], good: list[int],
                  sequential: bool, flow: rs.Flow) -> rs.FileJob:
        assert self.plane is not None
        plane = self.plane
        follower = src_hash = None
        if not sequential and p.size > 0:
            src_hash = plane.spawn_aux(self.src.host, "hash", {"path": p.source, "expect": p.identity},
                                       f"source hasher on {self.src.host}")
            follower = plane.spawn_aux(self.dst.host, "follow", {"partial": p.partial, "size": p.size},
                                       f"destination hasher on {self.dst.host}")
        job = rs.FileJob(p, sending, good, sequential, follower, len(pairs))
        job.fail_hook = plane.abort
        self._job = job  # for the resume hint, should this transfer fail
        try:
            if sending:
                rs.move_chunks(job, pairs, flow, self.src.host, self.dst.host, self.opts.stall_timeout)
            else:
                pairs[0].writer.write(b"F")  # everything was already there: just close the opened partial
                rs.writer_reply(pairs[0].writer, "end")
            missing = [i for i in range(len(p.chunks)) if i not in job.done]
            if missing:
                raise OperationError(f"{len(missing)} chunks of {p.final} were not confirmed by the destination",
                                     hint=self._resume_hint(p, job))
            if follower is not None and src_hash is not None:
                flow.status(f"comparing whole-file sha256 of {p.rel or posixpath.basename(p.final)}")
                job.dest_digest = self._aux_digest(follower, p, job, b"end\n")
                job.source_digest = self._aux_digest(src_hash, p, job, None)
            return job
        finally:
            for proc in (follower, src_hash):
                if proc is not None:
                    plane.release_aux(proc)

    def _aux_digest(self, proc: rs.RemoteProcess, p: rp.FilePlan, job: rs.FileJob, send: bytes | None) -> str:
        if send:
            proc.write(send)
        line = proc.readline()
        try:
            reply = json.loads(line)
        except ValueError:
            raise HostError(proc.host, f"the {proc.what} stopped: {rs.tail(proc.error_text()) or 'no answer'}",
                            hint=self._resume_hint(p, job)) from None
        if reply.get("error") == "changed":
            raise rs.SourceChanged(reply["detail"])
        return reply["sha256"]

    def _mismatch(self, p: rp.FilePlan, outcome: FileOutcome) -> None:
        """Whole-file digests disagree: find the chunks that differ, forget them, and fail loudly."""
        ranges = p.chunks
        s, d = self.both(
            lambda: self.call(self.src.host, "hash_ranges", path=p.source, ranges=ranges, expect=p.identity),
            lambda: self.call(self.dst.host, "hash_ranges", path=p.partial, ranges=ranges),
        )
        bad = [] if "digests" not in s else [i for i, (a, b) in enumerate(zip(s["digests"], d["digests"])) if a != b]
        if bad:
            self.call(self.dst.host, "journal_drop", final=p.final, indices=bad)
        raise OperationError(
            f"integrity check failed for {self.dst.host}:{p.final}: sha256 source {outcome.source_sha256}, "
            f"in flight {outcome.in_flight_sha256 or '(per chunk)'}, destination {outcome.destination_sha256}; "
            f"{len(bad)} chunk(s) differ",
            hint=f"the partial {p.partial} is kept without the bad chunks; re-run the same command to re-send them",
        )

    # -- strip and manifest

    def _strip(self, result: RelayResult) -> tuple[str, dict | None, str | None]:
        from orchestrator.deploy.operation import deploy, payload_dir
        from orchestrator.deploy.manifest import default_payload_root

        host = self.inv.hosts[self.src.host]
        facts = self.call(self.src.host, "source_facts", path=self.src.path, wait_stable=self.opts.wait_stable)
        if facts["kind"] != "file":
            what = {"dir": "a directory", "missing": "missing"}.get(facts["kind"], "not a regular file")
            raise InputError(f"--strip-optimizer needs a training checkpoint file; {self.src} is {what}")
        key = hashlib.sha256(f"{self.src.path}\0{facts['size']}\0{facts['mtime_ns']}".encode()).hexdigest()[:16]
        out_dir = posixpath.join(host.workdir, STRIP_DIR, key)
        python = self.call(self.src.host, "python_for", venv=host.venv, fallback=host.python)["python"]
        if self.opts.dry_run:
            result.notes.append(f"would deploy the payload to {self.src.host}, strip {self.src.path} there with "
                                f"{python} into {out_dir}, and relay that folder")
            result.kind = "dir"
            return out_dir, None, None
        outcome = deploy(self.connector, [self.src.host], root=default_payload_root(), console=self.console)[self.src.host]
        if not outcome.ok:
            raise outcome.error  # type: ignore[misc]
        self.say(f"stripping the optimizer state on {self.src.host} ({python})…")
        cmd = (f"cd {shlex.quote(payload_dir(host.workdir))} && exec {shlex.quote(python)} -m remote_payload "
               f"strip-checkpoint {shlex.quote(self.src.path)} {shlex.quote(out_dir)}")
        res = self.connector.session(self.src.host).run(cmd, check=False, env=dict(host.env) if host.env else None)
        if not res.ok:
            errs = [ln for ln in res.err_text.splitlines() if ln.startswith("dfo-payload error:")]
            detail = errs[-1].removeprefix("dfo-payload error:").strip() if errs else rs.tail(res.err_text or res.text)
            raise HostError(self.src.host, f"strip-checkpoint of {self.src.path} failed: {detail}")
        record = self.call(self.src.host, "read_json", path=posixpath.join(out_dir, "dfo-source.json"))["data"] or {}
        keep = ("source_path", "sha256", "bytes", "step", "dropped", "format")
        return out_dir, ({k: record[k] for k in keep if k in record} or None), out_dir

    def _manifest_doc(self, kind: str, outcomes: list[FileOutcome], final_root: str) -> dict:
        files = {f.rel or posixpath.basename(final_root): {"size": f.size, "sha256": f.sha256} for f in outcomes}
        doc = {
            "dfo_relay_manifest": 1,
            "source": f"{self.src.host}:{self.src.path}",
            "destination": f"{self.dst.host}:{final_root}",
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
    sight (once per process), so the pumps' small allocations do not trigger walks over the whole heap."""
    global _FROZEN
    if not _FROZEN:
        _FROZEN = True
        gc.collect()
        gc.freeze()


def relay(connector: Connector, source: str, destination: str, options: RelayOptions | None = None,
          console: Console | None = None) -> RelayResult:
    """Relay SOURCE (``HOST:PATH``) to DESTINATION (``HOST:PATH``) through this machine.

    Raises InputError for bad arguments, OperationError/HostError when the relay fails (the partial is
    kept for resume). Returns a RelayResult (``as_dict()`` is the --json summary).
    """
    options = options or RelayOptions()
    console = console or Console(stderr=True)
    inv = connector.inventory
    src = rp.parse_endpoint(source, inv, "source")
    dst = rp.parse_endpoint(destination, inv, "destination")
    if options.bwlimit is not None and options.bwlimit <= 0:
        raise InputError("--bwlimit must be positive")
    if options.stall_timeout <= 0:
        raise InputError("--stall-timeout must be positive")
    if options.wait_stable < 0:
        raise InputError("--wait-stable must be zero or more seconds")
    _freeze_heap()
    return _Relay(connector, src, dst, options, console).run()
