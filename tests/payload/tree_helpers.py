"""Pure test helpers: synthetic per-anchor top-k drafts in the tree-metrics input format, and sample lines.

A draft pass is described by where the target's token ranks among the drafter's candidates:
``rank_of(anchor, depth)`` (depth 1..B-1) gives the rank of the target's token at that depth, or None when
it is not among them. The other candidates are filler ids that never occur in the continuation.
"""

from __future__ import annotations

from typing import Callable

from remote_payload.metrics.chain import chain_rounds
from remote_payload.metrics.sample_rounds import entry_from_rounds
from remote_payload.metrics.tree import sample_tree_rounds

FILLER = 1_000_000  # candidate ids >= FILLER never occur in a continuation


def default_logprobs(width: int) -> list[float]:
    return [-0.25 - 0.75 * r for r in range(width)]  # -0.25, -1.0, -1.75, … (exact binary fractions)


def synthetic_drafts(tokens: list[int], prompt_len: int, block_size: int, width: int,
                     rank_of: Callable[[int, int], int | None],
                     logprobs_of: Callable[[int, int], list[float]] | None = None) -> dict:
    anchors = list(range(prompt_len, len(tokens) - 1))
    ids, lps = [], []
    for a in anchors:
        row_ids, row_lps = [], []
        for d in range(1, block_size):
            pos = a + d
            truth = tokens[pos] if pos < len(tokens) else -1  # past the end: nothing to match
            cands = [FILLER + 1000 * d + r for r in range(width)]
            r = rank_of(a, d)
            if r is not None and truth >= 0:
                cands[r] = truth
            row_ids.append(cands)
            row_lps.append(list(logprobs_of(a, d)) if logprobs_of else default_logprobs(width))
        ids.append(row_ids)
        lps.append(row_lps)
    return {"tokens": list(tokens), "prompt_len": prompt_len, "anchors": anchors, "topk_ids": ids,
            "topk_logprobs": lps}


def chain_of(drafts: dict):
    top1 = {a: [c[0] for c in row] for a, row in zip(drafts["anchors"], drafts["topk_ids"], strict=False)}
    return chain_rounds(drafts["tokens"], drafts["prompt_len"], top1.__getitem__)


def sample_line(index: int, drafts_by_name: dict, *, k: int, budget: int, K: int | None = None,
                sample_id: str | None = None) -> tuple[dict, dict]:
    """A samples.jsonl line (as the eval writes it, with tree records) and {name: (chain, TreeRounds)}."""
    any_drafts = next(iter(drafts_by_name.values()))
    pt = any_drafts["prompt_len"]
    line = {"index": index, "id": sample_id or f"p{index}", "category": None, "prompt_tokens": pt,
            "continuation_tokens": len(any_drafts["tokens"]) - pt, "drafters": {}}
    computed = {}
    for name, drafts in drafts_by_name.items():
        chain = chain_of(drafts)
        tr = sample_tree_rounds(drafts, k=k, budget=budget, K=K)
        line["drafters"][name] = {**entry_from_rounds(chain), "tree": tr.entry()}
        computed[name] = (chain, tr)
    return line, computed
