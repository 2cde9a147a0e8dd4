"""Reference completions: the target's own greedy continuation of each prompt (deterministic).

Plain token-by-token greedy decoding with the model's cache; the continuation includes the stop token
when one is produced. Cached per (target, prompt tokens, max_new_tokens) with the numerics that
produced it (dtype, device, kernel path, versions).
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass
from pathlib import Path

from remote_payload.inputs import cache as cachemod
from remote_payload.models.target import Target, cache_kwarg

# Fields of a cached reference that must match the current run for reuse.
REFERENCE_FIELDS = ("schema", "weights_digest", "prompt_tokens", "max_new_tokens", "stop_ids", "dtype",
                    "device", "kernel_path", "torch", "transformers")


@dataclass
class Reference:
    prompt_ids: list[int]
    continuation: list[int]
    stop_reason: str  # "eos" | "max_new_tokens"
    seconds: float = 0.0
    cached: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.continuation


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def forward(model, input_ids, cache=None, logits_to_keep: int | None = None):
    """One target forward with the cache keyword this transformers version expects."""
    kwargs = {"input_ids": input_ids, "use_cache": cache is not None}
    if cache is not None:
        kwargs[cache_kwarg(model)] = cache
    if logits_to_keep is not None and "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = logits_to_keep
    return model(**kwargs)


def greedy_decode(target: Target, prompt_ids: list[int], max_new_tokens: int) -> Reference:
    import torch

    start = time.perf_counter()
    model = target.model
    stop = set(target.stop_ids)
    out_tokens: list[int] = []
    with torch.inference_mode():
        cache = new_cache(model)
        ids = torch.tensor([prompt_ids], device=target.input_device)
        while len(out_tokens) < max_new_tokens:
            logits = forward(model, ids, cache=cache, logits_to_keep=1).logits
            tok = int(logits[0, -1].argmax())
            out_tokens.append(tok)
            if tok in stop:
                break
            ids = torch.tensor([[tok]], device=target.input_device)
    reason = "eos" if out_tokens and out_tokens[-1] in stop else "max_new_tokens"
    return Reference(list(prompt_ids), out_tokens, reason, time.perf_counter() - start)


def numerics(target: Target) -> dict:
    import torch
    import transformers

    return {"weights_digest": target.digest.get("value"), "dtype": str(target.dtype).replace("torch.", ""),
            "device": target.device, "kernel_path": target.kernel_path, "torch": torch.__version__,
            "transformers": transformers.__version__}


def cached_reference(target: Target, prompt_ids: list[int], max_new_tokens: int, cache_dir: Path | None,
                     warn=None) -> Reference:
    expected = {"schema": "dfo.reference/1", "prompt_tokens": list(prompt_ids), "max_new_tokens": max_new_tokens,
                "stop_ids": list(target.stop_ids), **numerics(target)}
    path = None
    if cache_dir is not None:
        key = cachemod.tokens_digest(list(prompt_ids) + [max_new_tokens])[:32]
        path = cache_dir / "references" / f"{cachemod.safe_name(target.config.name)}-{key}.json"
        if path.exists():
            try:
                found = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                found = None
            reasons = cachemod.mismatches(expected, found, REFERENCE_FIELDS)
            if not reasons:
                return Reference(list(prompt_ids), list(found["continuation"]), found["stop_reason"], 0.0, True)
            if warn:
                warn(f"reference cache {path.name} not reused ({'; '.join(reasons)}): regenerating")
    ref = greedy_decode(target, prompt_ids, max_new_tokens)
    if path is not None:
        cachemod.atomic_write_json(path, {**expected, "continuation": ref.continuation,
                                          "stop_reason": ref.stop_reason, "seconds": round(ref.seconds, 3)})
    return ref
