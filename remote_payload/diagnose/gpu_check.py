"""GPU host check: hidden states from the fla kernels vs transformers' torch path, on a real target.

    python -m remote_payload gpu-check --target /models/Qwen3.5-0.8B [--drafter PATH] [--samples 4]
    python -m remote_payload gpu-check --synthetic      # no weights on the host: builds its own (below)

Loads the target on CUDA (fla bound when installed), builds greedy references for a few built-in
prompts, extracts every decoder layer's hidden states twice — with the fla kernels, then with the
linear-attention functions swapped to transformers' torch code on the same loaded model — and reports
per layer the max / mean absolute difference, the teacher-forced argmax disagreements, and (with a
drafter) how many draft tokens differ between the two feature sets and the τ of each. This is what
pitfall 7 of docs/troubleshooting.md is about: a drafter trained on one path and evaluated on the other.

``--synthetic`` needs no downloaded weights: it builds a randomly initialised Qwen3.5 text model with the
real layer shapes (hidden 4096, Gated DeltaNet 16/32 heads of 128, attention 16/4 heads of 256, the
3 linear : 1 full pattern; 8 layers and the fixture's 512-token vocabulary to stay small) plus a random
z-lab-format drafter of matching width, and compares on those. Kernel differences do not need trained
weights to show; whether drafts flip does depend on the drafter, so treat that figure as indicative.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.models import kernels
from remote_payload.progress import SILENT, Progress


def compare_paths(target, refs, layer_ids, runtime=None, progress: Progress = SILENT) -> dict:
    """Extract with the bound kernels and with the torch path; per-layer diffs and draft differences."""
    import torch

    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.inputs.features import extract
    from remote_payload.metrics.chain import summarize

    stats = {lid: {"max_abs_diff": 0.0, "sum_abs_diff": 0.0, "count": 0, "max_abs_value": 0.0} for lid in layer_ids}
    argmax_diff = 0
    drafts: dict[str, Any] = {"compared": 0, "differ": 0, "rounds_bound": [], "rounds_torch": []}
    for i, ref in enumerate(refs):
        P = len(ref.prompt_ids)
        a = extract(target, ref.tokens, layer_ids, P)
        with kernels.torch_linear_attention(target.model):
            b = extract(target, ref.tokens, layer_ids, P)
        for lid in layer_ids:
            x, y = a.layers[lid].float(), b.layers[lid].float()
            d = (x - y).abs()
            s = stats[lid]
            s["max_abs_diff"] = max(s["max_abs_diff"], float(d.max()))
            s["sum_abs_diff"] += float(d.sum())
            s["count"] += d.numel()
            s["max_abs_value"] = max(s["max_abs_value"], float(x.abs().max()))
        if a.argmax is not None and b.argmax is not None:
            argmax_diff += int((a.argmax[P - 1:-1] != b.argmax[P - 1:-1]).sum())
        if runtime is not None:
            da = draft_sample(runtime, a.layers, ref.tokens, P)
            db = draft_sample(runtime, b.layers, ref.tokens, P)
            drafts["compared"] += da.topk_ids[..., 0].numel()
            drafts["differ"] += int((da.topk_ids[..., 0] != db.topk_ids[..., 0]).sum())
            drafts["rounds_bound"].append(replay(da))
            drafts["rounds_torch"].append(replay(db))
        progress.progress("gpu-check", i + 1, len(refs), unit="samples")
        del a, b
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    per_layer = [{"layer": lid, "max_abs_diff": s["max_abs_diff"],
                  "mean_abs_diff": s["sum_abs_diff"] / max(1, s["count"]),
                  "max_abs_value": s["max_abs_value"]} for lid, s in stats.items()]
    out = {"per_layer": per_layer, "teacher_forced_argmax_differences": argmax_diff}
    if runtime is not None:
        B = runtime.block_size
        out["drafts"] = {"top1_compared": drafts["compared"], "top1_differ": drafts["differ"],
                         "tau_macro_bound_features": summarize(drafts["rounds_bound"], B)["tau_macro"],
                         "tau_macro_torch_features": summarize(drafts["rounds_torch"], B)["tau_macro"]}
    return out


REAL_SHAPES = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=8, num_attention_heads=16,
                   num_key_value_heads=4, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
                   linear_num_key_heads=16, linear_num_value_heads=32, linear_conv_kernel_dim=4)
TINY_SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4)


def build_synthetic(folder: Path, shapes: dict = REAL_SHAPES, seed: int = 0) -> tuple[Path, Path]:
    """A random Qwen3.5 target with the given layer shapes + a random z-lab drafter; returns both folders."""
    import torch
    from transformers import GenerationConfig, Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from remote_payload.fixtures import models as fixtures
    from remote_payload.models.export import write_zlab_folder
    from remote_payload.models.spec import from_training

    folder = Path(folder)
    tok_dir, target_dir, drafter_dir = folder / "tokenizer", folder / "target", folder / "drafter"
    fixtures.build_tokenizer(tok_dir, {})
    tok = fixtures._tokenizer(tok_dir)
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen3_5TextConfig(vocab_size=512, tie_word_embeddings=False, max_position_embeddings=4096,
                            eos_token_id=im_end, pad_token_id=eot, bos_token_id=None, **shapes)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, do_sample=False)
    model.save_pretrained(str(target_dir))
    tok.save_pretrained(str(target_dir))
    del model
    H, n = shapes["hidden_size"], shapes["num_hidden_layers"]
    spec = from_training({"block_size": 16, "mask_token_id": tok.convert_tokens_to_ids("<|MASK|>"),
                          "target_layer_ids": [1, n // 2, n - 1], "reserve_last_target_layer": False,
                          "num_hidden_layers": 1, "hidden_size": H, "num_attention_heads": max(1, H // 128),
                          "num_key_value_heads": max(1, H // 512), "head_dim": min(128, H),
                          "intermediate_size": 2 * H, "rope_theta": 10000000.0}, {}, "synthetic drafter")
    spec.format = "zlab"
    write_zlab_folder(drafter_dir, spec, fixtures.seeded_drafter_weights(spec, seed + 1))
    return target_dir, drafter_dir


def run(target: str | None, drafter: str | None = None, samples: int = 4, max_new_tokens: int = 128,
        out: str | None = None, progress: Progress = SILENT, device: str = "cuda", synthetic: bool = False) -> dict:
    # One parameter per `gpu-check` flag (plus progress/device for the tests): the CLI passes them as parsed.
    from remote_payload.models.target import resolve_device

    if bool(target) == bool(synthetic):
        raise PayloadError("gpu-check needs exactly one of --target PATH or --synthetic")
    if resolve_device("auto") != "cuda" and device == "cuda":
        raise PayloadError("gpu-check needs a CUDA device (it compares the fla kernels with the torch path); "
                           "none is visible to torch on this host")
    kernels.apply_policy(device)
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.models.target import load_target, render_prompt
    from remote_payload.models.validation import validate_against_target
    from remote_payload.results import versions
    from remote_payload.scratch import private_dir

    started = time.perf_counter()
    folder: str | Path
    if synthetic:
        work = private_dir("dfo-gpu-check-")
        progress.progress("gpu-check", 0, samples, unit="samples", message=f"building a synthetic target in {work}")
        folder, synthetic_drafter = build_synthetic(work, REAL_SHAPES if device == "cuda" else TINY_SHAPES)
        drafter = drafter or str(synthetic_drafter)
    else:
        assert target is not None  # exactly one of target and synthetic, checked above
        folder = target
    t = load_target(folder, device=device, dtype="bfloat16", progress=progress)
    report = {"dfo": "gpu-check", "versions": versions(), "target": t.info(), "samples": samples,
              "max_new_tokens": max_new_tokens, "synthetic": synthetic}
    if t.kernel_path != "fla":
        env = kernels.environment()
        report["status"] = "not-compared"
        report["reason"] = (f"the bound linear-attention path is {t.kernel_path!r}, not fla "
                            f"(fla installed: {env['fla_installed']}, triton installed: {env['triton_installed']})")
    else:
        prompts, _ = load_prompts("builtin")
        refs = []
        for p in prompts[:samples]:
            ids = render_prompt(t.tokenizer, p.message_dicts(), False)
            refs.append(greedy_decode(t, ids, max_new_tokens))
        runtime = None
        if drafter:
            ld = load_drafter(drafter)
            validate_against_target(ld.spec, t.config, t.tokenizer, t.stop_ids, drafter, ld.extras)
            runtime = DrafterRuntime(ld, t.model.get_input_embeddings(), t.model.get_output_embeddings(),
                                     device=t.input_device, dtype=t.dtype)
            report["drafter"] = {"path": drafter, "spec": ld.spec.to_json()}
        report.update(compare_paths(t, refs, list(range(t.config.num_layers)), runtime, progress))
        report["status"] = "compared"
    report["seconds"] = round(time.perf_counter() - started, 2)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    return report

