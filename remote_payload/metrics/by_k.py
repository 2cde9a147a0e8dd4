"""Acceptance length at every draft count K, as an engine set to K drafts and counts (pure Python).

What an engine does at K < B - 1 with a block drafter. vLLM's DFlash proposer (``vllm/v1/spec_decode/dflash.py``,
0.31 and 0.32: ``num_query_per_req = 1 + num_speculative_tokens``) feeds the drafter a block of K + 1 rows, the
bonus token (the last committed one, at the anchor's position) and K mask tokens at the positions after it; it
does not draft the trained block and keep the first K. SGLang's DFlash workers do the same with a block of
``speculative_num_draft_tokens`` rows. The drafter's attention is bidirectional inside the block (and DFlash2's
convolutions run over its rows), so the drafts of the shorter block are not the first K of the full block's:
the figure at K needs the drafter run at K + 1 rows (``eval/offline.draft_sample(replan=True)``; the full block
at K = B - 1), its rounds replayed over the same references (teacher forcing, as the full block's are).

How it is counted. ``accept_length_by_k`` is what the profile's schema means and what the engines' counters
report: per step 1 + accepted drafts, drafts accepted past the stop token (or max_tokens) included, over the
rounds that commit the kept tokens: dfo's ``vllm`` convention (``conventions.vllm_rounds``, which reads the
target's tokens past the stop). Beside it, ``committed``: the same rounds counted until the kept tokens are
committed (the last round capped at the tokens kept: ``metrics.chain``). Without enough tokens past the stop
the engine count of a last round is a lower bound (``exact`` false).

Profiles written before this (dfo's ``truncated`` method) replayed the full block's drafts cut to K and counted
1 + accepted drafts capped at the kept tokens, a figure no engine reports; ``METHOD`` names this one.

The CI of each K's per-step mean is the ratio estimator's (Σ accepted / Σ rounds over samples, a sample's rounds
kept together): 1 + R ± 1.96·sqrt(m/(m-1)·Σ(a_i - R·n_i)²)/Σn_i over the m samples with rounds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

from .conventions import SampleEnd, committed_rounds, vllm_rounds

METHOD = "replanned"  # the block re-planned at K + 1 rows, counted as the engine counts
OLD_METHOD = "truncated"  # dfo before METHOD: the full block's drafts cut to K, accepted capped at the kept tokens
METHODS = {
    METHOD: "per K, the drafter run with a block of K + 1 rows (the bonus token and K masks, as vLLM's and SGLang's "
            "DFlash proposers plan it), its rounds replayed over the references; per step 1 + accepted drafts, "
            "drafts accepted past the stop token included (the engines' counters; dfo's vllm convention)",
    OLD_METHOD: "the full block's drafts truncated to K (no engine drafts so); per step 1 + accepted drafts capped "
                "at the kept tokens (dfo's profiles before the replanned method)",
}
DEFINITION = ("accept length at K: " + METHODS[METHOD] + "; mean over steps, with its 95% CI over samples "
              "(ratio estimator)")
COMMITTED_DEFINITION = ("the same rounds counted until the kept tokens are committed (the last round capped at "
                        "the tokens kept: the committed convention); Σ tokens committed / steps")
Z95 = 1.959964


def sample_record(end: SampleEnd, drafts_at_k: Callable[[int], Callable[[int], Sequence[int]]],
                  block_size: int) -> dict[str, list[int]]:
    """{K: [steps, accepted drafts (engine count), tokens committed (committed count)]} for K = 1..B-1: what
    merging shards needs to recompute the means. ``end``: the sample with the target's tokens past the stop;
    ``drafts_at_k(K)``: drafts_at(anchor) of the block planned for K drafts."""
    out = {}
    for k in range(1, block_size):
        at_k = dataclasses.replace(end, drafts_at=drafts_at_k(k))
        engine = vllm_rounds(at_k, k + 1)
        committed = committed_rounds(at_k)
        out[str(k)] = [len(engine), sum(r.accepted for r in engine), sum(r.produced for r in committed)]
    return out


def _ci(pairs: Sequence[tuple[int, int]]) -> list[float] | None:
    """95% CI of 1 + Σa/Σn over samples (a sample's rounds together), None with fewer than two samples."""
    pairs = [(n, a) for n, a in pairs if n]
    m, total = len(pairs), sum(n for n, _ in pairs)
    if m < 2:
        return None
    r = sum(a for _, a in pairs) / total
    half = Z95 * math.sqrt(m / (m - 1) * sum((a - r * n) ** 2 for n, a in pairs)) / total
    return [round(1 + r - half, 6), round(1 + r + half, 6)]


def _valid(rec) -> bool:
    return isinstance(rec, list) and len(rec) == 3 and all(isinstance(x, int) and not isinstance(x, bool)
                                                           for x in rec)


def summarize_by_k(records: Sequence[dict | None], block_size: int, exact: bool = True) -> dict:
    """Per K: steps, accepted drafts, the engine-count mean per step (with its CI) and per request, and the
    committed mean; the method and what each figure is."""
    by_k = {}
    for k in range(1, block_size):
        recs = [r[str(k)] for r in records if isinstance(r, dict) and _valid(r.get(str(k)))]
        n = sum(p[0] for p in recs)
        acc = sum(p[1] for p in recs)
        produced = sum(p[2] for p in recs)
        per_request = [1 + p[1] / p[0] for p in recs if p[0]]
        by_k[str(k)] = {"rounds": n, "drafts_accepted": acc,
                        "mean_accept_length": round(1 + acc / n, 6) if n else None,
                        "ci95": _ci([(p[0], p[1]) for p in recs]),
                        "mean_accept_length_per_request":
                            round(sum(per_request) / len(per_request), 6) if per_request else None,
                        "committed": {"tokens": produced, "mean_accept_length": round(produced / n, 6) if n else None}}
    return {"method": METHOD, "definition": DEFINITION, "committed_definition": COMMITTED_DEFINITION,
            "exact": exact, "by_k": by_k}
