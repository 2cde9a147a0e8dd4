"""The sampled rule's exact estimator against the greedy rule's replay, and against running its loop per draw.

    .venv/bin/python benchmarks/sampled_rule_cost.py [--temperature 1] [--draws 8] [--max-new-tokens 64]
                                                     [--device cpu|cuda] [--out FILE.json]

On the fixture target + trained z-lab drafter, for every built-in prompt × ``--draws`` continuations sampled from
the target (the same draws for every method), side by side in one run:

- cost per draw: the greedy rule's replay (draft every anchor top-1, replay) and the sampled rule's estimator
  (the drafter's law at every anchor through ``slot_logprobs``, the target's law from one teacher-forced pass,
  the per-(anchor, slot) reductions and the forward/backward), both after the same feature extraction; their ratio;
- variance: per-draw τ from the estimator against per-draw τ of the online sampled-rule loop (as many runs as
  draws, its own seeds): the within-prompt variance and the standard error of the mean of per-prompt means. The
  ratio of the variances is what integrating the round boundaries out saves (draws needed by the loop for the
  same standard error).
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
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--draws", type=int, default=8, help="draws per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fixtures", help="fixture folder (default: build it in a temporary folder)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    return ap.parse_args()


def measure(pair, law, args, clock: Clock) -> dict:
    """Every draw of every prompt through the three methods, the same continuation for each: per-draw τ lists."""
    from remote_payload.eval import sampled_rule as sr
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.eval.online import online_generate
    from remote_payload.inputs.features import extract
    from remote_payload.inputs.sampled_reference import sampled_decode
    from remote_payload.inputs.sampling import draw_seed
    from remote_payload.metrics.chain import sample_tau

    target, rt, N = pair.target, pair.runtime, args.max_new_tokens
    layers = pair.drafter.spec.fc_layer_ids
    got: dict = {"estimate": [], "loop": [], "greedy": [], "prompts": [], "checks": [], "tokens": 0}
    for p, ids in enumerate(pair.prompt_ids):
        for j in range(args.draws):
            ref = sampled_decode(target, ids, N, law, draw_seed(0, ids, j))
            got["tokens"] += len(ref.continuation)
            feats = clock.timed("extract_s", lambda ref=ref, ids=ids: extract(target, ref.tokens, layers, len(ids),
                                                                               with_argmax=False))
            got["greedy"].append(sample_tau(clock.timed("greedy_replay_s", lambda ref=ref, ids=ids, feats=feats:
                                                        replay(draft_sample(rt, feats.layers, ref.tokens, len(ids))))))

            def estimate(ref=ref, ids=ids, feats=feats):
                tl = sr.TargetLaw(target, ref.tokens, len(ids), law)
                sc = sr.slot_scalars(rt, rt.prepare(feats.layers), ref.tokens, len(ids), tl, law)
                return sr.estimate(sc)

            fig = clock.timed("sampled_estimator_s", estimate)
            got["estimate"].append(fig["tau"])
            got["checks"].append(fig["check_error"])
            res = clock.timed("online_loop_s", lambda ids=ids, j=j: online_generate(
                target, rt, ids, N, sampling=law, seed=draw_seed(0, ids, j, "online"), draft_rule="sampled"))
            got["loop"].append(sample_tau(res.rounds))
            got["prompts"].append(p)
    return got


def summarize(got: dict, clock: Clock, law, args, n_prompts: int) -> dict:
    import torch

    from remote_payload.metrics.sampled import variance_parts

    sec = clock.seconds
    draws = len(got["estimate"])

    def mean(key):
        return sum(t or 0 for t in got[key]) / draws

    est = variance_parts([t or 0.0 for t in got["estimate"]], got["prompts"])
    loop = variance_parts([t or 0.0 for t in got["loop"]], got["prompts"])
    return {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "device": args.device, "threads": args.threads},
        "law": law.as_json(), "prompts": n_prompts, "draws": draws, "max_new_tokens": args.max_new_tokens,
        "continuation_tokens_per_draw": round(got["tokens"] / draws, 2),
        "seconds_per_draw": {k: round(v / draws, 5) for k, v in sec.items()},
        "estimator_over_replay": round(sec["sampled_estimator_s"] / sec["greedy_replay_s"], 3),
        "estimator_over_online_loop": round(sec["sampled_estimator_s"] / sec["online_loop_s"], 3),
        "tau_macro": {"sampled_rule_estimate": mean("estimate"), "sampled_rule_loop": mean("loop"),
                      "greedy_rule_replay": mean("greedy")},
        "variance": {"estimate": est, "loop": loop,
                     "within_ratio_loop_over_estimate": (loop["within"] / est["within"]
                                                         if est["within"] else None),
                     "se_ratio_loop_over_estimate": (loop["standard_error"] / est["standard_error"]
                                                     if est["standard_error"] else None)},
        "max_check_error": max(got["checks"]),
    }


def main() -> int:
    args = parse_args()
    from remote_payload.models import kernels

    kernels.apply_policy(args.device, "torch")  # the linear-attention kernel is not what this measures
    import torch

    torch.set_num_threads(args.threads)
    from remote_payload.inputs.sampling import Sampling

    pair = load_pair(args.fixtures, args.device)
    law = Sampling(args.temperature, args.top_p, args.top_k)
    clock = Clock(("greedy_replay_s", "sampled_estimator_s", "online_loop_s", "extract_s"), args.device)
    got = measure(pair, law, args, clock)
    emit(summarize(got, clock, law, args, len(pair.prompt_ids)), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
