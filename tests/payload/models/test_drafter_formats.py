"""All three checkpoint formats load to one spec; equivalent weights draft identically; bad inputs are named."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from remote_payload.errors import PayloadError
from remote_payload.eval.offline import draft_sample
from remote_payload.models.checkpoint import load_drafter, read_training_checkpoint
from remote_payload.models.export import strip_checkpoint
from remote_payload.models.spec import from_zlab, zlab_default_layer_ids
from remote_payload.models.validation import validate_against_target


def test_three_formats_normalise_to_the_same_spec(loaded):
    tr, zl, sp = loaded["training"].spec, loaded["zlab"].spec, loaded["speculators"].spec
    assert (tr.format, zl.format, sp.format) == ("training", "zlab", "speculators")
    # the training spec lists [1, 3, 5, 7] with 7 reserved for the loss; speculators stores ids + 1
    assert tr.fc_layer_ids == zl.fc_layer_ids == sp.fc_layer_ids == [1, 3, 5]
    assert tr.reserved_layer_ids == [7] and zl.reserved_layer_ids == [] and sp.reserved_layer_ids == []
    assert "minus 1" in sp.layer_ids_source
    for s in (tr, zl, sp):
        assert s.block_size == 8 and s.fc_in_features == 3 * 64
        assert [(a.kind, a.window, a.causal) for a in s.attn] == [
            ("sliding_attention", 64, True), ("full_attention", None, False)]
    assert (sp.embed_source, sp.lm_head_source, sp.vocab_map) == ("checkpoint", "checkpoint", "d2t")
    assert (zl.embed_source, zl.lm_head_source, zl.vocab_map) == ("target", "target", None)


def test_equivalent_weights_give_identical_drafts(loaded, runtime_for, samples):
    for _p, ref, feats in samples[:4]:
        outs = {}
        for name in ("training", "zlab", "speculators"):
            d = draft_sample(runtime_for(loaded[name]), feats.layers, ref.tokens, len(ref.prompt_ids), topk=4)
            outs[name] = d
        assert torch.equal(outs["training"].topk_ids, outs["zlab"].topk_ids)
        # the speculators copy permutes its draft vocabulary; d2t maps it back to the same target ids
        assert torch.equal(outs["training"].topk_ids[..., 0], outs["speculators"].topk_ids[..., 0])
        assert torch.allclose(outs["training"].topk_logprobs, outs["speculators"].topk_logprobs, atol=1e-5)
    random = draft_sample(runtime_for(loaded["random"]), feats.layers, ref.tokens, len(ref.prompt_ids))
    assert not torch.equal(random.topk_ids[..., 0], outs["zlab"].topk_ids[..., 0])


def test_old_and_new_zlab_schemas_parse_alike():
    new = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "intermediate_size": 128, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
           "layer_types": ["full_attention", "full_attention"],
           "dflash_config": {"block_size": 16, "mask_token_id": 5, "target_layer_ids": [1, 3]}}
    old = {k: v for k, v in new.items() if k not in ("rope_parameters", "layer_types", "dflash_config")}
    old.update(block_size=16, rope_theta=1e6, rope_scaling=None, use_sliding_window=False,
               dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 3]})
    a, b = from_zlab(new, {}, "new"), from_zlab(old, {}, "old")
    for field in ("block_size", "mask_token_id", "fc_layer_ids", "attn", "num_layers", "head_dim"):
        assert getattr(a, field) == getattr(b, field), field
    assert a.rope == b.rope == {"rope_type": "default", "rope_theta": 1e6}
    # YaRN in the old rope_scaling form normalises to rope_parameters
    old["rope_scaling"] = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert from_zlab(old, {}, "old").rope == {"rope_type": "yarn", "factor": 4.0,
                                              "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    # no target_layer_ids: z-lab's default spread (Qwen3.6-27B: 64 layers, 5 drafter layers)
    assert zlab_default_layer_ids(64, 5) == [1, 16, 31, 46, 61]


def test_strip_checkpoint_roundtrip(fixture_dir, tmp_path, loaded, runtime_for, samples):
    src = fixture_dir / "trained-drafter" / "checkpoint.pt"
    out = tmp_path / "stripped"
    summary = strip_checkpoint(src, out)  # spec.json beside the checkpoint is found
    assert summary["status"] == "written" and summary["spec"] == "complete"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "dfo-source.json", "model.safetensors"]
    record = json.loads((out / "dfo-source.json").read_text())
    import hashlib
    assert record["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    assert record["dropped"] == ["epoch", "optimizer", "step"] and record["step"] == 45
    assert (out / "model.safetensors").stat().st_size < src.stat().st_size / 2  # optimizer state gone
    again = load_drafter(out)
    assert again.spec.format == "training (stripped)"
    assert again.spec.fc_layer_ids == [1, 3, 5] and again.spec.reserved_layer_ids == [7]
    _p, ref, feats = samples[0]
    a = draft_sample(runtime_for(again), feats.layers, ref.tokens, len(ref.prompt_ids))
    b = draft_sample(runtime_for(loaded["training"]), feats.layers, ref.tokens, len(ref.prompt_ids))
    assert torch.equal(a.topk_ids, b.topk_ids)
    assert strip_checkpoint(src, out)["status"] == "unchanged"  # idempotent for the relay's re-runs


def test_strip_without_any_spec_writes_weights_and_eval_asks_for_one(fixture_dir, tmp_path):
    src = tmp_path / "ckpt" / "step_45.pt"
    src.parent.mkdir()
    shutil.copy(fixture_dir / "trained-drafter" / "checkpoint.pt", src)  # no spec.json beside it
    out = tmp_path / "stripped"
    assert strip_checkpoint(src, out)["spec"] == "missing"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_size"] == 64 and cfg["fc_in_features"] == 192 and "dfo_incomplete" in cfg
    with pytest.raises(PayloadError, match="has no drafter spec"):
        load_drafter(out)
    ld = load_drafter(out, fixture_dir / "trained-drafter" / "spec.json")
    assert ld.spec.fc_layer_ids == [1, 3, 5]


def test_unknown_checkpoint_layout_lists_keys(tmp_path):
    path = tmp_path / "weird.pt"
    torch.save({"weights": {"fc.weight": torch.zeros(2, 2)}, "opt": {}, "iteration": 3}, path)
    with pytest.raises(PayloadError, match=r"unknown layout .* top-level keys found: iteration, opt, weights"):
        read_training_checkpoint(path)
    torch.save({"fc.weight": torch.zeros(2, 2)}, path)
    with pytest.raises(PayloadError, match=r"looks like a bare state dict"):
        read_training_checkpoint(path)


# ---------------------------------------------------------------------------------------------------
# corrupt or mismatched inputs


def _copy(fixture_dir, name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(fixture_dir / name, dst)
    return dst


def test_truncated_safetensors_is_named(fixture_dir, tmp_path):
    d = _copy(fixture_dir, "zlab-drafter", tmp_path)
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(PayloadError, match=r"model\.safetensors: unreadable safetensors .* truncated or corrupt"):
        load_drafter(d)


def test_truncated_training_checkpoint_is_named(fixture_dir, tmp_path):
    src = fixture_dir / "trained-drafter" / "checkpoint.pt"
    bad = tmp_path / "ckpt.pt"
    bad.write_bytes(src.read_bytes()[:5000])
    with pytest.raises(PayloadError, match=r"ckpt\.pt: unreadable torch file"):
        read_training_checkpoint(bad)


def test_missing_config_field_is_named(fixture_dir, tmp_path):
    d = _copy(fixture_dir, "zlab-drafter", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["dflash_config"]["mask_token_id"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PayloadError, match=r"config\.json: missing field dflash_config\.mask_token_id; refusing "
                                           r"to fall back to pad/eos"):
        load_drafter(d)
    del cfg["dflash_config"]["block_size"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PayloadError, match=r"missing field block_size"):
        load_drafter(d)
    # the spec override supplies what an old config lacks
    spec = tmp_path / "fix.json"
    spec.write_text(json.dumps({"mask_token_id": 5, "block_size": 8}))
    assert load_drafter(d, spec).spec.mask_token_id == 5


def test_fc_width_mismatch_message(fixture_dir, tmp_path):
    spec = json.loads((fixture_dir / "trained-drafter" / "spec.json").read_text())
    spec["reserve_last_target_layer"] = False  # claims fc sees all four listed layers
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(PayloadError, match=r"fc expects 192 = 3 × 64 inputs but the spec lists 4 layers "
                                           r"\[1, 3, 5, 7\]; fc skips one listed layer"):
        load_drafter(fixture_dir / "trained-drafter" / "checkpoint.pt", path)


def test_missing_and_unexpected_keys_are_listed(fixture_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(fixture_dir, "zlab-drafter", tmp_path)
    w = load_file(str(d / "model.safetensors"))
    w.pop("layers.1.mlp.up_proj.weight")
    w["layers.1.mlp.extra.weight"] = torch.zeros(1)
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(PayloadError, match=r"missing keys: layers\.1\.mlp\.up_proj\.weight; unexpected keys: "
                                           r"layers\.1\.mlp\.extra\.weight"):
        load_drafter(d)


def test_fp16_weights_refused_unless_forced(fixture_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    d = _copy(fixture_dir, "zlab-drafter", tmp_path)
    w = {k: v.half() for k, v in load_file(str(d / "model.safetensors")).items()}
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(PayloadError, match=r"weights are float16; .* near-0% acceptance .* --allow-fp16"):
        load_drafter(d)
    assert load_drafter(d, allow_fp16=True).spec.weights_dtype == "float16"


def test_fp16_eval_dtype_refused():
    from remote_payload.models.target import resolve_dtype

    with pytest.raises(PayloadError, match="dtype float16 refused"):
        resolve_dtype("float16")
    assert resolve_dtype("float16", allow_fp16=True) == torch.float16


def test_wrong_hidden_size_is_named(loaded, target):
    import dataclasses

    other = dataclasses.replace(target.config, hidden_size=128, name="bigger")
    with pytest.raises(PayloadError, match=r"drafter hidden size 64 but the target \(bigger\) has hidden size 128"):
        validate_against_target(loaded["zlab"].spec, other, target.tokenizer, target.stop_ids, "zlab")


def test_layer_ids_beyond_the_target_are_named(loaded, target):
    import dataclasses

    shallow = dataclasses.replace(target.config, num_layers=6)
    with pytest.raises(PayloadError, match=r"target layer id\(s\) \[7\] outside the target's decoder layers 0..5"):
        validate_against_target(loaded["training"].spec, shallow, target.tokenizer, target.stop_ids, "t")


@pytest.mark.parametrize("mask,message", [
    ("<|im_end|>", "is the tokenizer's eos token"),
    ("<|endoftext|>", "is the tokenizer's pad token"),
    ("Here", "is the regular vocabulary token 'Here'"),
    ("<|im_start|>", "chat-template token"),
    (9999, "outside the vocabulary"),
])
def test_wrong_mask_id_refused(loaded, target, mask, message):
    import dataclasses

    tok = target.tokenizer
    mask_id = mask if isinstance(mask, int) else tok.convert_tokens_to_ids(mask)
    spec = dataclasses.replace(loaded["zlab"].spec, mask_token_id=mask_id)
    with pytest.raises(PayloadError, match=message):
        validate_against_target(spec, target.config, tok, target.stop_ids, "zlab")
    # the real mask token passes
    validate_against_target(loaded["zlab"].spec, target.config, tok, target.stop_ids, "zlab")


def test_dflash2_weights_under_a_dflash_config_are_refused(fixture_dir, tmp_path):
    """DFlash2 weights (selector, dynamic convolutions) loaded as DFlash would silently drop the selector."""
    from safetensors.torch import load_file, save_file

    d = _copy(fixture_dir, "zlab-drafter", tmp_path)
    w = load_file(str(d / "model.safetensors"))
    w["layers.0.attention_conv.base_kernel"] = torch.zeros(2, 2, 64)
    w["predecessor_codebook"] = torch.zeros(16, 4)
    save_file(w, str(d / "model.safetensors"))
    with pytest.raises(PayloadError, match=r"the weights are a DFlash2 drafter's .*layers\.0\.attention_conv\."
                                           r"base_kernel, predecessor_codebook\) but the config describes a DFlash "
                                           r"drafter .*ignore the selector"):
        load_drafter(d)


def test_a_dflash2_config_without_its_fields_names_them(fixture_dir, tmp_path):
    d = _copy(fixture_dir, "zlab-drafter", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"]["selector_top_k"] = 8
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PayloadError, match=r"a DFlash2 config .* needs dflash_config\.conv_kernel_size, "
                                           r"dflash_config\.conv_group_size, dflash_config\.selector_rank;"):
        load_drafter(d)


SAFETENSORS_HEAD = (20).to_bytes(8, "little") + b'{"__metadata__":{}} '


@pytest.mark.parametrize("content, said", [
    (b"", "an empty file (0 bytes)"),
    (b"hello, this is not a checkpoint\n", "a text file, not a torch.save file (it starts 'hello, this is not a "),
    (SAFETENSORS_HEAD, "a safetensors file, not a torch.save file"),
    (bytes(range(1, 64)), "not a torch.save file (neither a zip archive nor a pickle)"),
], ids=["empty", "text", "safetensors", "binary"])
def test_a_file_that_is_not_a_torch_file_is_said_to_be_so(tmp_path, capsys, content, said):
    from remote_payload.cli import main

    bad = tmp_path / "garbage.pt"
    bad.write_bytes(content)
    with pytest.raises(PayloadError) as caught:
        read_training_checkpoint(bad)
    assert said in str(caught.value) and "Python objects" not in str(caught.value)
    # the payload's strip says it in its one error line, and writes nothing
    code = main(["strip-checkpoint", str(bad), str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0]
    assert err[0].startswith("dfo-payload error: training checkpoint")
    assert not (tmp_path / "out").exists()
