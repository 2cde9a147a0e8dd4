"""Counting conventions for τ at the end of an output, each named by whose rule it is (docs/metrics.md):
committed, zlab-2604, vllm, and the name zlab, an alias of committed.

They differ only in a sample's last round(s). The drafter's drafts and the target's tokens are the same;
what each convention counts is:

- ``committed`` (dfo's original figure, ``metrics.chain``): rounds until every kept token is committed; the
  last round is capped at the tokens actually kept (drafts past the end token or past max_new are not
  counted, τ_round <= tokens left).
- ``zlab`` = ``committed``: z-lab's ``dflash_generate`` loop since August 2026 records what a round produced,
  cut after the end token and at max_new, which is exactly the committed count. It is an alias (``ALIASES``):
  results carry ``{"alias_of": "committed"}`` under that name, never a second computation.
- ``zlab-2604`` (z-lab's ``dflash_generate`` benchmark loop as of April 2026, the name ``zlab`` had until
  results schema ``dfo.results/2``; ``migrate.py`` renames it in older files): ``while anchor < prompt +
  max_new``: one round, τ_round = accepted + 1 with every accepted draft counted, including drafts past the
  end token; stop after the round that committed an end token. At a max-tokens stop, when the rounds land
  exactly on the last kept token, it therefore runs one more round than the kept tokens need (anchored there),
  counted in full.
  Needs the target's greedy tokens a block past the stop.
- ``vllm`` (vLLM's spec-decode counters): the same rounds as ``committed`` (the request finishes once the
  kept tokens are committed) but each round's accepted drafts are counted in full, past the end token or
  max_tokens too; τ = 1 + accepted / drafts, p_k = (rounds accepting >= k) / rounds.

Each convention gives ``tau_macro`` (mean over samples of the sample mean; samples without rounds
excluded), ``tau_micro`` (Σ τ_round / rounds) and ``per_position``. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from remote_payload.errors import PayloadError

from .chain import Round, accepted_prefix, chain_rounds

NAMES = ("committed", "zlab-2604", "vllm")  # the conventions computed, in the order tables show them
ALIASES = {"zlab": "committed"}  # another rule's name for a computed convention: the same figures, not recomputed
DEFINITIONS = {
    "committed": "rounds until the kept tokens are committed; the last round capped at the tokens kept",
    "zlab": "zlab = committed, z-lab's loop since August 2026 (a round records what it produced, cut after the "
            "end token and at max_new)",
    "zlab-2604": "z-lab's dflash_generate loop of April 2026 (named zlab before results schema dfo.results/2): "
                 "rounds while anchor < prompt+max_new, stop after a round that "
                 "committed an end token; every accepted draft counts, past the end token too",
    "vllm": "vLLM's counters: the committed rounds, each counted in full (accepted drafts past the end "
            "token or max_tokens included); tau = 1 + accepted/drafts",
}


@dataclass(frozen=True)
class SampleEnd:
    """What a sample's last rounds need beyond the kept continuation.

    ``tokens``: prompt + kept continuation + the target's greedy tokens past the stop (>= B-1 of them for
    exact figures; fewer make the last round's count a lower bound). ``kept``: length of prompt + kept
    continuation. ``drafts_at(a)``: the B-1 greedy drafts of the block anchored at absolute position a, for
    anchors prompt_len .. kept-1.
    """
    tokens: Sequence[int]
    prompt_len: int
    kept: int
    max_new: int
    stop_ids: frozenset
    drafts_at: Callable[[int], Sequence[int]]


def committed_rounds(s: SampleEnd) -> list[Round]:
    return chain_rounds(list(s.tokens[:s.kept]), s.prompt_len, s.drafts_at)


def _full_round(s: SampleEnd, a: int, B: int) -> Round:
    truth = s.tokens[a + 1:a + B]
    acc = accepted_prefix(s.drafts_at(a), truth)
    return Round(a, acc, acc + 1, len(truth))


def anchors_at_last_token(continuation: int, stop_reason: str | None) -> bool:
    """Whether the zlab-2604 rounds may anchor at the last kept token, so the draft pass must draft from it too:
    at a max-tokens stop (rounds that land exactly on it run one more), and for an answer of one token, the stop
    token alone (the loop looks for the stop only after a round, so its one round is anchored there). An empty
    answer is a sample like any other: no committed or vllm round, one zlab-2604 round."""
    return stop_reason == "max_new_tokens" or continuation == 1


def vllm_rounds(s: SampleEnd, B: int) -> list[Round]:
    return [_full_round(s, r.anchor, B) for r in committed_rounds(s)]


def zlab_2604_rounds(s: SampleEnd, B: int) -> list[Round]:
    rounds: list[Round] = []
    a, limit = s.prompt_len, s.prompt_len + s.max_new
    eos = next((i for i in range(s.prompt_len, len(s.tokens)) if s.tokens[i] in s.stop_ids), None)
    while a < limit and a < s.kept:  # anchors beyond the kept tokens never happen: the stop comes first
        r = _full_round(s, a, B)
        rounds.append(r)
        a += r.produced
        if eos is not None and eos <= a:
            break
    return rounds


def _summary(per_sample: Sequence[Sequence[Round]], B: int, capped: bool) -> dict:
    flat = [r for rs in per_sample for r in rs]
    n = len(flat)
    means = [sum(r.produced for r in rs) / len(rs) for rs in per_sample if rs]
    per_position = []
    for k in range(1, B):
        eligible = sum(1 for r in flat if not capped or min(B - 1, r.remaining) >= k)
        hits = sum(1 for r in flat if r.accepted >= k)
        per_position.append({"k": k, "accepted_ge_k": hits, "eligible": eligible,
                             "p": hits / eligible if eligible else None})
    return {"tau_macro": sum(means) / len(means) if means else None,
            "tau_micro": sum(r.produced for r in flat) / n if n else None,
            "rounds": n, "drafts_accepted": sum(r.accepted for r in flat), "per_position": per_position}


def conventions(samples: Sequence[SampleEnd], block_size: int) -> dict:
    """``metrics.conventions``: {name: {tau_macro, tau_micro, rounds, drafts_accepted, per_position}}."""
    B = block_size
    return summaries([committed_rounds(s) for s in samples], [zlab_2604_rounds(s, B) for s in samples],
                     [vllm_rounds(s, B) for s in samples], B)


def summaries(committed: Sequence[Sequence[Round]], zlab_2604: Sequence[Sequence[Round]] | None,
              vllm: Sequence[Sequence[Round]] | None, block_size: int, exact: bool = True,
              unavailable: str | None = None) -> dict:
    """The ``metrics.conventions`` block from each convention's rounds per sample (the eval and the shard merge
    both build it here, so a merged result is the same function of the same rounds).

    ``zlab_2604``/``vllm`` None (with ``unavailable`` saying why): the target's tokens past the stop were not
    to be had, so those two are ``{"available": false, "reason": ...}``. ``exact`` False: some sample had
    fewer than B-1 tokens past the stop, so its last round's count is a lower bound. Each alias is
    ``{"alias_of": NAME, "definition": ...}``: its figures are NAME's (``resolve``).
    """
    B = block_size
    out = {"committed": {**_summary(committed, B, capped=True), "exact": True}}
    for name, rounds in (("zlab-2604", zlab_2604), ("vllm", vllm)):
        if rounds is None:
            out[name] = {"available": False, "reason": unavailable or "the target's tokens past the stop are unknown"}
        else:
            out[name] = {**_summary(rounds, B, capped=False), "exact": exact}
    for name in NAMES:
        out[name]["definition"] = DEFINITIONS[name]
    for alias, name in ALIASES.items():
        out[alias] = {"alias_of": name, "definition": DEFINITIONS[alias]}
    return out


def resolve(block: dict, name: str) -> dict | None:
    """Convention NAME's figures in a ``metrics.conventions`` block, an alias read as the convention it names."""
    entry = block.get(name) if isinstance(block, dict) else None
    if isinstance(entry, dict) and isinstance(entry.get("alias_of"), str):
        entry = block.get(entry["alias_of"])
    return entry if isinstance(entry, dict) else None


