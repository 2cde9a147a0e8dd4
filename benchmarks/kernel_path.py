"""What the linear-attention kernel path costs τ: a drafter trained on fla bf16 features, evaluated on others.

    .venv/bin/python benchmarks/kernel_path.py [--samples 12] [--max-new-tokens 160] [--out FILE.json]

The team's GPU trainer extracts target features with flash-linear-attention's Triton kernels in bf16; a CPU
eval host has no GPU, so transformers runs its torch fallback there. This trains the fixture drafter (same
architecture, steps and seed as the ``trained-drafter`` fixture) on **fla bf16** features of the tiny hybrid
target and evaluates it, on the same continuations, with features from
  (a) fla bf16    — what training saw (the GPU eval host)
  (b) torch bf16  — a CPU host at the default --dtype bfloat16
  (c) torch fp32  — a CPU host with --dtype float32
(plus (d): fla bf16 features with an fp32 drafter, separating the drafter's own dtype from the features').
Reported: τ (macro) and per-position acceptance with 95% bootstrap CIs over samples, the paired τ
difference to (a), and the per-layer hidden-state drift between the paths.

fla's kernels run on CPU through Triton's interpreter with the test-only shim (tests/fla_cpu/shim.py) in the
separate fla venv (tests/fla_cpu/fla_env.py builds it on first use, ~2-3 min). References are the
target's fp32 greedy continuations (torch path), shared by every row, so only the features differ. The
drafter is evaluated on the prompts it was trained on (as the fixture drafter is): the question is how
much a feature perturbation moves its drafts, not how well it generalises.

Cost: one fla forward per sample through the interpreter. Measured with the defaults (12 samples, 1308
tokens) on a 2-core machine shared with other jobs (load ~10): fla extraction 1242 s (66-158 s per
sample), drafter training 342 s, 31.6 min wall; an idle machine needs several times less.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "fla_cpu")]
ROWS = {"a": "fla bf16", "b": "torch bf16", "c": "torch fp32", "d": "fla bf16, fp32 drafter"}


# ---------------------------------------------------------------- worker (fla venv, shim active)

def _features(samples, tb, tf, layers, progress):
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


def _train(spec, samples, feats, tf, steps: int, lr: float, seed: int):
    """The fixture drafter's training loop, on fla bf16 features (cast to the fp32 drafter)."""
    import torch

    from remote_payload.fixtures.models import _loaded_from, _random_drafter_weights
    from remote_payload.models.drafter import DrafterRuntime

    rt = DrafterRuntime(_loaded_from(spec, _random_drafter_weights(spec, seed)), tf.model.get_input_embeddings(),
                        tf.model.get_output_embeddings(), dtype=torch.float32)
    params = [p for p in rt.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.05, 1 - s / steps))
    B = spec.block_size
    rt.model.train()
    for _ in range(steps):
        for ref, f in zip(samples, feats, strict=True):
            tokens = torch.tensor(ref.tokens)
            P, S = len(ref.prompt_ids), len(ref.tokens)
            anchors = torch.arange(P, S - 1)
            h = rt.hidden(rt.prepare(f["a"], grad=True), tokens, anchors, grad=True)
            tgt = anchors[:, None] + torch.arange(1, B)[None]
            labels = torch.where(tgt < S, tokens[tgt.clamp(max=S - 1)], torch.full_like(tgt, -100))
            logits = rt.logits(h)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                     ignore_index=-100)
            (loss / len(samples)).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    rt.model.eval()
    return {k: v.detach().clone() for k, v in rt.model.state_dict().items() if not k.startswith("rotary_emb.")}


