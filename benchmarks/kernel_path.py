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
difference to (a), and the per-layer hidden-state drift between the paths. The experiment itself is
remote_payload/diagnose/gpu_kit/kernel_path.py; scripts/gpu-check.sh runs the same code on a GPU's real kernels.

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


# ---------------------------------------------------------------- worker (fla venv, shim active)

def worker(args) -> dict:
    import torch

    from remote_payload.diagnose.gpu_kit import kernel_path

    torch.set_num_threads(args.threads)
    log = lambda msg: print(f"[kernel-path] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    res = kernel_path.run(Path(args.fixtures) / "target", device="cpu", kernel="fla", n_samples=args.samples,
                          max_new_tokens=args.max_new_tokens, train_steps=None, resamples=1000, progress=log)
    if res["kernel_path"] != "fla":
        raise SystemExit(f"fla did not bind (kernel path {res['kernel_path']}): is the shim active?")
    return res


# ---------------------------------------------------------------- driver (test venv)

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
    from remote_payload.diagnose.gpu_kit.kernel_path import render

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
