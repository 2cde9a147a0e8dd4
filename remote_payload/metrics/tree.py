"""Tree acceptance (docs/metrics.md), offline, from the same draft pass as the chain τ. Pure stdlib.

The offline eval drafts at *every* continuation position and keeps, per anchor and per draft depth, the
drafter's top-k token ids and log-probs (``offline.SampleDrafts.topk_ids / topk_logprobs``; ``.tolist()``
gives the nested lists ``[A][B-1][k]`` read here). Both tree figures replay rounds over the target's own
continuation exactly like the chain (``chain.chain_rounds``): a round at anchor a accepts some drafts,
τ_round = accepted + 1 (capped by the tokens left), and the next round is anchored at a + τ_round. No
target forward is needed: the target's "next token" at every tree node on the path is the reference
continuation itself, and nodes off that path are never accepted.

Two figures, two definitions (printed next to the numbers, see ``DEFINITIONS``):

- **top-k depth acceptance** ("DDTree-k", headline k = 8): accepted = number of leading depths j whose
  target token is among the drafter's top-k at depth j. This is a full width-k tree (k^(B-1) nodes), the
  upper bound of any tree whose nodes at depth j come from the top-k at depth j.
- **budgeted DDTree** (liranringel/ddtree): from the top-K candidates per depth, best-first search over
  rank tuples keeps the ``budget`` most probable prefixes (score = sum over the path of the per-depth
  log-probs of the chosen ranks; ties go to the lexicographically smaller rank tuple, so a parent always
  precedes its children and rank r its sibling r+1: the tree is prefix-closed). The walk follows the
  target's tokens from the root; accepted = nodes matched. τ_round ≤ budget + 1.

When chain τ ≤ budgeted τ ≤ top-k τ is guaranteed (tests/payload/metrics/test_tree_metrics.py checks each case):

- Per round at the same anchor: chain ≤ top-k always (rank 0 is the chain's draft); budgeted ≤ top-k
  when K ≤ k (every tree node at depth j is a top-K ⊆ top-k candidate); chain ≤ budgeted when the tree
  holds the chain's drafts as deep as the chain accepts, which ``guarantees_chain`` ensures (budget ≥ B−1
  and no runner-up outscoring the rest of the chain). With budget < B−1, or a flat runner-up, the
  budgeted tree can accept less than the chain.
- Per sample (and so τ macro and micro): the replays visit different anchors, so per-round dominance is
  not enough. It suffices that, in addition, one of the two walks has a reach a + τ_round(a) that never
  decreases as a grows (then the dominating walk is never behind, and needs no more rounds for the same
  tokens). That holds e.g. when whether a draft is right depends only on the position it predicts; a real
  drafter approximately but not exactly behaves so, and a counterexample is in the tests.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from remote_payload.errors import PayloadError
from remote_payload.metrics.chain import Round, summarize
from remote_payload.metrics.sample_rounds import entry_from_rounds

DEFAULT_K = 8  # headline "DDTree-8" = top-8 depth acceptance (the team's figures)
DEFAULT_BUDGET = 16  # >= B-1 for B = 16, so the budgeted tree can hold the whole greedy chain

DEFINITIONS = {
    "topk": ("top-k depth acceptance (DDTree-k, a full width-k tree): per round, accepted = number of leading "
             "draft depths whose target token is among the drafter's top-k tokens at that depth (capped by the "
             "tokens left); τ_round = accepted + 1; the next round starts at anchor + τ_round; τ macro/micro as "
             "for the chain. Offline over the target's own continuation, from the chain's draft pass."),
    "budgeted": ("budgeted DDTree (liranringel/ddtree): per round, a best-first search over rank tuples of the "
                 "top-K candidates per depth keeps the `budget` most probable prefixes (score = sum of the "
                 "per-depth log-probs along the path; ties to the smaller rank tuple; prefix-closed); the "
                 "target's continuation walks the tree from the root (move to the child holding the target's "
                 "next token, else stop); τ_round = 1 + matched nodes (<= budget + 1); the next round starts at "
                 "anchor + τ_round. Exact DDTree when K >= budget (ranks >= budget never enter a tree of "
                 "`budget` nodes); with K < budget the search is limited to the K stored candidates."),
}


# ----------------------------------------------------------------------------------------- one round


def topk_depth_accepted(depth_ids: Sequence[Sequence[int]], truth: Sequence[int], k: int) -> int:
    """Leading depths j where truth[j] is among depth_ids[j][:k] (len(truth) caps the walk)."""
    n = 0
    for cands, t in zip(depth_ids, truth, strict=False):
        if t not in cands[:k]:
            break
        n += 1
    return n


@dataclass
class DraftTree:
    """A prefix-closed draft tree. Node 0 is the root (the anchor token); nodes 1.. in best-first order."""
    token: list[int] = field(default_factory=lambda: [-1])
    parent: list[int] = field(default_factory=lambda: [-1])
    depth: list[int] = field(default_factory=lambda: [0])
    ranks: list[tuple] = field(default_factory=lambda: [()])
    score: list[float] = field(default_factory=lambda: [0.0])
    children: list[dict] = field(default_factory=lambda: [{}])  # token id -> child node

    def __len__(self) -> int:
        return len(self.token) - 1  # non-root nodes

    def add(self, parent: int, token: int, ranks: tuple, score: float) -> int:
        node = len(self.token)
        self.token.append(token)
        self.parent.append(parent)
        self.depth.append(self.depth[parent] + 1)
        self.ranks.append(ranks)
        self.score.append(score)
        self.children.append({})
        # Top-k ids of one depth are distinct for a real drafter; should one repeat, the better-ranked node
        # (added first) keeps the token, so the greedy chain stays reachable.
        self.children[parent].setdefault(token, node)
        return node

    def walk(self, truth: Sequence[int]) -> int:
        """Nodes matched by following ``truth`` from the root (the target's tokens after the anchor)."""
        node, matched = 0, 0
        for t in truth:
            nxt = self.children[node].get(t)
            if nxt is None:
                break
            node, matched = nxt, matched + 1
        return matched

    def chain_depth(self) -> int:
        """Depth of the all-rank-0 path held by the tree (the greedy chain's drafts it contains)."""
        node, d = 0, 0
        while True:
            nxt = next((c for c in self.children[node].values() if self.ranks[c][-1] == 0), None)
            if nxt is None:
                return d
            node, d = nxt, d + 1


def build_budgeted_tree(depth_ids: Sequence[Sequence[int]], depth_logprobs: Sequence[Sequence[float]],
                        budget: int, K: int) -> DraftTree:
    """Best-first DDTree over rank tuples (see module doc).

    The heap holds candidate rank tuples keyed by (−score, ranks). Popping a tuple adds its node and pushes
    its next sibling (last rank + 1) and its first child (rank 0 at the next depth). With per-depth
    log-probs sorted descending and <= 0 (log-softmax top-k), both successors rank after the popped tuple,
    so the ``budget`` popped tuples are exactly the ``budget`` best by that key among all rank tuples.
    Scores are left-to-right sums along the path (parent score + own log-prob), which keeps them
    bit-identical to a brute-force sum over the path.
    """
    tree = DraftTree()
    D = len(depth_ids)
    if budget <= 0 or D == 0 or K <= 0:
        return tree
    heap: list[tuple[float, tuple[int, ...], int]] = [(-depth_logprobs[0][0], (0,), 0)]  # (−score, ranks, parent node)
    while heap and len(tree) < budget:
        neg, ranks, parent = heapq.heappop(heap)
        score, d, r = -neg, len(ranks) - 1, ranks[-1]
        node = tree.add(parent, depth_ids[d][r], ranks, score)
        if r + 1 < K:
            heapq.heappush(heap, (-(tree.score[parent] + depth_logprobs[d][r + 1]), ranks[:-1] + (r + 1,), parent))
        if d + 1 < D:
            heapq.heappush(heap, (-(score + depth_logprobs[d + 1][0]), ranks + (0,), node))
    return tree


def guarantees_chain(depth_logprobs: Sequence[Sequence[float]], budget: int, K: int) -> bool:
    """A sufficient condition for the budgeted tree to hold the whole greedy chain (all B−1 depths).

    True when budget >= B−1 and either K = 1 (the tree is the chain) or, at every depth j, the runner-up
    is no more probable than the rest of the chain from j on: lp[j][1] <= Σ_{i>=j} lp[i][0]. Then no
    off-chain rank tuple (whose best is a chain prefix plus one rank-1 step) outscores the full chain, every
    chain prefix precedes it (ties go to the chain: its rank tuple is lexicographically smaller or a
    prefix), and the first B−1 pops are the chain. With the whole chain in the tree, the walk matches at
    least what the chain accepts, in every round.
    """
    D = len(depth_logprobs)
    if budget < D:
        return False
    if K <= 1:
        return True
    tail = 0.0
    for j in range(D - 1, -1, -1):
        tail += depth_logprobs[j][0]
        if depth_logprobs[j][1] > tail:
            return False
    return True


# ----------------------------------------------------------------------------------------- replay


def replay(tokens: Sequence[int], prompt_len: int, accepted_at: Callable[[int, Sequence[int]], int]) -> list[Round]:
    """Rounds over a fixed continuation; accepted_at(anchor, truth) with truth = tokens after the anchor."""
    rounds: list[Round] = []
    a, last = prompt_len, len(tokens) - 1
    while a < last:
        remaining = last - a
        acc = accepted_at(a, tokens[a + 1:a + 1 + remaining])
        produced = min(acc + 1, remaining)
        rounds.append(Round(a, acc, produced, remaining))
        a += produced
    return rounds


@dataclass
class TreeRounds:
    """Tree replays of one sample (both kinds) and the parameters that produced them."""
    topk: list[Round]
    budgeted: list[Round]
    k: int
    budget: int
    K: int

    def entry(self) -> dict:
        """The per-sample record for samples.jsonl: ``line["drafters"][name]["tree"]``."""
        return {"topk": {"k": self.k, **entry_from_rounds(self.topk)},
                "budgeted": {"budget": self.budget, "K": self.K, **entry_from_rounds(self.budgeted)}}


def _raw(drafts: Any, name: str):
    return drafts[name] if isinstance(drafts, dict) else getattr(drafts, name)


def _field(drafts: Any, name: str):
    value = _raw(drafts, name)
    return value.tolist() if hasattr(value, "tolist") else value


def _is_torch_tensor(value) -> bool:
    return type(value).__module__.split(".")[0] == "torch" and hasattr(value, "shape") and hasattr(value, "isnan")


def _resolve_params(width: int | None, k: int, budget: int, K: int | None) -> int:
    if k < 1 or budget < 0:
        raise PayloadError(f"tree metrics: need k >= 1 and budget >= 0 (got k={k}, budget={budget})")
    if K is None:
        K = min(budget, width) if width is not None else budget
    if K < 1:
        raise PayloadError(f"tree metrics: need K >= 1 (got {K})")
    if width is not None and (k > width or K > width):
        raise PayloadError(f"tree metrics: the draft pass kept the top-{width} per depth, but k={k}, K={K} need "
                           f"more; rerun with --topk {max(k, K)} or lower k/K")
    return K


def _check_anchors(anchors: list, n_ids: int, n_lps: int, prompt_len: int, tokens: list) -> None:
    if n_ids != len(anchors) or n_lps != len(anchors):
        raise PayloadError(f"tree metrics: {len(anchors)} anchors but top-k ids for {n_ids} and log-probs for "
                           f"{n_lps}")
    if anchors != list(range(prompt_len, len(tokens) - 1)):
        raise PayloadError("tree metrics need drafts at every continuation position "
                           f"({prompt_len}..{len(tokens) - 2}); got anchors {anchors[:3]}…")


def sample_tree_rounds(drafts: Any, *, k: int = DEFAULT_K, budget: int = DEFAULT_BUDGET,
                       K: int | None = None) -> TreeRounds:
    """Top-k depth and budgeted-DDTree replays of one sample from its draft pass.

    ``drafts``: an ``offline.SampleDrafts`` or a dict with ``tokens`` (prompt + continuation ids),
    ``prompt_len``, ``anchors`` (prompt_len..len(tokens)−2) and per anchor the per-depth top-k
    ``topk_ids`` / ``topk_logprobs`` (``[A][B−1][width]``, best first; objects with .tolist() are read
    through it). ``K`` defaults to min(budget, width). Needs k <= width and K <= width.

    torch tensors (what the eval passes) take a faster path with the same result: top-k acceptance is
    computed for every anchor at once, and only the anchors the budgeted replay visits are converted to
    lists. Without tensors this module needs no torch (the controller imports it).
    """
    tokens = list(_field(drafts, "tokens"))
    prompt_len = int(_field(drafts, "prompt_len"))
    anchors = list(_field(drafts, "anchors"))
    ids_raw, lps_raw = _raw(drafts, "topk_ids"), _raw(drafts, "topk_logprobs")
    if _is_torch_tensor(ids_raw) and _is_torch_tensor(lps_raw):
        return _tensor_tree_rounds(tokens, prompt_len, anchors, ids_raw, lps_raw, k, budget, K)
    ids, lps = _field(drafts, "topk_ids"), _field(drafts, "topk_logprobs")
    _check_anchors(anchors, len(ids), len(lps), prompt_len, tokens)
    width = len(ids[0][0]) if anchors and ids[0] else None
    K = _resolve_params(width, k, budget, K)
    row = {a: i for i, a in enumerate(anchors)}
    for i in range(len(anchors)):
        if any(len(c) != width for c in ids[i]) or len(ids[i]) != len(ids[0]) or \
                [len(c) for c in lps[i]] != [len(c) for c in ids[i]]:
            raise PayloadError(f"tree metrics: anchor {anchors[i]} has top-k lists of another shape than anchor "
                               f"{anchors[0]} ({len(ids[0])} depths × {width})")
        if any(v != v for c in lps[i] for v in c):  # NaN
            raise PayloadError(f"tree metrics: NaN log-probs in the drafts at anchor {anchors[i]}")

    def topk_at(a, truth):
        return topk_depth_accepted(ids[row[a]], truth, k)

    def budgeted_at(a, truth):
        i = row[a]
        return build_budgeted_tree(ids[i], lps[i], budget, K).walk(truth)

    return TreeRounds(replay(tokens, prompt_len, topk_at), replay(tokens, prompt_len, budgeted_at), k, budget, K)


def _tensor_tree_rounds(tokens, prompt_len, anchors, ids, lps, k, budget, K) -> TreeRounds:
    # The fields of a SampleDrafts plus the three tree settings, unpacked by sample_tree_rounds.
    import torch

    if ids.dim() != 3 or tuple(lps.shape) != tuple(ids.shape):
        raise PayloadError(f"tree metrics: top-k ids {list(ids.shape)} and log-probs {list(lps.shape)} must both be "
                           "[anchors, depths, width]")
    _check_anchors(anchors, int(ids.shape[0]), int(lps.shape[0]), prompt_len, tokens)
    width = int(ids.shape[2]) if anchors and ids.shape[1] else None
    K = _resolve_params(width, k, budget, K)
    nan_rows = torch.isnan(lps).flatten(1).any(1).nonzero()
    if nan_rows.numel():
        raise PayloadError(f"tree metrics: NaN log-probs in the drafts at anchor {anchors[int(nan_rows[0])]}")
    row = {a: i for i, a in enumerate(anchors)}
    if not anchors:
        return TreeRounds([], [], k, budget, K)
    ids_cpu, lps_cpu = ids.detach().cpu(), lps.detach().cpu()
    # top-k depth acceptance at every anchor at once: leading depths whose target token is in the top-k
    D = ids_cpu.shape[1]
    pos = torch.tensor(anchors)[:, None] + torch.arange(1, D + 1)[None]
    valid = pos < len(tokens)
    truth = torch.where(valid, torch.tensor(tokens)[pos.clamp(max=len(tokens) - 1)], torch.full_like(pos, -1))
    hit = (ids_cpu[:, :, :k] == truth[..., None]).any(-1) & valid
    topk_acc = hit.long().cumprod(1).sum(1).tolist()

    def topk_at(a, truth_):
        return topk_acc[row[a]]

    def budgeted_at(a, truth_):
        i = row[a]
        return build_budgeted_tree(ids_cpu[i, :, :K].tolist(), lps_cpu[i, :, :K].tolist(), budget, K).walk(truth_)

    return TreeRounds(replay(tokens, prompt_len, topk_at), replay(tokens, prompt_len, budgeted_at), k, budget, K)


# ----------------------------------------------------------------------------------------- summary


def tree_summary(topk_rounds: Sequence[Sequence[Round]], budgeted_rounds: Sequence[Sequence[Round]], *,
                 block_size: int, k: int, budget: int, K: int) -> dict:
    """``metrics["tree"]`` of one drafter: both figures summarised like the chain (chain.summarize)."""
    out = {}
    for kind, rounds, params in (("topk", topk_rounds, {"k": k}),
                                 ("budgeted", budgeted_rounds, {"budget": budget, "K": K, "exact": K >= budget})):
        s = summarize(rounds, block_size)
        out[kind] = {**params, "tau_macro": s["tau_macro"], "tau_micro": s["tau_micro"],
                     "mean_accepted": s["mean_accepted"], "rounds": s["rounds"],
                     "per_position": s["per_position"], "tau_histogram": s["tau_histogram"],
                     "definition": DEFINITIONS[kind]}
    return out
