"""The cost of ``--card`` and ``--explain`` on the fixtures: seconds of the whole eval and of its card stage.

    .venv/bin/python benchmarks/card_explain_cost.py [--max-new-tokens 160] [--threads 1] [--out F.json]

The tiny target and z-lab-format drafter, the 12 built-in prompts, fp32 on the CPU, a cold reference/feature
cache (a temporary folder). In order, in one cache: the eval without a card; ``--card`` with that run's own τ as
the figure (reproduced: the verdict alone); the same card with ``--explain`` (every knob measured although nothing
is to be explained: the reruns decode cold); a card whose figure is τ with thinking on (measured in a cache of its
own) and thinking left unknown (above: ``--explain`` runs by itself; its reruns read back what the run before
decoded, as a second ``--explain`` on the same rows does). Printed, not asserted: each run's wall seconds, its card
stage's seconds and each rerun's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from fixture_pair import emit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

CARD = """card: bench
source: benchmarks/card_explain_cost.py
target: {{name: fixture-target}}
drafter: {{name: fixture-zlab-drafter}}
figure: {{tau: {tau!r}, ci: null, n: 12}}
count: committed
aggregation: per_request
protocol:
  dataset: builtin
  n: 12
  thinking: {thinking}
  temperature: 0.0
  max_new_tokens: {max_new}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="also write the figures as JSON here")
    args = ap.parse_args()

    from remote_payload.models import kernels

    kernels.apply_policy("cpu")
    import torch

    from remote_payload.cli import build_parser
    from remote_payload.eval.pipeline import run_eval
    from remote_payload.eval.settings import settings_from_values
    from remote_payload.fixtures import build

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="dfo-card-cost-"))
    fx = work / "fixtures"
    build.build(fx, ["target", "zlab-drafter"])
    cache, other_cache = work / "cache", work / "figure-cache"

    def run(name: str, *extra, cache_dir: Path = cache) -> tuple[dict, float]:
        argv = ["eval", "--target", fx / "target", "--drafter", f"z={fx / 'zlab-drafter'}", "--dtype", "float32",
                "--max-new-tokens", args.max_new_tokens, "--cache-dir", cache_dir, "--out", work / name, *extra]
        t0 = time.perf_counter()
        results = run_eval(settings_from_values(vars(build_parser().parse_args(list(map(str, argv))))))
        return results, round(time.perf_counter() - t0, 1)

    def card(name: str, tau: float, thinking: str) -> Path:
        path = work / f"{name}.yaml"
        path.write_text(CARD.format(tau=tau, thinking=thinking, max_new=args.max_new_tokens))
        return path

    def stage(results: dict) -> dict:
        block = results["card"]
        return {"verdict": block["verdict"], "card_stage_s": block["seconds"],
                "reruns_s": {f"{e['knob']} {e['setting']}": e["seconds"] for e in block.get("explain", [])
                             if "seconds" in e},
                "skipped": block.get("explain_skipped", [])}

    plain, plain_s = run("plain")
    tau = plain["drafters"]["z"]["metrics"]["tau_macro"]
    reproduced, reproduced_s = run("reproduced", "--card", card("own", tau, "off"))
    explained, explained_s = run("explained", "--card", card("own", tau, "off"), "--explain")
    on, _ = run("figure-on", "--enable-thinking", cache_dir=other_cache)
    gap, gap_s = run("gap", "--card", card("on", on["drafters"]["z"]["metrics"]["tau_macro"], "unknown"))
    emit({"max_new_tokens": args.max_new_tokens, "threads": args.threads, "prompts": 12,
          "no_card": {"run_s": plain_s},
          "card_reproduced": {"run_s": reproduced_s, **stage(reproduced)},
          "card_reproduced_explain": {"run_s": explained_s, **stage(explained)},
          "card_thinking_unknown": {"run_s": gap_s, **stage(gap)}}, args.out)


if __name__ == "__main__":
    main()
