"""Engine vs offline acceptance (metrics.engine_agreement) on hand-built rounds and counters."""

from __future__ import annotations

import pytest

from remote_payload.metrics.engine_agreement import TOLERANCE, compare, engine_figures, figures, sample_counts

B1 = 3  # drafts per round in these cases


def test_figures_count_like_vllm():
    f = figures([[3, 0, 1], [2]], B1)
    assert (f["rounds"], f["drafts_accepted"]) == (4, 6)
    assert [p["accepted_ge_k"] for p in f["per_position"]] == [3, 2, 1]
    assert [p["p"] for p in f["per_position"]] == [0.75, 0.5, 0.25]
    assert f["tau_micro"] == 1 + 6 / 4
    assert f["tau_macro"] == pytest.approx(((1 + 4 / 3) + (1 + 2)) / 2)
    assert sample_counts([3, 0, 1], B1) == {"rounds": 3, "drafts_accepted": 4, "per_position_counts": [2, 1, 1]}
    assert figures([[]], B1)["tau_micro"] is None


def test_engine_figures_sum_requests():
    e = engine_figures([{"rounds": 3, "drafts_accepted": 4, "per_position_counts": [2, 1, 1]},
                        {"rounds": 1, "drafts_accepted": 2, "per_position_counts": [1, 1, 0]}], B1)
    assert e == figures([[3, 0, 1], [2]], B1)


def test_identical_rounds_agree_exactly():
    offline = [[3, 0, 1], [2, 2], [0]]
    engine = [sample_counts(o, B1) for o in offline]
    out = compare(["a", "b", "c"], engine, offline, B1)
    assert out["within_tolerance"] and out["problems"] == []
    assert out["samples"] == {"compared": 3, "identical": 3, "outside_tolerance": []}
    assert out["tau_micro_diff"] == 0 and all(p["diff"] == 0 for p in out["per_position"])


def test_a_near_tie_flip_stays_within_tolerance():
    # One draft flipped in sample b: the engine accepts one fewer there and needs one more round.
    offline = [[3, 0, 1, 3, 3], [2, 3, 3, 1, 3], [3, 3, 3, 0]]
    engine = [sample_counts(offline[0], B1), sample_counts([2, 1, 3, 3, 0, 3], B1), sample_counts(offline[2], B1)]
    out = compare(["a", "b", "c"], engine, offline, B1)
    assert out["samples"]["identical"] == 2 and out["samples"]["outside_tolerance"] == []
    assert out["within_tolerance"], out["problems"]
    assert out["engine"]["rounds"] == out["offline"]["rounds"] + 1
    assert out["tau_micro_diff"] < 0 and abs(out["tau_micro_diff"]) <= TOLERANCE["tau_micro_abs"]


def test_a_drafter_that_accepts_less_in_the_engine_is_flagged():
    offline = [[3, 3, 3, 1]] * 4
    engine = [sample_counts([1, 0, 1, 0, 1, 0, 1, 1, 0, 1], B1)] * 4  # e.g. the engine read other target layers
    out = compare(list("abcd"), engine, offline, B1)
    assert not out["within_tolerance"]
    text = "\n".join(out["problems"])
    assert "4 sample(s) whose rounds differ by more than 5% + 1: a (10 vs 4)" in out["notes"][0]
    assert "τ micro" in text and "p1 " in text and "rounds 40 vs 16 (allowed ±4.8)" in text


def test_samples_far_off_are_listed_and_the_verdict_is_on_the_aggregates():
    # A flip can move one sample by two rounds (the Qwen3 fixture: 21 vs 19): listed, not a disagreement.
    offline = [[1] * 10, [1] * 10]
    engine = [sample_counts([1] * 13, B1), sample_counts([1] * 7, B1)]  # totals equal, each sample 3 rounds off
    out = compare(["a", "b"], engine, offline, B1)
    assert out["engine"]["rounds"] == out["offline"]["rounds"]
    assert [x["id"] for x in out["samples"]["outside_tolerance"]] == ["a", "b"]
    assert out["within_tolerance"] and out["problems"] == []
    assert out["notes"] == ["2 sample(s) whose rounds differ by more than 5% + 1: a (13 vs 10), b (7 vs 10)"]


def test_per_position_bound_is_absolute():
    offline = [[2] * 10 + [0] * 10]  # p1 = p2 = 0.5
    near = [sample_counts([2] * 11 + [0] * 9, B1)]  # p1 0.55: within 0.08
    far = [sample_counts([2] * 12 + [0] * 8, B1)]  # p1 0.60: outside
    assert compare(["a"], near, offline, B1)["within_tolerance"]
    out = compare(["a"], far, offline, B1)
    assert [p["ok"] for p in out["per_position"]] == [False, False, True]
    assert "p1 0.600 vs 0.500 (allowed ±0.08)" in out["problems"]


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 ids, 1 engine and 1 offline"):
        compare(["a", "b"], [sample_counts([1], B1)], [[1]], B1)
