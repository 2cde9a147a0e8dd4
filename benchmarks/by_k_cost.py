"""accept_length_by_k: what the re-planned blocks cost beside the full-block pass, and what they change.

    .venv/bin/python benchmarks/by_k_cost.py [--max-new-tokens 96] [--samples N] [--device cpu|cuda]
                                             [--drafter zlab-drafter|dflash2-drafter|engine-zlab-drafter]
                                             [--k-plan RESULTS.json] [--out FILE.json]

On the fixture target and drafter, every built-in prompt's greedy reference (with B - 1 tokens past the stop),
side by side in one run:

- cost per sample: the eval's full-block draft pass (every anchor, top-1) and the B - 2 re-planned passes
  (the same anchors at K + 1 rows, K = 1 .. B - 2: ``draft_sample(replan=True)``), and their ratio;
- per K: the figure dfo's profiles carried before (the full block's drafts truncated to K, 1 + accepted capped
  at the kept tokens: method ``truncated``), the re-planned block counted as the engine counts (the profile's
  figure now, with its CI) and counted as committed;
- with ``--k-plan``, a results.json of ``eval --engine vllm --engine-k ...`` on the same fixture and settings
  (``engine-zlab-drafter`` is the z-lab export of the engine fixture's trained drafter, on ``engine-target``):
  the K plan's check (predicted vs measured speedup per concurrency and K) from the figures before and now.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--drafter", default="zlab-drafter",
                    choices=("zlab-drafter", "dflash2-drafter", "engine-zlab-drafter"))
    ap.add_argument("--samples", type=int, help="the first N built-in prompts (default: all)")
    ap.add_argument("--k-plan", help="results.json of an engine run on the same fixture: the K plan before and now")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", help="also write the figures as JSON here")
    return ap.parse_args()


def truncated_record(tokens, prompt_len, drafts_at, B) -> dict:
    """The per-K record of dfo's profiles before the re-planned method: [rounds, accepted] of the full block's
    drafts cut to K over the kept tokens."""
    from remote_payload.metrics.chain import chain_rounds

    out = {}
    for k in range(1, B):
        rounds = chain_rounds(tokens, prompt_len, lambda a, k=k: list(drafts_at(a))[:k])
        out[k] = [len(rounds), sum(r.accepted for r in rounds)]
    return out


def main() -> None:
    args = parse_args()
    import tempfile

    import torch

    from remote_payload.models import kernels

    kernels.apply_policy(args.device)
    torch.set_num_threads(args.threads)
    from fixture_pair import emit

    from remote_payload.eval.offline import draft_sample
    from remote_payload.fixtures import build
    from remote_payload.inputs.features import extract
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode, greedy_tail
    from remote_payload.metrics import conventions as conv
    from remote_payload.metrics.by_k import sample_record, summarize_by_k
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.target import load_target, render_prompt

    fx = Path(tempfile.mkdtemp(prefix="dfo-bench-"))
    target_item = "engine-target" if args.drafter.startswith("engine-") else "target"
    build.build(fx, [target_item, args.drafter])
    target = load_target(fx / target_item, device=args.device, dtype="float32")
    ld = load_drafter(fx / args.drafter)
    rt = DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings(),
                        device=target.input_device, dtype=torch.float32)
    B = rt.block_size
    full_s = replan_s = 0.0
    records, old = [], []
    prompts = load_prompts("builtin")[0][:args.samples]
    for p in prompts:
        ids = render_prompt(target.tokenizer, p.message_dicts(), False)
        ref = greedy_decode(target, ids, args.max_new_tokens)
        tail = greedy_tail(target, ref.tokens, B - 1)
        feats = extract(target, ref.tokens, list(ld.spec.fc_layer_ids), len(ids))
        drafts = draft_sample(rt, feats.layers, ref.tokens, len(ids), replan=True)
        full_s += drafts.seconds
        replan_s += drafts.replan_seconds
        end = conv.SampleEnd(tokens=ref.tokens + tail, prompt_len=len(ids), kept=len(ref.tokens),
                             max_new=args.max_new_tokens, stop_ids=frozenset(target.stop_ids), drafts_at=drafts.top1)
        records.append(sample_record(end, drafts.drafts_at_k, B))
        old.append(truncated_record(ref.tokens, len(ids), drafts.top1, B))
    new = summarize_by_k(records, B)["by_k"]
    per_k = []
    for k in range(1, B):
        n, acc = sum(r[k][0] for r in old), sum(r[k][1] for r in old)
        row = new[str(k)]
        per_k.append({"k": k, "truncated (before)": round(1 + acc / n, 4),
                      "replanned, engine count (now)": row["mean_accept_length"], "ci95": row["ci95"],
                      "replanned, committed": row["committed"]["mean_accept_length"]})
    plan = k_plan_before_and_now(args.k_plan, per_k, B) if args.k_plan else None
    emit({**({"k_plan_check": plan} if plan else {}), "drafter": args.drafter, "block_size": B,
          "samples": len(prompts), "device": args.device,
          "full_block_pass_s_per_sample": round(full_s / len(prompts), 4),
          "replanned_passes_s_per_sample": round(replan_s / len(prompts), 4),
          "replanned_over_full": round(replan_s / full_s, 2) if full_s else None,
          "rows_ratio": round(sum(range(2, B)) / B, 2), "per_k": per_k}, args.out)


def k_plan_before_and_now(results_path: str, per_k: list[dict], B: int) -> dict:
    """The K plan's check of the run's first drafter with τ(K) from the figures before and now."""
    import json

    from orchestrator.evaluation.k_schedule import plan_for_drafter

    results = json.loads(Path(results_path).read_text())
    engine = next(iter(results["drafters"].values()))["engine"]
    out = {}
    for key in ("truncated (before)", "replanned, engine count (now)"):
        tau = {r["k"]: r[key] for r in per_k}
        plan = plan_for_drafter(engine, tau.get, B - 1) or {}
        out[key] = [{f: c[f] for f in ("concurrency", "k", "predicted_speedup", "measured_speedup", "relative_error",
                                       "held_out", "profile_tau", "engine_tau")} for c in plan.get("check", [])]
    return out


if __name__ == "__main__":
    main()
