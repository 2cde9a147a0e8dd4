"""τ under the sampled rule (eval/sampled_rule.py): the forward/backward over round boundaries given each
continuation, against brute force, against the greedy replay (one-hot drafts), and against the online
sampled-rule loop over 120 draws (12 built-in prompts × 10 seeds) on the fixture target.

Tolerance of the online agreement: ``metrics.sampled.expectation_agreement``, paired by prompt, |D| <= 2.576·SE
(two-sided, 1% false-alarm rate). The estimator's per-draw values have less variance than the loop's (the round
randomness is integrated out), which the test also checks.
"""

from __future__ import annotations

import math

import pytest
import torch

from remote_payload.eval import sampled_rule as sr
from remote_payload.eval.offline import draft_sample, replay
from remote_payload.eval.online import online_generate
from remote_payload.inputs.features import extract
from remote_payload.inputs.sampled_reference import cached_sampled_reference
from remote_payload.inputs.sampling import Sampling, draw_seed
from remote_payload.metrics.chain import sample_tau, summarize
from remote_payload.metrics.sampled import expectation_agreement, variance_parts

MAX_NEW = 16
DRAWS = 10  # per prompt: 12 × 10 = 120 per side (the greedy rule's replay still 2.0 bounds from the loop for
# DFlash2, 3.1 at 17 draws; fewer and the test that tells the rules apart loses its margin)
# The drafters the online agreement runs for: a name of the session's `loaded` fixtures (tests/payload/conftest.py).
DRAFTERS = ["zlab", "dflash2"]


@pytest.fixture(scope="module")
def prompt_ids(target):
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.models.target import render_prompt

    return [render_prompt(target.tokenizer, p.message_dicts(), False) for p in load_prompts("builtin")[0]]


def _scalars(target, rt, ids, ref_tokens, law):
    feats = extract(target, ref_tokens, rt.spec.fc_layer_ids, len(ids), with_argmax=False)
    ctx = rt.prepare(feats.layers)
    tl = sr.TargetLaw(target, ref_tokens, len(ids), law)
    return sr.slot_scalars(rt, ctx, ref_tokens, len(ids), tl, law), feats, tl


def _brute_force(sc: sr.SlotScalars) -> dict[int, float]:
    """P(R = r | y) by enumerating every composition of the L-1 tokens into rounds, e(a, m) written out afresh."""
    L, B = sc.log_p.shape[0], sc.block_size
    p_y = sc.log_p.exp().tolist()
    q_y = sc.log_q.exp().tolist()

    def e(a, m):
        out = 1.0
        for j in range(1, m):
            out *= min(p_y[a + j], q_y[a][j - 1])
        last = a + m
        if last == L - 1 or m == B:
            return out * p_y[last]
        return out * max(0.0, p_y[last] - q_y[a][m - 1])

    dist: dict[int, float] = {}

    def walk(a, r, prob):
        if a == L - 1:
            dist[r] = dist.get(r, 0.0) + prob
            return
        for m in range(1, min(B, L - 1 - a) + 1):
            walk(a + m, r + 1, prob * e(a, m))

    walk(0, 0, 1.0)
    return dist


@pytest.mark.parametrize("law", [Sampling(1.0), Sampling(0.7, top_p=0.9, top_k=20)], ids=["T=1", "T=0.7,p,k"])
def test_the_forward_pass_matches_brute_force_and_the_total_probability_holds(target, loaded, runtime_for,
                                                                            prompt_ids, eval_cache, law):
    rt = runtime_for(loaded["zlab"])
    checked = 0
    for p, ids in enumerate(prompt_ids[:6]):
        for j in range(3):
            ref = cached_sampled_reference(target, ids, 10, law, draw_seed(0, ids, j), eval_cache)
            sc, _, _ = _scalars(target, rt, ids, ref.tokens, law)
            seg = sr.segment(sc)
            assert seg.error <= sr.TOLERANCE, (p, j, seg.log_total, seg.log_target)
            brute = _brute_force(sc)
            z = sum(brute.values())
            assert math.log(z) == pytest.approx(seg.log_target, abs=1e-9)
            for r, pr in enumerate(seg.round_count):
                assert pr == pytest.approx(brute.get(r, 0.0) / z, abs=1e-9)
            checked += 1
    assert checked == 18


