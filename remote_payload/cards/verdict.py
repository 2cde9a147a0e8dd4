"""The verdict of a measurement against a card: τ in the card's count and aggregation with its 95 % CI over
prompts, the published figure, their difference, and ``reproduced`` / ``below`` / ``above``. Pure stdlib, from
the sample lines (the payload writes it; the controller recomputes it over merged shards).

Per response i the count gives (τ_i, tokens_i, rounds_i) and each aggregation is a ratio of sums:
``per_request`` Σ τ_i / n (z-lab's mean over responses), ``token_weighted`` Σ tokens_i τ_i / Σ tokens_i,
``pooled`` Σ tokens_i / Σ rounds_i (an engine's counters over the whole run). The CI is the cluster bootstrap of
metrics/sampled.py: a prompt's draws at T > 0 are resampled together.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any, Sequence

from remote_payload.cards.schema import UNKNOWN, Card
from remote_payload.metrics.sampled import cluster_sums, clusters_of
from remote_payload.metrics.stats import bootstrap_cis

HEADLINE_COUNT, HEADLINE_AGGREGATION = "committed", "per_request"  # dfo's τ macro: what an unknown count is read as
Z95 = NormalDist().inv_cdf(0.975)
RULE = ("reproduced: the published figure inside the measured 95 % CI (or, when the card gives a CI, the two CIs "
        "overlap); below / above: the measurement is lower / higher than that")


def response_figures(line: dict, name: str, count: str, rule: str) -> tuple[float, float, float] | None:
    """(τ, tokens, rounds) of one response in COUNT; ``rule`` "sampled" reads the sampled rule's expectations
    where the line has them (the committed count), "greedy" the replay of the greedy drafts."""
    entry = (line.get("drafters") or {}).get(name)
    if not isinstance(entry, dict):
        return None
    if count in ("committed", "zlab"):
        produced = entry.get("produced")
        sampled = entry.get("sampled_rule") if rule == "sampled" else None
    else:
        produced = ((entry.get("conventions") or {}).get(count) or {}).get("produced")
        sampled = None
    if not isinstance(produced, list) or not produced or not all(_real(p) for p in produced):
        return None
    tokens = float(sum(produced))
    if isinstance(sampled, dict) and _real(sampled.get("tau")) and _real(sampled.get("rounds")):
        return float(sampled["tau"]), tokens, float(sampled["rounds"])
    return tokens / len(produced), tokens, float(len(produced))


def figure(lines: Sequence[dict], name: str, count: str, aggregation: str, rule: str, *, seed: int = 0,
           drop_last_round: bool = False) -> dict | None:
    """{value, ci, samples} of drafter NAME in COUNT and AGGREGATION over ``lines``; None without rounds.
    ``drop_last_round``: each response's last round left out (a harness that counts full rounds only)."""
    rows, kept = [], []
    for line in lines:
        got = _trimmed(line, name, count) if drop_last_round else response_figures(line, name, count, rule)
        if got is None:
            continue
        tau, tokens, rounds = got
        rows.append(_terms(aggregation, tau, tokens, rounds))
        kept.append(line)
    return ratio_figure(rows, clusters_of(kept), seed)


def by_k_figure(lines: Sequence[dict], name: str, k: int, aggregation: str, *, seed: int = 0) -> dict | None:
    """The accept length at K drafts per step (the profile's per-K replay, ``by_k`` of each line)."""
    rows, kept = [], []
    for line in lines:
        rec = (((line.get("drafters") or {}).get(name) or {}).get("by_k") or {})
        pair = rec.get(str(k), rec.get(k)) if isinstance(rec, dict) else None
        if not isinstance(pair, list) or len(pair) != 2 or not all(_real(v) for v in pair) or not pair[0]:
            continue
        rounds, accepted = float(pair[0]), float(pair[1])
        tokens = rounds + accepted
        rows.append(_terms(aggregation, tokens / rounds, tokens, rounds))
        kept.append(line)
    return ratio_figure(rows, clusters_of(kept), seed)


