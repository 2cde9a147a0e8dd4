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
    ap.add_argument("--draws", type=int, default=8, help="draws per prompt (the largest K)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fixtures", help="fixture folder (default: build/copy from the fixture cache)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args()

    from remote_payload.models import kernels

    kernels.apply_policy("cpu")
    import torch

    torch.set_num_threads(args.threads)
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.fixtures import build as fixtures
    from remote_payload.inputs.features import extract
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode, greedy_tail
    from remote_payload.inputs.sampled_reference import sampled_decode, sampled_tail
    from remote_payload.inputs.sampling import Sampling, draw_seed
    from remote_payload.metrics.chain import sample_tau
    from remote_payload.metrics.sample_rounds import entry_from_rounds
    from remote_payload.metrics.sampled import sampled_figures
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.target import load_target, render_prompt

    fx = Path(args.fixtures) if args.fixtures else Path(tempfile.mkdtemp(prefix="dfo-bench-"))
    if not args.fixtures:
        fixtures.build(fx, ["target", "zlab-drafter"])
    target = load_target(fx / "target", device="cpu", dtype="float32")
    ld = load_drafter(fx / "zlab-drafter")
    rt = DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings(),
                        dtype=torch.float32)
    B, layers, law, N = rt.block_size, ld.spec.fc_layer_ids, Sampling(args.temperature), args.max_new_tokens
    prompt_ids = [render_prompt(target.tokenizer, p.message_dicts(), False) for p in load_prompts("builtin")[0]]
    clock = {"reference_s": 0.0, "tail_s": 0.0, "extract_s": 0.0, "draft_replay_s": 0.0}

    def timed(key, fn):
        t0 = time.perf_counter()
        out = fn()
        clock[key] += time.perf_counter() - t0
        return out

    def evaluate(ref, tail):
        feats = timed("extract_s", lambda: extract(target, ref.tokens, layers, len(ref.prompt_ids), with_argmax=False))
        return timed("draft_replay_s", lambda: replay(draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids))))

    greedy_taus = []
    for ids in prompt_ids:
        ref = timed("reference_s", lambda ids=ids: greedy_decode(target, ids, N))
        tail = timed("tail_s", lambda ref=ref: greedy_tail(target, ref.tokens, B - 1))
        greedy_taus.append(sample_tau(evaluate(ref, tail)))
    greedy_clock, clock = dict(clock), {k: 0.0 for k in clock}
    lines = []
    for p, ids in enumerate(prompt_ids):
        for j in range(args.draws):
            seed = draw_seed(0, ids, j)
            ref = timed("reference_s", lambda ids=ids, seed=seed: sampled_decode(target, ids, N, law, seed))
            tail = timed("tail_s", lambda ref=ref, seed=seed: sampled_tail(target, ref.tokens, B - 1, law, seed))
            rounds = evaluate(ref, tail)
            lines.append({"index": len(lines), "id": f"{p}#{j}", "prompt_index": p, "draw": j,
                          "prompt_tokens": len(ids), "continuation_tokens": len(ref.continuation),
                          "drafters": {"z": entry_from_rounds(rounds)}})
    draws = len(lines)
    per_draw = {k: round(v / draws, 4) for k, v in clock.items()}
    per_greedy = {k: round(v / len(prompt_ids), 4) for k, v in greedy_clock.items()}
    sampling = {**law.as_json(), "samples_per_prompt": args.draws}
    by_k = []
    k = 1
    while k <= args.draws:
        chosen = [line for line in lines if line["draw"] < k]
        fig = sampled_figures(chosen, "z", B, sampling=sampling, seed=0)
        lo, hi = fig["tau_macro"]["ci"] or (None, None)
        by_k.append({"K": k, "draws": len(chosen), "tau_macro": round(fig["tau_macro"]["value"], 4),
                     "ci": [round(lo, 4), round(hi, 4)] if lo is not None else None,
                     "ci_width": round(hi - lo, 4) if lo is not None else None,
                     "standard_error": fig["variance"]["standard_error"],
                     "seconds_per_prompt": round(k * sum(per_draw.values()), 3)})
        k *= 2
    full = sampled_figures(lines, "z", B, sampling=sampling, seed=0)
    var = full["variance"]
    figures = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": args.threads,
                    "cpus": os.cpu_count(), "load_average": os.getloadavg()},
        "setup": {"prompts": len(prompt_ids), "draws_per_prompt": args.draws, "law": law.label(),
                  "max_new_tokens": N, "target": "fixture Qwen3.5 (8 layers, 6 Gated DeltaNet), fp32, CPU",
                  "drafter": "fixture z-lab drafter", "block_size": B},
        "greedy": {"tau_macro": round(sum(greedy_taus) / len(greedy_taus), 4), "seconds_per_prompt": per_greedy,
                   "total_s_per_prompt": round(sum(per_greedy.values()), 3)},
        "sampled": {"seconds_per_draw": per_draw, "total_s_per_draw": round(sum(per_draw.values()), 3),
                    "mean_continuation_tokens": round(sum(x["continuation_tokens"] for x in lines) / draws, 1),
                    "variance": var, "by_K": by_k},
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