def test_the_check_fails_loudly_when_the_law_does_not_fit_the_draws(target, loaded, runtime_for, prompt_ids,
                                                                      eval_cache):
    """The identity holds for any aligned laws (min + residual = p telescopes), so what it catches is a broken
    DP or laws that cannot have produced y: here the draws are at T = 1 and the estimator is told top-k 1."""
    ids = prompt_ids[0]
    rt = runtime_for(loaded["zlab"])
    for j in range(8):  # a draw with a token past the first that is not the target's argmax
        ref = cached_sampled_reference(target, ids, 10, Sampling(1.0), draw_seed(0, ids, j), eval_cache)
        sc, _, _ = _scalars(target, rt, ids, ref.tokens, Sampling(1.0, top_k=1))
        if not math.isfinite(float(sc.log_p[1:].sum())):
            break
    else:
        pytest.fail("every draw is the greedy continuation: the fixture target is too peaked for this test")
    with pytest.raises(Exception, match=r"prompt 0 draw \d: continuation token \d+ has probability 0 under the"):
        sr.estimate(sc, f"prompt 0 draw {j}")
    good, _, _ = _scalars(target, rt, ids, ref.tokens, Sampling(1.0))
    assert sr.estimate(good)["check_ok"] is True


def test_the_check_catches_a_forward_pass_that_loses_segmentations(target, loaded, runtime_for, prompt_ids,
                                                                  eval_cache, monkeypatch):
    """A DP that drops a kind of round (here: every round that rejects its first draft) no longer sums to p(y)."""
    ids = prompt_ids[2]
    rt = runtime_for(loaded["zlab"])
    ref = cached_sampled_reference(target, ids, 24, Sampling(1.0), draw_seed(0, ids, 0), eval_cache)
    sc, _, _ = _scalars(target, rt, ids, ref.tokens, Sampling(1.0))
    assert sr.estimate(sc)["check_ok"] is True
    whole = sr.round_log_probs

    def lossy(scalars):
        log_e, share = whole(scalars)
        return log_e.index_fill(1, torch.tensor([0]), float("-inf")), share

    monkeypatch.setattr(sr, "round_log_probs", lossy)
    with pytest.raises(Exception, match="total probability"):
        sr.estimate(sc, "prompt 2 draw 0")


def test_greedy_drafts_give_the_greedy_rules_replay_exactly(target, loaded, runtime_for, prompt_ids, eval_cache):
    """One-hot q (the drafter's argmax): one segmentation, today's teacher-forced replay, figure for figure."""
    law = Sampling(1.0)
    rt = runtime_for(loaded["zlab"])
    B = rt.block_size
    reasons = set()
    for ids in prompt_ids:
        for j in range(2):
            ref = cached_sampled_reference(target, ids, 24, law, draw_seed(0, ids, j), eval_cache)
            reasons.add(ref.stop_reason)
            feats = extract(target, ref.tokens, rt.spec.fc_layer_ids, len(ids), with_argmax=False)
            drafts = draft_sample(rt, feats.layers, ref.tokens, len(ids))
            rounds = replay(drafts)
            tl = sr.TargetLaw(target, ref.tokens, len(ids), law)
            log_p = sr.slot_scalars(rt, rt.prepare(feats.layers), ref.tokens, len(ids), tl, law).log_p
            sc = sr.greedy_scalars(log_p, drafts.topk_ids[:, :, 0], tl.y)
            fig = sr.estimate(sc)
            want = summarize([rounds], B)
            assert fig["tau"] == sample_tau(rounds)
            assert fig["rounds"] == len(rounds)
            assert fig["accepted"] == pytest.approx(want["drafts_accepted"], abs=1e-12)
            # counts from the rounds' posterior: exp(α + e + β − Z) of the one path, exact up to float64 rounding
            assert fig["tau_histogram"] == pytest.approx([want["tau_histogram"][str(t)] for t in range(1, B + 1)],
                                                         abs=1e-12)
            assert fig["hits"] == pytest.approx([x["accepted_ge_k"] for x in want["per_position"]], abs=1e-12)
            assert fig["eligible"] == pytest.approx([x["eligible"] for x in want["per_position"]], abs=1e-12)
    assert reasons == {"eos", "max_new_tokens"} or len(reasons) == 1  # both ends when the fixture draws them


