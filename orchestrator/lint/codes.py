"""`dfo lint`'s vocabulary: every finding code with its severity, meaning and what to do (``CODES``), the
--diagnose probes that confirm a code, the engines' layer-id and window conventions, and the names the rules look
for in headers. Data only; the checks that use it are rules.py (docs/lint.md lists every code)."""

from __future__ import annotations

from typing import Any

ERROR, WARNING, INFO = "error", "warning", "info"

# code -> (severity, what it means, what to do). The order is docs/lint.md's.
CODES: dict[str, tuple[str, str, str]] = {
    "not-found": (ERROR, "the drafter or target path does not exist on its host", "give the path as it is on "
                  "that host (HOST:PATH), or a local path"),
    "safetensors-unreadable": (ERROR, "a weights file is empty, truncated or not a safetensors file",
                               "re-copy the file (a relay verifies it) or re-export it"),
    "no-weights": (ERROR, "the folder holds no *.safetensors weights", "point at the folder with model.safetensors, "
                   "or at the training checkpoint file"),
    "config-missing": (ERROR, "no config.json in the drafter folder", "copy the drafter's config.json next to its "
                       "weights"),
    "config-unrecognised": (ERROR, "config.json is neither a z-lab nor a speculators config", "use the config the "
                            "drafter was exported with (dflash_config or speculators_model_type)"),
    "config-invalid": (ERROR, "dfo's own reader refuses the config (the message says why)", "fix the field named"),
    "torch-not-read": (INFO, "a training checkpoint's weights are not read without loading it: its spec sidecar is "
                       "linted, the tensors are checked when the eval loads it", "strip it (dfo relay-checkpoint "
                       "--strip-optimizer) for a full lint of the safetensors"),
    "torch-no-spec": (INFO, "a training checkpoint with no spec.json beside it: its embedded config is read only when "
                      "the eval loads it, so nothing is linted here",
                      "put its spec.json beside it, or lint the stripped folder"),
    "torch-not-zip": (ERROR, "the training checkpoint is empty or not a torch.save zip file", "re-copy or re-save it "
                      "with torch.save"),
    "layer-convention": (INFO, "how the checkpoint's layer ids are read, and what each engine expects", "compare "
                         "with the table in docs/lint.md before converting a checkpoint for another engine"),
    "layer-ids-missing": (ERROR, "no target layer ids in the config", "give dflash_config.target_layer_ids (decoder-"
                          "layer ids)"),
    "layer-ids-invalid": (ERROR, "the target layer ids are not a list of integers", "give a list of decoder-layer "
                          "ids"),
    "layer-ids-guessed": (WARNING, "no target layer ids: z-lab's fallback spread is used, wrong for 14 of 20 "
                          "published checkpoints (z-lab/dflash#156, sgl-project/sglang#37475)",
                          "write the ids the drafter was trained with into dflash_config.target_layer_ids"),
    "layer-ids-duplicate": (ERROR, "a target layer id is listed twice: engines capture each layer once, so fc gets "
                            "fewer planes than it expects (NVIDIA/Model-Optimizer#2149)",
                            "list each trained layer once, in training order"),
    "layer-ids-negative": (ERROR, "a negative target layer id (or speculators' 0, the embedding output): it passes "
                           "validation in some engines and reads another tensor (NVIDIA/Model-Optimizer#2149)",
                           "use decoder-layer ids >= 0 (speculators: hidden_states indices >= 1)"),
    "layer-ids-out-of-range": (ERROR, "a target layer id past the target's last decoder layer "
                               "(--include-last-layer: vllm-project/speculators#705)", "drop it, or pair the drafter "
                               "with the target it was trained on"),
    "layer-ids-last-layer": (WARNING, "fc reads the target's last decoder layer: a hook gives its output, HF's last "
                             "hidden_states entry the post-norm state, and engines differ", "check which one the "
                             "drafter was trained on (--diagnose probes the post-norm state)"),
    "layer-ids-shifted": (WARNING, "the ids are z-lab's default spread shifted by one: a hidden_states index where a "
                          "decoder-layer id is expected, or the reverse (SpecForge's layer L is hidden_states[L+1]; "
                          "onnxruntime-genai needs +1: microsoft/onnxruntime-genai#2538)", "convert once to the "
                          "reading engine's convention; --diagnose's layer-shift probe confirms it"),
    "layer-ids-two-conventions": (WARNING, "the config lists the target layers twice, as decoder-layer ids and as "
                                  "hidden_states indices, and the two lists do not differ by exactly one: readers of "
                                  "either key capture other layers", "keep one key (dflash_config.target_layer_ids), "
                                  "or make aux_hidden_state_layer_ids = ids + 1"),
    "fc-width": (ERROR, "fc's input width is not (number of fc layer ids) × the target's hidden size", "list the "
                 "layers fc was trained on (reserve_last_target_layer for training specs)"),
    "hidden-size": (ERROR, "the drafter's hidden size is not the target's", "pair the drafter with its own target"),
    "weights-missing": (ERROR, "fc.weight is missing from the weights", "export the drafter's full state (fc, "
                        "hidden_norm, norm, layers)"),
    "block-size-missing": (ERROR, "no block size: z-lab's newest code silently uses 16, dfo refuses",
                           "give dflash_config.block_size as trained"),
    "block-size-conflict": (ERROR, "block_size at the top level and in dflash_config disagree: readers of either "
                            "schema draft different blocks", "keep one, in dflash_config"),
    "block-size": (INFO, "the block size and the draft counts K engines may ask for", "ask engines for K <= "
                   "block - 1 (vLLM: --num-speculative-tokens)"),
    "k-beyond-block": (ERROR, "an engine draft count K is larger than the block allows", "give K <= block - 1"),
    "mask-missing": (ERROR, "no mask token id: readers fall back to pad/eos (pitfall 3)", "give "
                     "dflash_config.mask_token_id as trained"),
    "mask-out-of-vocab": (ERROR, "the mask token id is outside the target's vocabulary", "use the mask id of the "
                          "drafter's training (Qwen3 151669; Qwen3.5/3.6 248070 or 248077 by revision)"),
    "mask-regular-token": (ERROR, "the mask token id is a regular token the tokenizer produces: drafts cannot tell "
                           "masked slots from text", "use the reserved mask token of the drafter's training"),
    "mask-special-token": (ERROR, "the mask token id is the tokenizer's eos/pad/bos, a stop token or a chat-template "
                           "token: a fallback, not a mask (pitfall 3)", "use the reserved mask token of the "
                           "drafter's training"),
    "mask-token": (INFO, "what the mask token is in the target's tokenizer", "nothing"),
    "vocab-size-mismatch": (WARNING, "the drafter config's vocab_size is not the target's: vLLM sizes the drafter's "
                            "vocabulary from it", "write the target's vocab_size into config.json"),
    "vocab-size-missing": (INFO, "config.json has no vocab_size: vLLM then assumes Qwen3's 151936 and fails at the "
                           "first draft on another vocabulary", "write the target's vocab_size into config.json"),
    "window-missing": (ERROR, "sliding-window layers without an integer sliding_window", "give sliding_window as "
                       "trained"),
    "window-vllm-full": (WARNING, "sliding-window layers, but no dflash_config.use_swa / swa_window_size: vLLM reads "
                         "the window there and runs them as full attention (τ collapses past the window at long "
                         "context)", "add dflash_config.use_swa: true and swa_window_size = sliding_window"),
    "window-size-conflict": (ERROR, "dflash_config.swa_window_size differs from sliding_window: vLLM and "
                             "z-lab/transformers slide over different windows", "make them equal"),
    "window-types-full": (WARNING, "dflash_config.use_swa is on but layer_types lists no sliding layer: vLLM slides, "
                          "z-lab/transformers/dfo run full attention", "make layer_types and use_swa agree"),
    "window-is-causal": (WARNING, "is_causal makes every layer causal inside the block, also the full-attention "
                         "ones (DFlash's are bidirectional); an engine that does not read is_causal runs them "
                         "bidirectional", "drop is_causal unless the drafter was trained so"),
    "window-mixed-layers": (INFO, "sliding and full-attention layers mixed: vLLM runs them only on its V2 model "
                            "runner", "serve with VLLM_USE_V2_MODEL_RUNNER=1 (dfo's engine stage sets it)"),
    "window": (INFO, "the attention windows each engine will use", "nothing"),
    "dtype-float16": (WARNING, "weights stored in float16: DFlash drafters are trained in bfloat16 and fp16's range "
                      "has given ~0% acceptance (pitfall 5)", "export in bfloat16"),
    "quantized-drafter": (WARNING, "quantized drafter weights: a W4A16 DFlash2 drafter fell from τ 3.7 to 1.0 "
                          "(sgl-project/sglang#39087)", "measure it against its bf16 export before serving it"),
    "quantized-embedding": (WARNING, "a quantized embedding or lm_head copy in the drafter", "keep the drafter's "
                            "embedding and lm_head in the target's precision"),
    "precision-pair-mismatch": (ERROR, "drafter and target quantized with different schemes: an NVFP4 target with an "
                                "MXFP4 drafter gave τ exactly 1.0 (vllm-project/vllm#49133)", "quantize both "
                                "with one scheme, or serve the drafter in bf16"),
    "embedding-shape": (ERROR, "the drafter's embed_tokens/lm_head copy has another shape than the target's",
                        "pair the drafter with the target it was trained on"),
    "embedding-differs": (WARNING, "the drafter's embed_tokens/lm_head copy holds other bytes than the target's "
                          "(--deep)", "re-export the copy from this target, or check the target's revision"),
    "embedding-digest": (INFO, "the shapes (and with --deep the data) of the embedding and lm_head compared",
                         "nothing"),
    "dflash2-fields": (ERROR, "a DFlash2 config lacks some of dflash_config's conv_kernel_size, conv_group_size, "
                       "selector_rank, selector_top_k", "give all four, as z-lab's DFlash2 configs do"),
    "dflash2-weights-under-dflash": (ERROR, "DFlash2 weights (convolutions, selector) under a DFlash config: "
                                     "evaluated as DFlash the selector is dropped and τ changes",
                                     "give the checkpoint its DFlash2 config"),
    "dflash2-weights-missing": (ERROR, "a DFlash2 config without the convolution or selector weights",
                                "export the DFlash2 modules too, or give the DFlash config"),
    "dflash2-vocab": (ERROR, "the DFlash2 selector's codebooks do not have one row per target token",
                      "pair the drafter with the target it was trained on"),
    "dflash2-engine": (INFO, "vLLM runs DFlash2's candidate selector only on its V2 model runner; on V1 it silently "
                       "does not run", "serve it on a vLLM with the V2 model runner (Triton: a GPU host)"),
    "training-metadata-missing": (INFO, "no `training` block: the thinking mode and chat template the drafter was "
                                  "trained with cannot be checked (on vs off has moved τ by up to 22 %)",
                                  "add training.enable_thinking and training.chat_template_sha256 to config.json"),
    "training-metadata-invalid": (ERROR, "the `training` block has a field of the wrong type", "fix the field "
                                  "named (docs: remote_payload/README.md, Training metadata)"),
    "training-thinking-missing": (INFO, "the `training` block does not say the thinking mode", "add "
                                  "training.enable_thinking"),
    "thinking-differs": (WARNING, "the eval renders prompts in another thinking mode than the drafter's training "
                         "(acceptance 60% -> 25% in one report)", "run with the training's --enable-thinking / "
                         "--no-enable-thinking"),
    "chat-template-differs": (WARNING, "the target's chat template is not the one the drafter was trained with",
                              "use the training's tokenizer files, or retrain"),
    "no-target": (INFO, "no --target: the checks against the target were skipped", "give --target"),
    "target-unreadable": (ERROR, "the target's config.json or tokenizer cannot be read", "fix the file named"),
}

