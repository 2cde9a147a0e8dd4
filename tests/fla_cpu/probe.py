"""Run in the fla venv through bootstrap.py: load the target on the fla path, report the binding and
gpu-check's fla-vs-torch comparison (``compare_paths``) per dtype, as JSON on stdout's last line.

    bootstrap.py probe.py --target DIR [--dtype bfloat16 --dtype float32] [--new-tokens 24]
"""

from __future__ import annotations

import argparse
import json


def probe(target_dir: str, dtype: str, new_tokens: int) -> dict:
    import torch

    from remote_payload.diagnose.gpu_check import compare_paths
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.models import kernels
    from remote_payload.models.target import load_target, render_prompt

    torch.set_num_threads(1)
    t = load_target(target_dir, device="cpu", dtype=dtype, kernel="fla")
    prompts, _ = load_prompts("builtin")
    ids = render_prompt(t.tokenizer, prompts[0].message_dicts(), False)
    # The reference through the torch path: decoding token by token through the interpreter costs minutes.
    with kernels.torch_linear_attention(t.model):
        ref = greedy_decode(t, ids, new_tokens)
    report = compare_paths(t, [ref], list(range(t.config.num_layers)))
    return {"dtype": dtype, "kernel_path": t.kernel_path, "kernels": t.kernel_details,
            "tokens": len(ref.tokens), **report}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--dtype", action="append")
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args()
    out = [probe(args.target, d, args.new_tokens) for d in args.dtype or ["bfloat16"]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
