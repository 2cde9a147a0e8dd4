"""Figures at T > 0 (remote_payload/metrics/sampled.py): CIs that resample prompts with their draws, the variance
parts, the agreement test of two estimates, and the engine's verdict at T > 0. Pure: lines built by hand."""

from __future__ import annotations

import random

import pytest

from remote_payload.metrics.compare import compare_drafters
from remote_payload.metrics.sampled import (
    clusters_of,
    expectation_agreement,
    sampled_engine_agreement,
    sampled_figures,
    variance_parts,
)

B = 8
LAW = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def _entry(produced: list[int], prompt_len: int) -> dict:
    anchors, a = [], prompt_len
    for p in produced:
        anchors.append(a)
        a += p
    return {"tau": sum(produced) / len(produced), "rounds": len(produced), "anchors": anchors,
            "accepted": [p - 1 for p in produced], "produced": list(produced)}


def _line(index: int, produced: dict[str, list[int]], prompt_index: int | None = None, draw: int = 0) -> dict:
    lengths = {sum(p) for p in produced.values()}
    assert len(lengths) == 1
    line = {"index": index, "id": f"s{index}", "prompt_tokens": 10, "continuation_tokens": lengths.pop() + 1,
            "drafters": {name: _entry(p, 10) for name, p in produced.items()}}
    if prompt_index is not None:
        line.update(prompt_index=prompt_index, prompt_id=f"p{prompt_index}", draw=draw, seed=1000 + index)
    return line


def _rounds(rng: random.Random, level: float, tokens: int = 40) -> list[int]:
    """Rounds covering ``tokens`` tokens, each τ_round around ``level`` (1..B)."""
    out, left = [], tokens
    while left:
        p = max(1, min(B, left, round(rng.gauss(level, 1.0))))
        out.append(p)
        left -= p
    return out


def _draw_lines(prompts: int, draws: int, seed: int = 0, spread: float = 2.0, sampled: bool = True) -> list[dict]:
    """Lines whose τ depends strongly on the prompt (its level) and a little on the draw; drafter b is better than
    a by an amount that depends on the prompt too."""
    rng = random.Random(seed)
    lines = []
    for p in range(prompts):
        level = 1.5 + spread * rng.random() * 2
        gain = rng.uniform(-1.0, 2.0)
        for j in range(draws):
            i = len(lines)
            lines.append(_line(i, {"a": _rounds(rng, level), "b": _rounds(rng, level + gain)},
                               p if sampled else None, j))
    return lines


def test_the_ci_resamples_prompts_with_their_draws():
    lines = _draw_lines(prompts=8, draws=10)
    fig = sampled_figures(lines, "a", B, sampling=LAW, seed=0, resamples=500)
    assert fig["prompts"] == 8 and fig["draws"] == 80 and fig["draws_per_prompt"] == 10
    taus = [line["drafters"]["a"]["tau"] for line in lines]
    assert fig["tau_macro"]["value"] == pytest.approx(sum(taus) / len(taus))
    lo, hi = fig["tau_macro"]["ci"]
    # the draws of one prompt share its level: treated as 80 independent samples the CI would be far narrower
    flat = sampled_figures([{k: v for k, v in line.items() if k != "prompt_index"} for line in lines], "a", B,
                           sampling=LAW, seed=0, resamples=500)
    assert flat["prompts"] == 80
    flo, fhi = flat["tau_macro"]["ci"]
    assert hi - lo > 1.8 * (fhi - flo)
    var = fig["variance"]
    assert var["between"] > 3 * var["within"] and var["standard_error"] == pytest.approx((hi - lo) / 3.92, rel=0.35)
    assert 0 < fig["per_position"][0]["ci"][0] <= fig["per_position"][0]["value"] <= fig["per_position"][0]["ci"][1]


def test_variance_parts_recover_the_between_and_within_components():
    rng = random.Random(4)
    values, clusters = [], []
    for p in range(300):
        mu = rng.gauss(0, 2.0)  # between-prompt sd 2 (variance 4)
        for _ in range(5):
            values.append(mu + rng.gauss(0, 1.0))  # within sd 1
            clusters.append(p)
    v = variance_parts(values, clusters)
    assert v["between"] == pytest.approx(4.0, rel=0.2) and v["within"] == pytest.approx(1.0, rel=0.1)
    assert v["standard_error"] == pytest.approx((4.0 / 300 + 1.0 / 1500) ** 0.5, rel=0.15)