# --diagnose's finding codes (remote_payload/diagnose/findings.py) -> the lint codes a probe confirms.
CONFIRMED_BY_DIAGNOSE: dict[str, tuple[str, ...]] = {
    "layer-shift": ("layer-ids-shifted",),
    "layer-ids-look-shifted": ("layer-ids-shifted",),
    "last-layer-post-norm": ("layer-ids-last-layer",),
    "mask-id": ("mask-regular-token", "mask-special-token", "mask-out-of-vocab"),
    "mask-in-text": ("mask-regular-token",),
    "fp16-weights": ("dtype-float16",),
    "embedding-mismatch": ("embedding-differs", "embedding-shape"),
    "thinking-mismatch": ("thinking-differs",),
    "chat-template-mismatch": ("chat-template-differs",),
    "no-training-metadata": ("training-metadata-missing",),
}

def confirmed_by_diagnose(diagnose_findings: Any) -> list[str]:
    """One line per --diagnose finding (results.json's ``diagnostics.findings``) that confirms a lint code: what
    `dfo lint` calls it, so the run's report and the checkpoint's lint speak of one thing by one name."""
    lines = []
    for f in diagnose_findings if isinstance(diagnose_findings, list) else []:
        code = f.get("code") if isinstance(f, dict) else None
        if code in CONFIRMED_BY_DIAGNOSE:
            who = f" (drafter '{f['drafter']}')" if isinstance(f.get("drafter"), str) else ""
            names = " / ".join(CONFIRMED_BY_DIAGNOSE[code])
            lines.append(f"--diagnose {code}{who} confirms what `dfo lint` reports as {names} (docs/lint.md)")
    return lines


