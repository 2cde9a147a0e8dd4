"""accept_length_by_k: the offline replay at K equals the real draft-verify loop offering K drafts per step."""

from __future__ import annotations

from payload_helpers import MAX_NEW

from remote_payload.eval.offline import draft_sample
from remote_payload.eval.online import online_generate
from remote_payload.metrics.by_k import sample_record, summarize_by_k


class FirstKDrafts:
    """The drafter drafts its whole block; only the first K drafts are offered to the target (as an engine does)."""

    def __init__(self, runtime, k: int):
        self._runtime, self.block_size = runtime, k + 1

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def draft(self, ctx, tokens, anchors, topk: int = 1):
        ids, lps = self._runtime.draft(ctx, tokens, anchors, topk=topk)
        return ids[:, :self.block_size - 1], lps[:, :self.block_size - 1]


def test_offline_replay_at_each_k_equals_the_online_loop_offering_k_drafts(loaded, runtime_for, samples, target):
    rt = runtime_for(loaded["zlab"])
    B = rt.block_size
    records = []
    for _p, ref, feats in samples[:3]:
        drafts = draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids))
        record = sample_record(drafts.tokens, drafts.prompt_len, drafts.top1, B)
        records.append(record)
        for k in (1, 3, B - 1):
            res = online_generate(target, FirstKDrafts(rt, k), ref.prompt_ids, MAX_NEW)
            assert res.continuation == ref.continuation
            assert record[str(k)] == [len(res.rounds), sum(r.accepted for r in res.rounds)], k
    summary = summarize_by_k(records, B)["by_k"]
    means = [summary[str(k)]["mean_accept_length"] for k in range(1, B)]
    assert all(1.0 <= m <= k + 1 for k, m in enumerate(means, start=1))
    assert means[-1] > means[0]  # more drafts offered, more accepted per step for this trained drafter


def test_summary_counts_one_plus_accepted_per_round():
    rec = {"1": [4, 2], "2": [3, 3]}
    other = {"1": [2, 2], "2": [2, 2]}
    s = summarize_by_k([rec, other], 3)["by_k"]
    assert s["1"]["mean_accept_length"] == round(1 + 4 / 6, 6)
    assert s["2"]["mean_accept_length"] == round(1 + 5 / 5, 6)
    assert s["1"]["mean_accept_length_per_request"] == round(((1 + 2 / 4) + (1 + 2 / 2)) / 2, 6)
