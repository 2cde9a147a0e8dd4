"""Small statistics for comparing drafters: a seeded percentile bootstrap of a mean. Pure stdlib.

Shared by the in-run drafter comparison and `dfo runs compare` (the controller imports this module; it
must stay free of torch and of anything host-specific).
"""

from __future__ import annotations

import random
from typing import Sequence


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def bootstrap_mean_ci(values: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95,
                      seed: int = 0) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the mean of ``values`` (e.g. per-sample τ differences).

    Resampling samples (not rounds) keeps each response's rounds together, which is the unit the macro τ
    averages over. Deterministic for a given seed. None when there are fewer than two values.
    """
    n = len(values)
    if n < 2:
        return None
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    lo_i = int((1 - confidence) / 2 * resamples)
    hi_i = min(resamples - 1, int((1 + confidence) / 2 * resamples))
    return means[lo_i], means[hi_i]


def verdict(ci: tuple[float, float] | None) -> str:
    if ci is None:
        return "too few samples for a confidence interval"
    if ci[0] > 0:
        return "B is higher (CI excludes 0)"
    if ci[1] < 0:
        return "B is lower (CI excludes 0)"
    return "no clear difference (CI includes 0)"
