"""How many rows a batched decode fits on the device (``--decode-batch auto``), from the target's config.

One row of T tokens holds, for its whole decode:
- the key/value cache of every full-attention layer: 2 × key/value heads × head dim × T, in the model's dtype;
- each linear-attention (gated delta-net) layer's recurrent state (value heads × key dim × value dim, counted
  in fp32: the torch and fla kernels keep it there) and its conv window (conv channels × kernel, model dtype);
and, for a moment, its prefill of P tokens (the prompt; a tail's row prefills all T): one layer's activations
(the MLP's three intermediate-wide projections and a few hidden-wide ones), the padding mask (P × T bytes) and
the last position's logits in fp32.
The batch is what ``MARGIN`` of the free memory holds for the longest row, at most the number of rows; the
estimate is deliberately rough (an out-of-memory error halves the batch and decoding goes on). Pure but for
``auto_batch``, which asks torch for the free memory.
"""

from __future__ import annotations

from typing import Any, Mapping

MARGIN = 0.8  # of the free memory: allocator fragmentation, kernels' workspaces, what the estimate misses
STATE_BYTES = 4  # linear-attention recurrent state: fp32


def text_config(cfg: Any) -> dict:
    """The text model's fields from a transformers config (or its dict); a VL config's text_config."""
    data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    nested = data.get("text_config")
    return dict(nested) if isinstance(nested, Mapping) else data


def row_bytes(cfg: Any, tokens: int, dtype_bytes: int, prefill_tokens: int | None = None) -> dict:
    """Bytes one row of ``tokens`` tokens needs: held for the decode (``held``) and at its prefill of
    ``prefill_tokens`` (default: all of them; ``prefill``)."""
    c = text_config(cfg)
    layers = int(c["num_hidden_layers"])
    types = list(c.get("layer_types") or ["full_attention"] * layers)
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    full = sum(1 for t in types if t != "linear_attention")
    linear = layers - full
    kv = full * 2 * kv_heads * head_dim * tokens * dtype_bytes
    state = conv = 0
    if linear:
        k_heads, v_heads = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
        k_dim, v_dim = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
        kernel = int(c.get("linear_conv_kernel_dim") or 4)
        state = linear * v_heads * k_dim * v_dim * STATE_BYTES
        conv = linear * (2 * k_heads * k_dim + v_heads * v_dim) * kernel * dtype_bytes
    intermediate = int(c.get("intermediate_size") or 4 * hidden)
    p = tokens if prefill_tokens is None else prefill_tokens
    prefill = p * (3 * intermediate + 8 * hidden) * dtype_bytes + p * tokens + int(c["vocab_size"]) * 8
    return {"kv_cache": kv, "linear_state": state, "conv_window": conv, "held": kv + state + conv,
            "prefill": prefill, "total": kv + state + conv + prefill}


def rows_that_fit(free_bytes: int, per_row: int, rows: int) -> int:
    """The batch ``MARGIN`` of ``free_bytes`` holds at ``per_row`` each: at least 1, at most ``rows``."""
    fit = int(free_bytes * MARGIN) // max(per_row, 1)
    return max(1, min(fit, max(rows, 1)))


def auto_batch(target, tokens: int, rows: int, prefill_tokens: int | None = None) -> int:
    """``--decode-batch auto``: on a GPU what its free memory holds for a row of ``tokens`` whose prefill is
    ``prefill_tokens`` long (default all); 1 on the CPU."""
    import torch

    if target.device != "cuda":
        return 1
    free, _ = torch.cuda.mem_get_info(target.input_device)
    dtype_bytes = torch.empty((), dtype=target.dtype).element_size()
    return rows_that_fit(free, row_bytes(target.model.config, tokens, dtype_bytes, prefill_tokens)["total"], rows)
