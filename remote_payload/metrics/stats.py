"""Small statistics for comparing drafters: a seeded percentile bootstrap of a mean. Pure stdlib.

Shared by the in-run drafter comparison and `dfo runs compare` (the controller imports this module; it
must stay free of torch and of anything host-specific).
"""

from __future__ import annotations

import random
from typing import Callable, Mapping, Sequence


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


def verdict(ci: tuple[float, float] | None, *, higher: str = "B is higher", lower: str = "B is lower",
            same: str = "no clear difference", unit: str = "samples") -> str:
    """What a CI of a difference says, in words (the labels name the two sides)."""
    if ci is None:
        return f"too few {unit} for a confidence interval"
    if ci[0] > 0:
        return f"{higher} (CI excludes 0)"
    if ci[1] < 0:
        return f"{lower} (CI excludes 0)"
    return f"{same} (CI includes 0)"


def bootstrap_cis(n: int, statistic: Callable[[Sequence[int]], Mapping[str, float | None]], *,
                  resamples: int = 2000, confidence: float = 0.95,
                  seed: int = 0) -> dict[str, tuple[float, float] | None]:
    """Percentile bootstrap CIs of several statistics over one set of resamples of ``n`` items.

    ``statistic(indices)`` gets the item indices of one resample (drawn with replacement, in draw order)
    and returns {name: value}; a None value (e.g. a ratio with an empty denominator) leaves that resample
    out for that name. The draws are those of ``bootstrap_mean_ci`` for the same seed, so a statistic that
    is the mean of per-item values gets exactly its interval. None for a name with fewer than two items or
    no value in any resample.
    """
    if n < 2:
        return {name: None for name in statistic(list(range(n)))} if n else {}
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(resamples):
        values = statistic([rng.randrange(n) for _ in range(n)])
        for name, v in values.items():
            bucket = draws.setdefault(name, [])
            if v is not None:
                bucket.append(v)
    return {name: _percentile_interval(sorted(vals), confidence) if vals else None for name, vals in draws.items()}


def _percentile_interval(sorted_values: Sequence[float], confidence: float) -> tuple[float, float]:
    """The same order statistics as bootstrap_mean_ci picks from its sorted resample means."""
    m = len(sorted_values)
    lo_i = int((1 - confidence) / 2 * m)
    hi_i = min(m - 1, int((1 + confidence) / 2 * m))
    return sorted_values[lo_i], sorted_values[hi_i]
