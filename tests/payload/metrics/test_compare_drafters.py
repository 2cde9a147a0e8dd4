"""Side-by-side drafter comparison: hand-computed deltas, the bootstrap over samples, verdicts, bad input."""

from __future__ import annotations

import random

import pytest
from tree_helpers import sample_line, synthetic_drafts

from remote_payload.errors import PayloadError
from remote_payload.metrics.chain import Round
from remote_payload.metrics.compare import compare_drafters
from remote_payload.metrics.sample_rounds import entry_from_rounds
from remote_payload.metrics.stats import bootstrap_cis, bootstrap_mean_ci

B = 4

# Three samples, two drafters, rounds written out by hand (anchor, accepted, produced, remaining).
# sample 0: prompt 2 + continuation 8 (last position 9); sample 1: 3 + 5 (last 7); sample 2: 1 + 4 (last 4).
SHAPES = [(2, 8), (3, 5), (1, 4)]
CHAIN = {
    "a": [[Round(2, 0, 1, 7), Round(3, 1, 2, 6), Round(5, 3, 4, 4)],  # τ 7/3
          [Round(3, 1, 2, 4), Round(5, 1, 2, 2)],  # τ 2
          [Round(1, 0, 1, 3), Round(2, 0, 1, 2), Round(3, 0, 1, 1)]],  # τ 1
    "b": [[Round(2, 3, 4, 7), Round(6, 2, 3, 3)],  # τ 3.5
          [Round(3, 3, 4, 4)],  # τ 4
          [Round(1, 1, 2, 3), Round(3, 0, 1, 1)]],  # τ 1.5
}
TOPK = {  # the top-k tree records: a's = b's chain, b's = accept everything
    "a": CHAIN["b"],
    "b": [[Round(2, 3, 4, 7), Round(6, 3, 3, 3)], [Round(3, 3, 4, 4)], [Round(1, 2, 3, 3)]],  # τ 3.5, 4, 3
}


def _hand_lines():
    lines = []
    for i, (pt, ct) in enumerate(SHAPES):
        line = {"index": i, "id": f"s{i}", "prompt_tokens": pt, "continuation_tokens": ct, "drafters": {}}
        for name in ("a", "b"):
            tree = {"topk": {"k": 8, **entry_from_rounds(TOPK[name][i])},
                    "budgeted": {"budget": 16, "K": 8, **entry_from_rounds(TOPK[name][i])}}
            line["drafters"][name] = {**entry_from_rounds(CHAIN[name][i]), "tree": tree}
        lines.append(line)
    return lines


def test_hand_computed_deltas():
    comp = compare_drafters(_hand_lines(), ["a", "b"], block_sizes={"a": B, "b": B}, resamples=500, seed=7)
    assert comp["baseline"] == "a" and comp["confidence"] == 0.95 and comp["resamples"] == 500 and comp["seed"] == 7
    (pair,) = comp["pairs"]
    assert (pair["a"], pair["b"], pair["samples"]) == ("a", "b", 3)
    # τ macro: per-sample differences 3.5 − 7/3 = 7/6, 4 − 2 = 2, 1.5 − 1 = 0.5 -> mean 11/9.
    assert pair["tau_macro"]["delta"] == pytest.approx(11 / 9)
    assert pair["tau_macro"]["a"] == pytest.approx((7 / 3 + 2 + 1) / 3)
    # τ micro: both produce 7 + 4 + 3 = 14 tokens; a in 8 rounds (1.75), b in 5 (2.8) -> +1.05.
    assert pair["tau_micro"]["delta"] == pytest.approx(2.8 - 1.75)
    # DDTree-8 (top-k τ macro): a 3.5, 4, 1.5; b 3.5, 4, 3 -> differences 0, 0, 1.5 -> 0.5.
    assert pair["ddtree"]["delta"] == pytest.approx(0.5) and pair["ddtree"]["k"] == 8
    # p_k, a: k=1 4/8 (rounds accepting ≥ 1 of those with ≥ 1 token left), k=2 1/7, k=3 1/5;
    #       b: k=1 4/5, k=2 3/4, k=3 2/4.
    assert [p["k"] for p in pair["per_position"]] == [1, 2, 3]
    assert [p["delta"] for p in pair["per_position"]] == pytest.approx([0.8 - 0.5, 0.75 - 1 / 7, 0.5 - 0.2])


def test_tau_macro_ci_is_the_bootstrap_of_per_sample_differences():
    """Resampling samples (each sample's rounds together): the τ macro CI is exactly the percentile bootstrap
    of the mean per-sample difference, with the same draws as stats.bootstrap_mean_ci."""
    comp = compare_drafters(_hand_lines(), ["a", "b"], block_sizes={"a": B, "b": B}, resamples=500, seed=7)
    diffs = [3.5 - 7 / 3, 4 - 2, 1.5 - 1]
    assert tuple(comp["pairs"][0]["tau_macro"]["ci"]) == bootstrap_mean_ci(diffs, resamples=500, seed=7)
    lo, hi = comp["pairs"][0]["tau_micro"]["ci"]
    assert lo <= comp["pairs"][0]["tau_micro"]["delta"] <= hi


