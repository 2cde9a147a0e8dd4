"""The separate venv that runs the payload's fla path on CPU (tests and benchmarks/kernel_path.py only).

triton and flash-linear-attention must never enter .venv: with both installed, transformers binds fla's
Triton kernels in every payload test process and CPU forwards fail ("0 active drivers"). So they live in
their own venv, built once and reused: under $DFO_TEST_CACHE when set, else <repo>/.cache/fla-venv.
A stamp holds the requirement list; a venv whose stamp differs is rebuilt.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BOOTSTRAP = HERE / "bootstrap.py"
# torch is the CPU build (pip takes it from /opt/wheels); the payload's own CPU stack plus fla and the
# triton version shim.py patches.
REQUIREMENTS = ["torch==2.13.0+cpu", "transformers==5.24.0", "flash-linear-attention==0.6.0", "triton==3.9.0",
                "safetensors", "accelerate", "tokenizers", "numpy"]
STAMP = ".dfo-fla-requirements"
BUILD_TIMEOUT_S = 1500


class FlaEnvError(RuntimeError):
    pass


def venv_dir() -> Path:
    root = os.environ.get("DFO_TEST_CACHE")
    return (Path(root) if root else REPO / ".cache") / "fla-venv"


def python_path(venv: Path) -> Path:
    return venv / "bin" / "python"


def _wanted() -> str:
    return "\n".join(REQUIREMENTS) + "\n"


def _pip_torch_is_cpu(py: Path) -> bool:
    out = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip().endswith("+cpu")


def ensure_venv(log=None) -> Path:
    """Build (or reuse) the fla venv; returns its python. Raises FlaEnvError with pip's last lines."""
    venv = venv_dir()
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / ".fla-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test sessions share one build
        py = python_path(venv)
        stamp = venv / STAMP
        if py.exists() and stamp.exists() and stamp.read_text() == _wanted():
            return py
        if venv.exists():
            shutil.rmtree(venv)
        if log:
            log(f"building the fla venv at {venv} (triton + flash-linear-attention, ~2-3 min)")
        _run([sys.executable, "-m", "venv", str(venv)])
        # Plain pip: it takes the local CPU torch build that an index's CUDA build would otherwise shadow
        # (a +cpu local version sorts above the plain release).
        _run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--find-links", "/opt/wheels",
              *REQUIREMENTS])
        if not _pip_torch_is_cpu(py):
            shutil.rmtree(venv)
            raise FlaEnvError("the fla venv resolved a torch that is not the +cpu build; refusing to keep it")
        stamp.write_text(_wanted())
        return py


def _run(cmd: list[str]) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise FlaEnvError(f"{' '.join(cmd[:4])} ...: no result after {BUILD_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise FlaEnvError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}):\n{tail}")


def child_env(extra: dict | None = None) -> dict:
    """Environment for a payload run in the fla venv: offline, quiet, one thread, nothing from .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
                "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    env.update(extra or {})
    return env


def run_in_fla(py: Path, args: list[str], timeout: float, env: dict | None = None,
               cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``py bootstrap.py ARGS`` (shim active): ``["-m", "remote_payload", ...]`` or ``[script, ...]``."""
    return subprocess.run([str(py), str(BOOTSTRAP), *args], capture_output=True, text=True, timeout=timeout,
                          env=child_env(env), cwd=str(cwd))
