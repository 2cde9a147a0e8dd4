"""The drafter forward follows the DFlash block (models/drafter.py), and the pitfalls of the table in
docs/troubleshooting.md are caught or impossible."""

from __future__ import annotations

import dataclasses
import math

import torch

from remote_payload.eval.offline import draft_sample, replay
from remote_payload.fixtures.models import seeded_drafter_weights
from remote_payload.metrics.chain import summarize
from remote_payload.models.checkpoint import LoadedDrafter
from remote_payload.models.drafter import DrafterRuntime, block_mask
from remote_payload.models.spec import FULL, SLIDING, AttnLayer


def _tau(runtime, samples, n=6):
    rounds = [replay(draft_sample(runtime, f.layers, r.tokens, len(r.prompt_ids))) for _p, r, f in samples[:n]]
    return summarize(rounds, runtime.block_size)["tau_macro"]


def _mixed_spec(loaded):
    """A 3-layer random drafter: causal sliding (window 3 < block 8), bidirectional full, bidirectional sliding."""
    spec = dataclasses.replace(loaded["zlab"].spec, num_layers=3, attn=[
        AttnLayer(SLIDING, 3, True), AttnLayer(FULL, None, False), AttnLayer(SLIDING, 5, False)])
    return LoadedDrafter(spec=spec, weights=seeded_drafter_weights(spec, 7), extras={}, source={})


def _naive_hidden(rt: DrafterRuntime, features, tokens, a):
    """Straight from the definition (models/drafter.py): one block, explicit per-query visibility and per-head
    softmax."""
    spec, m = rt.spec, rt.model
    B, hd = spec.block_size, spec.head_dim
    with torch.no_grad():
        c = m.hidden_norm(m.fc(torch.cat([features[lid][:a] for lid in spec.fc_layer_ids], -1)))
        h = rt.embed(torch.tensor([tokens[a]] + [spec.mask_token_id] * (B - 1))).float()
        cos_c, sin_c = m.cos_sin(torch.arange(a), torch.float32)
        cos_b, sin_b = m.cos_sin(torch.arange(a, a + B), torch.float32)

        def rope(x, cos, sin):  # x [L, heads, hd]
            half = hd // 2
            rot = torch.cat([-x[..., half:], x[..., :half]], -1)
            return x * cos[:, None] + rot * sin[:, None]

        for li, layer in enumerate(m.layers):
            att, kind = layer.self_attn, spec.attn[li]
            x = layer.input_layernorm(h)
            q = rope(att.q_norm(att.q_proj(x).view(B, -1, hd)), cos_b, sin_b)
            kc = rope(att.k_norm(att.k_proj(c).view(a, -1, hd)), cos_c, sin_c)
            kb = rope(att.k_norm(att.k_proj(x).view(B, -1, hd)), cos_b, sin_b)
            vc, vb = att.v_proj(c).view(a, -1, hd), att.v_proj(x).view(B, -1, hd)
            group = spec.num_heads // spec.num_kv_heads
            out = torch.zeros(B, spec.num_heads, hd)
            for i in range(B):
                keys, vals = [], []
                for p in range(a):
                    if kind.window is None or (a + i) - p < kind.window:
                        keys.append(kc[p]), vals.append(vc[p])
                for j in range(B):
                    if (not kind.causal or j <= i) and (kind.window is None or abs(i - j) < kind.window):
                        keys.append(kb[j]), vals.append(vb[j])
                K, V = torch.stack(keys), torch.stack(vals)  # [n, kv, hd]
                for head in range(spec.num_heads):
                    kv = head // group
                    w = torch.softmax(K[:, kv] @ q[i, head] / math.sqrt(hd), 0)
                    out[i, head] = w @ V[:, kv]
            h = h + att.o_proj(out.reshape(B, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return m.norm(h)[1:]


def test_batched_forward_matches_a_naive_implementation_of_the_design_note(loaded, runtime_for, samples):
    rt = runtime_for(_mixed_spec(loaded))
    _p, ref, feats = samples[0]
    P = len(ref.prompt_ids)
    anchors = [P, P + 1, P + 9, P + 30]  # several blocks in one masked pass
    ctx = rt.prepare(feats.layers)
    batched = rt.hidden(ctx, ref.tokens, anchors)
    for g, a in enumerate(anchors):
        assert torch.allclose(batched[g], _naive_hidden(rt, feats.layers, ref.tokens, a), atol=2e-5), a


def test_all_anchor_pass_equals_one_block_at_a_time(loaded, runtime_for, samples):
    rt = runtime_for(loaded["zlab"])
    _p, ref, feats = samples[2]
    P = len(ref.prompt_ids)
    batch = draft_sample(rt, feats.layers, ref.tokens, P, topk=3)
    ctx = rt.prepare(feats.layers)
    for a in batch.anchors[::7]:
        ids, lps = rt.draft(ctx, ref.tokens, [a], topk=3)
        k = batch.anchors.index(a)
        assert torch.equal(ids[0], batch.topk_ids[k]) and torch.allclose(lps[0], batch.topk_logprobs[k], atol=1e-5)


def test_sliding_window_layers_see_only_their_window(loaded, runtime_for, samples):
    # one causal sliding layer with window 4: context beyond the window cannot change anything
    spec = dataclasses.replace(loaded["zlab"].spec, num_layers=1, attn=[AttnLayer(SLIDING, 4, True)])
    rt = runtime_for(LoadedDrafter(spec=spec, weights=seeded_drafter_weights(spec, 3), extras={}, source={}))
    _p, ref, feats = samples[0]
    a = len(ref.prompt_ids) + 20
    base = rt.hidden(rt.prepare(feats.layers), ref.tokens, [a])[0]

    def perturbed(pos):
        f = {k: v.clone() for k, v in feats.layers.items()}
        for v in f.values():
            v[pos] += 3.0
        return rt.hidden(rt.prepare(f), ref.tokens, [a])[0]

    assert torch.equal(perturbed(a - 10), base)  # 10 positions back: outside every slot's window
    changed = (perturbed(a - 1) - base).abs().amax(-1) > 1e-6
    # slot i (position a+i) sees context a-1 only while (a+i) - (a-1) < 4, i.e. slots 0..2 (row 0 = slot 1)
    assert changed.tolist() == [True, True, False, False, False, False, False]


def test_block_mask_causality_per_layer_kind():
    anchors = torch.tensor([5, 9])
    causal = block_mask(anchors, 4, 9, None, True)
    bidir = block_mask(anchors, 4, 9, None, False)
    assert causal.shape == (8, 9 + 8)
    # block 0 (anchor 5): context 0..4 visible, 5..8 not (they are after the anchor)
    assert causal[0, :9].tolist() == [True] * 5 + [False] * 4
    assert bidir[1, 9:13].tolist() == [True] * 4 and causal[1, 9:13].tolist() == [True, True, False, False]
    assert not causal[0, 13:].any() and not bidir[3, 13:].any()  # never another block's slots
    windowed = block_mask(anchors, 4, 9, 2, False)
    assert windowed[4, :9].tolist() == [False] * 8 + [True]  # slot 0 of block 1 (position 9) sees context 8
    assert not windowed[5, :9].any()  # position 10 would need context 9, which is the block's own slot 0
    assert windowed[5, 13:].tolist() == [True, True, True, False]  # slot 1 sees slots 0..2


def test_slot_zero_holds_the_committed_token_on_both_paths(loaded, runtime_for, samples, target, monkeypatch):
    from remote_payload.eval.online import online_generate

    rt = runtime_for(loaded["zlab"])
    seen = []
    original = rt.block_input_ids

    def spy(tokens, anchors, *how):
        ids = original(tokens, anchors, *how)
        seen.append((tokens.tolist(), anchors.tolist(), ids.clone()))
        return ids

    monkeypatch.setattr(rt, "block_input_ids", spy)
    _p, ref, feats = samples[3]
    draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids))  # offline: every anchor in one pass
    online_generate(target, rt, ref.prompt_ids, 24)  # online: one block per round
    assert len(seen) > 3
    for tokens, anchors, ids in seen:
        # slot 0 = the last committed token (the previous round's bonus), never the mask
        assert ids[:, 0].tolist() == [tokens[a] for a in anchors]
        assert (ids[:, 0] != rt.spec.mask_token_id).all()
        assert (ids[:, 1:] == rt.spec.mask_token_id).all()
        # the committed token at the anchor is the reference token there (online == greedy)
        assert [tokens[a] for a in anchors] == [ref.tokens[a] for a in anchors]


