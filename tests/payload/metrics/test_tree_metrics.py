"""Tree acceptance: exact hand-computed values, brute-force cross-checks, and when chain ≤ budgeted ≤ top-k holds."""

from __future__ import annotations

import itertools
import random

import pytest
from tree_helpers import chain_of, synthetic_drafts

from remote_payload.errors import PayloadError
from remote_payload.metrics.chain import Round, summarize
from remote_payload.metrics.tree import (
    DEFINITIONS,
    build_budgeted_tree,
    guarantees_chain,
    sample_tree_rounds,
    topk_depth_accepted,
    tree_summary,
)

# ---------------------------------------------------------------------------------------------------
# The hand-built case. B = 4 (three draft depths), two candidates per depth, top-k with k = 2, budgeted
# DDTree with budget 3 and K = 2. Prompt [10, 11]; continuation 100..111 at positions 2..13; last = 13,
# so every replay produces 11 tokens. ``RANKS[a]`` = rank of the target's token at depths 1..3 of the
# block anchored at a (None: not among the two candidates); anchors not listed have the target's token
# at rank 0 everywhere. Default log-probs per depth: [-0.25, -1.0].
B, K2, BUDGET = 4, 2, 3
TOKENS = [10, 11] + list(range(100, 112))
RANKS = {2: [0, 1, 0], 4: [1, 0, 0], 5: [0, 0, 0], 6: [0, 0, 0], 9: [0, 1, None], 10: [0, 0, 0], 11: [0, 0, 0],
         12: [0, 0, 0]}
# At anchors 2 and 9 depth 2 is uncertain: log-probs [-0.5, -0.625]. Best-first with budget 3 there:
# (0): -0.25; (0,0): -0.25-0.5 = -0.75; (0,1): -0.25-0.625 = -0.875; (1): -1.0; (0,0,0): -0.75-0.25 = -1.0.
# The three best are (0), (0,0), (0,1): a root child with two children, no depth-3 node.
UNCERTAIN = {(2, 2): [-0.5, -0.625], (9, 2): [-0.5, -0.625]}


def _hand_drafts():
    return synthetic_drafts(TOKENS, 2, B, 2, lambda a, d: RANKS.get(a, [0, 0, 0])[d - 1],
                            lambda a, d: UNCERTAIN.get((a, d), [-0.25, -1.0]))


def test_hand_built_case_exact_rounds():
    drafts = _hand_drafts()
    # Chain (top-1 only): a=2 ranks [0,1,0] -> 1 accepted, τ 2 -> a=4 ranks [1,..] -> 0, τ 1 -> a=5 all rank 0
    # -> 3, τ 4 -> a=9 ranks [0,1,-] -> 1, τ 2 -> a=11: 2 tokens left, both rank 0 -> 2, τ 2 (no bonus) -> 13.
    assert chain_of(drafts) == [Round(2, 1, 2, 11), Round(4, 0, 1, 9), Round(5, 3, 4, 8), Round(9, 1, 2, 4),
                                Round(11, 2, 2, 2)]
    tr = sample_tree_rounds(drafts, k=K2, budget=BUDGET, K=K2)
    # Top-2 depth: a=2 ranks [0,1,0] all within top-2 -> 3, τ 4 -> a=6 -> 3, τ 4 -> a=10: 3 left -> 3, τ 3.
    assert tr.topk == [Round(2, 3, 4, 11), Round(6, 3, 4, 7), Round(10, 3, 3, 3)]
    # Budgeted: a=2 tree {(0),(0,0),(0,1)}; the walk takes (0) then (0,1) (target's token is rank 1 at
    # depth 2), (0,1) has no child -> 2, τ 3 -> a=5: default log-probs make the tree the chain
    # ((0,0,0) = -0.75 beats (1) = -1.0), all rank 0 -> 3, τ 4 -> a=9: same tree as a=2, ranks [0,1,-] -> 2,
    # τ 3 -> a=12: one token left -> 1, τ 1.
    assert tr.budgeted == [Round(2, 2, 3, 11), Round(5, 3, 4, 8), Round(9, 2, 3, 4), Round(12, 1, 1, 1)]
    assert (tr.k, tr.budget, tr.K) == (2, 3, 2)


