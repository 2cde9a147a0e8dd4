"""Helpers of the provision tests, shared with the security tests: tiny hand-made wheels and locks, and a
provisioned venv's marker."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

MARKER = ".dfo-provision.json"


def make_wheel(folder: Path, name: str, version: str, *, requires_python: str | None = None,
               padding: int = 0) -> tuple[Path, str]:
    """A minimal valid pure-Python wheel (with RECORD hashes, as installers check them)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode() + (b"#" * padding + b"\n" if padding else b""),
        f"{dist}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name}\n" f"Version: {version}\n"
                             + (f"Requires-Python: {requires_python}\n" if requires_python else "")).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: dfo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()


def write_lock(path: Path, entries: list[tuple[str, str, str]]) -> Path:
    lines = ["# tiny test lock"]
    for name, version, sha in entries:
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{sha}")
    path.write_text("\n".join(lines) + "\n")
    return path


def read_marker(venv: str) -> dict | None:
    # The sandbox hosts share this machine's filesystem; reading the marker directly is exact.
    path = Path(venv) / MARKER
    return json.loads(path.read_text()) if path.exists() else None
