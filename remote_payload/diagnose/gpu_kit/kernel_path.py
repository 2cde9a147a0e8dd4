"""What the linear-attention kernel path costs τ: a drafter trained on fla bf16 features, evaluated on others.

The team's GPU trainer extracts target features with fla's Triton kernels in bf16; a CPU eval host runs
transformers' torch fallback. This trains the fixture drafter's architecture (its steps and seed) on **fla
bf16** features of the tiny hybrid target and evaluates it, on the same continuations, with features from
  (a) fla bf16    — what training saw (a GPU eval host)
  (b) torch bf16  — a CPU host at the default --dtype bfloat16
  (c) torch fp32  — a CPU host with --dtype float32
(plus (d): fla bf16 features with an fp32 drafter, separating the drafter's own dtype from the features').
Reported: τ (macro) and per-position acceptance with 95% bootstrap CIs over samples, the paired τ difference
to (a), the share of top-1 drafts that differ from (a)'s, and the per-layer hidden-state drift between paths.

References are the target's fp32 greedy continuations through the torch path, shared by every row, so only the
features differ. The drafter is evaluated on the prompts it was trained on (as the fixture drafter is): the
question is how much a feature perturbation moves its drafts, not how well it generalises.

Runs wherever fla binds: on a GPU (``scripts/gpu-check.sh``), or on CPU through Triton's interpreter with the
tests' shim (``benchmarks/kernel_path.py``). ``device`` places the targets and the drafter.
"""

from __future__ import annotations

import json
import time
from typing import Callable

ROWS = {"a": "fla bf16", "b": "torch bf16", "c": "torch fp32", "d": "fla bf16, fp32 drafter"}


def features(samples, tb, tf, layers, progress: Callable[[str], None]) -> tuple[list, float]:
    """Per sample: {"a": fla bf16, "b": torch bf16, "c": torch fp32} feature dicts (one forward each)."""
    from remote_payload.inputs.features import extract
    from remote_payload.models.kernels import torch_linear_attention

    out, fla_s = [], 0.0
    for i, ref in enumerate(samples):
        P = len(ref.prompt_ids)
        t0 = time.perf_counter()
        a = extract(tb, ref.tokens, layers, P, with_argmax=False).layers
        fla_s += time.perf_counter() - t0
        with torch_linear_attention(tb.model):
            b = extract(tb, ref.tokens, layers, P, with_argmax=False).layers
        with torch_linear_attention(tf.model):
            c = extract(tf, ref.tokens, layers, P, with_argmax=False).layers
        out.append({"a": a, "b": b, "c": c})
        progress(f"features {i + 1}/{len(samples)} ({len(ref.tokens)} tokens; "
                 f"fla forward {time.perf_counter() - t0:.1f} s)")
    return out, fla_s


def _runtime(spec, weights, target, dtype):
    from remote_payload.fixtures.models import loaded_from
    from remote_payload.models.drafter import DrafterRuntime

    return DrafterRuntime(loaded_from(spec, weights), target.model.get_input_embeddings(),
                          target.model.get_output_embeddings(), device=target.input_device, dtype=dtype)