def test_hand_built_case_summary():
    drafts = _hand_drafts()
    tr = sample_tree_rounds(drafts, k=K2, budget=BUDGET, K=K2)
    s = tree_summary([tr.topk], [tr.budgeted], block_size=B, k=K2, budget=BUDGET, K=K2)
    chain_tau = summarize([chain_of(drafts)], B)["tau_macro"]
    assert chain_tau == pytest.approx(11 / 5)  # 2.2
    assert s["budgeted"]["tau_macro"] == pytest.approx(11 / 4) == s["budgeted"]["tau_micro"]  # 2.75
    assert s["topk"]["tau_macro"] == pytest.approx(11 / 3) == s["topk"]["tau_micro"]  # 3.67
    assert s["topk"]["tau_histogram"] == {"1": 0, "2": 0, "3": 1, "4": 2}
    assert s["budgeted"]["tau_histogram"] == {"1": 1, "2": 0, "3": 2, "4": 1}
    # Budgeted p_k: k=1: all 4 rounds eligible, all accept >= 1. k=2: the round at 12 (1 token left) is not
    # eligible; rounds at 2, 5, 9 accept >= 2 -> 3/3. k=3: eligible 2, 5, 9; only 5 accepts 3 -> 1/3.
    assert [(p["accepted_ge_k"], p["eligible"]) for p in s["budgeted"]["per_position"]] == [(4, 4), (3, 3), (1, 3)]
    assert s["topk"]["k"] == 2 and s["budgeted"]["budget"] == 3 and s["budgeted"]["K"] == 2
    assert s["budgeted"]["exact"] is False  # K=2 < budget=3: limited to the stored candidates
    assert s["topk"]["definition"] == DEFINITIONS["topk"] and "best-first" in s["budgeted"]["definition"]


def test_budgeted_tree_shape_by_hand():
    ids = [[100, 200], [101, 201], [102, 202]]
    tree = build_budgeted_tree(ids, [[-0.25, -1.0], [-0.5, -0.625], [-0.25, -1.0]], budget=3, K=2)
    assert tree.ranks[1:] == [(0,), (0, 0), (0, 1)]
    assert tree.score[1:] == [-0.25, -0.75, -0.875]
    assert tree.token[1:] == [100, 101, 201] and tree.parent[1:] == [0, 1, 1]
    assert tree.walk([100, 201, 102]) == 2 and tree.walk([100, 101, 102]) == 2 and tree.walk([200]) == 0
    assert tree.chain_depth() == 2
    # One node more: (1) and (0,0,0) tie at -1.0; the smaller rank tuple (0,0,0) goes first.
    assert build_budgeted_tree(ids, [[-0.25, -1.0], [-0.5, -0.625], [-0.25, -1.0]], 4, 2).ranks[4] == (0, 0, 0)


def test_topk_with_k1_and_budgeted_with_K1_are_the_chain():
    drafts = _hand_drafts()
    chain = chain_of(drafts)
    tr = sample_tree_rounds(drafts, k=1, budget=B - 1, K=1)
    assert tr.topk == chain and tr.budgeted == chain


def test_budget_caps_tau_round():
    drafts = synthetic_drafts(TOKENS, 2, B, 2, lambda a, d: 0)  # a perfect drafter
    for budget in (0, 1, 2):
        tr = sample_tree_rounds(drafts, k=2, budget=budget, K=2)
        assert max(r.produced for r in tr.budgeted) == budget + 1
    assert [r.produced for r in sample_tree_rounds(drafts, k=2, budget=0, K=1).budgeted] == [1] * 11


# ------------------------------------------------------------------------------- brute force


def _brute_tree(lps, budget, K):
    """All rank tuples (depth 1..D, ranks < K), best (score, then rank tuple) first; the first `budget`."""
    D = len(lps)
    tuples = [t for d in range(1, D + 1) for t in itertools.product(range(K), repeat=d)]

    def score(t):
        s = 0.0
        for j, r in enumerate(t):
            s += lps[j][r]
        return s

    return sorted(tuples, key=lambda t: (-score(t), t))[:budget]


def _brute_walk(chosen, ids, truth):
    tokens_of = {tuple(ids[j][r] for j, r in enumerate(t)) for t in chosen}
    m = 0
    while m < len(truth) and tuple(truth[:m + 1]) in tokens_of:
        m += 1
    return m


