"""Step ``kernel_path``: the kernel-path experiment (``kernel_path.py``) with fla on the device's kernels.

On a GPU the fla rows are real Triton kernels; a run whose target did not bind fla is recorded as a failure
(its τ rows would all be the torch path). The smoke runs the same code at toy size on the torch path.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from remote_payload.diagnose.gpu_kit import fixtures as kit_fixtures
from remote_payload.diagnose.gpu_kit import kernel_path
from remote_payload.diagnose.gpu_kit.part import Part

# gpu: the benchmark's defaults (12 built-in prompts, 96 new tokens, the fixture drafter's 45 steps).
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {"n_samples": 12, "max_new_tokens": 96, "train_steps": None, "resamples": 1000},
    "smoke": {"n_samples": 2, "max_new_tokens": 12, "train_steps": 2, "resamples": 20}}


def run(part: Part, mode: str, device: str, kernel: str, work: Path) -> None:
    with part.section("fixture"):
        kit_fixtures.build(work, ["target"])
    if not part.ok("fixture"):
        return

    def log(msg: str) -> None:
        print(f"[kernel_path] {msg}", file=sys.stderr, flush=True)

    with part.section("experiment") as out:
        res = kernel_path.run(work / "target", device=device, kernel=kernel, progress=log, **SIZES[mode])
        out.update(res)
        out["table"] = kernel_path.render(res)
        if kernel == "fla" and res["kernel_path"] != "fla":
            raise RuntimeError(f"fla did not bind (the target's kernel path is {res['kernel_path']}): every row "
                               "would be the torch path")
