"""Offline (teacher-forced) evaluation: drafts for every anchor in one batched pass, then replay.

Drafting at *every* anchor of the continuation (not only those the chain replay visits) costs one
batched drafter pass per sample and makes any replay rule computable from the same drafts: the chain
τ here, and tree / top-k acceptance walks (which visit other anchors) without another drafter pass.
Per-anchor, per-depth top-k ids and log-probs are kept for that. With ``end=True`` the last token is drafted
from too (``SampleDrafts.end_drafts``, kept apart from the per-anchor tensors the tree metrics check): the
``zlab-2604`` convention's extra round at a max-tokens stop is anchored there.

With ``replan=True`` the same anchors are drafted once more per smaller block, 2 .. B-1 rows (the bonus row and
K = 1 .. B-2 mask rows, what an engine set to K drafts: ``metrics/by_k.py``), each pass batched over the anchors
like the full one: B - 2 extra passes of fewer rows, top-1 only, timed apart (``replan_seconds``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from remote_payload.metrics.chain import Round, chain_rounds

if TYPE_CHECKING:
    import torch


@dataclass
class SampleDrafts:
    """What the draft pass gives for one sample; anchors are absolute positions prompt_len..len(tokens)-2."""
    prompt_len: int
    tokens: list[int]
    anchors: list[int]
    topk_ids: torch.Tensor  # LongTensor [A, B-1, k]
    topk_logprobs: torch.Tensor  # FloatTensor [A, B-1, k]
    seconds: float = 0.0
    end_drafts: list[int] | None = None  # top-1 drafts anchored at the last token (draft_sample(end=True))
    replanned: dict[int, list[list[int]]] = field(default_factory=dict)  # K -> per anchor, K top-1 drafts
    replan_seconds: float = 0.0
    _top1: dict = field(default_factory=dict, repr=False)

    def top1(self, anchor: int) -> list[int]:
        if anchor == len(self.tokens) - 1 and self.end_drafts is not None:
            return self.end_drafts
        if not self._top1:
            rows = self.topk_ids[:, :, 0].tolist()
            self._top1.update(zip(self.anchors, rows, strict=False))
        return self._top1[anchor]

    def drafts_at_k(self, k: int):
        """drafts_at(anchor) of the block planned for K drafts: the full block's at K = B-1, else the re-planned
        block of K + 1 rows (``draft_sample(replan=True)``)."""
        if k == self.topk_ids.shape[1]:
            return self.top1
        by_anchor = dict(zip(self.anchors, self.replanned[k], strict=True))
        return by_anchor.__getitem__


def anchors_for(tokens_len: int, prompt_len: int) -> list[int]:
    return list(range(prompt_len, tokens_len - 1))


def draft_sample(source, features: dict, tokens: list[int], prompt_len: int, topk: int = 1,
                 end: bool = False, replan: bool = False) -> SampleDrafts:
    start = time.perf_counter()
    anchors = anchors_for(len(tokens), prompt_len)
    ctx = source.prepare(features)
    ids, lps = source.draft(ctx, tokens, anchors, topk=topk)
    end_drafts = None
    if end and len(tokens) > prompt_len:  # its own call: the batch of the other anchors stays as it was
        last, _ = source.draft(ctx, tokens, [len(tokens) - 1], topk=1)
        end_drafts = last[0, :, 0].tolist()
    seconds = time.perf_counter() - start
    replanned: dict[int, list[list[int]]] = {}
    if replan:
        for k in range(1, source.block_size - 1):
            replanned[k] = source.draft(ctx, tokens, anchors, topk=1, block=k + 1)[0][:, :, 0].tolist()
    return SampleDrafts(prompt_len, list(tokens), anchors, ids, lps, seconds, end_drafts, replanned,
                        time.perf_counter() - start - seconds)


def replay(drafts: SampleDrafts) -> list[Round]:
    return chain_rounds(drafts.tokens, drafts.prompt_len, drafts.top1)
