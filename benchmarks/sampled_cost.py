"""The cost of K draws per prompt at T > 0, and what it buys, on the fixture target + trained z-lab drafter.

    .venv/bin/python benchmarks/sampled_cost.py [--temperature 1] [--draws 8] [--max-new-tokens 96] [--out FILE.json]

For the built-in prompts: one greedy reference each (today's T = 0 path) and ``--draws`` sampled ones each, every
stage timed per draw (sampling the continuation, its tail for the zlab-2604/vllm conventions, the one-pass feature
extraction, drafting + replay). Then, for K = 1, 2, 4, … ``--draws``, the run that takes the first K draws of every
prompt: its τ macro, the 95% cluster-bootstrap CI (metrics.sampled) and its width, against the cost (K × the
per-draw cost). The variance parts (between prompts / within a prompt) say how the standard error falls with K:
sqrt(between/n + within/(n·K)), so K stops paying once within/K is small against between.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

from fixture_pair import Clock, emit, load_pair

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--draws", type=int, default=8, help="draws per prompt (the largest K)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fixtures", help="fixture folder (default: build/copy from the fixture cache)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    return ap.parse_args()


STAGES = ("reference_s", "tail_s", "extract_s", "draft_replay_s")


def evaluate(pair, clock: Clock, ref):
    """Features of one continuation, then the drafter's pass and replay: its rounds."""
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.inputs.features import extract

    P, layers = len(ref.prompt_ids), pair.drafter.spec.fc_layer_ids
    feats = clock.timed("extract_s", lambda: extract(pair.target, ref.tokens, layers, P, with_argmax=False))
    return clock.timed("draft_replay_s", lambda: replay(draft_sample(pair.runtime, feats.layers, ref.tokens, P)))


def greedy_pass(pair, N: int, clock: Clock) -> list:
    """Today's T = 0 path, one reference per prompt: per-prompt τ."""
    from remote_payload.inputs.reference import greedy_decode, greedy_tail
    from remote_payload.metrics.chain import sample_tau

    taus = []
    for ids in pair.prompt_ids:
        ref = clock.timed("reference_s", lambda ids=ids: greedy_decode(pair.target, ids, N))
        clock.timed("tail_s", lambda ref=ref: greedy_tail(pair.target, ref.tokens, pair.runtime.block_size - 1))
        taus.append(sample_tau(evaluate(pair, clock, ref)))
    return taus


def sampled_pass(pair, law, N: int, draws: int, clock: Clock) -> list:
    """``draws`` sampled continuations per prompt, each evaluated: one samples.jsonl-like line per draw."""
    from remote_payload.inputs.sampled_reference import sampled_decode, sampled_tail
    from remote_payload.inputs.sampling import draw_seed
    from remote_payload.metrics.sample_rounds import entry_from_rounds

    B, lines = pair.runtime.block_size, []
    for p, ids in enumerate(pair.prompt_ids):
        for j in range(draws):
            seed = draw_seed(0, ids, j)
            ref = clock.timed("reference_s", lambda ids=ids, seed=seed: sampled_decode(pair.target, ids, N, law, seed))
            clock.timed("tail_s", lambda ref=ref, seed=seed: sampled_tail(pair.target, ref.tokens, B - 1, law, seed))
            rounds = evaluate(pair, clock, ref)
            lines.append({"index": len(lines), "id": f"{p}#{j}", "prompt_index": p, "draw": j,
                          "prompt_tokens": len(ids), "continuation_tokens": len(ref.continuation),
                          "drafters": {"z": entry_from_rounds(rounds)}})
    return lines


def by_k(lines: list, B: int, sampling: dict, max_k: int, seconds_per_draw: float) -> list:
    """For K = 1, 2, 4, … the run of the first K draws of every prompt: τ macro, its CI and width, its cost."""
    from remote_payload.metrics.sampled import sampled_figures

    out, k = [], 1
    while k <= max_k:
        chosen = [line for line in lines if line["draw"] < k]
        fig = sampled_figures(chosen, "z", B, sampling=sampling, seed=0)
        lo, hi = fig["tau_macro"]["ci"] or (None, None)
        out.append({"K": k, "draws": len(chosen), "tau_macro": round(fig["tau_macro"]["value"], 4),
                    "ci": [round(lo, 4), round(hi, 4)] if lo is not None else None,
                    "ci_width": round(hi - lo, 4) if lo is not None else None,
                    "standard_error": fig["variance"]["standard_error"],
                    "seconds_per_prompt": round(k * seconds_per_draw, 3)})
        k *= 2
    return out


def main() -> int:
    args = parse_args()
    from remote_payload.models import kernels

    kernels.apply_policy("cpu")
    import torch

    torch.set_num_threads(args.threads)
    from remote_payload.inputs.sampling import Sampling
    from remote_payload.metrics.sampled import sampled_figures

    pair = load_pair(args.fixtures, "cpu")
    B, law, N = pair.runtime.block_size, Sampling(args.temperature), args.max_new_tokens
    greedy_clock = Clock(STAGES)
    greedy_taus = greedy_pass(pair, N, greedy_clock)
    clock = Clock(STAGES)
    lines = sampled_pass(pair, law, N, args.draws, clock)
    draws = len(lines)
    per_draw = {k: round(v / draws, 4) for k, v in clock.seconds.items()}
    per_greedy = {k: round(v / len(pair.prompt_ids), 4) for k, v in greedy_clock.seconds.items()}
    sampling = {**law.as_json(), "samples_per_prompt": args.draws}
    var = sampled_figures(lines, "z", B, sampling=sampling, seed=0)["variance"]
    emit({
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": args.threads,
                    "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "setup": {"prompts": len(pair.prompt_ids), "draws_per_prompt": args.draws, "law": law.label(),
                  "max_new_tokens": N, "target": "fixture Qwen3.5 (8 layers, 6 Gated DeltaNet), fp32, CPU",
                  "drafter": "fixture z-lab drafter", "block_size": B},
        "greedy": {"tau_macro": round(sum(greedy_taus) / len(greedy_taus), 4), "seconds_per_prompt": per_greedy,
                   "total_s_per_prompt": round(sum(per_greedy.values()), 3)},
        "sampled": {"seconds_per_draw": per_draw, "total_s_per_draw": round(sum(per_draw.values()), 3),
                    "mean_continuation_tokens": round(sum(x["continuation_tokens"] for x in lines) / draws, 1),
                    "variance": var, "by_K": by_k(lines, B, sampling, args.draws, sum(per_draw.values()))},
    }, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