def _evaluate(spec, weights, samples, feats, tb, tf) -> tuple[dict, dict]:
    """Per row: per-sample round lists and the share of top-1 drafts that differ from row (a)'s.

    The drafter runs in the row's dtype, as the eval does (its dtype follows --dtype)."""
    import torch

    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.fixtures.models import _loaded_from
    from remote_payload.models.drafter import DrafterRuntime

    def runtime(t, dtype):
        return DrafterRuntime(_loaded_from(spec, weights), t.model.get_input_embeddings(),
                              t.model.get_output_embeddings(), dtype=dtype)

    setups = {"a": ("a", runtime(tb, torch.bfloat16)), "b": ("b", runtime(tb, torch.bfloat16)),
              "c": ("c", runtime(tf, torch.float32)), "d": ("a", runtime(tf, torch.float32))}
    rounds, top1 = {}, {}
    with torch.inference_mode():
        for row, (key, rt) in setups.items():
            drafts = [draft_sample(rt, f[key], r.tokens, len(r.prompt_ids))
                      for r, f in zip(samples, feats, strict=True)]
            rounds[row] = [replay(d) for d in drafts]
            top1[row] = torch.cat([d.topk_ids[..., 0].reshape(-1) for d in drafts])  # type: ignore[index]
    # Top-1 drafts (every anchor, every depth) that differ from (a)'s: more sensitive than τ.
    flips = {row: float((ids != top1["a"]).float().mean()) for row, ids in top1.items()}
    return rounds, flips


def _stats(rounds: dict, block_size: int) -> dict:
    from remote_payload.metrics.chain import sample_tau, summarize
    from remote_payload.metrics.stats import bootstrap_cis, bootstrap_mean_ci

    out = {}
    base = [sample_tau(rs) for rs in rounds["a"]]
    for row, per_sample in rounds.items():
        def stat(idx, per_sample=per_sample):
            s = summarize([per_sample[i] for i in idx], block_size)
            return {"tau": s["tau_macro"], **{f"p{p['k']}": p["p"] for p in s["per_position"]}}

        point, cis = stat(range(len(per_sample))), bootstrap_cis(len(per_sample), stat, resamples=1000)
        taus = [sample_tau(rs) for rs in per_sample]
        diffs = [x - y for x, y in zip(taus, base, strict=True) if x is not None and y is not None]
        out[row] = {"label": ROWS[row], "point": point, "ci95": cis,
                    "delta_tau_vs_a": sum(diffs) / len(diffs), "delta_ci95": bootstrap_mean_ci(diffs, resamples=1000)}
    return out


def _drift(feats, layers) -> list[dict]:
    """Per layer, over every position of every sample: relative L2 difference and the lowest cosine."""
    import torch

    rows = []
    for lid in layers:
        row = {"layer": lid}
        for name, (x, y) in {"a_vs_b": ("a", "b"), "a_vs_c": ("a", "c"), "b_vs_c": ("b", "c")}.items():
            num = den = 0.0
            cos_min = 1.0
            for f in feats:
                u, v = f[x][lid].float(), f[y][lid].float()
                num += float((u - v).pow(2).sum())
                den += float(v.pow(2).sum())
                cos_min = min(cos_min, float(torch.nn.functional.cosine_similarity(u, v, dim=-1).min()))
            row[name] = {"rel_l2": (num / den) ** 0.5, "cos_min": cos_min}
        rows.append(row)
    return rows


