"""`dfo lint` on hand-written checkpoints: the host script run in this process on tiny configs and safetensors
headers, then the rules. One fixture per finding; the clean one gives no error and no warning."""

from __future__ import annotations

import json
import struct

import pytest
from lint_fixtures import MASK, N, drafter_tensors, target, write_safetensors, zlab_config, zlab_drafter

from orchestrator.lint import rules
from orchestrator.lint.operation import Place, lint_checkpoint, local_call
from orchestrator.lint.replies import drafter_facts


def run(drafter, against=None, **kw):
    return lint_checkpoint(None, Place(None, str(drafter)), Place(None, str(against)) if against else None, **kw)


def codes(report, severity=None):
    return {f.code for f in report.findings if severity is None or f.severity == severity}


def loud(report):
    return {f.code for f in report.findings if f.severity != rules.INFO}


@pytest.fixture
def tgt(tmp_path):
    return target(tmp_path / "target")


def test_the_clean_fixture_gives_no_error_and_no_warning(tmp_path, tgt):
    report = run(zlab_drafter(tmp_path / "d"), tgt)
    assert report.ok and loud(report) == set(), [f for f in report.findings if f.severity != "info"]
    assert {"layer-convention", "block-size", "mask-token", "window"} <= codes(report)


def _with(tmp_path, tensors=None, **dflash):
    cfg = zlab_config(**dflash)
    return zlab_drafter(tmp_path / "d", cfg, tensors)


@pytest.mark.parametrize("ids, code", [
    ([1, 3, 3], "layer-ids-duplicate"),
    ([-1, 3, 5], "layer-ids-negative"),
    ([1, 3, N], "layer-ids-out-of-range"),
    ([1, 3, N - 1], "layer-ids-last-layer"),
])
def test_layer_ids(tmp_path, tgt, ids, code):
    report = run(_with(tmp_path, target_layer_ids=ids), tgt)
    assert code in codes(report), report.findings
    assert (code in codes(report, rules.ERROR)) == (rules.CODES[code][0] == rules.ERROR)


def test_ids_shifted_by_one_from_zlabs_spread_are_named(tmp_path, tgt):
    default = rules.zlab_default_layer_ids(N, 3)  # [1, 3, 5] over 8 layers
    shifted = [i + 1 for i in default]
    report = run(_with(tmp_path, target_layer_ids=shifted), tgt)
    assert "layer-ids-shifted" in codes(report)
    (f,) = [f for f in report.findings if f.code == "layer-ids-shifted"]
    assert str(default) in f.message and "plus one" in f.message


def test_a_config_listing_its_layers_in_both_conventions_must_agree_by_one(tmp_path, tgt):
    cfg = zlab_config()
    cfg["aux_hidden_state_layer_ids"] = [1, 3, 5]  # the same numbers: one of the two readers is off by one
    assert "layer-ids-two-conventions" in codes(run(zlab_drafter(tmp_path / "a", cfg), tgt))
    cfg["aux_hidden_state_layer_ids"] = [2, 4, 6]
    assert "layer-ids-two-conventions" not in codes(run(zlab_drafter(tmp_path / "b", cfg), tgt))


def test_fc_width_off_names_both_widths(tmp_path, tgt):
    report = run(_with(tmp_path, drafter_tensors(fc_layers=4)), tgt)
    (f,) = [f for f in report.findings if f.code == "fc-width"]
    assert f.severity == "error" and "256 = 4 × 64" in f.message and "3 layers [1, 3, 5] × 64 = 192" in f.message


def test_speculators_ids_are_read_as_hidden_states_indices(tmp_path, tgt):
    cfg = {"speculators_model_type": "dflash", "transformer_layer_config": {**zlab_config(), "dflash_config": None},
           "block_size": 8, "mask_token_id": MASK, "aux_hidden_state_layer_ids": [0, 4, 6]}
    report = run(zlab_drafter(tmp_path / "d", cfg), tgt)
    (neg,) = [f for f in report.findings if f.code == "layer-ids-negative"]
    assert "embedding output" in neg.message
    cfg["aux_hidden_state_layer_ids"] = [2, 4, 6, 9]  # --include-last-layer one past: hidden_states has 0..8
    report = run(zlab_drafter(tmp_path / "d", cfg, drafter_tensors(fc_layers=4)), tgt)
    (out,) = [f for f in report.findings if f.code == "layer-ids-out-of-range"]
    assert "[9]" in out.message and "at most 8" in out.message


