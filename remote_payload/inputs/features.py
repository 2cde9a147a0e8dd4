"""Hidden-state extraction: one forward over prompt + continuation, forward hooks on decoder layers.

Layer id l means "output of decoder layer l" (docs/troubleshooting.md, pitfall 1): a forward hook on
``get_decoder().layers[l]``. This equals HF ``hidden_states[l + 1]`` for every layer but the last,
which HF replaces with the post-final-norm state; hooks avoid that trap. Features are cached per sample
as safetensors with metadata; a cache entry is reused only when the metadata matches.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.inputs.cache import (
    mark_used,
    mismatches,
    safe_name,
    temp_path_for,
    tokens_digest,
    with_suppress_unlink,
)
from remote_payload.inputs.reference import forward, numerics
from remote_payload.models.target import Target

FEATURE_FIELDS = ("schema", "target", "weights_digest", "tokens_sha256", "prompt_len", "dtype", "device",
                  "kernel_path", "torch", "transformers")
ARGMAX_CHUNK = 512


@dataclass
class Features:
    layers: dict  # layer id -> tensor [S, H] on CPU (target dtype)
    tokens: list[int]
    prompt_len: int
    # Target argmax at each position under teacher forcing (None when not computed).
    argmax: Any = None  # a torch int tensor (kept untyped: this module imports torch lazily)
    seconds: float = 0.0
    cached: bool = False
    meta: dict | None = None

    def teacher_forced_mismatches(self) -> int | None:
        """Continuation positions where the target's one-pass argmax disagrees with the reference token.

        0 for a reference produced by the same numerics; near-tied logits can flip across paths.
        """
        if self.argmax is None:
            return None
        pred = self.argmax[self.prompt_len - 1:len(self.tokens) - 1].tolist()
        return sum(int(a != b) for a, b in zip(pred, self.tokens[self.prompt_len:], strict=False))


def _layer_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def extract(target: Target, tokens: list[int], layer_ids: list[int], prompt_len: int,
            with_argmax: bool = True) -> Features:
    """Hidden states of the requested decoder layers for every position of ``tokens``."""
    import torch

    bad = [lid for lid in layer_ids if not 0 <= lid < len(target.layers)]
    if bad:
        raise PayloadError(f"layer id(s) {bad} outside the target's decoder layers 0..{len(target.layers) - 1}")
    captured: dict[int, torch.Tensor] = {}
    post_norm: list[torch.Tensor] = []
    handles = []
    start = time.perf_counter()
    try:
        for lid in sorted(set(layer_ids)):
            handles.append(target.layers[lid].register_forward_hook(
                lambda _m, _i, out, lid=lid: captured.__setitem__(lid, _layer_output(out)[0].detach().to("cpu"))))
        norm = getattr(target.model.get_decoder(), "norm", None)
        if with_argmax and norm is not None:
            handles.append(norm.register_forward_hook(lambda _m, _i, out: post_norm.append(_layer_output(out)[0])))
        with torch.inference_mode():
            ids = torch.tensor([tokens], device=target.input_device)
            forward(target.model, ids, cache=None, logits_to_keep=1)
            argmax = None
            if post_norm:
                head = target.model.get_output_embeddings()
                h = post_norm[-1]
                parts = [head(h[i:i + ARGMAX_CHUNK].to(head.weight.device)).argmax(-1).to("cpu")
                         for i in range(0, h.shape[0], ARGMAX_CHUNK)]
                argmax = torch.cat(parts)
    finally:
        for h in handles:
            h.remove()
    return Features(layers={lid: captured[lid] for lid in sorted(set(layer_ids))}, tokens=list(tokens),
                    prompt_len=prompt_len, argmax=argmax, seconds=time.perf_counter() - start)


def _expected_meta(target: Target, tokens: list[int], prompt_len: int) -> dict:
    return {"schema": "dfo.features/1", "target": target.config.name, "tokens_sha256": tokens_digest(tokens),
            "prompt_len": prompt_len, **numerics(target)}


def cache_path(cache_dir: Path, target: Target, tokens: list[int]) -> Path:
    return (cache_dir / "features" /
            f"{safe_name(target.config.name)}-{tokens_digest(tokens)[:32]}.safetensors")


def load_cached(path: Path, expected: dict, layer_ids: list[int]) -> tuple[Features | None, list[str]]:
    from safetensors import SafetensorError, safe_open

    if not path.exists():
        return None, []
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta_text = (fh.metadata() or {}).get("dfo")
            found = json.loads(meta_text) if meta_text else None
            reasons = mismatches(expected, found, FEATURE_FIELDS)
            if reasons or found is None:  # no metadata is a reason
                return None, reasons
            have = set(found.get("layer_ids", []))
            missing = sorted(set(layer_ids) - have)
            if missing:
                return None, [f"layers {missing} not in the cache (has {sorted(have)})"]
            layers = {lid: fh.get_tensor(f"layer.{lid}") for lid in sorted(set(layer_ids))}
            argmax = fh.get_tensor("argmax") if "argmax" in fh.keys() else None
            tokens = fh.get_tensor("tokens").tolist()
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as exc:
        return None, [f"unreadable ({type(exc).__name__})"]
    return Features(layers=layers, tokens=tokens, prompt_len=int(found["prompt_len"]), argmax=argmax,
                    cached=True, meta=found), []


def save(path: Path, feats: Features, meta: dict) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {f"layer.{lid}": t.contiguous() for lid, t in feats.layers.items()}
    tensors["tokens"] = torch.tensor(feats.tokens, dtype=torch.int64)
    if feats.argmax is not None:
        tensors["argmax"] = feats.argmax.to(torch.int64).contiguous()
    full_meta = {**meta, "layer_ids": sorted(feats.layers)}
    tmp = temp_path_for(path)
    try:
        save_file(tensors, str(tmp), metadata={"dfo": json.dumps(full_meta)})
        tmp.replace(path)
    finally:
        with_suppress_unlink(tmp)


def cached_features(target: Target, tokens: list[int], prompt_len: int, layer_ids: list[int],
                    cache_dir: Path | None, warn=None) -> Features:
    expected = _expected_meta(target, tokens, prompt_len)
    path = None
    if cache_dir is not None:
        path = cache_path(cache_dir, target, tokens)
        feats, reasons = load_cached(path, expected, layer_ids)
        if feats is not None:
            mark_used(path)
            return feats
        if reasons and warn:
            warn(f"feature cache {path.name} not reused ({'; '.join(reasons)}): re-extracting")
    feats = extract(target, tokens, layer_ids, prompt_len)
    if path is not None:
        save(path, feats, expected)
    feats.meta = {**expected, "layer_ids": sorted(feats.layers)}
    return feats


def bytes_per_token(target: Target, layer_ids: list[int]) -> int:
    """Feature cache bytes per token: layers × hidden size × the dtype's bytes (tokens and argmax add 16 B)."""
    import torch

    return len(set(layer_ids)) * target.config.hidden_size * torch.empty((), dtype=target.dtype).element_size()


# Features of a run are kept in memory up to this size; beyond it they are re-read from the cache per drafter.
KEEP_IN_MEMORY_BYTES = 2 * 2**30


class FeatureStore:
    """Features of every sample of a run: in memory when small, else re-read from the cache per drafter."""

    def __init__(self, layer_ids, cache_dir):
        self.layer_ids, self.cache_dir = layer_ids, cache_dir
        self.mem: dict = {}
        self.paths: dict = {}
        self.meta: dict = {}
        self.bytes = 0

    def add(self, i, feats, path):
        self.paths[i] = path
        self.meta[i] = feats.meta
        size = sum(t.numel() * t.element_size() for t in feats.layers.values())
        if self.bytes + size <= KEEP_IN_MEMORY_BYTES:
            self.mem[i] = feats.layers
            self.bytes += size

    def get(self, i):
        if i in self.mem:
            return self.mem[i]
        feats, reasons = load_cached(self.paths[i], self.meta[i], self.layer_ids)
        if feats is None:
            raise PayloadError(f"feature cache {self.paths[i]} changed during the run ({'; '.join(reasons)})")
        return feats.layers
