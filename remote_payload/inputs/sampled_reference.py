"""Reference continuations sampled from the target at T > 0, one per (prompt, seed), cached per seed.

Token-by-token decoding with the model's cache like the greedy references (``reference.py``), each token drawn
by ``sampling.sample`` from a generator seeded with the draw's seed; the continuation includes the end token
when one is drawn. The *tail* (the tokens past the stop that the zlab-2604/vllm τ conventions read) is sampled too,
from a fresh prefill of the kept tokens with its own seed (``draw_seed(..., purpose="tail")``), end tokens not
stopped on: at T > 0 the loop's verify samples the target's tokens past the end the same way.

Cached under ``references/`` keyed by the prompt tokens, max_new_tokens, the law and the seed, with the
numerics that produced it (a file is reused only when they match: the same seed on other numerics may draw
other tokens). The greedy path (``reference.py``) is untouched: T = 0 runs read and write its files only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from remote_payload.inputs.cache import safe_name, tokens_digest
from remote_payload.inputs.reference import CacheEntry, Reference, forward, lookup, new_cache, numerics
from remote_payload.inputs.sampling import Sampling, draw_seed, generator, sample
from remote_payload.models.target import Target

SCHEMA = "dfo.sampled-reference/1"
FIELDS = ("schema", "weights_digest", "prompt_tokens", "max_new_tokens", "stop_ids", "sampling", "seed", "dtype",
          "device", "kernel_path", "torch", "transformers")


@dataclass
class SampledReference(Reference):
    """A reference drawn at T > 0: the greedy ``Reference`` plus the seed it was drawn with."""

    seed: int | None = None


def _sampled(target: Target, ids: list[int], limit: int, stop: set, sampling: Sampling, seed: int) -> list[int]:
    """Up to ``limit`` tokens drawn after ``ids``, ending after the first one in ``stop``."""
    import torch

    model, gen = target.model, generator(seed)
    out: list[int] = []
    with torch.inference_mode():
        cache = new_cache(model)
        x = torch.tensor([ids], device=target.input_device)
        while len(out) < limit:
            logits = forward(model, x, cache=cache, logits_to_keep=1).logits
            tok = sample(logits[0, -1:], sampling, gen)[0]
            out.append(tok)
            if tok in stop:
                break
            x = torch.tensor([[tok]], device=target.input_device)
    return out


def sampled_decode(target: Target, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling,
                   seed: int) -> SampledReference:
    start = time.perf_counter()
    stop = set(target.stop_ids)
    tokens = _sampled(target, list(prompt_ids), max_new_tokens, stop, sampling, seed)
    reason = "eos" if tokens and tokens[-1] in stop else "max_new_tokens"
    return SampledReference(list(prompt_ids), tokens, reason, time.perf_counter() - start, seed=seed)


def sampled_tail(target: Target, tokens: list[int], n: int, sampling: Sampling, seed: int) -> list[int]:
    """``n`` tokens drawn after prompt + continuation (end tokens not stopped on), with the tail's own seed."""
    return _sampled(target, list(tokens), n, set(), sampling, tail_seed(seed, tokens)) if n > 0 else []


def sampled_entry(target: Target, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling, seed: int,
                  cache_dir: Path | None, warn=None) -> CacheEntry:
    """The cache entry of the draw of ``seed`` (reusable or to be drawn)."""
    expected = {"schema": SCHEMA, "prompt_tokens": list(prompt_ids), "max_new_tokens": max_new_tokens,
                "stop_ids": list(target.stop_ids), "sampling": sampling.as_json(), "seed": int(seed),
                **numerics(target)}
    path = None
    if cache_dir is not None:
        key = tokens_digest(list(prompt_ids) + [max_new_tokens])[:24]
        law = tokens_digest([int(seed), round(sampling.temperature * 1e6), round(sampling.top_p * 1e6),
                             sampling.top_k])[:12]
        path = cache_dir / "references" / f"{safe_name(target.config.name)}-{key}-t{law}.json"
    return lookup(path, expected, FIELDS, warn, what="sampled reference", again="drawing it again")


def tail_seed(seed: int, tokens: list[int]) -> int:
    """The seed the tail past a draw's continuation (``tokens``: prompt + continuation) is drawn with."""
    return draw_seed(seed, tokens, 0, "tail")


def cached_sampled_reference(target: Target, prompt_ids: list[int], max_new_tokens: int, sampling: Sampling,
                             seed: int, cache_dir: Path | None, warn=None, tail: int = 0) -> SampledReference:
    """The draw of ``seed``, from the cache when its numerics match; with ``tail`` > 0 also its tail. One draw at a
    time; the eval's reference stage draws many at once (``batched_references.py``)."""
    entry = sampled_entry(target, prompt_ids, max_new_tokens, sampling, seed, cache_dir, warn)
    if entry.found is not None:
        ref = SampledReference(list(prompt_ids), list(entry.found["continuation"]), entry.found["stop_reason"], 0.0,
                               True, seed=seed)
    else:
        ref = sampled_decode(target, prompt_ids, max_new_tokens, sampling, seed)
        entry.store(ref.continuation, ref.stop_reason, ref.seconds)
    if tail > 0:
        ref.tail = entry.cached_tail(tail)
        if ref.tail is None:
            ref.tail = sampled_tail(target, ref.tokens, tail, sampling, seed)
            entry.store_tail(ref.tail)
    return ref