def test_the_agreement_test_accepts_one_law_and_refuses_another():
    rng = random.Random(7)
    clusters = [p for p in range(20) for _ in range(10)]
    levels = [rng.uniform(1.5, 5.0) for _ in range(20)]
    a = [levels[c] + rng.gauss(0, 0.8) for c in clusters]
    b = [levels[c] + rng.gauss(0, 0.8) for c in clusters]
    same = expectation_agreement(a, b, clusters)
    assert same["agree"] is True and same["prompts"] == 20 and same["draws"] == [200, 200]
    shifted = expectation_agreement(a, [x + 0.4 for x in b], clusters)
    assert shifted["agree"] is False and shifted["difference"] == pytest.approx(same["difference"] - 0.4)
    # the between-prompt spread cancels: the bound is set by the within-prompt noise only
    assert same["bound"] == pytest.approx(2.576 * (2 * 0.8**2 / 10 / 20) ** 0.5, rel=0.25)
    one_draw = expectation_agreement(a[::10], b[::10], clusters[::10])
    assert one_draw["agree"] is None and "two draws" in one_draw["note"]


def test_the_in_run_comparison_resamples_prompts_at_t_above_0():
    sampled = compare_drafters(_draw_lines(8, 10), ["a", "b"], block_sizes={"a": B, "b": B}, resamples=500)
    flat = compare_drafters(_draw_lines(8, 10, sampled=False), ["a", "b"], block_sizes={"a": B, "b": B},
                            resamples=500)
    (ps,), (pf,) = sampled["pairs"], flat["pairs"]
    assert ps["tau_macro"]["delta"] == pytest.approx(pf["tau_macro"]["delta"])  # the same lines, the same point
    assert "paired by prompt and seed" in sampled["definition"] and "paired by prompt" not in flat["definition"]
    width = ps["tau_macro"]["ci"][1] - ps["tau_macro"]["ci"][0]
    assert width > 1.2 * (pf["tau_macro"]["ci"][1] - pf["tau_macro"]["ci"][0])
    assert clusters_of(_draw_lines(2, 3))[:6] == [0, 0, 0, 1, 1, 1]


def _engine(accepted_per_round: list[list[int]]) -> list[dict]:
    return [{"rounds": len(a), "drafts_accepted": sum(a), "per_position_counts": [sum(1 for x in a if x >= 1)]}
            for a in accepted_per_round]


def test_the_engine_at_t_above_0_collapsed_acceptance_is_named_when_it_accepts_greedily():
    rng = random.Random(1)
    clusters = [p for p in range(6) for _ in range(2)]
    offline = [[rng.choice([1, 2, 3, 4]) for _ in range(15)] for _ in clusters]
    collapsed = _engine([[0] * 44 for _ in clusters])
    greedy = {"requests": 2, "rounds": 20, "drafts_accepted": 70}
    named = sampled_engine_agreement(offline, collapsed, clusters, title="vLLM", law="T=1", device="cpu",
                                     greedy=greedy)
    assert named["limitation"] is not None and named["within_tolerance"] is None and named["problems"] == []
    assert "Triton" in named["limitation"]["text"] and "accepts at T = 0 (70 drafts in 20 rounds" in named["notes"][0]
    gpu = sampled_engine_agreement(offline, collapsed, clusters, title="vLLM", law="T=1", device="cuda", greedy=greedy)
    assert "Triton" not in gpu["limitation"]["text"] and "on this host" in gpu["limitation"]["text"]
    # accepting nothing greedily either: a broken drafter serving, a disagreement
    broken = sampled_engine_agreement(offline, collapsed, clusters, title="vLLM", law="T=1", device="cpu",
                                      greedy={"requests": 2, "rounds": 80, "drafts_accepted": 0})
    assert broken["limitation"] is None and broken["within_tolerance"] is False and broken["problems"]
    # an engine that accepts like the offline law agrees
    fine = sampled_engine_agreement(offline, _engine([[rng.choice([1, 2, 3, 4]) for _ in range(15)] for _ in clusters]),
                                    clusters, title="vLLM", law="T=1", device="cpu", greedy=greedy)
    assert fine["limitation"] is None and fine["within_tolerance"] is True
