"""Offline (teacher-forced) evaluation vs the online draft/verify loop, on the fixture target + drafter.

    .venv/bin/python benchmarks/eval_offline_vs_online.py [--repeats 3] [--threads 1] [--out FILE.json]

Same prompts (the built-in set), same target (tiny hybrid Qwen3.5, fp32, CPU), same trained fixture
drafter. Reports wall time of each path (best of --repeats), their ratio, whether τ and every round
agree, and the extraction throughput. The offline figure is given both with and without the one-pass
feature extraction; the reference continuations (greedy decoding) are timed separately because the
offline path needs them while the online loop produces its output itself.
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


def best_of(n, fn):
    times, result = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--fixtures", help="fixture folder (default: build/copy from the fixture cache)")
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args()

    from remote_payload.models import kernels

    kernels.apply_policy("cpu")
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.eval.online import online_generate
    from remote_payload.fixtures import build as fixtures
    from remote_payload.inputs.features import extract
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.metrics.chain import summarize
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.target import load_target, render_prompt

    fx = Path(args.fixtures) if args.fixtures else Path(tempfile.mkdtemp(prefix="dfo-bench-"))
    if not args.fixtures:
        fixtures.build(fx, ["target", "trained-drafter"])
    target = load_target(fx / "target", device="cpu", dtype="float32")
    ld = load_drafter(fx / "trained-drafter" / "checkpoint.pt", fx / "trained-drafter" / "spec.json")
    rt = DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings())
    prompts, _ = load_prompts("builtin")
    prompt_ids = [render_prompt(target.tokenizer, p.message_dicts(), False) for p in prompts]
    layers = ld.spec.fc_layer_ids

    ref_s, refs = best_of(args.repeats, lambda: [greedy_decode(target, ids, args.max_new_tokens) for ids in prompt_ids])
    gen_tokens = sum(len(r.continuation) for r in refs)
    ext_s, feats = best_of(args.repeats, lambda: [extract(target, r.tokens, layers, len(r.prompt_ids)) for r in refs])
    ext_tokens = sum(len(r.tokens) for r in refs)

    def offline():
        return [replay(draft_sample(rt, f.layers, r.tokens, len(r.prompt_ids)))
                for r, f in zip(refs, feats, strict=False)]

    def online():
        return [online_generate(target, rt, r.prompt_ids, args.max_new_tokens) for r in refs]

    off_s, off_rounds = best_of(args.repeats, offline)
    on_s, on_results = best_of(args.repeats, online)
    B = rt.block_size
    tau_off = summarize(off_rounds, B)
    tau_on = summarize([o.rounds for o in on_results], B)
    rounds_identical = all([r.as_dict() for r in a] == [r.as_dict() for r in o.rounds]
                           for a, o in zip(off_rounds, on_results, strict=False))
    lossless = all(o.continuation == r.continuation for o, r in zip(on_results, refs, strict=False))
    figures = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__, "threads": args.threads, "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
        "setup": {"prompts": len(refs), "max_new_tokens": args.max_new_tokens, "continuation_tokens": gen_tokens,
                  "target": "fixture Qwen3.5 (8 layers, 6 Gated DeltaNet), fp32, CPU", "drafter_block_size": B,
                  "repeats": args.repeats, "timing": "best of repeats"},
        "reference_generation_s": round(ref_s, 3),
        "reference_tokens_per_s": round(gen_tokens / ref_s, 1),
        "extraction_s": round(ext_s, 3),
        "extraction_tokens_per_s": round(ext_tokens / ext_s, 1),
        "offline_draft_replay_s": round(off_s, 3),
        "offline_total_s": round(off_s + ext_s, 3),
        "online_s": round(on_s, 3),
        "speedup_online_over_offline_total": round(on_s / (off_s + ext_s), 2),
        "speedup_online_over_offline_draft_replay": round(on_s / off_s, 2),
        "tau_macro_offline": tau_off["tau_macro"],
        "tau_macro_online": tau_on["tau_macro"],
        "tau_identical": tau_off["tau_macro"] == tau_on["tau_macro"],
        "rounds_identical": rounds_identical,
        "online_output_equals_greedy": lossless,
        "rounds": tau_off["rounds"],
        "online_target_forwards": sum(o.target_forwards for o in on_results),
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
    ok = figures["tau_identical"] and rounds_identical and lossless
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
