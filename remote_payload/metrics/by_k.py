"""Acceptance length at every draft count K, replayed offline from the same drafts (pure Python).

A block drafter (DFlash) drafts its whole block at every step whatever K the engine asks for; the engine
offers the first K drafts to the target. So the rounds at K are the chain replay with each block's drafts
truncated to K: the anchors move (a round commits at most K + 1 tokens), and the figure at K is measured,
never extrapolated from the full-block rounds. Counting is the engine's: a round's accept length is
1 + accepted drafts (the bonus token), so the mean is 1 + Σ marginal rates exactly.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .chain import Round, chain_rounds

DEFINITION = ("accept length at K: the chain replay with every block's drafts truncated to its first K "
              "(the block is still drafted at full size); per round 1 + accepted drafts, mean over rounds")


def rounds_at_k(tokens: Sequence[int], prompt_len: int, drafts_at: Callable[[int], Sequence[int]],
                k: int) -> list[Round]:
    return chain_rounds(tokens, prompt_len, lambda a: list(drafts_at(a))[:k])


def sample_record(tokens: Sequence[int], prompt_len: int, drafts_at: Callable[[int], Sequence[int]],
                  block_size: int) -> dict[str, list[int]]:
    """{K: [rounds, accepted drafts]} for K = 1..B-1: what merging shards needs to recompute the means."""
    out = {}
    for k in range(1, block_size):
        rounds = rounds_at_k(tokens, prompt_len, drafts_at, k)
        out[str(k)] = [len(rounds), sum(r.accepted for r in rounds)]
    return out


def summarize_by_k(records: Sequence[dict | None], block_size: int) -> dict:
    """Per K: rounds, accepted drafts, mean accept length per step and per request (macro over samples)."""
    by_k = {}
    for k in range(1, block_size):
        pairs = [r[str(k)] for r in records if isinstance(r, dict) and isinstance(r.get(str(k)), list)]
        n = sum(p[0] for p in pairs)
        acc = sum(p[1] for p in pairs)
        per_request = [1 + p[1] / p[0] for p in pairs if p[0]]
        by_k[str(k)] = {"rounds": n, "drafts_accepted": acc,
                        "mean_accept_length": round(1 + acc / n, 6) if n else None,
                        "mean_accept_length_per_request":
                            round(sum(per_request) / len(per_request), 6) if per_request else None}
    return {"definition": DEFINITION, "by_k": by_k}
