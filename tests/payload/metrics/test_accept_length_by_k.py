"""accept_length_by_k: at every K, the drafter run with a block of K + 1 rows (as vLLM's DFlash proposer plans
it), counted as the engine counts; equal to a plain loop that drafts so, and to the real draft-verify loop."""

from __future__ import annotations

import pytest
from payload_helpers import MAX_NEW

from remote_payload.eval.offline import draft_sample
from remote_payload.eval.online import online_generate
from remote_payload.inputs.reference import greedy_tail
from remote_payload.metrics import conventions as conv
from remote_payload.metrics.by_k import METHOD, sample_record, summarize_by_k

SAMPLES = 4


def engine_loop_at_k(rt, features, prompt_len: int, kept: list[int], tail: list[int], k: int) -> tuple[int, int]:
    """(steps, accepted drafts) of the engine's loop at K, written out: from each anchor the drafter drafts a block
    of K + 1 rows (the committed token, K masks); a step accepts the leading drafts equal to the target's tokens
    (its tokens past the stop too, as the engine's counters do) and commits them + 1, up to the kept tokens."""
    ctx = rt.prepare(features)
    truth = kept + tail
    a, last = prompt_len, len(kept) - 1
    steps = accepted = 0
    while a < last:
        drafts = rt.draft(ctx, kept, [a], topk=1, block=k + 1)[0][0, :, 0].tolist()
        n = 0
        while n < k and a + 1 + n < len(truth) and drafts[n] == truth[a + 1 + n]:
            n += 1
        steps, accepted = steps + 1, accepted + n
        a += min(n + 1, last - a)
    return steps, accepted


def _end(ref, tail, drafts) -> conv.SampleEnd:
    return conv.SampleEnd(tokens=ref.tokens + tail, prompt_len=len(ref.prompt_ids), kept=len(ref.tokens),
                          max_new=MAX_NEW, stop_ids=frozenset(), drafts_at=drafts.top1)


@pytest.mark.parametrize("fmt", ["zlab", "dflash2"])
def test_by_k_equals_a_plain_loop_drafting_k_plus_one_rows_and_the_engine_count_at_the_full_block(
        fmt, loaded, runtime_for, samples, target):
    rt = runtime_for(loaded[fmt])
    B = rt.block_size
    records, loops, full_engine = [], {k: [0, 0] for k in range(1, B)}, [0, 0]
    for _p, ref, feats in samples[:SAMPLES]:
        tail = greedy_tail(target, ref.tokens, B - 1)
        drafts = draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids), replan=True)
        records.append(sample_record(_end(ref, tail, drafts), drafts.drafts_at_k, B))
        for k in range(1, B):
            steps, acc = engine_loop_at_k(rt, feats.layers, len(ref.prompt_ids), ref.tokens, tail, k)
            loops[k][0] += steps
            loops[k][1] += acc
        engine = conv.vllm_rounds(_end(ref, tail, drafts), B)  # the vllm convention of the full block's rounds
        full_engine[0] += len(engine)
        full_engine[1] += sum(r.accepted for r in engine)
    summary = summarize_by_k(records, B)
    assert summary["method"] == METHOD == "replanned" and summary["exact"]
    by_k = summary["by_k"]
    for k in range(1, B):
        assert by_k[str(k)]["mean_accept_length"] == pytest.approx(1 + loops[k][1] / loops[k][0], abs=1e-6), k
        lo, hi = by_k[str(k)]["ci95"]
        assert lo < by_k[str(k)]["mean_accept_length"] < hi
    assert by_k[str(B - 1)]["mean_accept_length"] == pytest.approx(1 + full_engine[1] / full_engine[0], abs=1e-6)
    means = [by_k[str(k)]["mean_accept_length"] for k in range(1, B)]
    assert means[-1] > means[0]  # more drafts offered, more accepted per step for these trained drafters


class PlannedAt:
    """The runtime as an engine set to K drafts runs it: every block planned at K + 1 rows."""

    def __init__(self, runtime, k: int):
        self._runtime, self.block_size = runtime, k + 1

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def draft(self, ctx, tokens, anchors, topk: int = 1):
        return self._runtime.draft(ctx, tokens, anchors, topk=topk, block=self.block_size)


def test_the_committed_count_at_k_is_the_real_draft_verify_loop_run_at_k(loaded, runtime_for, samples, target):
    rt = runtime_for(loaded["zlab"])
    B = rt.block_size
    for _p, ref, feats in samples[:2]:
        drafts = draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids), replan=True)
        record = sample_record(_end(ref, [], drafts), drafts.drafts_at_k, B)
        for k in (1, 3):
            res = online_generate(target, PlannedAt(rt, k), ref.prompt_ids, MAX_NEW)
            assert res.continuation == ref.continuation
            assert record[str(k)][0] == len(res.rounds) and record[str(k)][2] == sum(r.produced for r in res.rounds)


def test_a_block_row_count_outside_the_trained_block_is_refused(loaded, runtime_for):
    rt = runtime_for(loaded["zlab"])
    for rows in (1, rt.block_size + 1):
        with pytest.raises(ValueError, match=f"expected 2 .. {rt.block_size}"):
            rt.block_rows(rows)


def test_summary_counts_engine_and_committed_per_k_with_a_ci():
    rec = {"1": [4, 2, 5], "2": [3, 3, 5]}
    other = {"1": [2, 2, 3], "2": [2, 2, 3]}
    s = summarize_by_k([rec, other], 3, exact=False)
    assert s["exact"] is False and "K + 1 rows" in s["definition"]
    by_k = s["by_k"]
    assert by_k["1"]["mean_accept_length"] == round(1 + 4 / 6, 6)
    assert by_k["2"]["mean_accept_length"] == round(1 + 5 / 5, 6)
    assert by_k["1"]["committed"]["mean_accept_length"] == round(8 / 6, 6)
    assert by_k["1"]["mean_accept_length_per_request"] == round(((1 + 2 / 4) + (1 + 2 / 2)) / 2, 6)
    # the ratio estimator's CI: R = 4/6, residuals 2 - 4R = -2/3 and 2 - 2R = 2/3, m = 2
    half = 1.959964 * (2 * (4 / 9 + 4 / 9)) ** 0.5 / 6
    assert by_k["1"]["ci95"] == pytest.approx([1 + 4 / 6 - half, 1 + 4 / 6 + half], abs=1e-6)
    assert summarize_by_k([rec], 3)["by_k"]["1"]["ci95"] is None  # one sample: no CI
    assert summarize_by_k([{"1": [4, 2]}], 3)["by_k"]["1"]["rounds"] == 0  # an old record shape is not counted
