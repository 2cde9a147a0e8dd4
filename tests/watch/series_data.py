"""Synthetic but valid eval results for the watch unit tests: samples.jsonl lines whose rounds form a
complete replay (as the payload writes them), and the matching results.json drafter block."""

from __future__ import annotations

import random

BLOCK = 8


def _rounds(prompt_tokens: int, continuation_tokens: int, accept: float, rng: random.Random) -> dict:
    last = prompt_tokens + continuation_tokens - 1
    anchor, anchors, accepted, produced = prompt_tokens, [], [], []
    while anchor < last:
        remaining = last - anchor
        acc = min(remaining, sum(1 for _ in range(BLOCK - 1) if rng.random() < accept))
        prod = min(acc + 1, remaining)
        anchors.append(anchor)
        accepted.append(acc)
        produced.append(prod)
        anchor += prod
    return {"tau": sum(produced) / len(produced), "rounds": len(produced), "anchors": anchors,
            "accepted": accepted, "produced": produced}


def samples(drafter: str, accept: float, n: int = 8, seed: int = 0) -> list[dict]:
    """``accept``: the chance that each draft position is accepted (higher = a better drafter)."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        pt, ct = 20 + i, 40 + 3 * i
        chain = _rounds(pt, ct, accept, rng)
        tree = _rounds(pt, ct, min(0.98, accept + 0.2), rng)
        lines.append({"index": i, "id": f"p{i}", "prompt_tokens": pt, "continuation_tokens": ct,
                      "drafters": {drafter: {**chain, "tree": {"topk": {"k": 8, **tree}}}}})
    return lines


def results(drafter: str, lines: list[dict], step: int | None = None) -> dict:
    entries = [line["drafters"][drafter] for line in lines]
    produced = [p for e in entries for p in e["produced"]]
    tree = [e["tree"]["topk"]["tau"] for e in entries]
    per_position = []
    for k in range(1, BLOCK):
        hits = sum(1 for e in entries for a in e["accepted"] if a >= k)
        per_position.append({"k": k, "p": hits / len(produced)})
    metrics = {"tau_macro": sum(e["tau"] for e in entries) / len(entries), "tau_micro": sum(produced) / len(produced),
               "tree": {"topk": {"k": 8, "tau_macro": sum(tree) / len(tree)}}, "per_position": per_position,
               "block_size": BLOCK, "samples": len(entries), "rounds": len(produced)}
    return {"drafters": {drafter: {"metrics": metrics, "source": {"step": step}}}}


def entry(step: int, tau: float = 2.0, *, status: str = "done", verdict: str = "flat") -> dict:
    """A done (or failed) series entry with measures of the shape ``measures.measure`` returns."""
    def stat(v: float) -> dict:
        return {"value": round(v, 4), "ci": [round(v - 0.2, 4), round(v + 0.2, 4)]}

    e = {"name": f"step_{step}.pt", "path": f"/ck/step_{step}.pt", "step": step, "step_source": "name",
         "status": status, "attempts": 1, "observed": {"size": 10, "mtime": 1.0}, "started_utc": "2026-01-01T00:00:00Z",
         "run": f"run-{step}", "superseded_runs": []}
    if status == "failed":
        return {**e, "error": "eval: corrupt"}
    e["measures"] = {"samples": 8, "rounds": 40, "tau_macro": stat(tau), "tau_micro": stat(tau - 0.1),
                     "ddtree": {"k": 8, **stat(tau + 2)}, "p": [{"k": k, **stat(0.9 / k)} for k in range(1, 5)],
                     "conventions": {"zlab-2604": tau + 0.05, "vllm": tau + 0.1},
                     "by_dataset": {"humaneval": {"samples": 4, "tau_macro": stat(tau + 0.3)}}}
    e["verdict"] = {"verdict": verdict, "against": None, "delta": 0.0, "ci": [-0.1, 0.1],
                    "regression": verdict == "down", "plateau": False, "paired_samples": 8}
    return e
