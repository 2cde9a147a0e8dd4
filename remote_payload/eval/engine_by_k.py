"""The engine's acceptance at K beside the profile's figure at K: ``drafters[NAME].engine.by_k_check[K]``.

The engine stage serves each drafter at its full block (K = B - 1) and, with ``--engine-k``, at smaller K (one
server each). At every such K the engine's per-request acceptance (each reply's own counters at the lowest
concurrency, summed: 1 + accepted drafts / steps) is set beside ``accept_length_by_k[K]``, the offline figure
the profile carries (the drafter run at a block of K + 1 rows, counted as the engine counts:
``metrics/by_k.py``), and its 95% CI. Inside the CI: the card describes what this engine does at K. At T > 0
the engine samples while the offline per-K figure follows the greedy drafts, so nothing is compared there.
"""

from __future__ import annotations

from remote_payload.eval.context import EvalContext


def record(ctx: EvalContext, name: str, block: dict, k: int, run: dict) -> None:
    """Set ``block["by_k_check"][K]`` from the engine sweep ``run`` at K; warn when the engine lies outside the
    profile's CI."""
    out = compare_at(ctx, name, k, run)
    block.setdefault("by_k_check", {})[str(k)] = out
    if out.get("within_ci") is False:
        ctx.warn(f"engine at K = {k} for '{name}': accept length {out['engine_mean_accept_length']:.3f} per step "
                 f"outside the profile's accept_length_by_k[{k}] = {out['profile_mean_accept_length']:.3f} "
                 f"(95% CI {out['profile_ci95'][0]:.3f} .. {out['profile_ci95'][1]:.3f})")


def compare_at(ctx: EvalContext, name: str, k: int, run: dict) -> dict:
    by_k = ctx.results[name].summary["metrics"].get("accept_length_by_k") or {}
    offline = (by_k.get("by_k") or {}).get(str(k)) or {}
    lowest = run["levels"][0]
    specs = [rec.get("spec") or {} for rec in lowest["samples"]]
    rounds = sum(int(s.get("rounds") or 0) for s in specs)
    accepted = sum(int(s.get("drafts_accepted") or 0) for s in specs)
    per_request = [1 + int(s.get("drafts_accepted") or 0) / int(s["rounds"]) for s in specs if s.get("rounds")]
    engine = 1 + accepted / rounds if rounds else None
    ci = offline.get("ci95")
    out = {"k": k, "concurrency": lowest["concurrency"], "engine_rounds": rounds,
           "engine_mean_accept_length": round(engine, 6) if engine is not None else None,
           "engine_mean_accept_length_per_request":
               round(sum(per_request) / len(per_request), 6) if per_request else None,
           "profile_mean_accept_length": offline.get("mean_accept_length"), "profile_ci95": ci,
           "profile_method": by_k.get("method"), "within_ci": None}
    if ctx.settings.sampled:
        out["note"] = ("at T > 0 the engine samples while the offline per-K figure follows the greedy drafts: "
                       "not compared")
    elif engine is not None and isinstance(ci, list) and len(ci) == 2:
        out["within_ci"] = ci[0] <= engine <= ci[1]
    return out