def test_best_first_tree_equals_brute_force_enumeration():
    rng = random.Random(1)
    grid = [-0.125 * i for i in range(1, 9)]  # coarse values: many ties
    for _ in range(400):
        D, K = rng.randint(1, 3), rng.randint(1, 3)
        lps = [sorted((rng.choice(grid) for _ in range(K)), reverse=True) for _ in range(D)]
        ids = [[10 * j + r for r in range(K)] for j in range(D)]
        budget = rng.randint(0, 10)
        tree = build_budgeted_tree(ids, lps, budget, K)
        brute = _brute_tree(lps, budget, K)
        assert tree.ranks[1:] == brute  # same nodes, same best-first order
        for truth in itertools.product(*[[10 * j + r for r in range(K + 1)] for j in range(D)]):
            assert tree.walk(list(truth)) == _brute_walk(brute, ids, list(truth))


def test_topk_depth_accepted_by_definition():
    rng = random.Random(2)
    for _ in range(300):
        D, W = rng.randint(1, 4), rng.randint(1, 4)
        ids = [rng.sample(range(6), W) for _ in range(D)]
        truth = [rng.randrange(6) for _ in range(rng.randint(0, D))]
        k = rng.randint(1, W)
        expected = next((j for j in range(len(truth)) if truth[j] not in ids[j][:k]), len(truth))
        assert topk_depth_accepted(ids, truth, k) == expected


# ------------------------------------------------------------------------------- the inequalities


def _guaranteed_case(rng, n_tokens, block_size, width):
    """Ranks fixed per *position* (so each walk's reach a + τ_round(a) never decreases with a) and log-probs
    where no runner-up outranks the rest of the chain (guarantees_chain holds at every anchor)."""
    rank_at = {p: rng.choice([0, 0, 0, 1, width - 1, None]) for p in range(n_tokens + block_size)}
    D = block_size - 1

    def lps(a, d):
        top = -rng.choice([0.0, 0.015625, 0.03125, 0.0625])  # rank 0: at most 1/16 below 0
        rest = sorted((-rng.uniform(D * 0.0625 + 0.01, 6.0) for _ in range(width - 1)), reverse=True)
        return [top, *rest]

    tokens = list(range(500, 500 + n_tokens))
    prompt_len = rng.randint(1, 3)
    return synthetic_drafts(tokens, prompt_len, block_size, width, lambda a, d: rank_at[a + d], lps)


def test_chain_le_budgeted_le_topk_when_guaranteed():
    """Guaranteed case: budget >= B-1, K <= k, guarantees_chain at every anchor, and reach monotone in the
    anchor (here: a draft's rank depends only on the position it predicts). Then, per round at the same
    anchor, chain ≤ budgeted ≤ top-k accepted, and per sample (hence macro and micro) τ in that order."""
    rng = random.Random(3)
    per_sample = {"chain": [], "budgeted": [], "topk": []}
    for _ in range(60):
        Bs, width = rng.choice([3, 4, 6]), rng.choice([2, 3, 4])
        drafts = _guaranteed_case(rng, rng.randint(2, 30), Bs, width)
        k, K = width, rng.randint(1, width)
        budget = rng.randint(Bs - 1, 3 * Bs)
        for row in drafts["topk_logprobs"]:
            assert guarantees_chain(row, budget, K)
        tr = sample_tree_rounds(drafts, k=k, budget=budget, K=K)
        chain = chain_of(drafts)
        # per anchor: build each acceptance at every anchor
        for a, ids, lps in zip(drafts["anchors"], drafts["topk_ids"], drafts["topk_logprobs"], strict=False):
            truth = drafts["tokens"][a + 1:]
            tree = build_budgeted_tree(ids, lps, budget, K)
            c = topk_depth_accepted(ids, truth, 1)
            assert tree.chain_depth() == Bs - 1
            assert c <= tree.walk(truth) <= topk_depth_accepted(ids, truth, k)
        taus = [sum(r.produced for r in rs) / len(rs) if rs else None for rs in (chain, tr.budgeted, tr.topk)]
        if taus[0] is not None:
            assert taus[0] <= taus[1] <= taus[2]
            assert len(chain) >= len(tr.budgeted) >= len(tr.topk)
        per_sample["chain"].append(chain)
        per_sample["budgeted"].append(tr.budgeted)
        per_sample["topk"].append(tr.topk)
    s = {name: summarize(rs, 6) for name, rs in per_sample.items()}
    assert s["chain"]["tau_macro"] <= s["budgeted"]["tau_macro"] <= s["topk"]["tau_macro"]
    assert s["chain"]["tau_micro"] <= s["budgeted"]["tau_micro"] <= s["topk"]["tau_micro"]
    assert s["chain"]["tau_macro"] < s["topk"]["tau_macro"]  # the cases are not all trivial


