"""What the sampled-draw benchmarks share: the fixture target and trained z-lab drafter loaded once, the built-in
prompts rendered for it, a per-stage clock, and the figures printed (and written with ``--out``).

Imported by the benchmark scripts after they chose the linear-attention path (``kernels.apply_policy``), which
must happen before transformers' modelling code is imported.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FixturePair:
    target: object
    drafter: object  # the LoadedDrafter
    runtime: object  # its DrafterRuntime on the target's device
    prompt_ids: list


def load_pair(fixtures: str | None, device: str) -> FixturePair:
    """The target and z-lab drafter from ``fixtures`` (default: built, or copied from the fixture cache, into a
    temporary folder), in fp32 on ``device``, with the built-in prompts rendered as token ids."""
    import torch

    from remote_payload.fixtures import build
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.target import load_target, render_prompt

    fx = Path(fixtures) if fixtures else Path(tempfile.mkdtemp(prefix="dfo-bench-"))
    if not fixtures:
        build.build(fx, ["target", "zlab-drafter"])
    target = load_target(fx / "target", device=device, dtype="float32")
    ld = load_drafter(fx / "zlab-drafter")
    rt = DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings(),
                        device=target.input_device, dtype=torch.float32)
    prompt_ids = [render_prompt(target.tokenizer, p.message_dicts(), False) for p in load_prompts("builtin")[0]]
    return FixturePair(target, ld, rt, prompt_ids)


class Clock:
    """Seconds per named stage, summed over calls; on CUDA each stage is timed between synchronisations."""

    def __init__(self, keys, device: str = "cpu"):
        self.seconds = {k: 0.0 for k in keys}
        self.device = device

    def _sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def timed(self, key: str, fn):
        self._sync()
        t0 = time.perf_counter()
        out = fn()
        self._sync()
        self.seconds[key] += time.perf_counter() - t0
        return out


def emit(figures: dict, out: str | None) -> None:
    print(json.dumps(figures, indent=2))
    if out:
        Path(out).write_text(json.dumps(figures, indent=2) + "\n")
