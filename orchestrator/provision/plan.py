"""Deciding what `dfo provision` does on a host: facts in, plan out (pure but for reading the controller's uv).

The flavour (cpu / cuda and its torch backend) comes from the inventory or the host's GPU; the lock from
``remote_payload/requirements-<flavour>.lock``; uv is the host's own when recent enough, else the controller's
pushed; the venv's marker (a hash of lock, Python version, flavour/backend, uv version) says whether anything
needs doing. The operation (operation.py) executes the plan. An engine venv (engine_venv.py) adds its set-up
steps to the plan and its set-up digest to the marker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.hashing import sha256_file
from orchestrator.core.inventory import Host
from orchestrator.provision.engine_venv import EngineSpec
from orchestrator.provision.lock import PAYLOAD_DIR, Lock
from orchestrator.provision.replies import ProbeFacts, UvFound

MIN_HOST_UV = (0, 8, 0)  # --torch-backend, --allow-existing, --no-config and --require-hashes all behave
# Never installed next to a CPU build: triton beside fla breaks every Qwen3.5 forward on CPU
# ("0 active drivers": fla binds triton's kernels, and triton finds no GPU).
FORBIDDEN = {"cpu": ["triton", "flash-linear-attention", "fla-core"]}
# Space a sync needs beyond the pushed wheels: uv unpacks into its cache, the venv hardlinks from there.
UNPACK_FACTOR = 2.5


# ------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class ControllerUv:
    path: str
    version: str

    @property
    def sha256(self) -> str:
        return _sha256_cached(self.path)


_SHA_CACHE: dict[tuple[str, float, int], str] = {}
_CONTROLLER_UV: ControllerUv | None = None


def _sha256_cached(path: str) -> str:
    st = os.stat(path)
    key = (path, st.st_mtime, st.st_size)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path)
    return _SHA_CACHE[key]


def controller_uv() -> ControllerUv:
    """The uv binary that ships in the controller's `uv` wheel (pushed to hosts that have none)."""
    global _CONTROLLER_UV
    if _CONTROLLER_UV is None:
        path = _uv_path()
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.split()
        if len(out) < 2 or out[0] != "uv":
            raise InputError(f"{path} does not look like uv (`uv --version` printed {' '.join(out)!r})")
        _CONTROLLER_UV = ControllerUv(path, out[1])
    return _CONTROLLER_UV


def _uv_path() -> str:
    try:
        from uv import find_uv_bin  # the `uv` wheel installed next to dfo

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            raise InputError("uv not found on the controller", hint="pip install uv==0.13.9 (dfo[test])") from None
        return found


