"""The separate venv that runs the payload's fla path on CPU (tests and benchmarks/kernel_path.py only).

triton and flash-linear-attention must never enter .venv: with both installed, transformers binds fla's
Triton kernels in every payload test process and CPU forwards fail ("0 active drivers"). So they live in
their own venv, built once and reused (orchestrator/testing/venvs.py, keyed by the requirement list):
$DFO_TEST_CACHE/venvs/fla when DFO_TEST_CACHE is set, else <repo>/.cache/venvs/fla.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from orchestrator.testing import venvs

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BOOTSTRAP = HERE / "bootstrap.py"
# torch is the CPU build (from /opt/wheels; the exact +cpu pin never takes an index's CUDA build); the
# payload's own CPU stack plus fla and the triton version shim.py patches.
REQUIREMENTS = ("torch==2.13.0+cpu", "transformers==5.24.0", "flash-linear-attention==0.6.0", "triton==3.9.0",
                "safetensors", "accelerate", "tokenizers", "numpy")
CHECK = ("import sys, torch\nprint(torch.__version__)\n"
         "sys.exit(None if torch.__version__.endswith('+cpu') else 'torch is not the +cpu build; not kept')")
BUILD_TIMEOUT_S = 1500

FlaEnvError = venvs.VenvBuildError


def venv_dir() -> Path:
    return venvs.cache_root(REPO) / "venvs" / "fla"


def ensure_venv(log=None) -> Path:
    """Build (or reuse) the fla venv; returns its python. Raises FlaEnvError with the installer's last lines."""
    recipe = venvs.VenvRecipe(path=venv_dir(), key="\n".join(REQUIREMENTS), base_python=venvs.base_python(),
                              install=REQUIREMENTS, check=CHECK, compile_bytecode=True,  # child_env: no .pyc
                              timeout_s=BUILD_TIMEOUT_S)
    python, _info = venvs.ensure_venv(recipe, log=log)
    return python


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
