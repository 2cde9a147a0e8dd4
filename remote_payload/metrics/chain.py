"""Acceptance-length metrics (docs/metrics.md). Pure Python: no torch, easy to test by hand.

A round drafts B-1 tokens from an anchor (the last committed token). Against the target's own
continuation, ``accepted`` = leading drafts equal to the continuation (capped at the tokens left after
the anchor), and ``produced`` = tokens committed by the round = accepted + 1 (the target's bonus token),
except at the very end where only the remaining tokens can be produced. ``produced`` is τ_round.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

DEFINITIONS = {
    "tau_round": "tokens committed by one draft+verify round: accepted drafts + 1 bonus token (capped by the "
                 "tokens left at the end of the continuation)",
    "tau_macro": "mean over samples of each sample's mean τ_round (samples without rounds excluded), in the "
                 "committed convention (= zlab, z-lab's loop since August 2026; not its April loop: see "
                 "conventions.zlab_2604_rounds)",
    "tau_micro": "Σ τ_round / number of rounds over all samples (tokens per verify step)",
    "p_k": "P(round accepts >= k drafts), over rounds where at least k tokens remained to verify",
    "tau_histogram": "number of rounds with each τ_round value 1..B",
    "mean_accepted": "Σ accepted drafts / rounds (speculators' 'eal'-style, excludes the bonus token)",
}


@dataclass(frozen=True)
class Round:
    anchor: int  # absolute position of the anchor token (block slot 0)
    accepted: int  # drafts accepted
    produced: int  # τ_round
    remaining: int  # continuation tokens after the anchor when the round started

    def as_dict(self) -> dict:
        return asdict(self)


def accepted_prefix(drafts: Sequence[int], truth: Sequence[int]) -> int:
    n = 0
    for d, t in zip(drafts, truth, strict=False):
        if d != t:
            break
        n += 1
    return n


def chain_rounds(tokens: Sequence[int], prompt_len: int, drafts_at: Callable[[int], Sequence[int]]) -> list[Round]:
    """Replay greedy chain speculation over a fixed continuation (teacher forcing).

    tokens = prompt + continuation; the first continuation token (position prompt_len) comes from the
    prefill and is the first anchor. drafts_at(a) gives the B-1 greedy drafts of the block anchored at a.
    """
    rounds: list[Round] = []
    a, last = prompt_len, len(tokens) - 1
    while a < last:
        remaining = last - a
        acc = accepted_prefix(drafts_at(a), tokens[a + 1:a + 1 + remaining])
        produced = min(acc + 1, remaining)
        rounds.append(Round(a, acc, produced, remaining))
        a += produced
    return rounds


def sample_tau(rounds: Sequence[Round]) -> float | None:
    return sum(r.produced for r in rounds) / len(rounds) if rounds else None


def summarize(per_sample: Sequence[Sequence[Round]], block_size: int) -> dict:
    B = block_size
    with_rounds = [rs for rs in per_sample if rs]
    taus = [t for t in map(sample_tau, with_rounds) if t is not None]  # every one: these samples have rounds
    all_rounds = [r for rs in per_sample for r in rs]
    n = len(all_rounds)
    per_position = []
    for k in range(1, B):
        eligible = sum(1 for r in all_rounds if min(B - 1, r.remaining) >= k)
        hits = sum(1 for r in all_rounds if r.accepted >= k)
        per_position.append({"k": k, "accepted_ge_k": hits, "eligible": eligible,
                             "p": hits / eligible if eligible else None})
    hist = {str(t): 0 for t in range(1, B + 1)}
    for r in all_rounds:
        hist[str(r.produced)] += 1
    produced = sum(r.produced for r in all_rounds)
    accepted = sum(r.accepted for r in all_rounds)
    return {
        "tau_macro": (sum(taus) / len(taus)) if taus else None,
        "tau_micro": produced / n if n else None,
        "mean_accepted": accepted / n if n else None,
        "rounds": n,
        "samples": len(per_sample),
        "samples_with_rounds": len(with_rounds),
        "tokens_produced": produced,
        "drafts_accepted": accepted,
        "drafts_proposed": n * (B - 1),
        "per_position": per_position,
        "tau_histogram": hist,
        "block_size": B,
        "definitions": DEFINITIONS,
    }