def worker(args) -> dict:
    import torch

    from remote_payload.fixtures.models import DRAFTER_TRAIN, SEED, _drafter_spec_dict
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.models.kernels import torch_linear_attention
    from remote_payload.models.spec import from_training
    from remote_payload.models.target import load_target, render_prompt

    torch.set_num_threads(args.threads)
    log = lambda msg: print(f"[kernel-path] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    target = Path(args.fixtures) / "target"
    tb = load_target(target, device="cpu", dtype="bfloat16", kernel="fla")
    tf = load_target(target, device="cpu", dtype="float32", kernel="fla")
    if tb.kernel_path != "fla" or tf.kernel_path != "fla":
        raise SystemExit(f"fla did not bind (kernel path {tb.kernel_path}): is the shim active?")
    spec = from_training(_drafter_spec_dict(tb.tokenizer.convert_tokens_to_ids("<|MASK|>")), {}, "kernel-path drafter")
    prompts, _ = load_prompts("builtin")
    samples = []
    with torch_linear_attention(tf.model):
        for p in prompts[:args.samples]:
            ids = render_prompt(tf.tokenizer, p.message_dicts(), False)
            samples.append(greedy_decode(tf, ids, args.max_new_tokens))
    layers = list(range(tb.config.num_layers))
    feats, fla_s = _features(samples, tb, tf, layers, log)
    t0 = time.perf_counter()
    weights = _train(spec, samples, feats, tf, int(DRAFTER_TRAIN["steps"]), DRAFTER_TRAIN["lr"], SEED + 2)
    train_s = time.perf_counter() - t0
    log(f"drafter trained on fla bf16 features in {train_s:.0f} s")
    rounds, flips = _evaluate(spec, weights, samples, feats, tb, tf)
    rows = _stats(rounds, spec.block_size)
    for row, r in rows.items():
        r["top1_differ_from_a"] = flips[row]
    return {"rows": rows, "drift": _drift(feats, layers), "samples": len(samples),
            "tokens": sum(len(r.tokens) for r in samples), "block_size": spec.block_size,
            "fla_extract_s": round(fla_s, 1), "train_s": round(train_s, 1),
            "worker_s": round(time.perf_counter() - started, 1), "kernels": tb.kernel_details}


# ---------------------------------------------------------------- driver (test venv)

def _fmt_ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "n/a"


def render(res: dict) -> str:
    B = res["block_size"]
    head = "| features (eval host) | τ macro [95% CI] | Δτ vs (a) [95% CI] | drafts ≠ (a) | " + " | ".join(
        f"p{k}" for k in range(1, B)) + " |"
    lines = [head, "|" + "---|" * (4 + B - 1)]
    for row, r in res["rows"].items():
        ps = " | ".join(f"{r['point'][f'p{k}']:.2f}" if r["point"][f"p{k}"] is not None else "–" for k in range(1, B))
        lines.append(f"| ({row}) {r['label']} | {r['point']['tau']:.3f} {_fmt_ci(r['ci95']['tau'])} | "
                     f"{r['delta_tau_vs_a']:+.3f} {_fmt_ci(r['delta_ci95'])} | {r['top1_differ_from_a'] * 100:.1f}% | "
                     f"{ps} |")
    lines += ["", "| layer | fla bf16 vs torch bf16 (rel L2 / min cos) | fla bf16 vs torch fp32 | "
              "torch bf16 vs torch fp32 |", "|---|---|---|---|"]
    for d in res["drift"]:
        cells = [f"{d[k]['rel_l2'] * 100:.2f}% / {d[k]['cos_min']:.4f}" for k in ("a_vs_b", "a_vs_c", "b_vs_c")]
        lines.append(f"| {d['layer']} | " + " | ".join(cells) + " |")
    cis = {row: {k: _fmt_ci(v) for k, v in r["ci95"].items()} for row, r in res["rows"].items()}
    lines.append(f"\n95% CIs of τ and p_k per row: {json.dumps(cis)}")
    return "\n".join(lines)


def driver(args) -> int:
    import subprocess

    import fla_env

    from remote_payload.fixtures import build as fx

    os.environ.setdefault("DFO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures"))
    started = time.perf_counter()
    py = fla_env.ensure_venv(log=lambda m: print(f"[kernel-path] {m}", file=sys.stderr))
    venv_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="dfo-kernel-path-") as tmp:
        fx.build(Path(tmp), ["target"], use_cache=True)
        out = Path(tmp) / "result.json"
        cmd = [str(py), str(fla_env.BOOTSTRAP), str(Path(__file__).resolve()), "--worker", "--fixtures", tmp,
               "--samples", str(args.samples), "--max-new-tokens", str(args.max_new_tokens),
               "--threads", str(args.threads), "--out", str(out)]
        proc = subprocess.run(cmd, env=fla_env.child_env(), cwd=str(REPO))
        if proc.returncode != 0:
            print(f"worker failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        res = json.loads(out.read_text())
    res["wall_s"] = round(time.perf_counter() - started, 1)
    res["venv_s"] = round(venv_s, 1)
    print(render(res))
    print(f"\n{res['samples']} samples, {res['tokens']} tokens, block {res['block_size']}; fla extraction "
          f"{res['fla_extract_s']} s, drafter training {res['train_s']} s, wall {res['wall_s']} s "
          f"(venv check/build {res['venv_s']} s)")
    print(f"command: .venv/bin/python benchmarks/kernel_path.py --samples {args.samples} "
          f"--max-new-tokens {args.max_new_tokens} --threads {args.threads}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=12, help="built-in prompts used (at most 12)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the full result JSON here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--fixtures", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not args.worker:
        return driver(args)
    res = worker(args)
    Path(args.out).write_text(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
