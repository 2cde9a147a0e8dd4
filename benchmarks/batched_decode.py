"""Batched vs one-at-a-time references on the tiny hybrid fixture target (fp32, CPU), in the same run.

    .venv/bin/python benchmarks/batched_decode.py [--prompts 10] [--batch 10] [--max-new-tokens 160] [--repeats 2]
        [--out F.json]

The first ``--prompts`` built-in prompts (repeated when more are asked for), greedy: today's path
(``reference.greedy_decode``, one prompt at a time), then ``batched_decode.decode_rows`` at ``--batch`` rows per
forward, and at T = 1 (top-p 0.95, top-k 20) the same with one seeded draw per prompt (``sampled_decode`` vs
the batched rows). Both methods run ``--repeats`` times, interleaved, the best of each kept. Printed, not
asserted: wall seconds, tokens/s, the ratio, how many continuations are
token-identical, and the batched decode's idle share (slots of finished rows left empty until their group ends).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from fixture_pair import emit, load_pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repetitions of both methods; the best of each")
    ap.add_argument("--fixtures", help="fixture folder (default: build/copy from the fixture cache)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    return ap.parse_args()


def compare(target, rows, batch: int, one_at_a_time, repeats: int, sampling=None) -> dict:
    """Both methods ``repeats`` times, interleaved (a busy machine slows both alike), the best time of each."""
    from remote_payload.inputs.batched_decode import decode_rows

    single, batched = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        expected = [one_at_a_time(r) for r in rows]
        single.append(time.perf_counter() - t0)
        got: dict[int, list] = {}
        t0 = time.perf_counter()
        stats = decode_rows(target, rows, batch, lambda i, tokens, s, got=got: got.__setitem__(i, list(tokens)),
                            sampling=sampling)
        batched.append(time.perf_counter() - t0)
    tokens = sum(map(len, expected))
    a, b = min(single), min(batched)
    return {"rows": len(rows), "tokens": tokens, "one_at_a_time_s": round(a, 3), "batched_s": round(b, 3),
            "one_at_a_time_tokens_per_s": round(tokens / a, 1), "batched_tokens_per_s": round(tokens / b, 1),
            "speedup": round(a / b, 2), "identical": sum(got[i] == e for i, e in enumerate(expected)),
            "idle_share": round(stats.idle_share, 3)}


def main() -> None:
    args = parse_args()
    from remote_payload.models import kernels

    kernels.apply_policy("cpu")
    import torch

    torch.set_num_threads(args.threads)
    from remote_payload.inputs.batched_decode import Row
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.inputs.sampled_reference import sampled_decode
    from remote_payload.inputs.sampling import Sampling, draw_seed

    pair = load_pair(args.fixtures, "cpu")
    target, N = pair.target, args.max_new_tokens
    prompts = [pair.prompt_ids[k % len(pair.prompt_ids)] for k in range(args.prompts)]
    stop = frozenset(target.stop_ids)
    greedy = compare(target, [Row(tuple(p), N, stop) for p in prompts], args.batch,
                     lambda r: greedy_decode(target, list(r.ids), N).continuation, args.repeats)
    law = Sampling(1.0, top_p=0.95, top_k=20)
    rows = [Row(tuple(p), N, stop, draw_seed(0, p, k)) for k, p in enumerate(prompts)]
    sampled = compare(target, rows, args.batch,
                      lambda r: sampled_decode(target, list(r.ids), N, law, r.seed).continuation, args.repeats,
                      sampling=law)
    emit({"benchmark": "batched_decode", "target": "fixture hybrid Qwen3.5 (fp32, CPU)", "batch": args.batch,
          "max_new_tokens": N, "threads": args.threads, "repeats": args.repeats, "load": os.getloadavg()[0],
          "machine": platform.processor() or platform.machine(),
          "greedy": greedy, "sampled_T1_top_p_0.95_top_k_20": sampled}, args.out)


if __name__ == "__main__":
    main()
