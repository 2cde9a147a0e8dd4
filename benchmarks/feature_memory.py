"""What the feature cache and the extraction cost at real scale: bytes per token, the projected cache size of
`--suite zlab` on Qwen3.6-27B, and the extraction's peak memory on a long sample measured on the fixture.

    .venv/bin/python benchmarks/feature_memory.py [--new-tokens 2048] [--out FILE.json]

Bytes per token = fc layers × hidden size × the dtype's bytes (remote_payload/inputs/features.py,
``bytes_per_token``); the cache file adds the token ids and the target's argmax (16 B per token). The
projection counts every sample at its prompt plus the full max-new (2048): an upper bound, since a response
that stops early stores fewer tokens. Prompt lengths: HumanEval's and MT-Bench's are measured on the rows the
packages ship (characters / 3.6, about Qwen's tokenizer on English and code, plus 20 template tokens); the
three exported sets use their typical lengths (gsm8k ≈ 95, math500 ≈ 110, mbpp ≈ 45 tokens with template).
mt-bench's second turn holds the first turn's prompt and answer.

The peak: one extraction of a prompt + ``--new-tokens`` sample on the fixture target (fp32, layers 1, 3, 5), in
a fresh process: resident size before and at its peak (``ru_maxrss``), next to the features it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QWEN36_27B = {"layers": 5, "hidden": 5120, "dtype_bytes": 2}  # the team's drafter: 5 fc layers of the 27B target
TYPICAL_PROMPT = {"gsm8k": 95, "math500": 110, "mbpp": 45}


def projection(max_new: int = 2048) -> dict:
    from remote_payload.inputs.datasets.load import load_one
    from remote_payload.inputs.datasets.registry import ADAPTERS, dataset_specs, package_source

    per_token = QWEN36_27B["layers"] * QWEN36_27B["hidden"] * QWEN36_27B["dtype_bytes"]
    tokens, rows = 0, {}
    for spec in dataset_specs([], "zlab"):
        if spec.name in TYPICAL_PROMPT:
            n, prompt = spec.count or 0, TYPICAL_PROMPT[spec.name]
            t = n * (prompt + max_new)
        else:
            path, _ = package_source(ADAPTERS[spec.name])
            prompts, _ = load_one(spec, str(path))
            t = 0
            for p in prompts:
                own = len(p.messages[-1][1]) / 3.6 + 20
                # a later turn also holds the turn before it: its prompt and full answer
                t += int(own + max_new + ((len(prompts[p.follows].messages[-1][1]) / 3.6 + 20 + max_new)
                                          if p.follows is not None else 0))
            n, prompt = len(prompts), None
        rows[spec.name] = {"samples": n, "tokens": t, "prompt_tokens": prompt}
        tokens += t
    total = tokens * (per_token + 16)
    return {"bytes_per_token": per_token, "max_new_tokens": max_new, "tokens": tokens, "bytes": total,
            "gib": round(total / 2**30, 1), "per_dataset": rows}


def peak(new_tokens: int) -> dict:
    """The extraction in a child process (a fresh peak)."""
    code = f"""
import json, resource, torch, os
from remote_payload.models import kernels
kernels.apply_policy("cpu")
torch.set_num_threads(1)
from remote_payload.fixtures import build as fx
from remote_payload.models.target import load_target
from remote_payload.inputs.features import extract, bytes_per_token
out = {str(Path(tempfile.gettempdir()) / "dfo-feature-memory")!r}
fx.build(out, ["target"], use_cache=True)
target = load_target(out + "/target", device="cpu", dtype="float32")
prompt, new = 200, {new_tokens}
tokens = [int(t) % target.config.vocab_size for t in torch.randint(0, target.config.vocab_size, (prompt + new,))]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
feats = extract(target, tokens, [1, 3, 5], prompt)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
held = sum(t.numel() * t.element_size() for t in feats.layers.values())
print(json.dumps({{"tokens": len(tokens), "bytes_per_token": bytes_per_token(target, [1, 3, 5]),
                  "features_bytes": held, "rss_before": before, "rss_peak": after,
                  "peak_over_start": after - before, "hidden": target.config.hidden_size,
                  "layers": target.config.num_layers}}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--out")
    args = ap.parse_args()
    report = {"projection_zlab_qwen36_27b": projection(), "fixture_peak": peak(args.new_tokens),
              "controller_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
