"""Step ``env``: the GPU, its driver, the libraries next to the payload's CUDA pins, a bf16 matmul rate.

The pins are read from ``requirements-cuda.lock`` (what a provisioned GPU host runs); a GPU machine that
carries other versions (its own torch and triton, say) is reported package by package, so every figure of
the other steps can be read against the environment that produced it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from remote_payload.diagnose.gpu_kit.part import Part

LOCK = Path(__file__).resolve().parents[2] / "requirements-cuda.lock"
PINNED = ("torch", "transformers", "flash-linear-attention", "fla-core", "triton", "accelerate", "safetensors",
          "tokenizers", "einops", "huggingface-hub")
MATMUL = {"gpu": {"n": 8192, "warmup": 3, "timed": 10}, "smoke": {"n": 256, "warmup": 1, "timed": 2}}
NVIDIA_SMI_FIELDS = "name,driver_version,memory.total,compute_cap"


def lock_pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a pip lock (hash continuation lines and markers ignored)."""
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def deviations(installed: dict, pins: dict) -> dict:
    """Packages whose installed version differs from the lock's pin: {name: {"installed", "pinned"}}."""
    out = {}
    for name in PINNED:
        have, want = installed.get(name), pins.get(name)
        if want is not None and (have is None or have.split("+")[0] != want):
            out[name] = {"installed": have, "pinned": want}
    return out


def _installed(names) -> dict:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"available": False}
    proc = subprocess.run([exe, f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv,noheader"], capture_output=True,
                          text=True, timeout=30)
    rows = [dict(zip(NVIDIA_SMI_FIELDS.split(","), (c.strip() for c in line.split(",")), strict=False))
            for line in proc.stdout.strip().splitlines() if line.strip()]
    return {"available": True, "rc": proc.returncode, "gpus": rows}


def matmul_tflops(device: str, n: int, warmup: int, timed: int) -> dict:
    """Mean bf16 n×n×n matmul rate over ``timed`` products after ``warmup`` (random data)."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(timed):
        a @ b
    sync()
    seconds = (time.perf_counter() - t0) / timed
    return {"n": n, "products": timed, "seconds_each": seconds, "tflops": 2 * n ** 3 / seconds / 1e12}


def run(part: Part, mode: str, device: str) -> None:
    import torch

    from remote_payload.models.kernels import environment
    from remote_payload.results import versions

    with part.section("versions") as out:
        out.update(versions())
        out["torch_cuda"] = torch.version.cuda
        out["packages"] = _installed(PINNED)
        out["kernels"] = environment()
        pins = lock_pins(LOCK.read_text())
        out["payload_pins"] = {k: pins.get(k) for k in PINNED}
        out["differs_from_payload_pins"] = deviations(out["packages"], pins)
    with part.section("device") as out:
        out["nvidia_smi"] = _nvidia_smi()
        out["device"] = device
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("torch sees no CUDA device (torch.version.cuda is "
                               f"{torch.version.cuda}); the versions above are what this machine offers")
        if device == "cuda":
            props = torch.cuda.get_device_properties(0)
            out.update(name=props.name, capability=f"{props.major}.{props.minor}",
                       memory_gib=round(props.total_memory / 2**30, 1), multiprocessors=props.multi_processor_count)
    if part.ok("device"):
        with part.section("bf16_matmul") as out:
            out.update(matmul_tflops(device, **MATMUL[mode]))
