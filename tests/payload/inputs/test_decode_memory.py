"""--decode-batch auto: the memory of one row from the target's config (inputs/decode_memory.py), pure."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from remote_payload.inputs.decode_memory import MARGIN, auto_batch, row_bytes, rows_that_fit

REAL = Path(__file__).resolve().parents[3] / "remote_payload/diagnose/gpu_kit/data/qwen3.6-27b.config.json"


def test_a_rows_memory_at_qwen3_6_27b_size_comes_from_its_config():
    cfg = json.loads(REAL.read_text())  # the VL config: its text_config is read
    one, two = row_bytes(cfg, 1000, 2, prefill_tokens=0), row_bytes(cfg, 2000, 2, prefill_tokens=0)
    # 16 full-attention layers (of 64) × K and V × 4 key/value heads × head dim 256 × 2 bytes, per token
    assert two["kv_cache"] - one["kv_cache"] == 1000 * 16 * 2 * 4 * 256 * 2
    # 48 gated delta-net layers: 48 value heads × 128 × 128 in fp32, whatever the length; conv window 4 wide
    assert one["linear_state"] == two["linear_state"] == 48 * 48 * 128 * 128 * 4
    assert one["conv_window"] == 48 * (2 * 16 * 128 + 48 * 128) * 4 * 2
    full = row_bytes(cfg, 2000, 2)
    assert full["prefill"] > two["prefill"] and full["total"] == full["held"] + full["prefill"]


def test_a_dense_config_has_no_linear_state():
    cfg = {"num_hidden_layers": 8, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "vocab_size": 512, "intermediate_size": 128}
    r = row_bytes(cfg, 10, 4, prefill_tokens=0)
    assert r["kv_cache"] == 8 * 2 * 2 * 64 * 10 * 4 and r["linear_state"] == r["conv_window"] == 0


def test_the_batch_is_what_the_margin_of_free_memory_holds_at_most_the_rows():
    assert rows_that_fit(100 * 2**30, 2**30, 500) == int(100 * MARGIN)
    assert rows_that_fit(100 * 2**30, 2**30, 12) == 12
    assert rows_that_fit(2**20, 2**30, 12) == 1  # not even one: 1 (out of memory then says so)
    assert auto_batch(SimpleNamespace(device="cpu"), 4096, 128) == 1  # the CPU: 1 unless given
