"""Tiny checkpoint folders for the lint tests: JSON configs and safetensors files written by hand (an 8-byte
little-endian header length, the JSON header, then the data), no model and no torch needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1, "I8": 1, "F8_E4M3": 1, "I32": 4}
H, N, VOCAB, MASK = 64, 8, 512, 5  # hidden size, target layers, vocabulary, the mask token (an added token)


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], fill: bytes = b"\0") -> None:
    header, offset, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for name, (dtype, shape) in tensors.items():
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        data += (fill * n)[:n]
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def drafter_tensors(fc_layers: int = 3, layers: int = 2, dtype: str = "BF16") -> dict:
    t = {"fc.weight": (dtype, [H, fc_layers * H]), "hidden_norm.weight": (dtype, [H]), "norm.weight": (dtype, [H])}
    for i in range(layers):
        p = f"layers.{i}."
        t.update({p + "input_layernorm.weight": (dtype, [H]), p + "post_attention_layernorm.weight": (dtype, [H]),
                  p + "self_attn.q_proj.weight": (dtype, [64, H]), p + "self_attn.k_proj.weight": (dtype, [32, H]),
                  p + "self_attn.v_proj.weight": (dtype, [32, H]), p + "self_attn.o_proj.weight": (dtype, [H, 64]),
                  p + "self_attn.q_norm.weight": (dtype, [16]), p + "self_attn.k_norm.weight": (dtype, [16]),
                  p + "mlp.gate_proj.weight": (dtype, [128, H]), p + "mlp.up_proj.weight": (dtype, [128, H]),
                  p + "mlp.down_proj.weight": (dtype, [H, 128])})
    return t


def zlab_config(**dflash) -> dict:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
            "rope_theta": 10000.0, "max_position_embeddings": 4096, "vocab_size": VOCAB,
            "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 64,
            "dflash_config": {"block_size": 8, "mask_token_id": MASK, "target_layer_ids": [1, 3, 5],
                              "use_swa": True, "swa_window_size": 64, **dflash},
            "training": {"enable_thinking": False}}


def zlab_drafter(folder: Path, config: dict | None = None, tensors: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config or zlab_config()))
    write_safetensors(folder / "model.safetensors", tensors or drafter_tensors())
    return folder


def target(folder: Path, quantization: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": H, "num_hidden_layers": N, "vocab_size": VOCAB}
    if quantization:
        cfg["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(cfg))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|MASK|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"t{i}": i for i in range(len(specials), 300)})  # 300..511: embedding rows no text maps to
    added = [{"id": i, "content": tok, "special": True} for i, tok in enumerate(specials)]
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab},
                                                       "added_tokens": added}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                                              "chat_template": "{{ messages }}"}))
    write_safetensors(folder / "model.safetensors", {"model.embed_tokens.weight": ("BF16", [VOCAB, H]),
                                                     "lm_head.weight": ("BF16", [VOCAB, H])}, fill=b"\1")
    return folder