def test_budget_below_chain_length_can_lose_to_the_chain():
    # Perfect drafter, B = 16: the chain accepts 15 per round, a budget-8 tree at most 8 (τ_round ≤ 9).
    tokens = list(range(100, 140))
    drafts = synthetic_drafts(tokens, 1, 16, 2, lambda a, d: 0, lambda a, d: [0.0, -100.0])  # certain drafter
    tr = sample_tree_rounds(drafts, k=2, budget=8, K=2)
    chain = chain_of(drafts)
    assert max(r.produced for r in tr.budgeted) == 9
    assert len(tr.budgeted) > len(chain)  # budgeted τ < chain τ: the inequality needs budget >= B-1


def test_flat_runner_up_pushes_the_chain_out_of_the_tree():
    # budget = B-1 = 3 but a runner-up as likely as the top token at depth 1: (1) = -0.5 beats the chain's
    # (0,0) = -1.0 and (0,0,0) = -1.5; the tree is (0), (1), (0,0) and loses depth 3 of the chain.
    lps = [[-0.5, -0.5], [-0.5, -4.0], [-0.5, -4.0]]
    assert not guarantees_chain(lps, 3, 2)
    tree = build_budgeted_tree([[1, 2], [3, 4], [5, 6]], lps, budget=3, K=2)
    assert tree.ranks[1:] == [(0,), (1,), (0, 0)] and tree.chain_depth() == 2
    assert tree.walk([1, 3, 5]) == 2 < topk_depth_accepted([[1, 2], [3, 4], [5, 6]], [1, 3, 5], 1)


def test_per_round_dominance_alone_does_not_order_sample_tau():
    """Replays visit different anchors: top-k accepts at least the chain at every anchor, yet takes more
    rounds when the anchor it jumps to is worse than the one the chain lands on (reach not monotone)."""
    tokens = [7] + list(range(100, 108))  # prompt_len 1, last = 8: 7 tokens to produce
    ranks = {1: [1, None, None], 2: [0, 0, 0], 6: [0, 0, 0], 7: [0, 0, 0]}  # elsewhere: never right
    drafts = synthetic_drafts(tokens, 1, 4, 2, lambda a, d: ranks.get(a, [None] * 3)[d - 1])
    chain = chain_of(drafts)
    tr = sample_tree_rounds(drafts, k=2, budget=3, K=2)
    # chain: a=1 -> 0, τ1 -> a=2 -> 3, τ4 -> a=6 (2 left) -> 2, τ2: 3 rounds, τ 7/3.
    assert [(r.anchor, r.produced) for r in chain] == [(1, 1), (2, 4), (6, 2)]
    # top-2: a=1 -> 1 (rank 1), τ2 -> a=3, 4, 5 never right, τ1 each -> a=6 -> τ2: 5 rounds, τ 7/5.
    assert [(r.anchor, r.produced) for r in tr.topk] == [(1, 2), (3, 1), (4, 1), (5, 1), (6, 2)]
    for a in drafts["anchors"]:
        i = a - 1
        assert topk_depth_accepted(drafts["topk_ids"][i], tokens[a + 1:], 2) >= \
            topk_depth_accepted(drafts["topk_ids"][i], tokens[a + 1:], 1)
    assert summarize([tr.topk], 4)["tau_macro"] == pytest.approx(7 / 5)
    assert summarize([chain], 4)["tau_macro"] == pytest.approx(7 / 3)


# ------------------------------------------------------------------------------- inputs


class _FakeTensor:
    def __init__(self, data):
        self.data = data

    def tolist(self):
        return self.data


def test_accepts_sample_drafts_objects_with_tensors():
    from remote_payload.eval.offline import SampleDrafts

    d = _hand_drafts()
    sd = SampleDrafts(d["prompt_len"], d["tokens"], d["anchors"], _FakeTensor(d["topk_ids"]),
                      _FakeTensor(d["topk_logprobs"]))
    assert sample_tree_rounds(sd, k=2, budget=3).entry() == sample_tree_rounds(d, k=2, budget=3).entry()