def _version_tuple(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


# ------------------------------------------------------------------------------ pure planning


@dataclass(frozen=True)
class UvChoice:
    path: str
    version: str
    source: str  # "host" (already on the host), "dfo" (pushed earlier), "push" (to push now)


def resolve_flavour(host: Host, gpu_found: bool | None) -> tuple[str, str | None]:
    """(flavour, torch backend) from the inventory, else from GPU detection. Backend None: the lock's."""
    backend = host.torch_backend
    if backend == "cpu":
        return "cpu", "cpu"
    if backend:  # cu128, cu130, ...: a GPU build was asked for explicitly
        return "cuda", backend
    gpu = host.gpu if host.gpu is not None else bool(gpu_found)
    return ("cuda", None) if gpu else ("cpu", "cpu")


def lock_path_for(flavour: str, backend: str | None, locks_dir: Path = PAYLOAD_DIR) -> Path:
    """The lock for a flavour; another CUDA backend than the shipped lock's needs its own lock file."""
    if flavour == "cpu":
        return locks_dir / "requirements-cpu.lock"
    specific = locks_dir / f"requirements-cuda-{backend}.lock"
    if backend and specific.is_file():
        return specific
    return locks_dir / "requirements-cuda.lock"


def choose_uv(found: tuple[UvFound, ...] | list[UvFound], controller: ControllerUv, dfo_path: str) -> UvChoice:
    """The host's uv when it is recent enough; else dfo's own copy (pushed earlier or to push now)."""
    for entry in found:
        if entry.source == "host" and entry.version and _version_tuple(entry.version) >= MIN_HOST_UV:
            return UvChoice(entry.path, entry.version, "host")
    for entry in found:
        if entry.source == "dfo" and entry.path == dfo_path and entry.version == controller.version:
            return UvChoice(dfo_path, controller.version, "dfo")
    return UvChoice(dfo_path, controller.version, "push")


def marker_fields(lock: Lock, python_version: str | None, flavour: str, backend: str | None,
                  uv_version: str, engine: EngineSpec | None = None) -> dict:
    fields = {"lock": lock.name, "lock_sha256": lock.sha256, "python": python_version, "flavour": flavour,
              "torch_backend": backend, "uv": uv_version}
    if engine is not None:  # only then: a payload venv's marker (and its hash) stays what it was
        fields.update(engine=engine.name, engine_setup=engine.setup_sha256)
    return fields


def marker_hash(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def marker_differences(stored: dict | None, expected: dict) -> list[str]:
    """Why a venv is not up to date, in words."""
    if not stored:
        return ["no dfo marker in the venv (never provisioned, or the last attempt did not finish)"]
    out = []
    if stored.get("lock_sha256") != expected["lock_sha256"]:
        out.append(f"lock changed ({stored.get('lock')} {str(stored.get('lock_sha256'))[:12]} -> "
                   f"{expected['lock']} {expected['lock_sha256'][:12]})")
    for key, label in (("python", "python"), ("flavour", "flavour"), ("torch_backend", "torch backend"),
                       ("uv", "uv")):
        if stored.get(key) != expected[key]:
            out.append(f"{label} {stored.get(key)} -> {expected[key]}")
    if stored.get("engine_setup") != expected.get("engine_setup"):
        out.append("engine set-up changed (torchvision stub or import check)")
    if not out and stored.get("hash") != marker_hash(expected):
        out.append("marker hash differs")
    return out


@dataclass
class ProvisionPlan:
    host: str
    venv: str
    flavour: str
    torch_backend: str | None
    lock: str
    lock_sha256: str
    python_version: str | None
    uv: UvChoice
    up_to_date: bool
    reasons: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)


# The facts of one decision; ``engine`` set: an engine venv (its set-up steps and marker fields).
def plan_provision(name: str, host: Host, venv: str, facts: ProbeFacts, lock: Lock, flavour: str,
                   backend: str | None, uv: UvChoice, force: bool, engine: EngineSpec | None = None) -> ProvisionPlan:
    """Decide from the probe's facts whether the venv matches the lock, and what a sync would do."""
    stored = facts.venv.marker
    python_version = facts.python.version if facts.python.found else (stored or {}).get("python")
    expected = marker_fields(lock, python_version, flavour, backend, uv.version, engine)
    reasons = []
    if force:
        reasons.append("--rebuild")
    if not facts.venv.python:
        reasons.append(f"no venv at {venv}")
    reasons += [r for r in marker_differences(stored, expected) if not (r.startswith("no dfo marker") and
                                                                        any(x.startswith("no venv") for x in reasons))]
    up_to_date = not reasons and stored is not None and stored.get("hash") == marker_hash(expected)
    steps = []
    if not up_to_date:
        if uv.source == "push":
            steps.append(f"push uv {uv.version} to {uv.path}")
        steps.append(("recreate" if force else "create/keep") + f" venv {venv} with {host.python}"
                     + (f" (Python {python_version})" if python_version else ""))
        steps.append(f"uv pip sync {lock.name} ({len(lock.requirements)} pinned packages, flavour {flavour}"
                     + (f", torch backend {backend}" if backend else "") + ")")
        steps += engine.steps() if engine is not None else []
        steps.append("verify installed packages, write the marker")
    return ProvisionPlan(name, venv, flavour, backend, lock.name, lock.sha256, python_version, uv, up_to_date,
                         reasons, steps)


def disk_shortfall(free_bytes: int | None, push_bytes: int, wheel_bytes: int, unpacked_bytes: int = 0) -> int:
    """Bytes missing for a sync (0 when it fits, or when free space is unknown). ``unpacked_bytes``: what the
    wheels hold uncompressed, when known (torch's wheels unpack to more than UNPACK_FACTOR times their size)."""
    if free_bytes is None:
        return 0
    need = push_bytes + max(int(UNPACK_FACTOR * wheel_bytes), unpacked_bytes)
    return max(0, need - free_bytes)


# ----------------------------------------------------------------------------------- results


@dataclass
class ProvisionResult:
    host: str
    status: str                 # "up-to-date" | "installed" | "would-install"
    python: str                 # the venv's interpreter on the host
    venv: str
    flavour: str
    torch_backend: str | None
    lock: str
    lock_sha256: str
    uv: str
    uv_version: str
    engine: str | None          # "vllm" for an engine venv, None for the payload's
    uv_source: str              # "host" | "dfo" | "pushed" (| "push" in a dry run)
    offline: bool | None
    reasons: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    pushed_files: int = 0
    pushed_bytes: int = 0
    wheelhouse: str | None = None
    packages: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