@pytest.mark.parametrize("mask, code", [(512, "mask-out-of-vocab"), (100, "mask-regular-token"),
                                        (2, "mask-special-token"), (3, "mask-special-token")])
def test_mask_token(tmp_path, tgt, mask, code):
    report = run(_with(tmp_path, mask_token_id=mask), tgt)
    assert code in codes(report, rules.ERROR), report.findings


def test_a_mask_beyond_the_tokenizer_but_inside_the_embedding_is_fine(tmp_path, tgt):
    report = run(_with(tmp_path, mask_token_id=400), tgt)
    assert report.ok and any(f.code == "mask-token" and "no text maps to" in f.message for f in report.findings)


@pytest.mark.parametrize("change, code", [
    ({"use_swa": False}, "window-vllm-full"),
    ({"swa_window_size": 128}, "window-size-conflict"),
])
def test_window_keys(tmp_path, tgt, change, code):
    report = run(_with(tmp_path, **change), tgt)
    assert code in codes(report), report.findings


def test_window_keys_across_fields(tmp_path, tgt):
    cfg = zlab_config()
    cfg["layer_types"] = ["full_attention", "full_attention"]
    assert "window-types-full" in codes(run(zlab_drafter(tmp_path / "a", cfg), tgt))
    cfg = zlab_config()
    del cfg["sliding_window"]
    assert "window-missing" in codes(run(zlab_drafter(tmp_path / "b", cfg), tgt), rules.ERROR)
    cfg = zlab_config()
    cfg["is_causal"] = True
    assert "window-is-causal" in codes(run(zlab_drafter(tmp_path / "c", cfg), tgt))


def test_a_quantized_drafter_and_a_mismatched_precision_pair(tmp_path):
    tensors = drafter_tensors()
    tensors["layers.0.mlp.up_proj.weight_scale"] = ("F8_E4M3", [128, 1])
    cfg = zlab_config()
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    tgt = target(tmp_path / "t", quantization={"quant_method": "modelopt", "quant_algo": "NVFP4"})
    report = run(zlab_drafter(tmp_path / "d", cfg, tensors), tgt)
    assert {"quantized-drafter", "precision-pair-mismatch"} <= codes(report)
    (q,) = [f for f in report.findings if f.code == "quantized-drafter"]
    assert "mxfp4" in q.message and "sglang#39087" in q.field + q.message + rules.CODES[q.code][1]


def test_float16_weights_are_named(tmp_path, tgt):
    assert "dtype-float16" in codes(run(_with(tmp_path, drafter_tensors(dtype="F16")), tgt))


def test_dflash2(tmp_path, tgt):
    tensors = drafter_tensors()
    tensors["layers.0.attention_conv.base_kernel"] = ("BF16", [2, 2, 64])
    tensors["candidate_selector.predecessor_codebook"] = ("BF16", [1000, 16])
    assert "dflash2-weights-under-dflash" in codes(run(_with(tmp_path, tensors), tgt), rules.ERROR)
    cfg = zlab_config(conv_kernel_size=2, conv_group_size=16)
    cfg["architectures"] = ["DFlash2DraftModel"]
    report = run(zlab_drafter(tmp_path / "d2", cfg, tensors), tgt)
    assert {"dflash2-fields", "dflash2-vocab"} <= codes(report, rules.ERROR)


def test_embedding_copies_against_the_target(tmp_path, tgt):
    tensors = drafter_tensors()
    tensors["embed_tokens.weight"] = ("BF16", [512, 64])
    d = zlab_drafter(tmp_path / "d", None, tensors)  # zero bytes; the target's are ones
    assert "embedding-differs" not in codes(run(d, tgt))  # shapes only without --deep
    assert "embedding-differs" in codes(run(d, tgt, deep=True))
    tensors["embed_tokens.weight"] = ("BF16", [500, 64])
    assert "embedding-shape" in codes(run(zlab_drafter(tmp_path / "e", None, tensors), tgt), rules.ERROR)


def test_training_metadata_and_thinking_mode(tmp_path, tgt):
    cfg = zlab_config()
    del cfg["training"]
    assert "training-metadata-missing" in codes(run(zlab_drafter(tmp_path / "a", cfg), tgt))
    d = zlab_drafter(tmp_path / "b")
    assert "thinking-differs" in codes(run(d, tgt, enable_thinking=True))
    assert "thinking-differs" not in codes(run(d, tgt, enable_thinking=False))


