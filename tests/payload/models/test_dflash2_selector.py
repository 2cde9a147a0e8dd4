"""The DFlash2 selector's batched walk equals a walk written one block and one slot at a time."""

from __future__ import annotations

import torch

from remote_payload.models.selector import CandidateSelector


def _setup(seed=0, V=40, R=6, H=12, N=5, S=4, K=7):
    g = torch.Generator().manual_seed(seed)
    sel = CandidateSelector(torch.randn(V, R, generator=g), torch.randn(V, R, generator=g),
                            torch.randn(R, H, generator=g), top_k=K)
    return sel, torch.randn(N, S, V, generator=g), torch.randn(N, S, H, generator=g), \
        torch.randint(0, V, (N,), generator=g)


def _one_block_greedy(sel, logits, hidden, anchor):
    """Independent reference: every vocabulary entry in the top-K scored by the formula, one block, one slot."""
    prev, out = int(anchor), []
    for t in range(logits.shape[0]):
        top = torch.topk(logits[t], sel.top_k).indices.tolist()
        wh = sel.hidden_projection @ hidden[t]
        query = sel.predecessor[prev] * wh
        best = max(top, key=lambda b: float(logits[t, b]) + float((query * sel.successor[b]).sum()))
        out.append(best)
        prev = best
    return out


def test_batched_greedy_walk_equals_one_block_at_a_time():
    sel, logits, hidden, anchors = _setup()
    ids, logprobs, drafts = sel.walk(logits, hidden, anchors, topk=3)
    assert ids.shape == (5, 4, 3) and logprobs.shape == (5, 4, 3)
    for n in range(5):
        assert drafts[n].tolist() == _one_block_greedy(sel, logits[n], hidden[n], anchors[n])
    assert torch.equal(ids[..., 0], drafts)
    assert bool((logprobs[..., :-1] >= logprobs[..., 1:]).all())  # ranked best first


def test_slot_logprobs_along_the_walk_match_the_walk_and_are_supported_on_k():
    sel, logits, hidden, anchors = _setup(seed=1)
    _ids, logprobs, drafts = sel.walk(logits, hidden, anchors, topk=1)
    preds = torch.cat([anchors[:, None], drafts[:, :-1]], dim=1)
    lq = sel.slot_logprobs(logits, hidden, preds, temperature=1.0)
    assert lq.shape == (5, 4, 40)
    assert bool(((lq > float("-inf")).sum(-1) == 7).all())
    assert torch.allclose(lq.exp().sum(-1), torch.ones(5, 4), atol=1e-5)
    assert torch.equal(lq.argmax(-1), drafts)
    assert torch.allclose(lq.gather(-1, drafts[..., None])[..., 0], logprobs[..., 0], atol=1e-5)


def test_sampled_walk_draws_only_candidates_and_is_seeded():
    sel, logits, hidden, anchors = _setup(seed=2)
    a = sel.walk(logits, hidden, anchors, temperature=1.0, generator=torch.Generator().manual_seed(3))[2]
    b = sel.walk(logits, hidden, anchors, temperature=1.0, generator=torch.Generator().manual_seed(3))[2]
    assert torch.equal(a, b)
    top = torch.topk(logits, 7, dim=-1).indices
    assert bool((top == a[..., None]).any(-1).all())