def ratio_figure(rows: list[list[float]], clusters: list[int], seed: int) -> dict | None:
    if not rows:
        return None
    renumber = {c: j for j, c in enumerate(dict.fromkeys(clusters))}
    sums = cluster_sums(rows, [renumber[c] for c in clusters])
    value = _ratio(sum(r[0] for r in sums), sum(r[1] for r in sums))
    ci = bootstrap_cis(len(sums), lambda idx: {"r": _ratio(sum(sums[i][0] for i in idx),
                                                           sum(sums[i][1] for i in idx))}, seed=seed).get("r")
    return {"value": value, "ci": [ci[0], ci[1]] if ci else None, "samples": len(rows), "prompts": len(sums)}


def judge(measured: dict, card: Card) -> dict:
    """The verdict block: measured, published, difference with its CI, and the word."""
    pub = card.figure
    value, ci = measured["value"], measured.get("ci")
    diff = value - pub.tau
    if ci is None:
        word, diff_ci = ("reproduced" if math.isclose(value, pub.tau, abs_tol=1e-9)
                         else "below" if value < pub.tau else "above"), None
    elif pub.ci is not None:
        overlap = ci[0] <= pub.ci[1] and pub.ci[0] <= ci[1]
        word = "reproduced" if overlap else "below" if value < pub.tau else "above"
        half = math.hypot((ci[1] - ci[0]) / 2, (pub.ci[1] - pub.ci[0]) / 2)  # normal approximation of both CIs
        diff_ci = [diff - half, diff + half]
    else:
        word = "reproduced" if ci[0] <= pub.tau <= ci[1] else "below" if ci[1] < pub.tau else "above"
        diff_ci = [ci[0] - pub.tau, ci[1] - pub.tau]
    return {"measured": measured, "published": {"tau": pub.tau, "ci": list(pub.ci) if pub.ci else None,
                                                "n": pub.n},
            "difference": {"value": diff, "ci": diff_ci}, "verdict": word, "rule": RULE}


def count_of(card: Card) -> str:
    return HEADLINE_COUNT if card.count in (UNKNOWN, "zlab") else card.count


def aggregation_of(card: Card) -> str:
    return HEADLINE_AGGREGATION if card.aggregation == UNKNOWN else card.aggregation


def verdict_line(block: dict) -> str:
    """"τ 4.09 [3.90, 4.27] (committed, per_request) vs published 1.29: above, Δ +2.80 [+2.61, +2.98]"."""
    m, d = block["measured"], block["difference"]
    ci = f" [{m['ci'][0]:.2f}, {m['ci'][1]:.2f}]" if m.get("ci") else ""
    dci = f" [{d['ci'][0]:+.2f}, {d['ci'][1]:+.2f}]" if d.get("ci") else ""
    return (f"card {block['card']}: τ {m['value']:.2f}{ci} ({block['count']}, {block['aggregation']}) vs published "
            f"{block['published']['tau']:g}: {block['verdict']}, Δ {d['value']:+.2f}{dci}")


def _terms(aggregation: str, tau: float, tokens: float, rounds: float) -> list[float]:
    if aggregation == "token_weighted":
        return [tokens * tau, tokens]
    if aggregation == "pooled":
        return [tokens, rounds]
    return [tau, 1.0]


def _trimmed(line: dict, name: str, count: str) -> tuple[float, float, float] | None:
    entry = (line.get("drafters") or {}).get(name) or {}
    produced = entry.get("produced") if count in ("committed", "zlab") else \
        ((entry.get("conventions") or {}).get(count) or {}).get("produced")
    if not isinstance(produced, list) or len(produced) < 2 or not all(_real(p) for p in produced):
        return None
    kept = produced[:-1]
    return sum(kept) / len(kept), float(sum(kept)), float(len(kept))


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
