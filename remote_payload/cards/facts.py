"""What a checkpoint says about itself that ``--explain`` reports: the chat template its drafter was trained with
(the ``chat_template`` knob) and whether the drafter or the target is quantized (the ``quantization`` fact). Pure
stdlib over values the card stage read from the host's files (eval/card_stage.py), so the rules are testable alone.
"""

from __future__ import annotations

import hashlib
from typing import Any

QUANTIZED_DTYPES = ("int", "uint", "float8", "float4")  # stored weight dtypes no bf16/fp32 training leaves behind
QUANTIZED_SEEN = ("a quantized drafter has lost most of its acceptance with no error anywhere (W4A16 DFlash2: "
                  "3.7 → 1.0, sgl-project/sglang#39087): compare with its unquantized weights")


def template_sha256(text: str) -> str:
    """As ``diagnose.findings.template_sha256`` hashes a tokenizer's chat_template string (training metadata's
    ``chat_template_sha256``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def drafter_template(trained_sha: str | None, shipped: str | None, shipped_where: str, target_sha: str | None
                     ) -> tuple[str | None, str]:
    """(the template text to rerun with, or None; why / where it came from). The drafter names its training
    template by ``training.chat_template_sha256`` (a hash: no text) and may ship the text beside its weights
    (``chat_template.jinja`` or tokenizer_config.json's ``chat_template``, as a tokenizer saved with it writes
    them). Only a shipped text can be rendered with; the hash, where given, must be that text's."""
    shipped_sha = template_sha256(shipped) if shipped is not None else None
    if shipped_sha is not None and trained_sha and shipped_sha != trained_sha.lower():
        return None, (f"the template the drafter ships ({shipped_where}, sha256 {shipped_sha[:12]}…) is not the "
                      f"one its metadata says it was trained with (training.chat_template_sha256 {trained_sha[:12]}…)")
    named = shipped_sha or (trained_sha.lower() if trained_sha else None)
    if named is None:
        return None, ("the drafter names no chat template (no training.chat_template_sha256 in its metadata, no "
                      "chat_template.jinja or tokenizer_config.json chat_template beside its weights)")
    if named == target_sha:
        return None, "the drafter was trained with the target's own chat template (the same sha256): nothing to switch"
    if shipped is None:
        return None, (f"the drafter was trained with a chat template of sha256 {named[:12]}… (training."
                      f"chat_template_sha256), not the target's {(target_sha or '?')[:12]}…, but ships no template "
                      "text to render with: put it beside the drafter's weights as chat_template.jinja")
    return shipped, shipped_where


def quantization(config: Any, weight_dtypes: set[str] | frozenset[str]) -> str | None:
    """How a checkpoint is quantized, in words, or None: a ``quantization_config`` in its config (transformers'
    mark of every quantized export: GPTQ, AWQ, compressed-tensors, bitsandbytes, FP8), else weights stored in an
    integer or 8/4-bit float dtype."""
    block = config.get("quantization_config") if isinstance(config, dict) else None
    if block is None and isinstance(config, dict) and isinstance(config.get("text_config"), dict):
        block = config["text_config"].get("quantization_config")
    if isinstance(block, dict):
        shown = [f"{k} {block[k]}" for k in ("quant_method", "bits", "format", "weight_dtype") if k in block
                 and isinstance(block[k], (str, int, float)) and not isinstance(block[k], bool)]
        return "quantization_config" + (f" ({', '.join(shown)})" if shown else "")
    if block is not None:
        return "quantization_config"
    low = sorted(d for d in weight_dtypes if d.startswith(QUANTIZED_DTYPES))
    return f"weights stored as {', '.join(low)}" if low else None


def quantization_entry(who: str, what: str) -> dict:
    """The ``quantization`` entry of card.explain: a fact, not a measurement (nothing to switch off offline)."""
    return {"knob": "quantization", "setting": f"{who} quantized: {what}", "tau": None, "ci": None, "tau_base": None,
            "rows": None, "from": f"the {who}'s checkpoint", "fact": True}
