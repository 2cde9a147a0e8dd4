"""The DFlash2 drafter: its config and weights, the grouped dynamic convolution, and its τ at T = 0 against an
independent online loop written here one block at a time (fixture: ``dflash2-drafter``, trained briefly)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from remote_payload.errors import PayloadError
from remote_payload.eval.offline import draft_sample, replay
from remote_payload.eval.online import online_generate
from remote_payload.inputs.features import extract
from remote_payload.metrics.chain import sample_tau
from remote_payload.models.checkpoint import load_drafter
from remote_payload.models.dflash2 import GroupedConv
from remote_payload.models.export import strip_checkpoint


def _copy(fixture_dir, tmp_path):
    d = tmp_path / "dflash2"
    shutil.copytree(fixture_dir / "dflash2-drafter", d)
    return d


def test_the_dflash2_config_loads_with_its_fields(loaded):
    spec = loaded["dflash2"].spec
    assert spec.variant == "dflash2" and spec.format == "zlab"
    f = spec.dflash2
    assert (f.conv_kernel_size, f.conv_group_size, f.selector_rank, f.selector_top_k, f.vocab_rows) == (2, 16, 16, 8,
                                                                                                       512)
    assert spec.to_json()["variant"] == "dflash2"
    assert loaded["zlab"].spec.variant == "dflash" and loaded["zlab"].spec.dflash2 is None


@pytest.mark.parametrize("edit, message", [
    (lambda w: w.pop("layers.1.mlp_conv.kernel_projection.weight"),
     r"weights do not match the spec \(DFlash2, 2 layers\) — missing keys: layers\.1\.mlp_conv\.kernel_projection"),
    (lambda w: w.update({"layers.0.attention_conv.extra": torch.zeros(1)}),
     r"unexpected keys: layers\.0\.attention_conv\.extra"),
    (lambda w: w.pop("candidate_selector.successor_codebook"),
     r"missing keys: candidate_selector\.successor_codebook"),
    (lambda w: w.update({"layers.0.attention_conv.base_kernel": torch.zeros(2, 3, 64)}),
     r"wrong tensor shape\(s\): layers\.0\.attention_conv\.base_kernel \[2, 3, 64\] \(expected \[2, 2, 64\]\)"),
])
def test_missing_extra_and_misshapen_dflash2_weights_are_named(fixture_dir, tmp_path, edit, message):
    from safetensors.torch import load_file, save_file

    d = _copy(fixture_dir, tmp_path)
    w = load_file(str(d / "model.safetensors"))
    edit(w)
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(PayloadError, match=message):
        load_drafter(d)


@pytest.mark.parametrize("field, value, message", [
    ("conv_group_size", 24, r"conv_group_size 24 must divide the hidden size 64"),
    ("conv_kernel_size", 9, r"conv_kernel_size 9 must be between 1 and the block size 8"),
    ("selector_top_k", "8", r"selector_top_k must be an integer"),
])
def test_bad_dflash2_fields_are_named(fixture_dir, tmp_path, field, value, message):
    d = _copy(fixture_dir, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["dflash_config"][field] = value
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PayloadError, match=message):
        load_drafter(d)


def test_a_selector_for_another_vocabulary_is_refused_against_the_target(loaded, target):
    import dataclasses

    from remote_payload.models.validation import validate_against_target

    spec = loaded["dflash2"].spec
    other = dataclasses.replace(spec, dflash2=dataclasses.replace(spec.dflash2, vocab_rows=600))
    with pytest.raises(PayloadError, match=r"selector's codebooks have 600 rows but the target .* 512-token"):
        validate_against_target(other, target.config, target.tokenizer, target.stop_ids, "d2")
    validate_against_target(spec, target.config, target.tokenizer, target.stop_ids, "d2")


def test_the_grouped_convolution_is_the_formula_row_by_row():
    """out[i, c] = Σ_t (base[side, t, c] + δ[i, t, g(c)]) · x[i − t, c], rows of another block never read."""
    torch.manual_seed(0)
    H, B, taps, gs = 8, 4, 3, 2
    conv = GroupedConv(H, B, taps, gs)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(3 * B, H)  # three blocks, flat
    y = torch.randn(3 * B, H)
    got_x, delta = conv.prepare(x)
    got_y = conv.finish(y, delta)
    raw = (x @ conv.kernel_projection.weight.T).view(3 * B, 2, taps, H // gs)
    for side, rows, got in ((0, x, got_x), (1, y, got_y)):
        want = torch.zeros_like(rows)
        for n in range(3 * B):
            for c in range(H):
                for t in range(taps):
                    if n % B - t < 0:
                        continue  # before the block's first row
                    coef = conv.base_kernel[side, t, c] + raw[n, side, t, c // gs]
                    want[n, c] += coef * rows[n - t, c]
        assert torch.allclose(got, want, atol=1e-5), side


def _plain_walk(rt, h, anchor_token):
    """The selector's greedy walk for one block, the score written out: logit(b) + <P[a] ⊙ W·h, S[b]> over the
    top-K of each slot's logits."""
    sel = rt.model.candidate_selector
    K = rt.spec.dflash2.selector_top_k
    prev, out = anchor_token, []
    for j in range(h.shape[0]):
        logits = rt.logits(h[j])
        best, best_score = None, None
        for b in torch.topk(logits, K).indices.tolist():
            score = float(logits[b]) + float(((sel.predecessor_codebook[prev] * (sel.hidden_projection.weight @ h[j]))
                                              * sel.successor_codebook[b]).sum())
            if best_score is None or score > best_score:
                best, best_score = b, score
        out.append(best)
        prev = best
    return out


