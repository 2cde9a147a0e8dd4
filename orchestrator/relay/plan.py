"""Planning for `dfo relay-checkpoint`: pure decisions from facts, so --dry-run is free and testable.

Facts come from the hosts (source listing with identities, destination state with partials and journals,
free space); here they become: which path each file lands at, how it is cut into chunks, which chunks a
resume may keep, whether a file is skipped, how much space is needed, how many streams to run and which
cipher to ask for. Nothing in this module touches a host.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import Inventory
from orchestrator.relay.protocol import FAST_CIPHER, JOURNAL_SUFFIX, JOURNAL_VERSION, MANIFEST_SUFFIX, PARTIAL_SUFFIX

MiB = 1 << 20
GiB = 1 << 30
MIN_CHUNK = 4 * MiB
MAX_CHUNK = 128 * MiB
TARGET_CHUNKS = 64
MAX_STREAMS = 16


# ----------------------------------------------------------------------------------- endpoints


@dataclass(frozen=True)
class Endpoint:
    host: str
    path: str
    trailing_slash: bool = False

    def __str__(self) -> str:
        return f"{self.host}:{self.path}"


def parse_endpoint(text: str, inventory: Inventory, role: str) -> Endpoint:
    """``HOST:PATH`` -> Endpoint. A relative PATH is taken under the host's ``paths.checkpoints``."""
    host, sep, path = text.partition(":")
    if not sep or not host:
        raise InputError(f"{role} {text!r}: expected HOST:PATH (e.g. kpro6:/data/ckpt/step_1000.pt)")
    inventory.select([host])  # unknown host -> InputError listing the known ones
    if not path:
        raise InputError(f"{role} {text!r}: the path after '{host}:' is empty")
    if "\0" in path or "\n" in path:
        raise InputError(f"{role} {text!r}: the path contains a NUL or newline character")
    trailing = path.endswith("/") and path != "/"
    if not path.startswith("/"):
        base = inventory.hosts[host].paths.checkpoints
        if not base:
            raise InputError(
                f"{role} {text!r}: relative path, but host {host!r} has no paths.checkpoints in {inventory.source}",
                hint="give an absolute path, or set paths.checkpoints for the host",
            )
        path = posixpath.join(base, path)
    norm = posixpath.normpath(path)
    if norm == "/":
        raise InputError(f"{role} {text!r}: refusing to use / itself")
    return Endpoint(host, norm, trailing)


def destination_path(dst: Endpoint, source_path: str, source_kind: str, dest_kind: str,
                     strip: bool = False, source_slash: bool = False) -> str:
    """Where the relay lands: DST itself, or DST/<source name> when DST ends with '/' or (for a file)
    is an existing directory -- the way `cp` treats a directory target. A source directory written
    with a trailing '/' means its contents (as rsync has it): they land in DST itself."""
    name = posixpath.basename(source_path.rstrip("/"))
    if strip:
        name = strip_dir_name(name)
    if source_kind == "dir" and source_slash and not strip:
        return dst.path
    if dst.trailing_slash or (source_kind == "file" and not strip and dest_kind == "dir"):
        return posixpath.join(dst.path, name)
    return dst.path


def strip_dir_name(checkpoint_name: str) -> str:
    stem, ext = posixpath.splitext(checkpoint_name)
    return (stem if ext in (".pt", ".pth", ".bin", ".ckpt") else checkpoint_name) + "-weights"


def manifest_path(final: str) -> str:
    return final.rstrip("/") + MANIFEST_SUFFIX


# ----------------------------------------------------------------------------------- sizing