def train(spec, samples, feats, tf, steps: int, lr: float, seed: int) -> dict:
    """The fixture drafter's training loop, on fla bf16 features (cast to the fp32 drafter), on tf's device."""
    import torch

    from remote_payload.fixtures.models import seeded_drafter_weights

    rt = _runtime(spec, seeded_drafter_weights(spec, seed), tf, torch.float32)
    params = [p for p in rt.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.05, 1 - s / steps))
    B = spec.block_size
    rt.model.train()
    for _ in range(steps):
        for ref, f in zip(samples, feats, strict=True):
            tokens = torch.tensor(ref.tokens, device=rt.device)
            P, S = len(ref.prompt_ids), len(ref.tokens)
            anchors = torch.arange(P, S - 1, device=rt.device)
            h = rt.hidden(rt.prepare(f["a"], grad=True), tokens, anchors, grad=True)
            tgt = anchors[:, None] + torch.arange(1, B, device=rt.device)[None]
            labels = torch.where(tgt < S, tokens[tgt.clamp(max=S - 1)], torch.full_like(tgt, -100))
            logits = rt.logits(h)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     labels.reshape(-1).to(logits.device), ignore_index=-100)
            (loss / len(samples)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    rt.model.eval()
    return {k: v.detach().clone() for k, v in rt.model.state_dict().items() if not k.startswith("rotary_emb.")}


def evaluate(spec, weights, samples, feats, tb, tf) -> tuple[dict, dict]:
    """Per row: per-sample round lists and the share of top-1 drafts that differ from row (a)'s.

    The drafter runs in the row's dtype, as the eval does (its dtype follows --dtype)."""
    import torch

    from remote_payload.eval.offline import draft_sample, replay

    setups = {"a": ("a", _runtime(spec, weights, tb, torch.bfloat16)),
              "b": ("b", _runtime(spec, weights, tb, torch.bfloat16)),
              "c": ("c", _runtime(spec, weights, tf, torch.float32)),
              "d": ("a", _runtime(spec, weights, tf, torch.float32))}
    rounds, top1 = {}, {}
    with torch.inference_mode():
        for row, (key, rt) in setups.items():
            drafts = [draft_sample(rt, f[key], r.tokens, len(r.prompt_ids))
                      for r, f in zip(samples, feats, strict=True)]
            rounds[row] = [replay(d) for d in drafts]
            top1[row] = torch.cat([d.topk_ids[..., 0].reshape(-1) for d in drafts])
    # Top-1 drafts (every anchor, every depth) that differ from (a)'s: more sensitive than τ.
    flips = {row: float((ids != top1["a"]).float().mean()) for row, ids in top1.items()}
    return rounds, flips


def stats(rounds: dict, block_size: int, resamples: int = 1000) -> dict:
    from remote_payload.metrics.chain import sample_tau, summarize
    from remote_payload.metrics.stats import bootstrap_cis, bootstrap_mean_ci

    out = {}
    base = [sample_tau(rs) for rs in rounds["a"]]
    for row, per_sample in rounds.items():
        def stat(idx, per_sample=per_sample):
            s = summarize([per_sample[i] for i in idx], block_size)
            return {"tau": s["tau_macro"], **{f"p{p['k']}": p["p"] for p in s["per_position"]}}

        point, cis = stat(range(len(per_sample))), bootstrap_cis(len(per_sample), stat, resamples=resamples)
        taus = [sample_tau(rs) for rs in per_sample]
        diffs = [x - y for x, y in zip(taus, base, strict=True) if x is not None and y is not None]
        out[row] = {"label": ROWS[row], "point": point, "ci95": cis,
                    "delta_tau_vs_a": sum(diffs) / len(diffs) if diffs else None,
                    "delta_ci95": bootstrap_mean_ci(diffs, resamples=resamples)}
    return out


def drift(feats, layers) -> list[dict]:
    """Per layer, over every position of every sample: relative L2 difference and the lowest cosine."""
    import torch

    rows = []
    for lid in layers:
        row: dict = {"layer": lid}
        for name, (x, y) in {"a_vs_b": ("a", "b"), "a_vs_c": ("a", "c"), "b_vs_c": ("b", "c")}.items():
            num = den = 0.0
            cos_min = 1.0
            for f in feats:
                u, v = f[x][lid].float(), f[y][lid].float()
                num += float((u - v).pow(2).sum())
                den += float(v.pow(2).sum())
                cos_min = min(cos_min, float(torch.nn.functional.cosine_similarity(u, v, dim=-1).min()))
            row[name] = {"rel_l2": (num / den) ** 0.5 if den else 0.0, "cos_min": cos_min}
        rows.append(row)
    return rows


def run(target_dir, device: str, kernel: str, n_samples: int, max_new_tokens: int, train_steps: int | None,
        resamples: int, progress: Callable[[str], None]) -> dict:
    """The whole experiment on the fixture target at ``target_dir``; the result dict ``render`` prints."""
    import torch

    from remote_payload.fixtures.models import DRAFTER_TRAIN, SEED, drafter_spec_dict
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.models.kernels import torch_linear_attention
    from remote_payload.models.spec import from_training
    from remote_payload.models.target import load_target, render_prompt

    started = time.perf_counter()
    tb = load_target(target_dir, device=device, dtype="bfloat16", kernel=kernel)
    tf = load_target(target_dir, device=device, dtype="float32", kernel=kernel)
    spec = from_training(drafter_spec_dict(tb.tokenizer.convert_tokens_to_ids("<|MASK|>")), {}, "kernel-path drafter")
    prompts, _ = load_prompts("builtin")
    samples = []
    with torch_linear_attention(tf.model):
        for p in prompts[:n_samples]:
            ids = render_prompt(tf.tokenizer, p.message_dicts(), False)
            samples.append(greedy_decode(tf, ids, max_new_tokens))
    layers = list(range(tb.config.num_layers))
    feats, fla_s = features(samples, tb, tf, layers, progress)
    steps = int(DRAFTER_TRAIN["steps"]) if train_steps is None else train_steps
    t0 = time.perf_counter()
    torch.manual_seed(SEED + 2)
    weights = train(spec, samples, feats, tf, steps, DRAFTER_TRAIN["lr"], SEED + 2)
    train_s = time.perf_counter() - t0
    progress(f"drafter trained on fla bf16 features in {train_s:.0f} s ({steps} steps)")
    rounds, flips = evaluate(spec, weights, samples, feats, tb, tf)
    rows = stats(rounds, spec.block_size, resamples)
    for row, r in rows.items():
        r["top1_differ_from_a"] = flips[row]
    return {"rows": rows, "drift": drift(feats, layers), "samples": len(samples),
            "tokens": sum(len(r.tokens) for r in samples), "block_size": spec.block_size, "train_steps": steps,
            "kernel_path": tb.kernel_path, "device": device, "fla_extract_s": round(fla_s, 2),
            "train_s": round(train_s, 2), "worker_s": round(time.perf_counter() - started, 2),
            "kernels": tb.kernel_details}


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "n/a"


def render(res: dict) -> str:
    """The result as two markdown tables (τ per feature path; drift per layer) and the CIs."""
    B = res["block_size"]
    head = "| features (eval host) | τ macro [95% CI] | Δτ vs (a) [95% CI] | drafts ≠ (a) | " + " | ".join(
        f"p{k}" for k in range(1, B)) + " |"
    lines = [head, "|" + "---|" * (4 + B - 1)]
    for row, r in res["rows"].items():
        ps = " | ".join(f"{r['point'][f'p{k}']:.2f}" if r["point"].get(f"p{k}") is not None else "–"
                        for k in range(1, B))
        delta = r["delta_tau_vs_a"]
        lines.append(f"| ({row}) {r['label']} | {r['point']['tau']:.3f} {_fmt_ci(r['ci95']['tau'])} | "
                     f"{'n/a' if delta is None else f'{delta:+.3f}'} {_fmt_ci(r['delta_ci95'])} | "
                     f"{r['top1_differ_from_a'] * 100:.1f}% | {ps} |")
    lines += ["", "| layer | fla bf16 vs torch bf16 (rel L2 / min cos) | fla bf16 vs torch fp32 | "
              "torch bf16 vs torch fp32 |", "|---|---|---|---|"]
    for d in res["drift"]:
        cells = [f"{d[k]['rel_l2'] * 100:.2f}% / {d[k]['cos_min']:.4f}" for k in ("a_vs_b", "a_vs_c", "b_vs_c")]
        lines.append(f"| {d['layer']} | " + " | ".join(cells) + " |")
    cis = {row: {k: _fmt_ci(v) for k, v in r["ci95"].items()} for row, r in res["rows"].items()}
    lines.append(f"\n95% CIs of τ and p_k per row: {json.dumps(cis)}")
    return "\n".join(lines)
