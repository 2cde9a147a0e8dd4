"""Validating a drafter's weights against its spec, and the spec against the target (config, tokenizer).

Each check fails with one line naming the file and what was expected vs found (README "Validation").
"""

from __future__ import annotations

from remote_payload.errors import PayloadError
from remote_payload.models.dflash2 import selector_shapes
from remote_payload.models.spec import DrafterSpec


def expected_shapes(spec: DrafterSpec) -> dict:
    """Every weight the spec's drafter holds, with its shape. DFlash2's selector codebooks have one row per token
    of the target's vocabulary: the checkpoint's rows here (``vocab_rows``), checked against the target later."""
    H, hd = spec.hidden_size, spec.head_dim
    q, kv, inter = spec.num_heads * hd, spec.num_kv_heads * hd, spec.intermediate_size
    shapes = {"fc.weight": [H, spec.fc_in_features], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [q, H], p + "self_attn.k_proj.weight": [kv, H],
            p + "self_attn.v_proj.weight": [kv, H], p + "self_attn.o_proj.weight": [H, q],
            p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
            p + "mlp.gate_proj.weight": [inter, H], p + "mlp.up_proj.weight": [inter, H],
            p + "mlp.down_proj.weight": [H, inter],
        })
        if spec.attention_bias:
            shapes.update({p + "self_attn.q_proj.bias": [q], p + "self_attn.k_proj.bias": [kv],
                           p + "self_attn.v_proj.bias": [kv], p + "self_attn.o_proj.bias": [H]})
    if spec.dflash2 is not None:
        shapes.update(selector_shapes(spec, spec.dflash2.vocab_rows or -1))
    return shapes


def _names(keys) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:8]) + (f" (+{len(keys) - 8} more)" if len(keys) > 8 else "")


# Weights only a DFlash2 drafter carries: the dynamic convolutions around each sub-layer and the candidate
# selector. Under a DFlash config they would be left out of the forward and τ would silently change.
DFLASH2_KEY_PARTS = (".attention_conv.", ".mlp_conv.", "predecessor_codebook", "successor_codebook",
                     "hidden_projection")


def refuse_dflash2_weights(spec: DrafterSpec, weights: dict, where: str) -> None:
    if spec.dflash2 is not None:
        return
    found = sorted(k for k in weights if any(part in f".{k}" for part in DFLASH2_KEY_PARTS))
    if found:
        raise PayloadError(f"{where}: the weights are a DFlash2 drafter's (dynamic convolutions / candidate selector: "
                           f"{_names(found)}) but the config describes a DFlash drafter ({spec.format} format); "
                           "evaluating it as DFlash would ignore the selector and give a different τ. Give the "
                           "checkpoint its DFlash2 config (architectures: [\"DFlash2DraftModel\"] with the "
                           "selector fields in dflash_config)")