def choose_chunk_size(size: int) -> int:
    """About TARGET_CHUNKS chunks per file, a power of two between 4 MiB and 128 MiB: small enough that
    a resume loses little and the streams finish together, large enough that per-chunk costs vanish."""
    want = max(1, size // TARGET_CHUNKS)
    chunk = MIN_CHUNK
    while chunk < want and chunk < MAX_CHUNK:
        chunk <<= 1
    return chunk


def chunk_ranges(size: int, chunk_size: int) -> list[tuple[int, int]]:
    if size == 0:
        return []
    return [(off, min(chunk_size, size - off)) for off in range(0, size, chunk_size)]


def choose_streams(size: int, requested: int | None, cpu_count: int | None = None) -> int:
    """Parallel SSH streams for a file of `size` bytes.

    One stream is bound by one core's ssh crypto on each end (~250-450 MiB/s), well below 10 Gbps; a
    few streams get near the link. Each stream costs the controller two ssh processes, so the default
    is also capped by the controller's cores (on a 2-core controller more streams only compete).
    """
    if requested is not None:
        if requested < 1:
            raise InputError(f"--streams must be at least 1, got {requested}")
        return min(requested, MAX_STREAMS)
    if size < 256 * MiB:
        by_size = 1
    elif size < GiB:
        by_size = 2
    else:
        by_size = 4
    cores = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    return max(1, min(by_size, cores // 2 if cores >= 4 else 1))


# ----------------------------------------------------------------------------------- per file


@dataclass
class FilePlan:
    rel: str                  # "" for a single-file relay
    source: str               # absolute path on the source host
    final: str                # absolute path on the destination host
    size: int
    identity: dict            # size, mtime_ns, ino, mode of the source file
    chunk_size: int
    action: str               # "send" | "resume" | "compare" (same size present: hash both) | "skip"
    reason: str = ""
    reset: bool = False       # an old partial/journal exists that cannot be resumed: start over
    claimed: list[int] = field(default_factory=list)  # chunks a resume may keep (verified before use)
    replaces: bool = False    # a different file already sits at `final`
    partial_allocated: int = 0
    source_root: str | None = None  # directory relays: the source folder the file must stay inside

    @property
    def partial(self) -> str:
        return self.final + PARTIAL_SUFFIX

    @property
    def journal(self) -> str:
        return self.final + JOURNAL_SUFFIX

    @property
    def chunks(self) -> list[tuple[int, int]]:
        return chunk_ranges(self.size, self.chunk_size)

    @property
    def claimed_bytes(self) -> int:
        ranges = self.chunks
        return sum(ranges[i][1] for i in self.claimed)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["claimed"] = len(self.claimed)
        d["claimed_bytes"] = self.claimed_bytes
        d.pop("identity")
        return d


def journal_header(source_host: str, source_path: str, identity: dict, chunk_size: int) -> dict:
    return {
        "dfo_relay": JOURNAL_VERSION,
        "source": {"host": source_host, "path": source_path, "size": identity["size"],
                   "mtime_ns": identity["mtime_ns"], "ino": identity.get("ino")},
        "size": identity["size"],
        "chunk_size": chunk_size,
    }


def plan_file(rel: str, source_host: str, source_path: str, identity: dict, final: str, dest_entry: dict) -> FilePlan:
    """Decide what to do with one file from the destination's facts about it."""
    size = identity["size"]
    plan = FilePlan(rel=rel, source=source_path, final=final, size=size, identity=identity,
                    chunk_size=choose_chunk_size(size), action="send")
    existing = dest_entry.get("final")
    if existing and existing.get("not_file"):
        raise InputError(f"destination {final} exists and is not a regular file")
    if existing and existing["size"] == size:
        plan.action, plan.reason = "compare", "a file of the same size is present: compare sha256"
    elif existing:
        plan.replaces = True
        plan.reason = f"replaces a different file ({existing['size']} bytes)"
    journal = dest_entry.get("journal")
    partial = dest_entry.get("partial")
    if journal or partial:
        expected = journal_header(source_host, source_path, identity, plan.chunk_size)
        header = journal["header"] if journal else None
        same_source = header is not None and header.get("dfo_relay") == JOURNAL_VERSION and \
            header.get("source") == expected["source"] and header.get("size") == size
        if same_source and header is not None and journal and partial and partial["size"] == size:
            plan.chunk_size = int(header.get("chunk_size") or plan.chunk_size)
            n = len(plan.chunks)
            plan.claimed = sorted(int(i) for i in journal["done"] if int(i) < n)
            plan.partial_allocated = partial.get("allocated", 0)
            if plan.claimed and plan.action != "compare":
                plan.action = "resume"
                plan.reason = f"{len(plan.claimed)} of {n} chunks already there (verified against the source first)"
        else:
            plan.reset = True
            if plan.action != "compare":
                plan.reason = "an old partial from another source version is discarded"
    return plan


def resume_verdict(claimed: Sequence[int], source_digests: Sequence[str], dest_digests: Sequence[str]
                   ) -> tuple[list[int], list[int]]:
    """Split the claimed chunks into (good, bad) by comparing the two hosts' sha256 of each range."""
    if not (len(claimed) == len(source_digests) == len(dest_digests)):
        raise ValueError("one digest per claimed chunk on each side")
    good: list[int] = []
    bad: list[int] = []
    for idx, s, d in zip(claimed, source_digests, dest_digests, strict=True):
        (good if s == d else bad).append(idx)
    return good, bad


def to_send(plan: FilePlan, good: Iterable[int]) -> list[int]:
    keep = set(good)
    return [i for i in range(len(plan.chunks)) if i not in keep]


def is_sequential(plan: FilePlan, sending: Sequence[int], streams: int) -> bool:
    """A fresh file sent by one stream in order: every end can hash the whole file as it goes."""
    return len(sending) == len(plan.chunks) and (streams == 1 or len(sending) <= 1)


def first_gap(done: set[int], start: int) -> int:
    """The first chunk index >= start that is not done (the contiguous done prefix ends there)."""
    i = start
    while i in done:
        i += 1
    return i


# ----------------------------------------------------------------------------------- space


def space_needed(plans: Iterable[FilePlan]) -> int:
    """Bytes the destination must still find: a resumed partial is already allocated."""
    need = 0
    for p in plans:
        if p.action == "skip":
            continue
        already = 0 if p.reset else min(p.partial_allocated, p.size)
        need += max(0, p.size - already)
    return need


def check_space(host: str, where: str, need: int, free: int) -> str | None:
    """None when it fits, else the message to show."""
    if need <= free:
        return None
    return (f"{host}: not enough free space for {where}: need {human_bytes(need)}, "
            f"{human_bytes(free)} free there")


# ----------------------------------------------------------------------------------- cipher


def cipher_choice(requested: str | None, client_ciphers: Sequence[str], server_offers_fast: dict[str, bool]
                  ) -> tuple[str | None, str]:
    """(-c value or None for ssh's default, a sentence saying why)."""
    if requested:
        if client_ciphers and requested not in client_ciphers:
            raise InputError(f"--cipher {requested!r} is not supported by this machine's ssh",
                             hint="supported: " + ", ".join(client_ciphers))
        return requested, "as requested with --cipher"
    if FAST_CIPHER not in client_ciphers:
        return None, f"ssh default ({FAST_CIPHER} not supported by the local ssh)"
    missing = [h for h, ok in server_offers_fast.items() if not ok]
    if missing:
        return None, f"ssh default ({', '.join(missing)} does not offer {FAST_CIPHER})"
    return FAST_CIPHER, "offered by both ends (about twice as fast as the default chacha20)"


# ----------------------------------------------------------------------------------- formatting


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def display(endpoint_host: str, path: str) -> str:
    return f"{endpoint_host}:{shlex.quote(path)}"
