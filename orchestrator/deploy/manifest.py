"""The local payload: compile-check it and describe it as a manifest of sha256 per file."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.hashing import sha256_file

PAYLOAD_PACKAGE = "remote_payload"
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo", ".swp"}


def default_payload_root() -> Path:
    """The directory that contains the ``remote_payload`` package: $DFO_PAYLOAD_ROOT, else this checkout."""
    override = os.environ.get("DFO_PAYLOAD_ROOT")
    return Path(override) if override else Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Manifest:
    files: dict[str, dict]  # relative posix path -> {"sha256": ..., "size": ...}

    @property
    def release_id(self) -> str:
        """Content address of the whole payload: same files, same id, on every machine."""
        lines = "".join(f"{p}\0{f['sha256']}\n" for p, f in sorted(self.files.items()))
        return hashlib.sha256(lines.encode()).hexdigest()[:16]

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())

    def to_json(self) -> str:
        return json.dumps({"release": self.release_id, "files": self.files}, sort_keys=True)


def payload_files(root: Path) -> list[Path]:
    base = root / PAYLOAD_PACKAGE
    if not base.is_dir():
        raise InputError(f"payload directory not found: {base}")
    out = []
    for path in sorted(base.rglob("*")):
        skipped = set(path.relative_to(root).parts) & _SKIP_DIRS or path.suffix in _SKIP_SUFFIXES
        if path.is_file() and not skipped:
            out.append(path)
    return out


def build_manifest(root: Path) -> Manifest:
    files = {}
    for path in payload_files(root):
        rel = path.relative_to(root).as_posix()
        files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return Manifest(files)


def compile_errors(root: Path) -> list[str]:
    """``file:line:col: message`` for every payload .py that does not compile (nothing is written)."""
    errors = []
    for path in payload_files(root):
        if path.suffix != ".py":
            continue
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            rel = path.relative_to(root).as_posix()
            errors.append(f"{rel}:{exc.lineno or 0}:{exc.offset or 0}: {exc.msg}")
        except ValueError as exc:  # e.g. null bytes in the source
            errors.append(f"{path.relative_to(root).as_posix()}:0:0: {exc}")
    return errors


def check_compiles(root: Path) -> None:
    errors = compile_errors(root)
    if errors:
        raise InputError(
            "the payload does not compile; nothing was deployed:\n" + "\n".join(errors),
            hint="fix the syntax error(s) above and run the command again",
        )
