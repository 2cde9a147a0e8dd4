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
from typing import TypeGuard

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


def forward(model, input_ids, cache=None, logits_to_keep: int | None = None, attention_mask=None, position_ids=None):
    """One target forward with the cache keyword this transformers version expects (a mask and positions only
    where given: a batch with left padding, ``batched_decode.py``)."""
    kwargs = {"input_ids": input_ids, "use_cache": cache is not None}
    if attention_mask is not None:
        kwargs.update(attention_mask=attention_mask, position_ids=position_ids)
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


@dataclass
class CacheEntry:
    """One continuation's cache file: what it must record to be reused, and its content when it can be."""

    path: Path | None  # None: no cache folder
    expected: dict  # the fields a reusable file holds (its key and the numerics)
    found: dict | None = None  # the file's content when it can be reused, else None (decode it)

    def store(self, continuation: list[int], stop_reason: str, seconds: float, **extra) -> None:
        """The decoded continuation, written at once (under a temporary name, then renamed)."""
        self.found = {**self.expected, "continuation": list(continuation), "stop_reason": stop_reason,
                      "seconds": round(seconds, 3), **extra}
        if self.path is not None:
            atomic_write_json(self.path, self.found)

    def cached_tail(self, n: int) -> list[int] | None:
        cached = (self.found or {}).get("tail")
        return list(cached[:n]) if token_list(cached) and len(cached) >= n else None

    def store_tail(self, tail: list[int]) -> None:
        self.found = {**(self.found or self.expected), "tail": list(tail)}
        if self.path is not None:
            atomic_write_json(self.path, self.found)


def lookup(path: Path | None, expected: dict, fields, warn=None, what: str = "reference",
           again: str = "regenerating") -> CacheEntry:
    """The cache entry at ``path``: reusable when every field in ``fields`` matches ``expected`` and its
    continuation is well formed (said through ``warn`` when a file is there but not reused)."""
    entry = CacheEntry(path, expected)
    if path is None or not path.exists():
        return entry
    try:
        found = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        found = None
    reasons = mismatches(expected, found, fields)
    if not reasons and token_list(found.get("continuation")) and found.get("stop_reason") in ("eos",
                                                                                             "max_new_tokens"):
        mark_used(path)
        entry.found = found
    elif warn:
        warn(f"{what} cache {path.name} not reused ({'; '.join(reasons) or 'malformed'}): {again}")
    return entry


def token_list(value: object) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def reference_entry(target: Target, prompt_ids: list[int], max_new_tokens: int, cache_dir: Path | None,
                    warn=None) -> CacheEntry:
    """The greedy reference's cache entry (reusable or to be decoded)."""
    expected = {"schema": "dfo.reference/1", "prompt_tokens": list(prompt_ids), "max_new_tokens": max_new_tokens,
                "stop_ids": list(target.stop_ids), **numerics(target)}
    path = None
    if cache_dir is not None:
        key = tokens_digest(list(prompt_ids) + [max_new_tokens])[:32]
        path = cache_dir / "references" / f"{safe_name(target.config.name)}-{key}.json"
    return lookup(path, expected, REFERENCE_FIELDS, warn)


def cached_reference(target: Target, prompt_ids: list[int], max_new_tokens: int, cache_dir: Path | None,
                     warn=None, tail: int = 0) -> Reference:
    """The reference, from the cache when its numerics match; with ``tail`` > 0 also ``tail`` tokens past it.
    One prompt at a time; the eval's reference stage decodes many at once (``batched_references.py``)."""
    entry = reference_entry(target, prompt_ids, max_new_tokens, cache_dir, warn)
    if entry.found is not None:
        ref = Reference(list(prompt_ids), list(entry.found["continuation"]), entry.found["stop_reason"], 0.0, True)
    else:
        ref = greedy_decode(target, prompt_ids, max_new_tokens)
        entry.store(ref.continuation, ref.stop_reason, ref.seconds)
    if tail > 0:
        ref.tail = entry.cached_tail(tail)
        if ref.tail is None:
            ref.tail = greedy_tail(target, ref.tokens, tail)
            entry.store_tail(ref.tail)
    return ref