def test_layer_offset_cannot_slip_through(loaded, runtime_for, samples, target):
    from remote_payload.inputs.features import extract

    zl = loaded["zlab"]
    # the same drafter fed the HF hidden_states indices (layer ids + 1) instead of decoder-layer ids
    shifted_spec = dataclasses.replace(zl.spec, fc_layer_ids=[2, 4, 6])
    rt_shift = runtime_for(LoadedDrafter(spec=shifted_spec, weights=zl.weights, extras={}, source={}))
    good = _tau(runtime_for(zl), samples, n=4)
    shifted_samples = []
    for p, r, _f in samples[:4]:
        f = extract(target, r.tokens, [2, 4, 6], len(r.prompt_ids), with_argmax=False)
        shifted_samples.append((p, r, f))
    bad = _tau(rt_shift, shifted_samples, n=4)
    assert bad < 0.8 * good
    # while the speculators format (ids stored +1) resolves to the same decoder layers as z-lab's
    assert loaded["speculators"].spec.fc_layer_ids == zl.spec.fc_layer_ids == [1, 3, 5]


def test_bf16_features_are_cast_explicitly_for_an_fp32_drafter(loaded, runtime_for, samples):
    rt = runtime_for(loaded["zlab"])
    _p, ref, feats = samples[0]
    bf16 = {k: v.to(torch.bfloat16) for k, v in feats.layers.items()}
    x = rt.fc_input(bf16)
    assert x.dtype == torch.float32
    d = draft_sample(rt, bf16, ref.tokens, len(ref.prompt_ids))  # runs: no dtype mismatch error
    assert d.topk_ids.shape[1] == rt.block_size - 1
