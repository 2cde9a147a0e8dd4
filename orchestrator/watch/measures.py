"""A checkpoint's headline numbers with confidence intervals, and the verdict against the previous best.

Pure: results.json and samples.jsonl content in, numbers out. The point values are the run's own
(``results["drafters"][NAME]["metrics"]``); the 95% CIs are percentile bootstraps over samples (a
sample's rounds stay together), computed here from the per-sample rounds because a run reports CIs only
for differences between its own drafters. The verdict pairs the checkpoint with the previous best by
prompt id: every checkpoint of a series is evaluated on the same prompts and reference continuations. On
benchmark datasets each dataset also gets its own τ with CI and its own verdict (``by_dataset``).
"""

from __future__ import annotations

import math

from orchestrator.core.errors import InputError
from remote_payload.metrics.sample_rounds import rounds_from_entry
from remote_payload.metrics.stats import bootstrap_cis, bootstrap_mean_ci, mean

POSITIONS = 4          # p1..p4 in the series
TREE_K_MAX = 4096      # DDTree's top-k: a small count (8 in the reports); it names TensorBoard tags and hook metrics
PLATEAU_WINDOW = 3     # this many "flat" verdicts in a row make a plateau
VERDICTS = ("first", "up", "flat", "down")


def _rows(samples: list[dict], drafter: str, positions: int) -> list[list[float]]:
    """Per sample: [τ, Σproduced, rounds, DDTree τ, hits_1..k, eligible_1..k] (additive but τ columns)."""
    rows = []
    for line in samples:
        entry = (line.get("drafters") or {}).get(drafter)
        if entry is None or not entry.get("rounds"):
            continue
        sid = line.get("id", line.get("index"))
        pt, ct = int(line["prompt_tokens"]), int(line["continuation_tokens"])
        try:
            rounds = rounds_from_entry(entry, pt, ct, f"sample {sid}, drafter '{drafter}'")
            topk = (entry.get("tree") or {}).get("topk")
            tree = rounds_from_entry(topk, pt, ct, f"sample {sid}, tree") if topk else None
        except Exception as exc:  # PayloadError from the shared reader: bad input for the watcher
            raise InputError(f"samples.jsonl: {exc}") from None
        produced = sum(r.produced for r in rounds)
        tree_tau = sum(r.produced for r in tree) / len(tree) if tree else float("nan")
        hits = [sum(1 for r in rounds if r.accepted >= k) for k in range(1, positions + 1)]
        eligible = [sum(1 for r in rounds if r.remaining >= k) for k in range(1, positions + 1)]
        rows.append([produced / len(rounds), produced, len(rounds), tree_tau, *hits, *eligible])
    return rows


def _number(value: object, what: str, drafter: str) -> float | None:
    """A headline value as the series stores, compares and prints it: a finite number, or None."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)):
        return value
    raise InputError(f"results.json: {what} of drafter {drafter!r} is {value!r:.40}, not a number")


def _tree_k(value: object, drafter: str) -> int | None:
    """DDTree's k as the series stores it: an int in 1..TREE_K_MAX, or None (no tree); it becomes part of the
    TensorBoard tag and the W&B/MLflow metric name, so nothing else a host writes there gets through."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= TREE_K_MAX):
        return value
    raise InputError(f"results.json: the DDTree k of drafter {drafter!r} is {value!r:.40}, not a whole number "
                     f"from 1 to {TREE_K_MAX}")


def measure(results: dict, samples: list[dict], drafter: str) -> dict:
    """τ macro, τ micro, DDTree-k and p1..p4 of ``drafter`` with their bootstrap CIs.

    The run's files came from the eval host: a shape this code does not read is an InputError (the
    watcher records the checkpoint as failed), never a traceback that a restarted watcher would repeat."""
    try:
        return _measure(results, samples, drafter)
    except (AttributeError, TypeError, KeyError, ValueError, IndexError, OverflowError) as exc:
        raise InputError(f"results.json / samples.jsonl: unexpected content for drafter {drafter!r} "
                         f"({type(exc).__name__}: {exc})") from None


def _measure(results: dict, samples: list[dict], drafter: str) -> dict:
    d = (results.get("drafters") or {}).get(drafter)
    if d is None:
        raise InputError(f"results.json has no drafter {drafter!r} (has: {', '.join(results.get('drafters') or {})})")
    m = d.get("metrics") or {}
    topk = (m.get("tree") or {}).get("topk") or {}
    positions = {p["k"]: p.get("p") for p in m.get("per_position", [])}
    k = min(POSITIONS, max(1, int(m.get("block_size") or POSITIONS + 1) - 1))
    rows = _rows(samples, drafter, k)
    have_tree = bool(rows) and all(r[3] == r[3] for r in rows)  # NaN marks a sample without tree rounds

    def statistic(idx):
        tot = [sum(rows[i][j] for i in idx) for j in range(4 + 2 * k)] if idx else [0.0] * (4 + 2 * k)
        n = len(idx)
        out = {"tau_macro": tot[0] / n if n else None, "tau_micro": tot[1] / tot[2] if tot[2] else None,
               "ddtree": tot[3] / n if n and have_tree else None}
        for j in range(k):
            out[f"p{j + 1}"] = tot[4 + j] / tot[4 + k + j] if tot[4 + k + j] else None
        return out

    cis = bootstrap_cis(len(rows), statistic) if rows else {}

    def value(v, name):
        ci = cis.get(name)
        return {"value": _number(v, name, drafter), "ci": [round(ci[0], 4), round(ci[1], 4)] if ci else None}

    by_dataset = dataset_measures(samples, drafter)
    conventions = {name: _number(c.get("tau_macro"), f"τ macro ({name})", drafter)
                   for name, c in (m.get("conventions") or {}).items()
                   if name != "committed" and isinstance(c, dict) and c.get("available", True)
                   and "alias_of" not in c}  # zlab = committed: its value is tau_macro
    return {
        **({"by_dataset": by_dataset} if by_dataset else {}),
        # point values: τ macro the way of z-lab's April loop (zlab-2604), vLLM's
        **({"conventions": conventions} if conventions else {}),
        "samples": m.get("samples"), "rounds": m.get("rounds"),
        "tau_macro": value(m.get("tau_macro"), "tau_macro"),
        "tau_micro": value(m.get("tau_micro"), "tau_micro"),
        "ddtree": {"k": _tree_k(topk.get("k"), drafter), **value(topk.get("tau_macro"), "ddtree")},
        "p": [{"k": j, **value(positions.get(j), f"p{j}")} for j in range(1, k + 1)],
    }