@pytest.fixture(scope="module")
def per_draw(target, loaded, runtime_for, prompt_ids, eval_cache):
    """Per drafter: per-draw τ from the estimator (offline draws) and from the sampled-rule loop (its own)."""
    law = Sampling(1.0)
    out = {}
    for name in DRAFTERS:
        rt = runtime_for(loaded[name])
        fig: dict = {"offline": [], "online": [], "greedy": [], "prompt": [], "checks": []}
        for p, ids in enumerate(prompt_ids):
            for j in range(DRAWS):
                ref = cached_sampled_reference(target, ids, MAX_NEW, law, draw_seed(0, ids, j), eval_cache)
                sc, feats, _ = _scalars(target, rt, ids, ref.tokens, law)
                est = sr.estimate(sc, f"prompt {p} draw {j}")
                fig["greedy"].append(sample_tau(replay(draft_sample(rt, feats.layers, ref.tokens, len(ids)))))
                fig["offline"].append(est["tau"])
                fig["checks"].append(est["check_error"])
                res = online_generate(target, rt, ids, MAX_NEW, sampling=law, seed=draw_seed(0, ids, j, "online"),
                                      draft_rule="sampled")
                fig["online"].append(sample_tau(res.rounds))
                fig["prompt"].append(p)
        out[name] = fig
    return out


@pytest.mark.parametrize("name", DRAFTERS)
def test_the_estimate_agrees_with_the_online_sampled_rule_loop(per_draw, name):
    fig = per_draw[name]
    verdict = expectation_agreement(fig["offline"], fig["online"], fig["prompt"])
    print(f"{name}: estimate {verdict['offline_tau']:.3f} vs loop {verdict['online_tau']:.3f}, "
          f"D {verdict['difference']:+.3f} ± {verdict['bound']:.3f}; max check error {max(fig['checks']):.2e}")
    assert verdict["prompts"] == 12 and verdict["draws"] == [12 * DRAWS] * 2
    assert verdict["agree"] is True, verdict
    assert max(fig["checks"]) <= sr.TOLERANCE
    assert verdict["offline_tau"] > 1.15  # drafts are accepted at all (a never-accepting drafter agrees trivially)
    # integrating the rounds out removes their share of the per-draw variance
    est = variance_parts([t for t in fig["offline"] if t is not None], fig["prompt"])
    loop = variance_parts([t for t in fig["online"] if t is not None], fig["prompt"])
    print(f"{name}: within-prompt variance of per-draw τ, estimate {est['within']:.4f} vs loop {loop['within']:.4f}")
    assert est["within"] < loop["within"], (est, loop)


@pytest.mark.parametrize("name", DRAFTERS)
def test_the_two_rules_give_different_tau_and_the_test_tells_them_apart(per_draw, name):
    """The greedy rule's replay on the same draws is not the sampled-rule loop's expectation: the rules differ,
    and the agreement test has the power to say so."""
    fig = per_draw[name]
    verdict = expectation_agreement(fig["greedy"], fig["online"], fig["prompt"])
    print(f"{name}: greedy-rule replay {verdict['offline_tau']:.3f} vs sampled-rule loop {verdict['online_tau']:.3f}")
    assert verdict["agree"] is False, verdict


def test_slot_logprobs_is_the_processed_block_law(target, loaded, runtime_for, prompt_ids, eval_cache):
    """The drafter's law at anchor a: its top-1 is the greedy draft, it sums to one, top-k leaves k tokens."""
    rt = runtime_for(loaded["zlab"])
    ids = prompt_ids[1]
    ref = cached_sampled_reference(target, ids, 12, Sampling(1.0), draw_seed(0, ids, 0), eval_cache)
    feats = extract(target, ref.tokens, rt.spec.fc_layer_ids, len(ids), with_argmax=False)
    ctx = rt.prepare(feats.layers)
    anchors = list(range(len(ids), len(ref.tokens) - 1))
    top1, _ = rt.draft(ctx, ref.tokens, anchors, topk=1)
    lq = rt.slot_logprobs(ctx, ref.tokens, anchors, Sampling(0.8, top_k=5))
    assert lq.shape == (len(anchors), rt.block_size - 1, rt.vocab_size)
    assert torch.equal(lq.argmax(-1).cpu(), top1[:, :, 0])
    assert torch.allclose(lq.exp().sum(-1), torch.ones(lq.shape[:2]), atol=1e-5)
    assert bool(((lq > float("-inf")).sum(-1) == 5).all())
    # a block depends on tokens[:a+1] only: changing a later token leaves it alone
    later = list(ref.tokens)
    later[-1] = (later[-1] + 1) % rt.vocab_size
    again = rt.slot_logprobs(ctx, later, anchors[:-1], Sampling(0.8, top_k=5))
    assert torch.allclose(again.exp(), lq[:-1].exp(), atol=1e-6)  # (another batch: float rounding only)