def _lines(n, rng, quality_a, quality_b, k=8):
    lines = []
    for i in range(n):
        tokens = list(range(1000, 1000 + rng.randint(20, 40)))
        drafts = {name: synthetic_drafts(tokens, 3, 6, 8, lambda a, d, q=q: 0 if rng.random() < q else None)
                  for name, q in (("a", quality_a), ("b", quality_b))}
        lines.append(sample_line(i, drafts, k=k, budget=16)[0])
    return lines


def test_a_better_drafter_wins_with_a_ci_excluding_zero():
    lines = _lines(12, random.Random(4), 0.1, 0.8)
    comp = compare_drafters(lines, block_sizes={"a": 6, "b": 6}, resamples=400)
    pair = comp["pairs"][0]
    for key in ("tau_macro", "tau_micro", "ddtree"):
        assert pair[key]["delta"] > 0 and pair[key]["ci"][0] > 0, key
    assert pair["per_position"][0]["ci"][0] > 0
    assert pair["verdict"] == "b accepts more than a: τ macro CI excludes 0"
    # the other way round: baseline b, the worse drafter a is lower
    rev = compare_drafters(lines, ["b", "a"], block_sizes={"a": 6, "b": 6}, resamples=400)
    assert rev["baseline"] == "b" and rev["pairs"][0]["tau_macro"]["ci"][1] < 0
    assert rev["pairs"][0]["verdict"].startswith("a accepts less than b")


def test_identical_drafters_show_no_difference():
    rng = random.Random(5)
    lines = []
    for i in range(6):
        tokens = list(range(1000, 1030))
        d = synthetic_drafts(tokens, 2, 4, 2, lambda a, dd: 0 if rng.random() < 0.5 else None)
        lines.append(sample_line(i, {"a": d, "b": d}, k=2, budget=3)[0])
    pair = compare_drafters(lines, block_sizes={"a": 4, "b": 4}, resamples=200)["pairs"][0]
    assert pair["tau_macro"]["delta"] == 0 and pair["tau_macro"]["ci"] == [0, 0]
    assert pair["verdict"].startswith("no clear τ macro difference")


def test_one_sample_has_no_interval_and_three_drafters_give_two_pairs():
    lines = _lines(1, random.Random(6), 0.5, 0.5)
    for line in lines:
        line["drafters"]["c"] = line["drafters"]["a"]
    comp = compare_drafters(lines, block_sizes={"a": 6, "b": 6, "c": 6}, resamples=50)
    assert [(p["a"], p["b"]) for p in comp["pairs"]] == [("a", "b"), ("a", "c")]
    assert comp["pairs"][0]["tau_macro"]["ci"] is None
    assert comp["pairs"][0]["verdict"] == "too few samples for a confidence interval"


def test_without_tree_records_ddtree_is_absent_not_wrong():
    lines = _hand_lines()
    for line in lines:
        del line["drafters"]["b"]["tree"]
    pair = compare_drafters(lines, block_sizes={"a": B, "b": B}, resamples=50)["pairs"][0]
    assert pair["ddtree"]["delta"] is None and "no per-sample tree metrics" in pair["ddtree"]["note"]
    assert pair["tau_macro"]["delta"] == pytest.approx(11 / 9)


def test_report_renders_the_block():
    pytest.importorskip("rich")
    from orchestrator.evaluation.report import comparison_lines

    comp = compare_drafters(_hand_lines(), block_sizes={"a": B, "b": B}, resamples=200)
    (line,) = comparison_lines({"comparison": comp})
    assert line.startswith("b − a (95% bootstrap CI over 3 samples): τ macro +1.22 [")
    assert "DDTree-8 +0.50" in line and "→ b accepts more than a" in line


def test_bad_input_is_named():
    lines = _hand_lines()
    del lines[1]["drafters"]["b"]
    with pytest.raises(PayloadError, match=r"sample s1 has no results for drafter 'b'"):
        compare_drafters(lines, ["a", "b"], block_sizes={"a": B, "b": B})
    lines = _hand_lines()
    lines[0]["drafters"]["a"]["produced"][-1] = 3  # the last round no longer reaches the end
    with pytest.raises(PayloadError, match=r"sample s0, drafter 'a'.*round 2"):
        compare_drafters(lines, ["a", "b"], block_sizes={"a": B, "b": B})
    with pytest.raises(PayloadError, match="no block size for drafter"):
        compare_drafters(_hand_lines(), ["a", "b"], block_sizes={"a": B})


def test_bootstrap_cis_skips_undefined_values_per_statistic():
    def stat(idx):
        return {"mean": sum(idx) / len(idx), "only_with_zero": 1.0 if 0 in idx else None}

    cis = bootstrap_cis(5, stat, resamples=300, seed=1)
    assert cis["mean"] == bootstrap_mean_ci([0, 1, 2, 3, 4], resamples=300, seed=1)
    assert cis["only_with_zero"] == (1.0, 1.0)
    assert bootstrap_cis(1, stat) == {"mean": None, "only_with_zero": None}