@torch.no_grad()
def _independent_loop(target, rt, prompt_ids, max_new):
    """The online DFlash2 loop at T = 0, one block at a time, nothing cached: the target runs over everything
    committed (features and verification), the drafter drafts one block at the last committed token."""
    B, stop, P = rt.block_size, set(target.stop_ids), len(prompt_ids)

    def target_argmax(seq):
        return target.model(input_ids=torch.tensor([seq])).logits[0].argmax(-1).tolist()

    committed = list(prompt_ids) + [target_argmax(prompt_ids)[-1]]
    rounds = []
    while committed[-1] not in stop and len(committed) - P < max_new:
        a = len(committed) - 1
        feats = extract(target, committed, rt.spec.fc_layer_ids, P, with_argmax=False)
        h = rt.hidden(rt.prepare(feats.layers), committed, [a])[0]
        drafts = _plain_walk(rt, h, committed[a])
        post = target_argmax(committed + drafts)[a:a + B]
        acc = 0
        while acc < B - 1 and drafts[acc] == post[acc]:
            acc += 1
        new = drafts[:acc] + [post[acc]]
        end = next((i for i, t in enumerate(new) if t in stop), None)
        new = (new if end is None else new[:end + 1])[:max_new - (len(committed) - P)]
        rounds.append((a, min(acc, len(new)), len(new)))
        committed += new
    return committed, rounds


def test_tau_at_t0_equals_an_independent_online_dflash2_loop_round_by_round(target, loaded, runtime_for, samples):
    rt = runtime_for(loaded["dflash2"])
    compared, differs = 0, 0
    for _, ref, _ in samples[:6]:
        P = len(ref.prompt_ids)
        feats = extract(target, ref.tokens, rt.spec.fc_layer_ids, P, with_argmax=False)
        offline = replay(draft_sample(rt, feats.layers, ref.tokens, P))
        committed, rounds = _independent_loop(target, rt, ref.prompt_ids, len(ref.tokens) - P)
        assert committed == ref.tokens
        assert [(r.anchor, r.accepted, r.produced) for r in offline] == rounds
        assert sample_tau(offline) == sum(r[2] for r in rounds) / len(rounds)
        compared += len(rounds)
        # the selector matters: its walk is not the plain argmax everywhere
        h = rt.hidden(rt.prepare(feats.layers), ref.tokens, list(range(P, len(ref.tokens) - 1)))
        walk, _ = rt.draft(rt.prepare(feats.layers), ref.tokens, list(range(P, len(ref.tokens) - 1)))
        differs += int((rt.logits(h).argmax(-1) != walk[:, :, 0]).sum())
    print(f"DFlash2 at T=0: {compared} rounds equal, offline replay vs independent loop")
    assert compared >= 30 and differs > 0


