"""Which K to run at which load: a cost model per engine host, the profile's accept lengths, the schedule.

Cost model. At concurrency c one engine step advances every request in flight by one verify; plain decoding
is the K = 0 step. For K >= 1 the step time is modelled linear in K, ``step_s(K, c) = a(c) + b(c)·K``,
calibrated from the engine sweep's own timings: the plain server gives the K = 0 point (``c / plain
tokens/s``), each DFlash server at K gives ``c · τ_engine / DFlash tokens/s``. With two or more K timed the
line goes through the DFlash points alone: a(c) above the plain step is the drafter's own cost per step, which
a block drafter pays at any K (one drafter pass per step, of K + 1 rows; measured on vLLM-CPU: K = 1 cost nearly
what K = 7 did, twice the plain step). With one K timed, the line goes through the plain point and it. With the
profile's accept length τ(K) (measured with the block planned at K + 1 rows and counted as the engine counts:
``remote_payload/metrics/by_k.py``):
predicted speedup = τ(K) · step_s(0, c) / step_s(K, c), predicted tokens/s = c · τ(K) / step_s(K, c).
The best K per c becomes vLLM's batch-size → K schedule (``num_speculative_tokens_per_batch_size``:
``[[lo, hi, K], …]``, inclusive batch-size ranges). Pure.
"""

from __future__ import annotations

import re
from typing import Callable

CALIBRATION = ("step time per concurrency from the engine's own timings: plain decoding is K = 0 (c / plain tok/s), "
               "each DFlash measurement at K gives c · engine τ / DFlash tok/s; for K >= 1 a least-squares line "
               "through the DFlash points (its intercept above the plain step is the drafter's own cost), through "
               "the plain point and the one DFlash point when only one K was timed")


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def step_points(concurrency_rows: list[dict], k_run: int) -> dict[int, list[tuple[int, float]]]:
    """Per concurrency: [(K, seconds per step)] from the engine sweep rows (plain = K 0, DFlash at k_run and at
    any per-K timing the row carries under ``per_k``: {K: {"tokens_per_s", "mean_acceptance_length"}})."""
    out: dict[int, list[tuple[int, float]]] = {}
    for row in concurrency_rows:
        c = row.get("concurrency")
        if not isinstance(c, int) or c < 1:
            continue
        pts: list[tuple[int, float]] = []
        if _num(row.get("plain_tokens_per_s")):
            pts.append((0, c / row["plain_tokens_per_s"]))
        measured = {k_run: {"tokens_per_s": row.get("dflash_tokens_per_s"),
                            "mean_acceptance_length": row.get("mean_acceptance_length")}}
        per_k = row.get("per_k")
        if isinstance(per_k, dict):
            # A K is a small whole number in ASCII digits (str.isdigit also takes '²' and 5000-digit strings)
            measured.update({int(k): v for k, v in per_k.items()
                             if re.fullmatch(r"[0-9]{1,4}", str(k)) and isinstance(v, dict)})
        for k, m in sorted(measured.items()):
            tps, tau = m.get("tokens_per_s"), m.get("mean_acceptance_length")
            if _num(tps) and _num(tau):
                pts.append((k, c * float(tau) / float(tps)))  # type: ignore[arg-type]
        if len(pts) >= 2 and pts[0][0] == 0:
            out[c] = pts
    return out


