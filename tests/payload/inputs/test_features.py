"""Hidden-state extraction: hooks vs output_hidden_states on both Qwen3.5 wrappers, and the feature cache."""

from __future__ import annotations

import json

import pytest
import torch

from remote_payload.inputs.features import cache_path, cached_features, extract
from remote_payload.models.target import decoder_layers, load_target


def _hook_vs_hidden_states(model, ids):
    layers = decoder_layers(model)
    n = len(layers)
    fake_target = type("T", (), {"layers": layers, "model": model, "input_device": ids.device})()
    feats = extract(fake_target, ids[0].tolist(), list(range(n)), prompt_len=4, with_argmax=False)
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(hs) == n + 1
    for lid in range(n - 1):
        # layer id l == output of decoder layer l == hidden_states[l + 1], bit for bit
        assert torch.equal(feats.layers[lid], hs[lid + 1][0]), lid
    last = feats.layers[n - 1]
    # HF replaces the last entry with the post-final-norm state: not the decoder layer's output ...
    assert (last - hs[n][0]).abs().max() > 1e-2
    # ... but exactly the final norm applied to it.
    with torch.no_grad():
        assert torch.allclose(model.get_decoder().norm(last[None])[0], hs[n][0], atol=1e-6)
    return feats


def test_hooks_match_hidden_states_on_causal_lm(target):
    ids = torch.tensor([list(range(5, 45))])
    _hook_vs_hidden_states(target.model, ids)
    assert type(target.model).__name__ == "Qwen3_5ForCausalLM"
    assert decoder_layers(target.model) is target.model.model.layers


def test_hooks_match_hidden_states_on_vl_wrapper(fixture_dir, target):
    from transformers import Qwen3_5ForConditionalGeneration

    vl = Qwen3_5ForConditionalGeneration.from_pretrained(str(fixture_dir / "target-vl"), local_files_only=True,
                                                         dtype=torch.float32).eval()
    # decoder layers live elsewhere in the VL wrapper; get_decoder() finds them
    assert decoder_layers(vl) is vl.model.language_model.layers
    ids = torch.tensor([list(range(5, 45))])
    feats_vl = _hook_vs_hidden_states(vl, ids)
    # the VL wrapper carries the same text weights: identical features to the CausalLM target
    fake = type("T", (), {"layers": target.layers, "model": target.model, "input_device": ids.device})()
    feats_lm = extract(fake, ids[0].tolist(), [1, 3, 7], prompt_len=4, with_argmax=False)
    for lid in (1, 3, 7):
        assert torch.allclose(feats_vl.layers[lid], feats_lm.layers[lid], atol=1e-5)


def test_vl_folder_loads_text_only_with_identical_logits(fixture_dir, target):
    vl_text = load_target(fixture_dir / "target-vl", device="cpu", dtype="float32")
    assert type(vl_text.model).__name__ == "Qwen3_5ForCausalLM"  # AutoModelForCausalLM: text model only
    assert vl_text.config.num_layers == 8 and vl_text.kernel_path == "torch"
    ids = torch.tensor([list(range(5, 45))])
    with torch.no_grad():
        a = vl_text.model(input_ids=ids).logits
        b = target.model(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-5)


def test_teacher_forced_argmax_reproduces_greedy_reference(samples):
    for _p, ref, feats in samples:
        assert ref.stop_reason == "eos"  # the trained fixture target ends its answers cleanly
        assert feats.teacher_forced_mismatches() == 0


def test_feature_cache_reused_only_when_metadata_matches(target, samples, tmp_path):
    _p, ref, _ = samples[0]
    warnings = []
    first = cached_features(target, ref.tokens, len(ref.prompt_ids), [1, 3], tmp_path, warn=warnings.append)
    assert not first.cached and warnings == []
    again = cached_features(target, ref.tokens, len(ref.prompt_ids), [1, 3], tmp_path, warn=warnings.append)
    assert again.cached and warnings == []
    assert torch.equal(again.layers[3], first.layers[3])
    meta = again.meta
    assert meta["kernel_path"] == "torch" and meta["dtype"] == "float32" and meta["layer_ids"] == [1, 3]
    assert meta["weights_digest"] == target.digest["value"]

    # a target that differs in its numerics (here the recorded kernel path) must not reuse the cache
    target.kernel_path, saved = "fla", target.kernel_path
    try:
        redo = cached_features(target, ref.tokens, len(ref.prompt_ids), [1, 3], tmp_path, warn=warnings.append)
    finally:
        target.kernel_path = saved
    assert not redo.cached
    assert len(warnings) == 1 and "kernel_path torch -> fla" in warnings[0] and "re-extracting" in warnings[0]

    # more layers than cached: re-extracted, and says which are missing
    cached_features(target, ref.tokens, len(ref.prompt_ids), [1, 3, 5], tmp_path, warn=warnings.append)
    assert "[5] not in the cache" in warnings[-1] or "kernel_path" in warnings[-1]


def test_truncated_feature_cache_is_re_extracted(target, samples, tmp_path):
    _p, ref, _ = samples[1]
    cached_features(target, ref.tokens, len(ref.prompt_ids), [1], tmp_path)
    path = cache_path(tmp_path, target, ref.tokens)
    path.write_bytes(path.read_bytes()[:100])
    warnings = []
    feats = cached_features(target, ref.tokens, len(ref.prompt_ids), [1], tmp_path, warn=warnings.append)
    assert not feats.cached and "unreadable" in warnings[0]
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    meta = json.loads(path.read_bytes()[8:8 + header_len])["__metadata__"]["dfo"]
    assert json.loads(meta)["tokens_sha256"]  # rewritten whole


def test_layer_ids_outside_the_target_are_refused(target):
    from remote_payload.errors import PayloadError

    with pytest.raises(PayloadError, match=r"layer id\(s\) \[8\] outside the target's decoder layers 0..7"):
        extract(target, [1, 2, 3], [8], prompt_len=1)
