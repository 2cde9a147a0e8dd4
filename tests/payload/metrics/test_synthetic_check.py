"""The synthetic-sampler check (metrics/synthetic_check.py): rates from rounds, the spread of accepted drafts,
and the verdict on draws of a sampler that replays the rates and of one that does not."""

from __future__ import annotations

import random

import pytest

from remote_payload.errors import PayloadError
from remote_payload.eval.options import parse_engine_check
from remote_payload.metrics.synthetic_check import accepted_sd, check, marginal_rates


def draw(rates: list[float], rounds: int, seed: int) -> tuple[int, list[int]]:
    """What vLLM's synthetic sampler does: draft i accepted with m_i / m_(i-1) until the first rejection."""
    rng = random.Random(seed)
    accepted, counts = 0, [0] * len(rates)
    for _ in range(rounds):
        prev = 1.0
        for i, m in enumerate(rates):
            if rng.random() >= (m / prev if prev > 0 else 0.0):
                break
            counts[i] += 1
            accepted += 1
            prev = m
    return accepted, counts


def test_rates_are_the_shares_of_rounds_accepting_at_least_i_drafts():
    assert marginal_rates([[3, 0, 1], [2]], 4) == [0.75, 0.5, 0.25, 0.0]
    assert marginal_rates([], 2) == [0.0, 0.0]


def test_spread_of_accepted_drafts_matches_the_distribution():
    # P(A = 0) = 0.2, P(A = 1) = 0.3, P(A = 2) = 0.5: mean 1.3, E[A^2] = 0.3 + 2.0 = 2.3, var 0.61
    assert accepted_sd([0.8, 0.5]) == pytest.approx(0.61 ** 0.5)
    assert accepted_sd([1.0, 1.0, 1.0]) == 0.0


def test_a_sampler_that_replays_the_rates_passes_and_one_that_does_not_fails():
    rates = [0.9, 0.7, 0.5, 0.3, 0.1]
    accepted, counts = draw(rates, 4000, seed=1)
    ok = check(rates, 4000, accepted, counts)
    assert ok["within"] and ok["problems"] == [], ok
    assert ok["expected_mean"] == pytest.approx(3.5) and abs(ok["difference"]) <= ok["bound"]
    # an engine that lost a tenth of each rate: caught on the mean and named per position
    accepted, counts = draw([r * 0.9 for r in rates], 4000, seed=2)
    bad = check(rates, 4000, accepted, counts)
    assert not bad["within"] and bad["problems"][0].startswith("mean accept length"), bad
    assert any(not p["ok"] for p in bad["per_position"])
    assert check(rates, 0, 0, [])["problems"] == ["the engine reported no speculative rounds"]


def test_engine_check_option():
    assert parse_engine_check("synthetic") == ("synthetic",) and parse_engine_check("") == ()
    with pytest.raises(PayloadError, match="unknown check 'simulated'"):
        parse_engine_check("simulated")
