"""The hosts' answers to the relay, typed: parsed once at the boundary, checked as they are parsed.

The source's answers are data from another machine: names are confined (``core.confine``), numbers
checked, and a malformed answer is a HostError naming the host and the field, never a KeyError later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.confine import check_name
from orchestrator.core.errors import HostError, InputError
from orchestrator.core.host_text import whole_number


def _int(obj: dict, key: str, host: str, where: str, *, optional: bool = False) -> int | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if not whole_number(value):
        raise HostError(host, f"malformed answer about {where}: {key} is {value!r:.60}")
    assert isinstance(value, int)
    return value


@dataclass
class SourceFile:
    rel: str                 # "" for a single-file relay, else a confined relative name
    size: int
    mtime_ns: int
    ino: int | None
    mode: int | None

    @property
    def identity(self) -> dict:
        return {"size": self.size, "mtime_ns": self.mtime_ns, "ino": self.ino, "mode": self.mode}


@dataclass
class SourceFacts:
    kind: str                                    # file | dir | missing | other
    path: str
    files: list[SourceFile] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    escapes: list[dict] = field(default_factory=list)  # links leading out of the tree (refused)
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, obj: Any, host: str) -> "SourceFacts":
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            raise HostError(host, f"malformed source facts: {str(obj)[:200]}")
        where = f"{host}:{obj.get('path')}"
        facts = cls(kind=obj["kind"], path=str(obj.get("path")), raw=obj,
                    skipped=[s for s in obj.get("skipped") or [] if isinstance(s, dict)],
                    escapes=[e for e in obj.get("escapes") or [] if isinstance(e, dict)])
        if facts.kind not in ("file", "dir"):
            return facts
        entries = obj.get("files") if facts.kind == "dir" else [dict(obj, rel="")]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise HostError(host, f"malformed source listing for {where}: 'files' is not a list of objects")
        for e in entries:
            rel = e.get("rel")
            if facts.kind == "dir":
                check_name(rel, host=host, what="source file name")
            name = f"{where} ({rel!r})"
            facts.files.append(SourceFile(rel=str(rel), size=_int(e, "size", host, name) or 0,
                                          mtime_ns=_int(e, "mtime_ns", host, name) or 0,
                                          ino=_int(e, "ino", host, name, optional=True),
                                          mode=_int(e, "mode", host, name, optional=True)))
        if len({f.rel for f in facts.files}) != len(facts.files):
            raise HostError(host, f"malformed source listing for {where}: a name appears twice")
        return facts

    def refuse_escapes(self, host: str) -> None:
        """A link leaving the source tree is never followed: the relay is refused, naming it."""
        if not self.escapes:
            return
        listed = ", ".join(f"{e.get('rel')!r} -> {e.get('target')!r}" for e in self.escapes[:5])
        more = f" and {len(self.escapes) - 5} more" if len(self.escapes) > 5 else ""
        raise InputError(f"source directory {host}:{self.path} holds symlinks that lead out of it: {listed}{more}",
                         hint="dfo does not follow a link out of the folder it relays; copy those files in, or "
                         "relay the folder the links point into")


@dataclass
class DestFacts:
    kind: str                        # file | dir | missing | other
    free_bytes: int
    free_measured_at: str
    writable: bool
    writable_checked_at: str
    files: list[dict]                # per file: final / partial / journal as the host saw them (plan.plan_file)
    inside: "DestFacts | None" = None  # DEST/NAME, asked in the same trip

    @classmethod
    def parse(cls, obj: Any, host: str) -> "DestFacts":
        try:
            inside = obj.get("inside")
            if not whole_number(obj["free_bytes"]):
                raise ValueError("free_bytes")
            return cls(kind=str(obj["kind"]), free_bytes=obj["free_bytes"],
                       free_measured_at=str(obj["free_measured_at"]), writable=bool(obj["writable"]),
                       writable_checked_at=str(obj["writable_checked_at"]), files=list(obj["files"]),
                       inside=cls.parse(inside, host) if isinstance(inside, dict) else None)
        except (AttributeError, KeyError, TypeError, ValueError):
            raise HostError(host, f"malformed destination facts: {str(obj)[:200]}") from None


@dataclass
class Hashes:
    """hash_ranges / hash_file: digests, or why the source can no longer be trusted (it changed)."""
    digests: list[str]
    changed: str | None = None

    @classmethod
    def parse(cls, obj: Any, host: str) -> "Hashes":
        if isinstance(obj, dict) and obj.get("error") == "changed":
            return cls([], changed=str(obj.get("detail") or "changed"))
        if isinstance(obj, dict) and isinstance(obj.get("digests"), list):
            return cls([str(d) for d in obj["digests"]])
        if isinstance(obj, dict) and isinstance(obj.get("sha256"), str):
            return cls([obj["sha256"]])
        detail = obj.get("detail") if isinstance(obj, dict) else None
        raise HostError(host, str(detail or f"malformed hash answer: {str(obj)[:200]}"))