# --------------------------------------------------------------------- per-sample records (samples.jsonl)


def record(rounds: Sequence[Round]) -> dict:
    """One convention's rounds of one sample as stored in samples.jsonl (``committed`` is the chain record;
    an alias has no record of its own)."""
    return {"accepted": [r.accepted for r in rounds], "produced": [r.produced for r in rounds]}


def rounds_from_record(entry, block_size: int, where: str) -> list[Round]:
    """A stored zlab-2604/vllm record back into Rounds; every round counted in full (produced = accepted + 1)."""
    try:
        accepted, produced = list(entry["accepted"]), list(entry["produced"])
    except (KeyError, TypeError):
        raise PayloadError(f"{where}: needs the lists 'accepted' and 'produced'") from None
    if len(accepted) != len(produced):
        raise PayloadError(f"{where}: 'accepted' and 'produced' have different lengths "
                           f"({len(accepted)}, {len(produced)})")
    for i, (acc, prod) in enumerate(zip(accepted, produced, strict=True)):
        if not (isinstance(acc, int) and isinstance(prod, int)) or isinstance(acc, bool) \
                or not 0 <= acc < block_size or prod != acc + 1:
            raise PayloadError(f"{where}: round {i} (accepted {acc!r}, produced {prod!r}) is not a full round of "
                               f"block size {block_size} (0 <= accepted < {block_size}, produced = accepted + 1)")
    # anchors and remaining are not stored: the summaries of these conventions do not use them
    return [Round(-1, acc, prod, -1) for acc, prod in zip(accepted, produced, strict=True)]