def per_sample_tau(samples: list[dict], drafter: str) -> dict[str, float]:
    out = {}
    for line in samples:
        try:
            tau = _number(((line.get("drafters") or {}).get(drafter) or {}).get("tau"), "a sample's tau", drafter)
        except (AttributeError, TypeError) as exc:
            raise InputError(f"samples.jsonl: unexpected content for drafter {drafter!r} ({exc})") from None
        if tau is not None:
            out[str(line.get("id", line.get("index")))] = float(tau)
    return out


def judge(current: dict[str, float], best: dict[str, float] | None, *, best_name: str | None,
          recent: list[str]) -> dict:
    """Up / flat / down against the previous best: the paired Δτ macro and its CI over common prompts.

    ``recent``: the verdicts of the checkpoints before this one, oldest first (for the plateau flag).
    """
    if best is None:
        return {"verdict": "first", "against": None, "delta": None, "ci": None, "regression": False,
                "plateau": False, "paired_samples": 0}
    common = sorted(set(current) & set(best))
    diffs = [current[i] - best[i] for i in common]
    ci = bootstrap_mean_ci(diffs)
    if ci is None:
        word = "flat"  # too few samples to call a move
    elif ci[0] > 0:
        word = "up"
    elif ci[1] < 0:
        word = "down"
    else:
        word = "flat"
    history = [v for v in recent if v != "first"] + [word]
    plateau = len(history) >= PLATEAU_WINDOW and all(v == "flat" for v in history[-PLATEAU_WINDOW:])
    delta = mean(diffs)
    return {"verdict": word, "against": best_name, "delta": round(delta, 4) if delta is not None else None,
            "ci": [round(ci[0], 4), round(ci[1], 4)] if ci else None, "regression": word == "down",
            "plateau": plateau, "paired_samples": len(common)}


def verdict_text(v: dict) -> str:
    if v["verdict"] == "first":
        return "first checkpoint of the series"
    ci = f" [{v['ci'][0]:+.2f}, {v['ci'][1]:+.2f}]" if v.get("ci") else " (no CI: too few samples)"
    delta = f"{v['delta']:+.2f}" if v.get("delta") is not None else "?"
    text = {"up": "up", "flat": "flat", "down": "DOWN (regression)"}[v["verdict"]]
    out = f"{text}: Δτ macro {delta}{ci} vs best so far {v['against']}"
    return out + ("; plateau" if v.get("plateau") else "")


# ------------------------------------------------------------------------------ per benchmark dataset


def dataset_taus(samples: list[dict], drafter: str) -> dict[str, dict[str, float]]:
    """{dataset: {sample id: τ}} for runs on benchmark datasets ({} for a prompt set)."""
    groups: dict[str, list[dict]] = {}
    for line in samples:
        dataset = line.get("dataset") if isinstance(line, dict) else None
        if isinstance(dataset, str):
            groups.setdefault(dataset, []).append(line)
    return {d: per_sample_tau(lines, drafter) for d, lines in groups.items()}


def dataset_measures(samples: list[dict], drafter: str) -> dict:
    """Per dataset: τ macro (committed) with its bootstrap CI over the dataset's samples: one curve each."""
    out = {}
    for dataset, taus in dataset_taus(samples, drafter).items():
        values = list(taus.values())
        ci = bootstrap_mean_ci(values)
        out[dataset] = {"samples": len(values),
                        "tau_macro": {"value": mean(values), "ci": [round(ci[0], 4), round(ci[1], 4)] if ci else None}}
    return out


def judge_datasets(current: dict[str, dict[str, float]], best: dict[str, dict[str, float]] | None, *,
                   best_name: str | None, recent: dict[str, list[str]]) -> dict:
    """A checkpoint's verdict on each dataset against the previous best, paired inside the dataset."""
    return {d: judge(taus, (best or {}).get(d) if best is not None else None, best_name=best_name,
                     recent=recent.get(d, [])) for d, taus in current.items()}


def recent_dataset_verdicts(entries: list[dict]) -> dict[str, list[str]]:
    """{dataset: verdicts oldest first} of earlier checkpoints (``entries``: done entries before this step)."""
    out: dict[str, list[str]] = {}
    for e in entries:
        for d, v in ((e.get("verdict") or {}).get("by_dataset") or {}).items():
            out.setdefault(d, []).append(v.get("verdict"))
    return out
