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
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def main() -> int:
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
    args = ap.parse_args()

    from remote_payload.models import kernels

    kernels.apply_policy(args.device, "torch")  # the linear-attention kernel is not what this measures
    import torch

    torch.set_num_threads(args.threads)
    from remote_payload.eval import sampled_rule as sr
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.eval.online import online_generate
    from remote_payload.fixtures import build as fixtures
    from remote_payload.inputs.features import extract
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.sampled_reference import sampled_decode
    from remote_payload.inputs.sampling import Sampling, draw_seed
    from remote_payload.metrics.chain import sample_tau
    from remote_payload.metrics.sampled import variance_parts
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.target import load_target, render_prompt

    fx = Path(args.fixtures) if args.fixtures else Path(tempfile.mkdtemp(prefix="dfo-bench-"))
    if not args.fixtures:
        fixtures.build(fx, ["target", "zlab-drafter"])
    target = load_target(fx / "target", device=args.device, dtype="float32")
    ld = load_drafter(fx / "zlab-drafter")
    rt = DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings(),
                        device=target.input_device, dtype=torch.float32)
    law = Sampling(args.temperature, args.top_p, args.top_k)
    N, layers = args.max_new_tokens, ld.spec.fc_layer_ids
    prompt_ids = [render_prompt(target.tokenizer, p.message_dicts(), False) for p in load_prompts("builtin")[0]]
    clock = {"greedy_replay_s": 0.0, "sampled_estimator_s": 0.0, "online_loop_s": 0.0, "extract_s": 0.0}

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def timed(key, fn):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        clock[key] += time.perf_counter() - t0
        return out

    est_tau, loop_tau, greedy_tau, prompts, checks, tokens = [], [], [], [], [], 0
    for p, ids in enumerate(prompt_ids):
        for j in range(args.draws):
            ref = sampled_decode(target, ids, N, law, draw_seed(0, ids, j))
            tokens += len(ref.continuation)
            feats = timed("extract_s", lambda ref=ref, ids=ids: extract(target, ref.tokens, layers, len(ids),
                                                                         with_argmax=False))
            greedy_tau.append(sample_tau(timed("greedy_replay_s", lambda ref=ref, ids=ids, feats=feats: replay(
                draft_sample(rt, feats.layers, ref.tokens, len(ids))))))

            def estimate(ref=ref, ids=ids, feats=feats):
                tl = sr.TargetLaw(target, ref.tokens, len(ids), law)
                sc = sr.slot_scalars(rt, rt.prepare(feats.layers), ref.tokens, len(ids), tl, law)
                return sr.estimate(sc)

            fig = timed("sampled_estimator_s", estimate)
            est_tau.append(fig["tau"])
            checks.append(fig["check_error"])
            res = timed("online_loop_s", lambda ids=ids, j=j: online_generate(
                target, rt, ids, N, sampling=law, seed=draw_seed(0, ids, j, "online"), draft_rule="sampled"))
            loop_tau.append(sample_tau(res.rounds))
            prompts.append(p)
    draws = len(est_tau)
    est = variance_parts([t or 0.0 for t in est_tau], prompts)
    loop = variance_parts([t or 0.0 for t in loop_tau], prompts)
    out = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
                    "device": args.device, "threads": args.threads},
        "law": law.as_json(), "prompts": len(prompt_ids), "draws": draws, "max_new_tokens": N,
        "continuation_tokens_per_draw": round(tokens / draws, 2),
        "seconds_per_draw": {k: round(v / draws, 5) for k, v in clock.items()},
        "estimator_over_replay": round(clock["sampled_estimator_s"] / clock["greedy_replay_s"], 3),
        "estimator_over_online_loop": round(clock["sampled_estimator_s"] / clock["online_loop_s"], 3),
        "tau_macro": {"sampled_rule_estimate": sum(t or 0 for t in est_tau) / draws,
                      "sampled_rule_loop": sum(t or 0 for t in loop_tau) / draws,
                      "greedy_rule_replay": sum(t or 0 for t in greedy_tau) / draws},
        "variance": {"estimate": est, "loop": loop,
                     "within_ratio_loop_over_estimate": (loop["within"] / est["within"]
                                                         if est["within"] else None),
                     "se_ratio_loop_over_estimate": (loop["standard_error"] / est["standard_error"]
                                                     if est["standard_error"] else None)},
        "max_check_error": max(checks),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