# The layer-id and window conventions of each reader (docs/lint.md shows the same table).
ENGINE_CONVENTIONS: tuple[tuple[str, str, str], ...] = (
    ("z-lab / transformers (and dfo)", "dflash_config.target_layer_ids: decoder-layer index l = output of layer l "
     "(HF hidden_states[l+1])", "layer_types + sliding_window; is_causal for every layer, else sliding layers "
     "causal and full layers bidirectional in the block"),
    ("vLLM (DFlash, DFlash2)", "dflash_config.target_layer_ids, decoder-layer ids as z-lab", "dflash_config.use_swa "
     "+ swa_window_size (without them: full attention); mixed layers on the V2 model runner only; DFlash2's selector "
     "on V2 only"),
    ("SGLang", "dflash_config.target_layer_ids, decoder-layer ids as z-lab", "not checked here: read its release"),
    ("speculators", "aux_hidden_state_layer_ids: HF hidden_states indices (decoder layer + 1)", "all layers sliding "
     "(window 2048) and causal by default; sliding_window_non_causal"),
    ("SpecForge (trainer)", "layer L = hidden_states[L+1]: decoder-layer ids", "as z-lab"),
    ("onnxruntime-genai", "hidden_states indices: decoder-layer ids + 1 (microsoft/onnxruntime-genai#2538)", "-"),
)

# remote_payload/models/validation.py's DFLASH2_KEY_PARTS (that module imports torch; a test keeps them equal).
# Not moved to spec.py: the fixture cache is keyed on spec.py's bytes.
DFLASH2_KEY_PARTS = (".attention_conv.", ".mlp_conv.", "predecessor_codebook", "successor_codebook",
                     "hidden_projection")
QUANTIZED_DTYPES = ("I8", "U8", "I4", "U4", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "I32")
QUANTIZED_NAME_PARTS = ("weight_packed", "weight_scale", "qweight", "qzeros", ".scales", "weight_scale_2",
                        "input_scale")
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")
