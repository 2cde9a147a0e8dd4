"""Batched decoding (inputs/batched_decode.py, inputs/batched_references.py) against the batch-1 loops.

Every expected continuation comes from today's one-prompt-at-a-time path (``greedy_decode`` / ``sampled_decode``,
or the session's cached greedy references, which it made), never from the batched loop itself. Both fixture
targets: the hybrid Qwen3.5 one (gated delta-net layers) and the dense Qwen3 one, fp32.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from payload_helpers import MAX_NEW

from remote_payload.errors import PayloadError
from remote_payload.inputs.batched_decode import Row, decode_rows
from remote_payload.inputs.batched_references import Request, references
from remote_payload.inputs.prompts import load_prompts
from remote_payload.inputs.reference import greedy_decode
from remote_payload.inputs.sampled_reference import sampled_decode, sampled_tail
from remote_payload.inputs.sampling import Sampling, draw_seed
from remote_payload.models.target import render_prompt

LAW = Sampling(1.0, top_p=0.9, top_k=20)
# Each row its own limit: some rows end at their stop token, some at their limit, at different steps.
LIMITS = [160, 7, 33, 160, 12, 160, 25, 3]


def _prompt_ids(target, n=None):
    prompts, _ = load_prompts("builtin")
    return [render_prompt(target.tokenizer, p.message_dicts(), False) for p in prompts[:n]]


def _decode(target, rows, batch, sampling=None, **kw):
    got: dict[int, list[int]] = {}

    def on_row(i, tokens, seconds):
        assert i not in got, f"row {i} ended twice"
        got[i] = list(tokens)

    stats = decode_rows(target, rows, batch, on_row, sampling=sampling, **kw)
    return [got[i] for i in range(len(rows))], stats


def test_batched_greedy_equals_the_batch_1_references_on_the_hybrid_target(target, samples):
    """Batch 8 with left padding and per-row limits: every row is the batch-1 reference (cached by the session's
    ``samples``, made by ``greedy_decode``), cut at its limit or ending at its stop token."""
    stop = frozenset(target.stop_ids)
    chosen = samples[:len(LIMITS)]
    rows = [Row(tuple(ref.prompt_ids), limit, stop) for (_, ref, _), limit in zip(chosen, LIMITS, strict=True)]
    got, stats = _decode(target, rows, 8)
    ended = 0
    for (p, ref, _), limit, tokens in zip(chosen, LIMITS, got, strict=True):
        assert tokens == ref.continuation[:limit], p.id
        ended += tokens[-1] in stop
    assert 0 < ended < len(rows)  # both ways of ending were exercised
    assert stats.rows == len(rows) and stats.groups == 1 and stats.tokens == sum(map(len, got))
    assert 0 < stats.idle_share < 1


def test_batched_greedy_equals_greedy_decode_on_the_qwen3_target(qwen3_target):
    t = qwen3_target
    ids = _prompt_ids(t, 6)
    stop = frozenset(t.stop_ids)
    expected = [greedy_decode(t, i, 32).continuation for i in ids]
    got, _ = _decode(t, [Row(tuple(i), 32, stop) for i in ids], 8)
    assert got == expected


@pytest.mark.parametrize("which", ["hybrid", "qwen3"])
def test_seeded_draws_do_not_depend_on_the_batch(which, target, qwen3_target):
    """T = 1 with top-p and top-k: each row draws from its own generator, so batch 8 gives the batch-1 draws of
    the same seeds, token for token (on the hybrid target the same prompt's draws differ: the seeds count; the
    trained Qwen3 one is too sure of its answers at top-k 20 / top-p 0.9 for that)."""
    t = target if which == "hybrid" else qwen3_target
    stop = frozenset(t.stop_ids)
    rows = [Row(tuple(i), 20, stop, draw_seed(0, i, j)) for i in _prompt_ids(t, 3) for j in range(2)]
    expected = [sampled_decode(t, list(r.ids), 20, LAW, r.seed).continuation for r in rows]
    got, _ = _decode(t, rows, 8, sampling=LAW)
    assert got == expected
    if which == "hybrid":
        assert any(a != b for a, b in zip(expected[::2], expected[1::2], strict=True))


def test_a_mixed_batch_of_greedy_rows_and_draws(target, samples):
    """Greedy rows and seeded rows in one batch: each is its own batch-1 continuation."""
    stop = frozenset(target.stop_ids)
    refs = [ref for _, ref, _ in samples[:4]]
    rows = [Row(tuple(r.prompt_ids), 20, stop, None if k % 2 else 11 + k) for k, r in enumerate(refs)]
    got, _ = _decode(target, rows, 4, sampling=LAW)
    for k, (r, tokens) in enumerate(zip(refs, got, strict=True)):
        want = r.continuation[:20] if k % 2 else sampled_decode(target, r.prompt_ids, 20, LAW, 11 + k).continuation
        assert tokens == want, k


class _Flaky:
    """The target's model, raising ``error`` once, at the first forward after a row ended (the batch shrank) while
    more than ``wider`` rows are left; it records which cache files existed at that moment."""

    def __init__(self, model, error, wider: int, cache_dir=None):
        self.model, self.error, self.wider, self.cache_dir = model, error, wider, cache_dir
        self.widest, self.fired, self.files_then = 0, False, set()

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, **kwargs):
        rows = kwargs["input_ids"].shape[0]
        self.widest = max(self.widest, rows)
        if not self.fired and self.wider < rows < self.widest:
            self.fired = True
            if self.cache_dir is not None:
                self.files_then = {p.name for p in (self.cache_dir / "references").glob("*.json")}
            raise self.error
        return self.model(**kwargs)


class SimulatedOOM(RuntimeError):
    pass


def test_out_of_memory_halves_the_batch_and_loses_no_finished_row(target, samples, tmp_path):
    """An out-of-memory error mid-decode (after rows of the first group ended and were cached): the batch halves,
    the unfinished rows are decoded again, every finished one is kept; the references are those of batch 1."""
    refs = sorted((ref for _, ref, _ in samples), key=lambda r: len(r.continuation))[:8]  # the shortest: cheap
    flaky = _Flaky(target.model, SimulatedOOM("CUDA out of memory (simulated)"), wider=4, cache_dir=tmp_path)
    t = dataclasses.replace(target, model=flaky)
    got, stats = references(t, [Request(r.prompt_ids) for r in refs], 48, tmp_path, batch=8,
                            is_oom=lambda e: isinstance(e, SimulatedOOM))
    assert flaky.fired and stats.halvings == [8] and stats.batch == 4
    assert [g.continuation for g in got] == [r.continuation[:48] for r in refs]
    assert stats.rows == len(refs)  # each row ended once: none was decoded again
    files = {p.name for p in (tmp_path / "references").glob("*.json")}
    assert flaky.files_then and flaky.files_then < files and len(files) == len(refs)
    again, stats = references(target, [Request(r.prompt_ids) for r in refs], 48, tmp_path, batch=1)
    assert all(g.cached for g in again) and stats.rows == 0  # the cache holds them all, whatever the batch


def test_out_of_memory_at_batch_1_is_a_clear_error(target, samples):
    ref = samples[0][1]
    flaky = _Flaky(target.model, SimulatedOOM("oom"), wider=0)
    flaky.widest = 2  # as if a wider batch had run: the one-row forward fails
    t = dataclasses.replace(target, model=flaky)
    with pytest.raises(PayloadError, match="out of memory decoding one row"):
        decode_rows(t, [Row(tuple(ref.prompt_ids), 10)], 1, lambda *a: None,
                    is_oom=lambda e: isinstance(e, SimulatedOOM))


def test_a_ctrl_c_keeps_the_rows_that_ended(target, samples, tmp_path):
    """Ctrl-C mid-decode: the rows that ended are in the cache, and the next run decodes only the others."""
    refs = sorted((ref for _, ref, _ in samples), key=lambda r: len(r.continuation))[:4]  # the shortest: cheap
    t = dataclasses.replace(target, model=_Flaky(target.model, KeyboardInterrupt(), wider=0))
    with pytest.raises(KeyboardInterrupt):
        references(t, [Request(r.prompt_ids) for r in refs], MAX_NEW, tmp_path, batch=4)
    kept = list((tmp_path / "references").glob("*.json"))
    assert 0 < len(kept) < len(refs)
    got, stats = references(target, [Request(r.prompt_ids) for r in refs], MAX_NEW, tmp_path, batch=4)
    assert sum(g.cached for g in got) == len(kept) and stats.rows == len(refs) - len(kept)
    assert [g.continuation for g in got] == [r.continuation for r in refs]


def test_batched_references_write_the_single_prompt_cache_entries_and_tails(target, tmp_path):
    """Draws and their tails decoded at batch 4 are the files ``cached_sampled_reference`` reads: the same
    continuation, the tail drawn with the tail's seed, the batch recorded but not part of the key."""
    from remote_payload.inputs.sampled_reference import cached_sampled_reference

    ids = _prompt_ids(target, 2)
    requests = [Request(i, draw_seed(0, i, j)) for i in ids for j in range(2)]
    got, _ = references(target, requests, 16, tmp_path, batch=4, sampling=LAW, tail=5)
    for req, ref in zip(requests, got, strict=True):
        single = cached_sampled_reference(target, req.prompt_ids, 16, LAW, req.seed, tmp_path, tail=5)
        assert single.cached and single.continuation == ref.continuation and single.tail == ref.tail
        assert ref.tail == sampled_tail(target, ref.tokens, 5, LAW, req.seed)
    entry = json.loads(next((tmp_path / "references").glob("*.json")).read_text())
    assert entry["decode_batch"] == 4


def test_a_simulated_cuda_error_counts_as_out_of_memory():
    from remote_payload.inputs.batched_decode import is_out_of_memory

    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory")) and not is_out_of_memory(
        RuntimeError("other"))