def test_dfos_online_loop_runs_the_dflash2_walk(target, loaded, runtime_for, samples):
    """The eval's own online loop (KV-cached target session) gives the offline rounds too."""
    rt = runtime_for(loaded["dflash2"])
    for _, ref, feats in samples[:3]:
        P = len(ref.prompt_ids)
        offline = replay(draft_sample(rt, feats.layers, ref.tokens, P))
        res = online_generate(target, rt, ref.prompt_ids, len(ref.tokens) - P)
        assert [r.as_dict() for r in res.rounds] == [r.as_dict() for r in offline]


def test_a_stripped_dflash2_training_checkpoint_drafts_the_same(fixture_dir, tmp_path, loaded, runtime_for, samples):
    ld = loaded["dflash2"]
    spec = {**json.loads((fixture_dir / "trained-drafter" / "spec.json").read_text()),
            "reserve_last_target_layer": False, "target_layer_ids": ld.spec.fc_layer_ids,
            "architectures": ["DFlash2DraftModel"], "conv_kernel_size": 2, "conv_group_size": 16,
            "selector_rank": 16, "selector_top_k": 8}
    ckpt = tmp_path / "checkpoint.pt"
    torch.save({"model": {f"draft_model.{k}": v for k, v in ld.weights.items()}, "config": spec, "step": 3}, ckpt)
    record = strip_checkpoint(ckpt, tmp_path / "out")
    assert record["status"] == "written"
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["dflash_config"]["selector_top_k"] == 8
    assert cfg["vocab_size"] == 512
    again = load_drafter(tmp_path / "out")
    assert again.spec.dflash2 == ld.spec.dflash2
    _, ref, feats = samples[0]
    a = draft_sample(runtime_for(ld), feats.layers, ref.tokens, len(ref.prompt_ids), topk=3)
    b = draft_sample(runtime_for(again), feats.layers, ref.tokens, len(ref.prompt_ids), topk=3)
    assert torch.equal(a.topk_ids, b.topk_ids)


def test_soft_capping_comes_before_the_output_multiplier_as_in_vllm(loaded, runtime_for):
    """With both set, the selector's candidates are ranked on multiplier · cap · tanh(logit / cap) (vLLM's
    LogitsProcessor for DFlash2's candidates), not on cap · tanh(multiplier · logit / cap)."""
    import dataclasses

    ld = loaded["dflash2"]
    both = dataclasses.replace(ld, spec=dataclasses.replace(ld.spec, output_multiplier=4.0, logit_softcap=3.0))
    plain, rt = runtime_for(ld), runtime_for(both)
    h = torch.randn(2, 3, ld.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    raw = plain.logits(h)
    assert torch.allclose(rt.logits(h), 4.0 * 3.0 * torch.tanh(raw / 3.0), atol=1e-5)
    assert not torch.allclose(rt.logits(h), 3.0 * torch.tanh(4.0 * raw / 3.0), atol=1e-3)
    vals, _ = rt.selector.candidates(rt.logits(h))
    assert float(vals.abs().max()) <= 12.0 + 1e-4  # the cap scaled by the multiplier bounds the selector's input


def test_topk_above_the_selectors_k_is_named(loaded):
    from remote_payload.eval.drafters import topk_above_selector

    k = loaded["dflash2"].spec.dflash2.selector_top_k
    assert topk_above_selector(loaded["dflash2"].spec, "d2", k) is None
    assert topk_above_selector(loaded["zlab"].spec, "z", k + 8) is None  # a DFlash drafter has every rank
    note = topk_above_selector(loaded["dflash2"].spec, "d2", k + 8)
    assert note == (f"--topk {k + 8}: drafter 'd2' is DFlash2, its selector walks the top {k} candidates of each "
                    f"slot, so ranks {k + 1}..{k + 8} do not exist for it (kept as id -1, never a match); its figures "
                    "use rank 1 only and are unaffected")