def fit_steps(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """(plain step, a, b): step_s(K) = a + b·K for K >= 1. With two or more drafted points the line goes through
    those alone, so a - plain is the drafter's own cost per step (one drafter pass per step whatever K, of K + 1
    rows); with one, through the plain point and it (that cost then grows with K like the verify's)."""
    plain = next(s for k, s in points if k == 0)
    drafted = [p for p in points if p[0] > 0]
    a, b = fit_line(drafted if len({k for k, _ in drafted}) >= 2 else points)
    return plain, a, b


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of the least-squares line step_s = a + b·K."""
    n = len(points)
    mk = sum(k for k, _ in points) / n
    ms = sum(s for _, s in points) / n
    var = sum((k - mk) ** 2 for k, _ in points)
    b = sum((k - mk) * (s - ms) for k, s in points) / var if var else 0.0
    return ms - b * mk, b


def predict(points: dict[int, list[tuple[int, float]]], tau_at: Callable[[int], float | None],
            max_k: int) -> list[dict]:
    """Per concurrency: the fitted costs and, per K = 1..max_k, predicted tokens/s and speedup; the best K."""
    rows = []
    for c, pts in sorted(points.items()):
        plain_step, a, b = fit_steps(pts)
        per_k = []
        for k in range(1, max_k + 1):
            tau, step = tau_at(k), a + b * k
            if tau is None or step <= 0 or plain_step <= 0:
                continue
            per_k.append({"k": k, "tau": round(tau, 4), "step_ms": round(step * 1000, 3),
                          "tokens_per_s": round(c * tau / step, 2), "speedup": round(tau * plain_step / step, 3)})
        best = max(per_k, key=lambda r: r["speedup"]) if per_k else None
        rows.append({"concurrency": c, "calibration_points": [[k, round(s * 1000, 3)] for k, s in pts],
                     "plain_step_ms": round(plain_step * 1000, 3), "step_ms_intercept": round(a * 1000, 3),
                     "ms_per_extra_k": round(b * 1000, 4),
                     "per_k": per_k, "best_k": best["k"] if best else None,
                     "best_speedup": best["speedup"] if best else None})
    return rows


def schedule(rows: list[dict]) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: [[lo, hi, K], …], inclusive batch-size ranges, from
    each measured concurrency to just below the next (the last range ends at the last one measured)."""
    levels = [(r["concurrency"], r["best_k"]) for r in rows if r.get("best_k")]
    out: list[list[int]] = []
    for i, (c, k) in enumerate(levels):
        lo = 1 if i == 0 else c
        hi = levels[i + 1][0] - 1 if i + 1 < len(levels) else c
        if out and out[-1][2] == k:
            out[-1][1] = hi
        else:
            out.append([lo, hi, k])
    return out


def check(points: dict[int, list[tuple[int, float]]], tau_at: Callable[[int], float | None],
          concurrency_rows: list[dict], k_run: int) -> list[dict]:
    """Prediction beside measurement at every concurrency and K the engine ran. Held out: the line is fitted
    without that K's point when two or more others remain (plain included), so the prediction did not see it;
    otherwise ``held_out`` is False (the K is the calibration point and the error is τ's alone)."""
    measured = {r.get("concurrency"): r for r in concurrency_rows}
    out = []
    for c, pts in sorted(points.items()):
        row = measured.get(c) or {}
        per_k: dict = row["per_k"] if isinstance(row.get("per_k"), dict) else {}
        for k, _ in pts:
            if k == 0:
                continue
            at_k = row if k == k_run else (per_k.get(str(k)) or {})
            speedup, engine_tau = at_k.get("speedup"), at_k.get("mean_acceptance_length")
            tau = tau_at(k)
            others = [p for p in pts if p[0] != k]
            held_out = sum(1 for q, _ in others if q > 0) >= 2  # a drafted line without this K's point
            plain, a, b = fit_steps(others if held_out else pts)
            if tau is None or not isinstance(speedup, (int, float)) or speedup <= 0 or a + b * k <= 0:
                continue
            pred = round(tau * plain / (a + b * k), 3)
            out.append({"concurrency": c, "k": k, "predicted_speedup": pred, "measured_speedup": speedup,
                        "relative_error": round((pred - speedup) / speedup, 4), "held_out": held_out,
                        "profile_tau": round(tau, 4), "engine_tau": engine_tau})
    return out


def plan_for_drafter(engine_block: dict, tau_at: Callable[[int], float | None], max_k: int) -> dict | None:
    """The K plan of one drafter's engine block (results.json drafters[NAME].engine), or None without a sweep."""
    k_run = engine_block.get("num_speculative_tokens")
    rows = [r for r in (engine_block.get("concurrency") or []) if isinstance(r, dict)]
    if not isinstance(k_run, int) or not rows:
        return None
    pts = step_points(rows, k_run)
    if not pts:
        return None
    predicted = predict(pts, tau_at, max_k)
    return {"calibration": CALIBRATION, "k_measured": sorted({k for p in pts.values() for k, _ in p if k}),
            "predicted": predicted, "num_speculative_tokens_per_batch_size": schedule(predicted),
            "check": check(pts, tau_at, rows, k_run)}


def k_plans(results: dict, samples: list[dict]) -> dict[str, dict]:
    """Every drafter's K plan, from its profile's accept lengths and its engine block's sweep."""
    from orchestrator.evaluation.profile import accept_length_at, build_profile

    plans = {}
    drafters = results.get("drafters")
    for name, d in (drafters if isinstance(drafters, dict) else {}).items():
        engine = d.get("engine") if isinstance(d, dict) else None
        if not isinstance(engine, dict) or engine.get("error"):
            continue
        try:
            profile = build_profile(results, samples, name)
        except Exception:  # noqa: BLE001 - a drafter without a block size has no profile, hence no plan
            continue
        def tau_at(k: int, p: dict = profile) -> float | None:
            return accept_length_at(p, k)

        plan = plan_for_drafter(engine, tau_at, profile["max_supported_k"])
        if plan is not None:
            plans[name] = plan
    return plans


def k_plan_markdown(plans: dict[str, dict], md_text: Callable[[object], str]) -> list[str]:
    """The report's K table: per drafter and concurrency the best K, its predicted speedup, the schedule and,
    at the K the engine ran, prediction beside measurement."""
    if not plans:
        return []
    out = ["", "## K per concurrency (predicted)", "", CALIBRATION + ".", "",
           "| drafter | requests in flight | best K | predicted speedup at best K | predicted tok/s | "
           "K measured | predicted speedup there | measured | error |", "|---|---|---|---|---|---|---|---|---|"]
    for name, plan in plans.items():
        for row in plan["predicted"]:
            best: dict = next((p for p in row["per_k"] if p["k"] == row["best_k"]), {})
            checks = [c for c in plan["check"] if c["concurrency"] == row["concurrency"]] or [{}]
            for c in checks:
                err = c.get("relative_error")
                out.append(f"| {md_text(name)} | {row['concurrency']} | {row['best_k']} | {best.get('speedup')}× | "
                           f"{best.get('tokens_per_s')} | {c.get('k', '–')}"
                           + ("" if c.get("held_out", True) else " (calibration)")
                           + f" | {c.get('predicted_speedup', '–')}× | {c.get('measured_speedup', '–')}× | "
                           + (f"{err * 100:+.1f}%" if isinstance(err, (int, float)) else "–") + " |")
        out += ["", f"{md_text(name)}: vLLM schedule `num_speculative_tokens_per_batch_size` = "
                f"`{plan['num_speculative_tokens_per_batch_size']}`"]
    return out
