"""The online reference loop: real draft -> target verify -> accept, with exact cache rollback.

This is the cross-check of the offline path: its output must equal plain greedy decoding of the target,
and its per-round (anchor, accepted, produced) must equal the offline replay on the same prompt.

Rollback after a partially accepted block: full-attention KV caches can be cropped, but the recurrent
state of linear-attention (Gated DeltaNet) layers cannot — ``cache.crop()`` leaves it wrong. So for
hybrid targets the cache is snapshotted (deep copy) before verify, restored afterwards and the accepted
tokens are fed again ("snapshot"); pure full-attention targets use ``crop``.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

from .errors import PayloadError
from .metrics import Round
from .reference import forward, new_cache
from .target import Target

ROLLBACKS = ("auto", "snapshot", "crop")


@dataclass
class OnlineResult:
    prompt_len: int
    continuation: list[int]
    rounds: list[Round]
    stop_reason: str
    seconds: float
    target_forwards: int


class _Capture:
    """Forward hooks collecting the requested decoder layers' outputs of every target forward."""

    def __init__(self, target: Target, layer_ids):
        self.last: dict = {}
        self.handles = [target.layers[lid].register_forward_hook(self._hook(lid)) for lid in sorted(set(layer_ids))]

    def _hook(self, lid):
        def fn(_m, _i, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            self.last[lid] = t[0].detach()
        return fn

    def close(self):
        for h in self.handles:
            h.remove()


def rollback_mode(target: Target, mode: str) -> str:
    if mode not in ROLLBACKS:
        raise PayloadError(f"rollback must be one of {', '.join(ROLLBACKS)}")
    if mode == "auto":
        return "snapshot" if target.config.has_linear_attention else "crop"
    return mode


def online_generate(target: Target, source, prompt_ids: list[int], max_new_tokens: int,
                    rollback: str = "auto") -> OnlineResult:
    import torch

    mode = rollback_mode(target, rollback)
    model, dev = target.model, target.input_device
    stop = set(target.stop_ids)
    layer_ids = list(getattr(getattr(source, "spec", None), "fc_layer_ids", []))
    B = source.block_size
    P = len(prompt_ids)
    start = time.perf_counter()
    cap = _Capture(target, layer_ids)
    feats: dict = {lid: [] for lid in layer_ids}
    rounds: list[Round] = []
    forwards = 0

    def keep_features(n: int):
        for lid in layer_ids:
            feats[lid].append(cap.last[lid][:n].to("cpu"))

    try:
        with torch.inference_mode():
            cache = new_cache(model)
            out = forward(model, torch.tensor([prompt_ids], device=dev), cache=cache, logits_to_keep=1)
            forwards += 1
            keep_features(P)
            committed = list(prompt_ids) + [int(out.logits[0, -1].argmax())]
            while committed[-1] not in stop and len(committed) - P < max_new_tokens:
                a = len(committed) - 1
                budget = max_new_tokens - (len(committed) - P)
                ctx = source.prepare({lid: torch.cat(feats[lid])[:a] for lid in layer_ids})
                ids, _ = source.draft(ctx, committed, [a], topk=1)
                drafts = ids[0, :, 0].tolist()
                block = [committed[a]] + drafts
                snapshot = copy.deepcopy(cache) if mode == "snapshot" else None
                out = forward(model, torch.tensor([block], device=dev), cache=cache)
                forwards += 1
                post = out.logits[0].argmax(-1).tolist()
                raw = 0
                while raw < B - 1 and drafts[raw] == post[raw]:
                    raw += 1
                new = drafts[:raw] + [post[raw]]
                for i, tok in enumerate(new):
                    if tok in stop:
                        new = new[:i + 1]
                        break
                new = new[:budget]
                produced = len(new)
                accepted = min(raw, produced)
                rounds.append(Round(a, accepted, produced, -1))
                committed.extend(new)
                if committed[-1] in stop or len(committed) - P >= max_new_tokens:
                    break
                kept = accepted + 1  # the anchor plus the accepted drafts have been verified and stay
                if kept == B:
                    keep_features(B)  # whole block accepted: the cache is already right
                    continue
                if mode == "snapshot":
                    cache = snapshot
                    forward(model, torch.tensor([block[:kept]], device=dev), cache=cache, logits_to_keep=1)
                    forwards += 1
                else:
                    cache.crop(a + kept)
                keep_features(kept)
    finally:
        cap.close()
    cont = committed[P:]
    total = len(committed) - 1
    rounds = [Round(r.anchor, r.accepted, r.produced, total - r.anchor) for r in rounds]
    reason = "eos" if cont and cont[-1] in stop else "max_new_tokens"
    return OnlineResult(P, cont, rounds, reason, time.perf_counter() - start, forwards)
