"""Fixtures for the fla-path tests: the separate fla venv, the tiny fixture target, a payload runner.

The payload runs in a subprocess with the fla venv's python and the CPU shim active (bootstrap.py); this
process (the test venv) never imports fla or triton. The venv is built once (seconds from uv's cache,
minutes from PyPI) and reused; see fla_env.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import fla_env
import pytest

REPO = fla_env.REPO
os.environ.setdefault("DFO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures"))
pytest.importorskip("torch", reason="fla tests build fixtures with the payload stack (pip install -e '.[payload]')")

# Interpreter forwards are slow (~10 s for a tiny one): generous per-call limits.
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="session")
def fla_python() -> Path:
    try:
        py = fla_env.ensure_venv(log=print)
    except fla_env.FlaEnvError as exc:
        pytest.fail(f"cannot build the fla venv at {fla_env.venv_dir()}: {exc}")
    code = (f"import sys; sys.path.insert(0, {str(fla_env.HERE)!r}); import shim; "
            "print(shim.triton_version() == shim.TRITON_VERSION, shim.TRITON_VERSION, shim.triton_version())")
    check = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120)
    ok, pinned, found = (check.stdout.split() + ["", "", ""])[:3]
    if ok != "True":
        pytest.skip(f"the CPU shim patches triton {pinned}; the fla venv has triton {found} ({check.stderr[-200:]})")
    return py


@pytest.fixture(scope="session")
def fla_fixtures(tmp_path_factory) -> Path:
    from remote_payload.fixtures import build as fx

    out = tmp_path_factory.mktemp("fla-fixtures")
    fx.build(out, ["target", "zlab-drafter"], use_cache=True)
    return out


@pytest.fixture
def run_fla(fla_python):
    """``run_fla(args, env=None)``: bootstrap.py ARGS in the fla venv; returns the CompletedProcess."""

    def run(args, env=None, timeout=RUN_TIMEOUT_S):
        return fla_env.run_in_fla(fla_python, [str(a) for a in args], timeout=timeout, env=env)

    return run