def test_block_size_and_the_engines_k(tmp_path, tgt):
    cfg = zlab_config()
    cfg["block_size"] = 16
    assert "block-size-conflict" in codes(run(zlab_drafter(tmp_path / "a", cfg), tgt), rules.ERROR)
    assert "k-beyond-block" in codes(run(zlab_drafter(tmp_path / "b"), tgt, engine_ks=(3, 8)), rules.ERROR)


@pytest.mark.parametrize("content, phrase", [
    (b"", "empty (0 bytes)"),
    (b"PK\x03\x04 a zip, not safetensors", "not a safetensors file"),
    (struct.pack("<Q", 12) + b"not json at!", "header is not JSON"),
])
def test_an_empty_or_foreign_weights_file_is_a_clear_error(tmp_path, tgt, content, phrase):
    d = zlab_drafter(tmp_path / "d")
    (d / "model.safetensors").write_bytes(content)
    report = run(d, tgt)
    (f,) = [f for f in report.findings if f.code == "safetensors-unreadable"]
    assert f.severity == "error" and f.field == "model.safetensors" and phrase in f.message


def test_a_truncated_file_says_so(tmp_path, tgt):
    d = zlab_drafter(tmp_path / "d")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:-10])
    (f,) = [f for f in run(d, tgt).findings if f.code == "safetensors-unreadable"]
    assert "truncated" in f.message


def test_a_training_checkpoint_is_linted_through_its_sidecar(tmp_path, tgt):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "step_1.pt").write_bytes(b"PK\x03\x04" + b"\0" * 60)
    spec = {**{k: v for k, v in zlab_config().items() if k != "dflash_config"}, "block_size": 8,
            "mask_token_id": MASK, "target_layer_ids": [1, 3, 5, 5]}
    (folder / "spec.json").write_text(json.dumps(spec))
    report = run(folder / "step_1.pt", tgt)
    assert {"torch-not-read", "layer-ids-duplicate"} <= codes(report)
    (folder / "step_2.pt").write_bytes(b"")
    assert "torch-not-zip" in codes(run(folder / "step_2.pt", tgt), rules.ERROR)


def test_the_host_answer_is_typed():
    from orchestrator.core.errors import HostError

    with pytest.raises(HostError, match="malformed"):
        drafter_facts("ct129", "x", {"kind": "folder", "json": {}, "files": [{"name": "m", "tensors": {
            "fc.weight": {"dtype": "BF16", "shape": ["64"]}}, "dtypes": {}}], "torch_files": []})
    assert drafter_facts("ct129", "x", {"missing": True}) is None


def test_the_host_script_reads_only_the_header_bytes(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"fc.weight": ("BF16", [64, 192])})
    facts = local_call("drafter_facts", path=str(tmp_path))
    (f,) = facts["files"]
    t = f["tensors"]["fc.weight"]
    assert t["end"] - t["start"] == 64 * 192 * 2 and t["end"] == path.stat().st_size


def test_every_code_is_documented_and_every_diagnose_code_exists():
    from pathlib import Path

    from remote_payload.diagnose.findings import FINDING_CODES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "lint.md").read_text()
    assert [c for c in rules.CODES if f"`{c}`" not in doc] == []
    assert set(rules.CONFIRMED_BY_DIAGNOSE) <= set(FINDING_CODES)
    assert {c for codes_ in rules.CONFIRMED_BY_DIAGNOSE.values() for c in codes_} <= set(rules.CODES)


def test_the_dflash2_key_parts_are_the_payloads():
    pytest.importorskip("torch")
    from remote_payload.models.validation import DFLASH2_KEY_PARTS

    assert rules.DFLASH2_KEY_PARTS == DFLASH2_KEY_PARTS



def test_a_diagnose_finding_that_confirms_a_lint_code_names_it_in_the_report(tmp_path):
    from orchestrator.evaluation.report import write_report

    diag = {"text": "dfo diagnostics", "findings": [
        {"severity": "warning", "code": "layer-shift", "message": "ids + 1 draft better", "drafter": "ours"},
        {"severity": "info", "code": "mask-token", "message": "mask id 5", "drafter": "ours"}]}
    lines = rules.confirmed_by_diagnose(diag["findings"])
    assert lines == ["--diagnose layer-shift (drafter 'ours') confirms what `dfo lint` reports as layer-ids-shifted "
                     "(docs/lint.md)"]
    write_report(tmp_path, {"drafters": {}, "diagnostics": diag}, [])
    assert "reports as layer-ids-shifted" in (tmp_path / "report.md").read_text()
