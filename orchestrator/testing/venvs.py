"""Virtual environments the tests build once and reuse (the vLLM engine venv, the fla venv).

A venv counts as built only once its marker file, written last after the recipe's check passed, names the
recipe's key (what built it: a lock's digest, a requirement list); a venv without it, half-built or from
another key, is removed and built again. Concurrent test sessions share one build (a file lock beside the
venv). Built with uv (the test extra pins it; from its cache in seconds) or, without uv, with venv + pip.
The torch wheel comes from /opt/wheels when that folder exists (the CPU build; never a CUDA torch from the
index).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

MARKER = ".dfo-test-venv.json"
INDEX = "https://pypi.org/simple"
FIND_LINKS = "/opt/wheels"


class VenvBuildError(RuntimeError):
    pass


class RegistryUnreachable(VenvBuildError):
    """The build failed and the package index cannot be reached: tests may skip instead of failing."""


@dataclass(frozen=True)
class VenvRecipe:
    path: Path
    key: str  # what the venv is built from; another key builds it again
    base_python: str
    install: tuple[str, ...]  # `pip install` arguments after the index options: requirements, -r LOCK, flags
    check: str  # Python run by the built venv: exit 0 means usable; its output is recorded in the marker
    # Run on the venv at every use, built (before the check) or reused: files kept current at no cost.
    refresh: Callable[[Path], None] | None = None
    # uv compiles every module at install time (as pip always does) only when asked: for a venv whose
    # processes run with PYTHONDONTWRITEBYTECODE, which would compile what they import again in each of them.
    # Without it, the first process to import a module writes its bytecode.
    compile_bytecode: bool = False
    timeout_s: float = 1800


def ensure_venv(recipe: VenvRecipe, log: Callable[[str], None] | None = None) -> tuple[Path, dict]:
    """The venv's python and what happened: {"status": "reused"|"built", "seconds", "checked", "key"}."""
    dest = recipe.path
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lockfile:
        fcntl.flock(lockfile, fcntl.LOCK_EX)
        python = dest / "bin" / "python"
        built = _marker(dest)
        if built.get("key") == recipe.key:
            if recipe.refresh:
                recipe.refresh(dest)
            return python, {**built, "status": "reused", "seconds": 0.0}
        if dest.exists():
            shutil.rmtree(dest)
        if log:
            log(f"building the test venv {dest}")
        started = time.monotonic()
        _install(recipe, dest.parent / f"{dest.name}.build.log")
        if recipe.refresh:
            recipe.refresh(dest)
        check = subprocess.run([str(python), "-c", recipe.check], capture_output=True, text=True, timeout=600)
        if check.returncode != 0:
            shutil.rmtree(dest)
            raise VenvBuildError(f"the test venv {dest} failed its check (removed):\n"
                                 f"{(check.stdout + check.stderr)[-3000:]}")
        info = {"key": recipe.key, "checked": check.stdout.strip(), "built_s": round(time.monotonic() - started, 1)}
        (dest / MARKER).write_text(json.dumps(info) + "\n")
        return python, {**info, "status": "built", "seconds": info["built_s"]}


def _marker(dest: Path) -> dict:
    try:
        info = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def base_python() -> str:
    """The interpreter this venv is made from (a venv is made from the base one, not from a venv)."""
    return getattr(sys, "_base_executable", sys.executable)


def _uv() -> str | None:
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


def _steps(recipe: VenvRecipe, dest: Path) -> list[list[str]]:
    python = str(dest / "bin" / "python")
    sources = ["--index-url", INDEX, *(["--find-links", FIND_LINKS] if os.path.isdir(FIND_LINKS) else [])]
    uv = _uv()
    if uv:
        return [[uv, "venv", "--no-config", "--python", recipe.base_python, str(dest)],
                [uv, "pip", "install", "--no-config", *(["--compile-bytecode"] if recipe.compile_bytecode else []),
                 "--python", python, *sources, *recipe.install]]
    return [[recipe.base_python, "-m", "venv", str(dest)],
            [python, "-m", "pip", "install", "--disable-pip-version-check", *sources, *recipe.install]]


def _install(recipe: VenvRecipe, log: Path) -> None:
    with open(log, "w") as fh:
        for argv in _steps(recipe, recipe.path):
            fh.write("$ " + " ".join(argv) + "\n")
            fh.flush()
            try:
                proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=recipe.timeout_s)
            except subprocess.TimeoutExpired:
                raise VenvBuildError(f"building {recipe.path}: {argv[0]} gave no result in {recipe.timeout_s:.0f} s"
                                     f" (log {log})") from None
            if proc.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                if not registry_reachable():
                    raise RegistryUnreachable(f"{INDEX} is unreachable and {recipe.path} is not built:\n{tail}")
                raise VenvBuildError(f"building {recipe.path} failed ({argv[0]} exit {proc.returncode}); "
                                     f"log {log}:\n{tail}")


def registry_reachable(timeout: float = 15.0) -> bool:
    try:
        with urllib.request.urlopen(INDEX + "/pip/", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def cache_root(repo: Path) -> Path:
    """$DFO_TEST_CACHE when set (scripts/test.sh sets it; .ci/run gives each CI run an empty one), else
    <repo>/.cache."""
    env = os.environ.get("DFO_TEST_CACHE")
    return Path(env).expanduser() if env else repo / ".cache"
