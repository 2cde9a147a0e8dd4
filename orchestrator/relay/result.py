"""What a relay is asked to do and what it reports (the --json summary is ``RelayResult.as_dict()``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from orchestrator.relay.plan import MiB

if TYPE_CHECKING:
    from orchestrator.relay.strip import Stripper


@dataclass
class RelayOptions:
    streams: int | None = None          # None: chosen by size (plan.choose_streams)
    cipher: str | None = None           # None: aes128-gcm when both ends offer it
    strip_optimizer: bool = False
    dry_run: bool = False
    wait_stable: float = 0.0            # seconds of quiet required before starting
    data_plane: str = "auto"            # "auto" | "ssh" | "paramiko"
    bwlimit: float | None = None        # bytes per second over all streams
    stall_timeout: float = 60.0         # no byte moved for this long -> fail (link down, host hung)
    stripper: Stripper | None = None    # with strip_optimizer: a resident strip worker (dfo watch) tried first
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
    in_flight_sha256: str | None = None  # always None: the controller no longer reads the bytes (kept for --json)
    chunks: int = 0
    chunk_size: int = 0
    chunks_checked_in_flight: int = 0    # parallel mode: chunks whose source-read and written digests agreed
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
        return self.sent_bytes / MiB / self.seconds if self.seconds > 0 else 0.0

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
