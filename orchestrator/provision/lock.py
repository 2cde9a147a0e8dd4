"""The payload's requirement locks: hash-pinned requirements files and their ``# dfo-<key>:`` header.

A *lock* (``remote_payload/requirements-<flavour>.lock``) pins every package with its sha256 hashes, as
``uv pip compile --generate-hashes`` writes it (``lock_compiler.py`` makes the shipped ones); its header
carries ``# dfo-<key>: value`` lines (flavour, torch backend, ...). ``select`` picks the requirements whose
environment markers hold on a target; ``sha256`` (of the whole text) names the lock in venv markers and in
the wheelhouse cache.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.errors import InputError

PAYLOAD_DIR = Path(__file__).resolve().parents[2] / "remote_payload"

try:  # `packaging` comes with pip, which the wheelhouse needs anyway
    from packaging.markers import InvalidMarker, Marker
except ImportError:  # pragma: no cover - only without a standalone packaging
    # The same classes, vendored: mypy sees pip's copy as other types than packaging's.
    from pip._vendor.packaging.markers import InvalidMarker, Marker  # type: ignore[assignment]


@dataclass(frozen=True)
class LockedRequirement:
    name: str
    version: str
    marker: str | None
    hashes: tuple[str, ...]  # "sha256:<hex>"

    def line(self, with_marker: bool = True) -> str:
        spec = f"{self.name}=={self.version}"
        if with_marker and self.marker:
            spec += f" ; {self.marker}"
        return " ".join([spec, *(f"--hash={h}" for h in self.hashes)])

    def applies(self, environment: dict[str, str]) -> bool:
        return not self.marker or Marker(self.marker).evaluate(environment)


@dataclass(frozen=True)
class Lock:
    path: Path
    text: str
    requirements: tuple[LockedRequirement, ...]
    header: dict[str, str] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def flavour(self) -> str | None:
        return self.header.get("flavour")

    @property
    def torch_backend(self) -> str | None:
        return self.header.get("torch-backend")

    @property
    def online_torch_backend(self) -> str | None:
        """`--torch-backend` for online installs (set when torch comes from the PyTorch index, not PyPI)."""
        return self.header.get("online-torch-backend")

    def names(self) -> set[str]:
        return {r.name for r in self.requirements}

    def select(self, environment: dict[str, str]) -> list[LockedRequirement]:
        """The requirements whose markers hold in ``environment`` (a PEP 508 marker environment)."""
        return [r for r in self.requirements if r.applies(environment)]


_REQ_RE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[^\s;]+)\s*(?:;(?P<marker>.*))?\Z")
_HEADER_RE = re.compile(r"^#\s*dfo-(?P<key>[a-z0-9-]+):\s*(?P<value>.*?)\s*\Z")


def canonical_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str, path: Path) -> Lock:
    """Parse a hash-pinned requirements file as `uv pip compile --generate-hashes` writes it.

    Errors name the file and line: every requirement must be ``name==version`` with at least one hash.
    """
    header: dict[str, str] = {}
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        m = _HEADER_RE.match(raw)
        if m:
            header[m["key"]] = m["value"]
            continue
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line and not pending:
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    if pending.strip():
        logical.append((start, pending))

    reqs = []
    for number, line in logical:
        tokens = line.split()
        hashes = tuple(t.split("=", 1)[1] for t in tokens if t.startswith("--hash="))
        others = [t for t in tokens if t.startswith("-") and not t.startswith("--hash=")]
        if others:
            raise InputError(f"{path}:{number}: unsupported option {others[0]!r} in a dfo lock",
                             hint="a lock holds only `name==version ; marker --hash=sha256:...` lines")
        spec = " ".join(t for t in tokens if not t.startswith("--hash="))
        m = _REQ_RE.match(spec)
        if not m:
            raise InputError(f"{path}:{number}: expected `name==version` (pinned), got {spec!r}",
                             hint="regenerate the lock with `uv pip compile --generate-hashes`")
        if not hashes:
            raise InputError(f"{path}:{number}: {m['name']}=={m['version']} has no --hash",
                             hint="locks must carry hashes: regenerate with `uv pip compile --generate-hashes`")
        bad = [h for h in hashes if not re.fullmatch(r"sha256:[0-9a-f]{64}", h)]
        if bad:
            raise InputError(f"{path}:{number}: malformed hash {bad[0]!r} (expected sha256:<64 hex digits>)")
        marker = (m["marker"] or "").strip() or None
        if marker:
            try:
                Marker(marker)
            except InvalidMarker as exc:
                raise InputError(f"{path}:{number}: invalid environment marker {marker!r}: {exc}") from None
        reqs.append(LockedRequirement(canonical_name(m["name"]), m["version"], marker, hashes))
    if not reqs:
        raise InputError(f"{path}: the lock lists no requirements")
    return Lock(path=path, text=text, requirements=tuple(reqs), header=header)


def load_lock(path: str | os.PathLike) -> Lock:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"lock file not found: {path}",
                         hint="generate it: python -m orchestrator.provision.lock_compiler compile-lock cpu|cuda",
                         ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read lock {path}: {exc}") from None
    return parse_lock(text, path)
