"""The references of many prompts at once: cache first, then batched decoding of what the cache lacks.

Each request is one continuation: a prompt's greedy reference (``reference.py``) or, with a seed, one draw at
T > 0 (``sampled_reference.py``). Their cache entries are the single-prompt functions' own (same files, same
fields; the batch size is recorded in an entry but is not part of its key), so a reference decoded at batch 32
is reused at batch 1 and the other way round. What the cache lacks is decoded by ``batched_decode.decode_rows``,
``batch`` rows at a time; every finished continuation is written to the cache as it ends, so an out-of-memory
error, a Ctrl-C or a crash loses only the rows still decoding. Then the tails (the tokens past the stop the
zlab-2604/vllm conventions read) that the cache lacks, decoded the same way from a fresh prefill of prompt +
continuation, end tokens not stopped on: greedy, or drawn with ``sampled_reference.tail_seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from remote_payload.inputs.batched_decode import DecodeStats, Row, decode_rows, is_out_of_memory
from remote_payload.inputs.reference import CacheEntry, Reference, reference_entry
from remote_payload.inputs.sampled_reference import SampledReference, sampled_entry, tail_seed
from remote_payload.inputs.sampling import Sampling


@dataclass(frozen=True)
class Request:
    prompt_ids: list[int]
    seed: int | None = None  # a draw at T > 0 (then ``sampling`` is given); None: the greedy reference


@dataclass
class Progress:
    """Where the work stands, for a progress line: rows (continuations and tails to decode) done of total."""

    done: int
    total: int
    tokens_per_s: float | None
    eta_s: float | None  # seconds left, from the rate so far and the rows' expected lengths
    stats: DecodeStats


def references(target, requests: list[Request], max_new_tokens: int, cache_dir: Path | None, *, batch: int,
               tail_batch: int | None = None, sampling: Sampling | None = None, tail: int = 0, warn=None,
               on_progress: Callable[[Progress], None] | None = None,
               is_oom: Callable[[BaseException], bool] = is_out_of_memory) -> tuple[list[Reference], DecodeStats]:
    """Every request's reference (with ``tail`` tokens past it when > 0), in request order, and the decode's
    figures. ``tail_batch``: the tails' batch (their prefill is the whole row; default ``batch``)."""
    entries = [_entry(target, r, max_new_tokens, sampling, cache_dir, warn) for r in requests]
    refs: list[Reference | None] = [_cached(r, e) for r, e in zip(requests, entries, strict=True)]
    misses = [k for k, ref in enumerate(refs) if ref is None]
    tails = [k for k, e in enumerate(entries) if tail > 0 and (refs[k] is None or e.cached_tail(tail) is None)]
    stats = DecodeStats(batch=batch)
    tracker = _Tracker(len(misses) + len(tails), len(misses), max_new_tokens, tail, stats, on_progress)
    stop = frozenset(target.stop_ids)

    def finished(k: int, tokens: list, seconds: float) -> None:
        k = misses[k]
        reason = "eos" if tokens and tokens[-1] in stop else "max_new_tokens"
        entries[k].store(tokens, reason, seconds, decode_batch=stats.batch)
        refs[k] = _reference(requests[k], tokens, reason, seconds)
        tracker.row_done(len(tokens), tail=False)

    rows = [Row(tuple(requests[k].prompt_ids), max_new_tokens, stop, requests[k].seed) for k in misses]
    tracker.report()
    decode_rows(target, rows, batch, finished, sampling=sampling, stats=stats, is_oom=is_oom)
    done = [ref for ref in refs if ref is not None]
    assert len(done) == len(refs)  # decode_rows ends every row (or raises)
    for ref, entry in zip(done, entries, strict=True):
        ref.tail = entry.cached_tail(tail) if tail > 0 else None

    def tail_finished(k: int, tokens: list, seconds: float) -> None:
        k = tails[k]
        done[k].tail = list(tokens)
        entries[k].store_tail(tokens)
        tracker.row_done(len(tokens), tail=True)

    tail_rows = [Row(tuple(done[k].tokens), tail, frozenset(),
                     None if (seed := requests[k].seed) is None else tail_seed(seed, done[k].tokens))
                 for k in tails]
    tail_batch = min(stats.batch, tail_batch or batch)  # after an out-of-memory halving, not above it
    decode_rows(target, tail_rows, tail_batch, tail_finished, sampling=sampling, stats=stats, is_oom=is_oom)
    return done, stats


def _entry(target, request: Request, max_new_tokens: int, sampling: Sampling | None, cache_dir: Path | None,
           warn) -> CacheEntry:
    if request.seed is None:
        return reference_entry(target, request.prompt_ids, max_new_tokens, cache_dir, warn)
    if sampling is None:
        raise ValueError("a draw (a request with a seed) needs the sampling law")
    return sampled_entry(target, request.prompt_ids, max_new_tokens, sampling, request.seed, cache_dir, warn)


def _cached(request: Request, entry: CacheEntry) -> Reference | None:
    if entry.found is None:
        return None
    ref = _reference(request, entry.found["continuation"], entry.found["stop_reason"], 0.0)
    ref.cached = True
    return ref


def _reference(request: Request, tokens: list, reason: str, seconds: float) -> Reference:
    if request.seed is None:
        return Reference(list(request.prompt_ids), list(tokens), reason, seconds)
    return SampledReference(list(request.prompt_ids), list(tokens), reason, seconds, seed=request.seed)


class _Tracker:
    """Rows done and the time left: the rows to go times their expected length (the mean of the finished
    continuations, ``max_new`` before the first) over the rate so far."""

    def __init__(self, total: int, continuations: int, max_new: int, tail: int, stats: DecodeStats, report_to):
        self.total, self.left_continuations, self.left_tails = total, continuations, total - continuations
        self.max_new, self.tail, self.stats, self.report_to = max_new, tail, stats, report_to
        self.done, self.continuation_tokens, self.continuations_done = 0, 0, 0

    def row_done(self, tokens: int, tail: bool) -> None:
        self.done += 1
        if tail:
            self.left_tails -= 1
        else:
            self.left_continuations -= 1
            self.continuations_done += 1
            self.continuation_tokens += tokens
        self.report()

    def report(self) -> None:
        if self.report_to is None:
            return
        rate = self.stats.tokens_per_s
        per_row = self.continuation_tokens / self.continuations_done if self.continuations_done else self.max_new
        left = self.left_continuations * per_row + self.left_tails * self.tail
        eta = left / rate if rate else None
        self.report_to(Progress(self.done, self.total, rate, eta, self.stats))
