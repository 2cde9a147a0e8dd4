"""Offline (teacher-forced) vs online (draft -> verify -> rollback): identical rounds, lossless output."""

from __future__ import annotations

import pytest
import torch
from payload_helpers import MAX_NEW, SyntheticDrafter

from remote_payload.eval.offline import draft_sample, replay
from remote_payload.eval.online import TargetSession, online_generate, rollback_mode
from remote_payload.inputs.reference import forward, greedy_decode


def _offline_rounds(rt, feats, ref):
    return [r.as_dict() for r in replay(draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids)))]


def test_online_equals_greedy_and_offline_rounds_with_trained_drafter(loaded, runtime_for, samples, target):
    rt = runtime_for(loaded["zlab"])
    accepted_depths = set()
    for _p, ref, feats in samples[:5]:
        res = online_generate(target, rt, ref.prompt_ids, MAX_NEW)
        assert res.continuation == ref.continuation  # lossless: exactly the target's greedy decoding
        assert res.stop_reason == ref.stop_reason == "eos"
        online = [r.as_dict() for r in res.rounds]
        assert online == _offline_rounds(rt, feats, ref)
        accepted_depths |= {r["accepted"] for r in online}
    # the comparison is meaningful: rounds with no, partial and full acceptance all occurred
    assert {0, 7} <= accepted_depths and len(accepted_depths) >= 5


def test_synthetic_drafter_online_and_offline_follow_the_planned_errors(samples, target):
    _p, ref, _f = samples[4]
    P, B = len(ref.prompt_ids), 8
    errors = {P: {3}, P + 3: {1}, P + 4: {7}, P + 11: {2, 5}}
    drafter = SyntheticDrafter(ref.tokens, B, errors, vocab=512)
    offline = replay(draft_sample(drafter, {}, ref.tokens, P))
    res = online_generate(target, SyntheticDrafter(ref.tokens, B, errors, vocab=512), ref.prompt_ids, MAX_NEW)
    assert res.continuation == ref.continuation
    assert [r.as_dict() for r in res.rounds] == [r.as_dict() for r in offline]
    first = [(r.anchor - P, r.accepted, r.produced) for r in offline[:4]]
    # anchor P: depth 3 wrong -> 2 accepted; P+3: depth 1 wrong -> 0; P+4: depth 7 wrong -> 6; P+11: depth 2 -> 1
    assert first == [(0, 2, 3), (3, 0, 1), (4, 6, 7), (11, 1, 2)]
    assert all(r.accepted == min(7, r.remaining) for r in offline[4:])  # no planned errors afterwards


def test_hybrid_target_is_rolled_back_exactly(samples, target):
    assert target.config.has_linear_attention and rollback_mode(target, "auto") == "snapshot"
    _p, ref, _f = samples[0]
    P = len(ref.prompt_ids)
    tokens = ref.tokens
    wrong_block = [tokens[P]] + [tokens[P + 1], tokens[P + 2], 7, 7, 7, 7, 7]  # two right drafts, then junk

    def next_logits_after_rollback(mode):
        s = TargetSession(target, mode)
        try:
            with torch.inference_mode():
                s.feed(tokens[:P])
                s.verify(wrong_block)
                s.keep(3)  # anchor + 2 accepted drafts
                assert s.length == P + 3
                return s.feed([tokens[P + 3]])[-1]
        finally:
            s.close()

    with torch.inference_mode():
        fresh = forward(target.model, torch.tensor([tokens[:P + 4]])).logits[0, -1]
    assert (next_logits_after_rollback("snapshot") - fresh).abs().max() < 1e-4
    # the pitfall: cropping a hybrid cache runs but leaves the linear-attention state wrong
    assert (next_logits_after_rollback("crop") - fresh).abs().max() > 1e-3


@pytest.fixture(scope="module")
def attention_only_target(fixture_dir, tmp_path_factory):
    """A tiny random Qwen3 (full attention only): the crop rollback path."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from remote_payload.models.target import load_target

    folder = tmp_path_factory.mktemp("qwen3-target")
    tok = AutoTokenizer.from_pretrained(str(fixture_dir / "tokenizer"))
    torch.manual_seed(5)
    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return load_target(folder, device="cpu", dtype="float32")


def test_attention_only_target_uses_crop_and_stays_lossless(attention_only_target, samples):
    t = attention_only_target
    assert t.kernel_path == "none" and rollback_mode(t, "auto") == "crop"
    prompt = samples[0][1].prompt_ids
    ref = greedy_decode(t, prompt, 40)
    P = len(prompt)
    errors = {a: {1 + (a % 5)} for a in range(P, P + 40, 3)}
    res = online_generate(t, SyntheticDrafter(ref.tokens, 6, errors, vocab=512), prompt, 40)
    assert res.continuation == ref.continuation
    offline = replay(draft_sample(SyntheticDrafter(ref.tokens, 6, errors, vocab=512), {}, ref.tokens, P))
    assert [r.as_dict() for r in res.rounds] == [r.as_dict() for r in offline]
    assert any(0 < r.accepted < 5 for r in offline)  # partial acceptance exercised the crop


def test_max_new_tokens_budget_truncates_the_last_round(samples, target, loaded, runtime_for):
    rt = runtime_for(loaded["zlab"])
    _p, ref, _f = samples[1]
    res = online_generate(target, rt, ref.prompt_ids, 20)
    assert res.continuation == ref.continuation[:20] and res.stop_reason == "max_new_tokens"
    assert sum(r.produced for r in res.rounds) == 19  # the prefill produced the first token
    short = greedy_decode(target, ref.prompt_ids, 20)
    feats = {k: v[:len(short.tokens)] for k, v in _f.layers.items()}
    assert [r.as_dict() for r in res.rounds] == [r.as_dict() for r in replay(
        draft_sample(rt, feats, short.tokens, len(short.prompt_ids)))]
