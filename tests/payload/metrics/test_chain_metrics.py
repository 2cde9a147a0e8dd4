"""The synthetic drafter gives exactly the τ, per-position rates and histogram computed by hand."""

from __future__ import annotations

import pytest
from payload_helpers import SyntheticDrafter

from remote_payload.eval.offline import draft_sample, replay
from remote_payload.metrics.chain import Round, chain_rounds, summarize

B = 4  # three drafts per round


def _rounds(tokens, prompt_len, errors):
    drafter = SyntheticDrafter(tokens, B, errors, vocab=1000)
    return replay(draft_sample(drafter, {}, tokens, prompt_len))


def test_chain_replay_follows_planned_errors():
    # prompt [10, 11]; continuation at positions 2..13 (12 tokens)
    tokens = [10, 11] + list(range(100, 112))
    rounds = _rounds(tokens, 2, {2: {2}, 8: {1}})
    assert rounds == [
        Round(anchor=2, accepted=1, produced=2, remaining=11),  # depth 2 wrong: 1 accepted + bonus
        Round(anchor=4, accepted=3, produced=4, remaining=9),  # all three drafts + bonus
        Round(anchor=8, accepted=0, produced=1, remaining=5),  # depth 1 wrong: bonus only
        Round(anchor=9, accepted=3, produced=4, remaining=4),
    ]
    assert sum(r.produced for r in rounds) == len(tokens) - 2 - 1  # every token after the prefill's


def test_end_of_continuation_caps_acceptance():
    tokens = [7] + [50, 51, 52]  # continuation at 1..3: only two tokens follow the first anchor
    assert _rounds(tokens, 1, {}) == [Round(anchor=1, accepted=2, produced=2, remaining=2)]
    assert _rounds([7, 50], 1, {}) == []  # the prefill produced the only token: no rounds


def test_summary_matches_hand_computation():
    s1 = _rounds([10, 11] + list(range(100, 112)), 2, {2: {2}, 8: {1}})
    s2 = _rounds([7, 50, 51, 52], 1, {})
    s3 = _rounds([7, 50], 1, {})
    m = summarize([s1, s2, s3], B)
    assert m["tau_macro"] == pytest.approx(((2 + 4 + 1 + 4) / 4 + 2 / 1) / 2)  # 2.375
    assert m["tau_micro"] == pytest.approx((11 + 2) / 5)
    assert m["mean_accepted"] == pytest.approx((1 + 3 + 0 + 3 + 2) / 5)
    assert m["rounds"] == 5 and m["samples"] == 3 and m["samples_with_rounds"] == 2
    assert [(p["k"], p["accepted_ge_k"], p["eligible"]) for p in m["per_position"]] == [
        (1, 4, 5), (2, 3, 5), (3, 2, 4)]  # the truncated round cannot judge depth 3
    assert [p["p"] for p in m["per_position"]] == pytest.approx([0.8, 0.6, 0.5])
    assert m["tau_histogram"] == {"1": 1, "2": 2, "3": 0, "4": 2}
    assert m["drafts_proposed"] == 5 * 3 and m["tokens_produced"] == 13


def test_chain_rounds_uses_only_the_drafts_of_visited_anchors():
    visited = []

    def drafts_at(a):
        visited.append(a)
        return [0, 0, 0]  # always wrong

    chain_rounds([1, 2, 3, 4, 5], 1, drafts_at)
    assert visited == [1, 2, 3]