def validate_weights(spec: DrafterSpec, weights: dict, extras: dict, where: str) -> None:
    refuse_dflash2_weights(spec, weights, where)
    fc = weights.get("fc.weight")
    if fc is not None and fc.dim() == 2 and fc.shape[1] != spec.fc_in_features:
        n_in, H = int(fc.shape[1]), spec.hidden_size
        have = f"{n_in} = {n_in // H} × {H}" if n_in % H == 0 else f"{n_in} (not a multiple of hidden size {H})"
        layers = str(spec.fc_layer_ids) + (f", reserved {spec.reserved_layer_ids}" if spec.reserved_layer_ids else "")
        hint = ""
        if n_in == (len(spec.fc_layer_ids) + len(spec.reserved_layer_ids)) * H and spec.reserved_layer_ids:
            hint = "; fc uses every listed layer: set reserve_last_target_layer: false"
        elif spec.format == "training" and n_in == (len(spec.fc_layer_ids) - 1) * H:
            hint = "; fc skips one listed layer: reserve_last_target_layer: true?"
        raise PayloadError(f"{where}: fc expects {have} inputs but the spec lists {len(spec.fc_layer_ids)} layers "
                           f"{layers}{hint}")
    expected = expected_shapes(spec)
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys: {_names(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_names(unexpected)}")
        kind = "DFlash2" if spec.dflash2 else "DFlash"
        raise PayloadError(f"{where}: weights do not match the spec ({kind}, {spec.num_layers} layers) — "
                           f"{'; '.join(parts)}")
    wrong = [f"{k} {list(weights[k].shape)} (expected {v})" for k, v in expected.items()
             if list(weights[k].shape) != v]
    if wrong:
        raise PayloadError(f"{where}: wrong tensor shape(s): {'; '.join(wrong[:4])}"
                           + (f" (+{len(wrong) - 4} more)" if len(wrong) > 4 else ""))
    if spec.embed_source == "checkpoint":
        emb = extras["embed_tokens.weight"]
        if emb.dim() != 2 or emb.shape[1] != spec.hidden_size:
            raise PayloadError(f"{where}: embed_tokens.weight {list(emb.shape)} does not match hidden size "
                               f"{spec.hidden_size}")
    if spec.lm_head_source == "checkpoint":
        head = extras["lm_head.weight"]
        if head.dim() != 2 or head.shape[1] != spec.hidden_size:
            raise PayloadError(f"{where}: lm_head.weight {list(head.shape)} does not match hidden size "
                               f"{spec.hidden_size}")
        if spec.draft_vocab_size is not None and head.shape[0] != spec.draft_vocab_size:
            raise PayloadError(f"{where}: lm_head.weight has {head.shape[0]} rows but draft_vocab_size is "
                               f"{spec.draft_vocab_size}")
    if spec.vocab_map == "d2t":
        d2t = extras["d2t"]
        if d2t.dim() != 1 or spec.lm_head_source != "checkpoint" or d2t.shape[0] != extras["lm_head.weight"].shape[0]:
            raise PayloadError(f"{where}: d2t {list(d2t.shape)} must have one entry per lm_head row")


def validate_against_target(spec: DrafterSpec, target_cfg, tokenizer, stop_ids: list[int], where: str,
                            extras: dict | None = None) -> None:
    """Checks that need the target: hidden size, layer ids, mask id, vocabulary sizes."""
    import torch

    if spec.hidden_size != target_cfg.hidden_size:
        raise PayloadError(f"{where}: drafter hidden size {spec.hidden_size} but the target "
                           f"({target_cfg.name}) has hidden size {target_cfg.hidden_size}")
    n = target_cfg.num_layers
    out = [i for i in spec.fc_layer_ids + spec.reserved_layer_ids if not 0 <= i < n]
    if out:
        raise PayloadError(f"{where}: target layer id(s) {out} outside the target's decoder layers 0..{n - 1} "
                           f"(ids from {spec.layer_ids_source})")
    if spec.dflash2 is not None and spec.dflash2.vocab_rows is not None:
        rows = spec.dflash2.vocab_rows
        if rows != target_cfg.vocab_size:
            raise PayloadError(f"{where}: the DFlash2 selector's codebooks have {rows} rows but the target "
                               f"({target_cfg.name}) has a {target_cfg.vocab_size}-token vocabulary")
    vocab = target_cfg.vocab_size
    if spec.embed_source == "checkpoint" and extras is not None:
        vocab = int(extras["embed_tokens.weight"].shape[0])
    mask = spec.mask_token_id
    if not 0 <= mask < vocab:
        raise PayloadError(f"{where}: mask_token_id {mask} is outside the vocabulary (0..{vocab - 1})")
    specials = {"eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id, "bos": tokenizer.bos_token_id}
    for label, tid in specials.items():
        if tid is not None and tid == mask:
            raise PayloadError(f"{where}: mask_token_id {mask} is the tokenizer's {label} token — a fallback, not the "
                               "drafter's mask token (pitfall 3)")
    if mask in stop_ids:
        raise PayloadError(f"{where}: mask_token_id {mask} is a stop token of the target (pitfall 3)")
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    if mask < len(tokenizer) and mask not in added:
        piece = tokenizer.convert_ids_to_tokens(mask)
        raise PayloadError(f"{where}: mask_token_id {mask} is the regular vocabulary token {piece!r}; the mask must be "
                           "a reserved/special token (Qwen3.5/3.6: 248070 or 248077 by revision)")
    if mask in added and added[mask].content in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>",
                                                  "</think>"):
        raise PayloadError(f"{where}: mask_token_id {mask} is the chat-template token {added[mask].content!r}")
    if spec.vocab_map == "d2t" and extras is not None:
        d2t = extras["d2t"].to(torch.int64)
        ids = torch.arange(d2t.shape[0]) + d2t
        if int(ids.min()) < 0 or int(ids.max()) >= target_cfg.vocab_size:
            raise PayloadError(f"{where}: d2t maps draft ids outside the target vocabulary "
                               f"0..{target_cfg.vocab_size - 1}")
    elif spec.lm_head_source == "checkpoint" and extras is not None:
        rows = extras["lm_head.weight"].shape[0]
        if rows != target_cfg.vocab_size:
            raise PayloadError(f"{where}: lm_head has {rows} rows (draft vocabulary) but no d2t map to the target's "
                               f"{target_cfg.vocab_size}-token vocabulary")
