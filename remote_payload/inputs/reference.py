"""Reference completions: the target's own greedy continuation of each prompt (deterministic).

Plain token-by-token greedy decoding with the model's cache; the continuation includes the stop token
when one is produced. Cached per (target, prompt tokens, max_new_tokens) with the numerics that
produced it (dtype, device, kernel path, versions).

The *tail*: the target's greedy tokens a block past the kept continuation (end tokens not stopped on), which
only the ``zlab-2604``/``vllm`` τ conventions read (their last round counts drafts accepted past the stop;
``metrics/conventions.py``). It is kept out of the continuation and of every other metric, and cached in the
same file under ``tail`` (an addition: a file without it is still reused, and gains it).
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass
from pathlib import Path

from remote_payload.inputs.cache import atomic_write_json, mark_used, mismatches, safe_name, tokens_digest
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
    tail: list[int] | None = None  # greedy tokens past the continuation (see the module doc); None: unknown

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


def _greedy(target: Target, ids: list[int], limit: int, stop: set) -> list[int]:
    """Up to ``limit`` greedy tokens after ``ids``, ending after the first one in ``stop``."""
    import torch

    model = target.model
    out: list[int] = []
    with torch.inference_mode():
        cache = new_cache(model)
        x = torch.tensor([ids], device=target.input_device)
        while len(out) < limit:
            logits = forward(model, x, cache=cache, logits_to_keep=1).logits
            tok = int(logits[0, -1].argmax())
            out.append(tok)
            if tok in stop:
                break
            x = torch.tensor([[tok]], device=target.input_device)
    return out


def greedy_decode(target: Target, prompt_ids: list[int], max_new_tokens: int) -> Reference:
    start = time.perf_counter()
    stop = set(target.stop_ids)
    out_tokens = _greedy(target, list(prompt_ids), max_new_tokens, stop)
    reason = "eos" if out_tokens and out_tokens[-1] in stop else "max_new_tokens"
    return Reference(list(prompt_ids), out_tokens, reason, time.perf_counter() - start)


def greedy_tail(target: Target, tokens: list[int], n: int) -> list[int]:
    """The tail: ``n`` greedy tokens after prompt + continuation, end tokens not stopped on.

    Always from a fresh prefill of ``tokens`` (whether the continuation was just decoded or came from the
    cache), so the tail is one function of the tokens.
    """
    return _greedy(target, list(tokens), n, set()) if n > 0 else []


def numerics(target: Target) -> dict:
    import torch
    import transformers

    return {"weights_digest": target.digest.get("value"), "dtype": str(target.dtype).replace("torch.", ""),
            "device": target.device, "kernel_path": target.kernel_path, "torch": torch.__version__,
            "transformers": transformers.__version__}


def cached_reference(target: Target, prompt_ids: list[int], max_new_tokens: int, cache_dir: Path | None,
                     warn=None, tail: int = 0) -> Reference:
    """The reference, from the cache when its numerics match; with ``tail`` > 0 also ``tail`` tokens past it."""
    expected = {"schema": "dfo.reference/1", "prompt_tokens": list(prompt_ids), "max_new_tokens": max_new_tokens,
                "stop_ids": list(target.stop_ids), **numerics(target)}
    path = None
    if cache_dir is not None:
        key = tokens_digest(list(prompt_ids) + [max_new_tokens])[:32]
        path = cache_dir / "references" / f"{safe_name(target.config.name)}-{key}.json"
        if path.exists():
            try:
                found = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                found = None
            reasons = mismatches(expected, found, REFERENCE_FIELDS)
            if not reasons:
                mark_used(path)
                ref = Reference(list(prompt_ids), list(found["continuation"]), found["stop_reason"], 0.0, True)
                _with_tail(target, ref, tail, path, found)
                return ref
            if warn:
                warn(f"reference cache {path.name} not reused ({'; '.join(reasons)}): regenerating")
    ref = greedy_decode(target, prompt_ids, max_new_tokens)
    found = {**expected, "continuation": ref.continuation, "stop_reason": ref.stop_reason,
             "seconds": round(ref.seconds, 3)}
    if path is not None:
        atomic_write_json(path, found)
    _with_tail(target, ref, tail, path, found)
    return ref


def _with_tail(target: Target, ref: Reference, n: int, path: Path | None, entry: dict) -> None:
    """Set ``ref.tail`` (n tokens) from the cache entry when it holds enough, else decode it and cache it."""
    if n <= 0:
        return
    cached = entry.get("tail")
    if isinstance(cached, list) and len(cached) >= n and all(isinstance(t, int) for t in cached):
        ref.tail = list(cached[:n])
        return
    ref.tail = greedy_tail(target, ref.tokens, n)
    if path is not None:
        atomic_write_json(path, {**entry, "tail": ref.tail})