def test_real_offline_draft_pass_feeds_the_tree_metrics():
    torch = pytest.importorskip("torch")
    from payload_helpers import SyntheticDrafter

    from remote_payload.eval.offline import draft_sample, replay

    tokens = [10, 11] + list(range(100, 112))
    drafter = SyntheticDrafter(tokens, 4, {2: {2}, 8: {1}}, vocab=1000)
    drafts = draft_sample(drafter, {}, tokens, 2, topk=3)
    assert isinstance(drafts.topk_ids, torch.Tensor)
    tr = sample_tree_rounds(drafts, k=1, budget=3, K=1)
    assert tr.topk == replay(drafts) == tr.budgeted
    # The synthetic drafter repeats its one token k times, all log-probs 0, so every score ties and rank
    # tuples go in lexicographic order: (0), (0,0), (0,0,0), (0,0,1), (0,0,2), (0,1). The last repeats the
    # token of its sibling (0,0): the better-ranked chain node keeps the token, so the walk still follows
    # the chain (else it would stop at the leaf (0,1) after 2 nodes).
    tr = sample_tree_rounds(drafts, k=3, budget=6, K=3)
    assert tr.topk == replay(drafts) == tr.budgeted


def test_tensor_path_equals_the_list_path():
    """The eval passes torch tensors (vectorised top-k, lazy rows for the budgeted tree); same rounds as lists."""
    torch = pytest.importorskip("torch")
    from remote_payload.eval.offline import SampleDrafts

    rng = random.Random(8)
    for _ in range(40):
        Bs, width = rng.choice([2, 4, 8]), rng.choice([1, 3, 5])
        tokens = [rng.randrange(5) for _ in range(rng.randint(1, 3))] + list(range(300, 300 + rng.randint(1, 30)))
        P = rng.randint(1, 2) if len(tokens) > 2 else 1
        def lps(a, d, width=width):
            return sorted((-rng.uniform(0, 3) for _ in range(width)), reverse=True)

        d = synthetic_drafts(tokens, P, Bs, width, lambda a, d, width=width: rng.choice([0, width - 1, None]), lps)
        sd = SampleDrafts(P, d["tokens"], d["anchors"], torch.tensor(d["topk_ids"]).reshape(-1, Bs - 1, width),
                          torch.tensor(d["topk_logprobs"]).reshape(-1, Bs - 1, width))
        k, budget = rng.randint(1, width), rng.randint(0, 3 * Bs)
        K = rng.randint(1, width)
        assert sample_tree_rounds(sd, k=k, budget=budget, K=K).entry() == \
            sample_tree_rounds(d, k=k, budget=budget, K=K).entry()
    d = _hand_drafts()
    ids, lps = torch.tensor(d["topk_ids"]), torch.tensor(d["topk_logprobs"])
    with pytest.raises(PayloadError, match=r"top-2 per depth.*k=8"):
        sample_tree_rounds({**d, "topk_ids": ids, "topk_logprobs": lps}, k=8, budget=3)
    lps[3, 0, 0] = float("nan")
    with pytest.raises(PayloadError, match="NaN log-probs.*anchor 5"):
        sample_tree_rounds({**d, "topk_ids": ids, "topk_logprobs": lps}, k=2, budget=3)
    with pytest.raises(PayloadError, match="must both be"):
        sample_tree_rounds({**d, "topk_ids": ids, "topk_logprobs": lps[:, :2]}, k=2, budget=3)


def test_bad_inputs_give_clear_errors():
    d = _hand_drafts()
    with pytest.raises(PayloadError, match=r"top-2 per depth.*k=8.*--topk 8"):
        sample_tree_rounds(d, k=8, budget=3)
    with pytest.raises(PayloadError, match="every continuation position"):
        sample_tree_rounds({**d, "anchors": d["anchors"][1:], "topk_ids": d["topk_ids"][1:],
                            "topk_logprobs": d["topk_logprobs"][1:]}, k=2, budget=3)
    bad = [row[:] for row in d["topk_logprobs"]]
    bad[3] = [[float("nan"), -1.0]] + bad[3][1:]
    with pytest.raises(PayloadError, match="NaN log-probs.*anchor 5"):
        sample_tree_rounds({**d, "topk_logprobs": bad}, k=2, budget=3)
    short = [row[:] for row in d["topk_ids"]]
    short[1] = short[1][:2]
    with pytest.raises(PayloadError, match="anchor 3 has top-k lists of another shape"):
        sample_tree_rounds({**d, "topk_ids": short}, k=2, budget=3)


def test_no_rounds_when_the_prefill_made_the_only_token():
    d = synthetic_drafts([7, 50], 1, 4, 2, lambda a, d: 0)
    tr = sample_tree_rounds(d, k=2, budget=3)
    assert tr.topk == [] and tr.budgeted == []
    assert tr.entry()["topk"] == {"k": 2, "tau": None, "rounds": 0, "anchors": [], "accepted": [], "produced": []}
