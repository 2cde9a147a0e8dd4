"""--on-result for Weights & Biases: each evaluated checkpoint's τ as W&B metrics at its training step.

    dfo watch … --on-result 'python3 /path/to/dfo/orchestrator/watch/examples/wandb_on_result.py'

Run it with a Python that has ``wandb`` (``pip install wandb``; logged in, or WANDB_API_KEY set). The result
JSON arrives on stdin (docs/watch.md). By default it logs into a run of its own per series (project
``$WANDB_PROJECT``, default ``dfo``; run id ``dfo-<series>``, resumed each time). Set ``WANDB_RUN_ID`` to the
trainer's run id to put τ into the trainer's own run, beside the loss. The x axis is ``trainer/global_step``
(W&B wants one growing step per run: the trainer owns it, so τ declares its own step metric). The metric
names are the TensorBoard tags `dfo watch --tensorboard` writes. A failed checkpoint logs nothing.
"""

import json
import os
import re
import sys


def metrics(result):
    """{name: value} of a done checkpoint's result (the names of orchestrator/watch/tensorboard.py)."""
    m = result.get("measures") or {}

    def value(stat):
        return stat.get("value") if isinstance(stat, dict) else None

    def part(name):
        return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:64] or "_"

    out = {"dflash/tau_macro": value(m.get("tau_macro")), "dflash/tau_micro": value(m.get("tau_micro"))}
    for name, v in (m.get("conventions") or {}).items():
        out["dflash/tau_" + part(name)] = v
    tree = m.get("ddtree") or {}
    out["dflash/ddtree_%s" % (tree.get("k") or 8)] = value(tree)
    for p in m.get("p") or []:
        out["dflash/p%s" % p.get("k")] = value(p)
    for name, d in sorted((m.get("by_dataset") or {}).items()):
        out["dflash_dataset/" + part(name)] = value((d or {}).get("tau_macro"))
    for name, b in sorted((result.get("baselines") or {}).items()):
        out["dflash_baseline/" + part(name)] = value((b or {}).get("tau_macro"))
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def main():
    result = json.load(sys.stdin)
    if result.get("status") != "done":
        return 0
    import wandb

    run_id = os.environ.get("WANDB_RUN_ID") or "dfo-" + str(result["series"])
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", "dfo"), id=run_id, resume="allow",
                     name=os.environ.get("WANDB_NAME") or run_id)
    run.define_metric("trainer/global_step")
    run.define_metric("dflash*", step_metric="trainer/global_step")
    run.log({"trainer/global_step": int(result["step"]), **metrics(result)})
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
