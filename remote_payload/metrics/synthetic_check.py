"""The engine's synthetic sampler against a profile: does the engine replay the card's marginal rates?

vLLM's synthetic rejection sampler (``rejection_sample_method: synthetic``) accepts draft i of a round with
the conditional rate m_i / m_(i-1), whatever the draft is, so a round accepts at least i drafts with
probability m_i (the card's marginal rate at position i). Rounds are independent draws, hence the engine's
mean accept length over n rounds estimates 1 + Σ m_i with standard error sd(A) / √n, where A (accepted drafts
per round) has P(A ≥ i) = m_i: E[A] = Σ m_i and E[A²] = Σ (2i - 1) m_i. The check passes when the measured
mean lies within ``Z`` standard errors of the card's mean (and each position's rate within ``Z`` binomial
standard errors). Pure: numbers in, a dict out.
"""

from __future__ import annotations

import math
from typing import Sequence

Z = 3.0  # standard errors allowed: a correct engine fails about 3 runs in 1000 by chance
DEFINITION = ("the engine serves the drafter with vLLM's synthetic sampler fed the profile's marginal rates; its "
              f"mean accept length (1 + accepted / rounds) must lie within {Z:g} standard errors of 1 + Σ marginals")


def marginal_rates(rounds: Sequence[Sequence[int]], positions: int) -> list[float]:
    """m_i for i = 1..positions: the share of rounds that accepted at least i drafts (the profile's rates)."""
    flat = [a for per_sample in rounds for a in per_sample]
    if not flat:
        return [0.0] * positions
    return [round(sum(1 for a in flat if a >= i) / len(flat), 6) for i in range(1, positions + 1)]


def accepted_sd(marginals: Sequence[float]) -> float:
    """Standard deviation of accepted drafts per round when P(A >= i) = marginals[i - 1]."""
    mean = sum(marginals)
    second = sum((2 * i - 1) * m for i, m in enumerate(marginals, 1))
    return math.sqrt(max(0.0, second - mean * mean))


def check(marginals: Sequence[float], rounds: int, accepted: int, per_position_counts: Sequence[int]) -> dict:
    """The engine's totals under the synthetic sampler against the marginals it was fed."""
    expected = 1 + sum(marginals)
    if rounds <= 0:
        return {"expected_mean": round(expected, 6), "measured_mean": None, "rounds": 0, "within": False,
                "problems": ["the engine reported no speculative rounds"], "z": Z, "definition": DEFINITION}
    measured = 1 + accepted / rounds
    se = accepted_sd(marginals) / math.sqrt(rounds)
    positions = []
    problems = []
    for i, m in enumerate(marginals, 1):
        got = (per_position_counts[i - 1] if i - 1 < len(per_position_counts) else 0) / rounds
        bound = Z * math.sqrt(m * (1 - m) / rounds)
        ok = abs(got - m) <= bound + 1e-9
        positions.append({"position": i, "profile": m, "engine": round(got, 6), "bound": round(bound, 6), "ok": ok})
        if not ok:
            problems.append(f"position {i}: engine rate {got:.3f}, profile {m:.3f} (bound ±{bound:.3f})")
    within_mean = abs(measured - expected) <= Z * se + 1e-9
    if not within_mean:
        problems.insert(0, f"mean accept length {measured:.3f} vs the profile's {expected:.3f} "
                           f"(bound ±{Z * se:.3f}, {rounds} rounds)")
    return {"expected_mean": round(expected, 6), "measured_mean": round(measured, 6),
            "difference": round(measured - expected, 6), "standard_error": round(se, 6),
            "bound": round(Z * se, 6), "rounds": rounds, "drafts_accepted": accepted,
            "per_position": positions, "within": within_mean and not problems, "problems": problems, "z": Z,
            "definition": DEFINITION}
