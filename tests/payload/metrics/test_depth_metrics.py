"""τ by context depth (metrics/depth.py): the bucket layout and the per-bucket figures, by hand."""

from __future__ import annotations

import pytest

from remote_payload.metrics.chain import Round
from remote_payload.metrics.depth import bucket_figures, label, layout


def test_short_runs_get_power_of_two_buckets_that_nest_in_the_standard_ones():
    kind, buckets = layout([(20, 150), (40, 90)])
    assert kind == "power-of-two"
    assert buckets == [(16, 32), (32, 64), (64, 128), (128, 256)]
    assert [label(lo, hi) for lo, hi in buckets] == ["16–32", "32–64", "64–128", "128–256"]
    kind, buckets = layout([(5, 3000)])  # two standard buckets: still finer
    assert kind == "power-of-two" and buckets[0] == (0, 16) and buckets[-1] == (2048, 4096)
    assert label(2048, 4096) == "2k–4k"


def test_runs_spanning_three_standard_buckets_get_the_standard_ones():
    kind, buckets = layout([(4096, 4400), (16384, 16600), (65536, 65800)])  # longctx@4k,16k,64k
    assert kind == "standard"
    assert [label(lo, hi) for lo, hi in buckets] == ["4k–16k", "16k–64k", "≥ 64k"]
    assert layout([(100, 70000)])[1][0] == (0, 1024) and label(0, 1024) == "< 1k"


def _rounds(start: int, produced: list[int]) -> list[Round]:
    out, a = [], start
    for p in produced:
        out.append(Round(a, p - 1, p, 1000))
        a += p
    return out


def test_bucket_figures_average_per_sample_then_over_samples_with_cis():
    # sample 1: rounds at 20 (τ 4), 24 (τ 8), 32 (τ 1), 33 (τ 1); sample 2: rounds at 40 (τ 2), 42 (τ 2), 44 (τ 3)
    per_sample = [_rounds(20, [4, 8, 1, 1]), _rounds(40, [2, 2, 3])]
    out = bucket_figures(per_sample, [(20, 40), (40, 50)], seed=3)
    by = {b["label"]: b for b in out["buckets"]}
    assert list(by) == ["16–32", "32–64"]
    assert by["16–32"]["samples"] == 1 and by["16–32"]["tau_macro"]["value"] == 6.0
    assert by["16–32"]["tau_macro"]["ci"] is None  # one sample: no interval
    b = by["32–64"]
    assert (b["samples"], b["rounds"]) == (2, 5)
    assert b["tau_macro"]["value"] == pytest.approx((1.0 + 7 / 3) / 2)  # per sample first, then over samples
    assert b["tau_micro"]["value"] == pytest.approx(9 / 5)
    assert b["p1"]["value"] == pytest.approx(3 / 5)
    lo, hi = b["tau_macro"]["ci"]
    assert lo <= b["tau_macro"]["value"] <= hi and lo < hi
    assert "anchor's absolute position" in out["definition"]


def test_under_the_sampled_rule_the_buckets_say_they_walk_the_greedy_rounds():
    out = bucket_figures([_rounds(20, [2, 2])], [(20, 23)], rule="sampled")
    assert out["rule"] == "greedy" and "integrates the round boundaries out" in out["rounds_binned"]
