"""Batched decoding of the target: many rows per forward, each row's tokens those of its batch-1 decoding.

A *row* is a prompt (token ids), how many tokens it may add, the tokens it stops after, and — for a draw at
T > 0 — the seed of its own generator. Rows are decoded in groups of up to ``batch``, longest prompts first (rows
of similar length share a group, so padding stays small and an out-of-memory error comes early):

- the group is left-padded to its longest prompt, with an attention mask and positions counted from each row's
  first real token. Full-attention layers mask the padding; Qwen3.5's linear-attention (gated delta-net) layers
  zero the padded positions' inputs at the prefill (transformers' ``apply_mask_to_padding_states``), so their
  recurrent state and conv window start from zeros exactly as at batch 1;
- every step picks each row's next token the way the batch-1 loops do (``reference._greedy``: argmax of the last
  logits; ``sampled_reference._sampled``: ``sampling.sample`` on that row's logits, in fp32 on the CPU, with the
  row's own generator seeded as there), so the tokens depend on the batch only through the forward's
  floating-point sums: token-identical in fp32 on the fixtures, while in bf16 a near-tie may flip;
- a row ends after its first stop token or at its limit; it is handed to ``on_row`` at once (the caller caches
  it: nothing finished is lost to a later error) and dropped from the batch (``Cache.reorder_cache``, the
  batch-dimension selection beam search uses on hybrid caches as well). Its slot is not refilled with the next
  row: a refill would prefill one row against a cache of another length, which hybrid caches (per-row conv
  windows, recurrent states, left-padded key/value) do not support; ``DecodeStats.idle_share`` measures what
  that leaves unused;
- a group of one row runs the batch-1 loops' very forward calls (no mask, default positions).

Out of memory (``torch.cuda.OutOfMemoryError``, or what ``is_out_of_memory`` says is one): the group's unfinished
rows go back to the queue, the batch halves and decoding goes on; at batch 1 the error is raised as a
``PayloadError``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from remote_payload.errors import PayloadError
from remote_payload.inputs.reference import forward, new_cache
from remote_payload.inputs.sampling import Sampling, generator, sample


@dataclass(frozen=True)
class Row:
    ids: tuple[int, ...]  # the prompt (or prompt + continuation, for a tail)
    limit: int  # at most this many new tokens
    stop: frozenset[int] = frozenset()  # ends after the first of these (empty: runs to the limit)
    seed: int | None = None  # a draw at T > 0: its generator's seed; None: greedy


@dataclass
class DecodeStats:
    """What a decode did: rows, tokens, time, and how full its groups stayed."""

    batch: int = 1  # the batch size it ended with (smaller than asked after an out-of-memory error)
    rows: int = 0
    tokens: int = 0  # new tokens decoded (a row lost to an out-of-memory error counts the ones it had)
    seconds: float = 0.0  # wall time of the groups (prefills included)
    groups: int = 0
    slot_steps: int = 0  # sum over decode steps of the group's starting size (what refilled slots could use)
    halvings: list = field(default_factory=list)  # batch sizes that ran out of memory
    group_started: float | None = field(default=None, repr=False)  # perf_counter of the running group's start

    def elapsed(self) -> float:
        """Seconds spent so far, the running group's included."""
        running = time.perf_counter() - self.group_started if self.group_started is not None else 0.0
        return self.seconds + running

    @property
    def tokens_per_s(self) -> float | None:
        seconds = self.elapsed()
        return self.tokens / seconds if seconds > 0 else None

    @property
    def idle_share(self) -> float | None:
        """The share of slot-steps no row used: a finished row's slot stays empty until its group ends."""
        return 1 - self.tokens / self.slot_steps if self.slot_steps else None

    def as_dict(self) -> dict:
        return {"batch": self.batch, "rows": self.rows, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "tokens_per_s": None if self.tokens_per_s is None else round(self.tokens_per_s, 2),
                "groups": self.groups, "idle_share": None if self.idle_share is None else round(self.idle_share, 4),
                "out_of_memory_at": list(self.halvings)}


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


# on_row(index of the row in ``rows``, its new tokens, seconds since its group started)
OnRow = Callable[[int, list, float], None]


def decode_rows(target, rows: Sequence[Row], batch: int, on_row: OnRow, sampling: Sampling | None = None,
                stats: DecodeStats | None = None,
                is_oom: Callable[[BaseException], bool] = is_out_of_memory) -> DecodeStats:
    """Decode every row, ``batch`` at a time; ``on_row`` gets each one as it ends. ``sampling``: the law of the
    rows that have a seed. ``stats`` (updated as rows end, so a caller's progress can read it) is returned."""
    if any(r.seed is not None for r in rows) and sampling is None:
        raise ValueError("rows with a seed need the sampling law")
    stats = stats or DecodeStats()
    stats.batch = max(1, int(batch))
    queue = sorted((i for i, r in enumerate(rows) if r.limit > 0), key=lambda i: -len(rows[i].ids))
    for i, r in enumerate(rows):
        if r.limit <= 0:
            on_row(i, [], 0.0)
            stats.rows += 1
    while queue:
        group, queue = queue[:stats.batch], queue[stats.batch:]
        done: set[int] = set()
        try:
            _decode_group(target, rows, group, sampling, stats, on_row, done)
        except BaseException as exc:
            if stats.group_started is not None:  # the failed group's time counts
                stats.seconds += time.perf_counter() - stats.group_started
                stats.group_started = None
            if not is_oom(exc):
                raise
            _release_memory(target)
            if stats.batch == 1:
                raise PayloadError(f"out of memory decoding one row ({len(rows[group[0]].ids)} prompt tokens + "
                                   f"{rows[group[0]].limit} new): the target does not fit beside its cache on this "
                                   "device") from None
            stats.halvings.append(stats.batch)
            stats.batch //= 2
            queue = [i for i in group if i not in done] + queue
    return stats


def _release_memory(target) -> None:
    import gc

    import torch

    gc.collect()
    if getattr(target, "device", None) == "cuda":
        torch.cuda.empty_cache()


def _decode_group(target, rows: Sequence[Row], group: list[int], sampling: Sampling | None, stats: DecodeStats,
                  on_row: OnRow, done: set) -> None:
    import torch

    model, device = target.model, target.input_device
    started = stats.group_started = time.perf_counter()
    n, width = len(group), max(len(rows[i].ids) for i in group)
    gens = {i: generator(seed) for i in group if (seed := rows[i].seed) is not None}
    outs: dict[int, list[int]] = {i: [] for i in group}
    active = list(group)  # the rows still decoding, in the batch's order
    padded = any(len(rows[i].ids) != width for i in group)
    with torch.inference_mode():
        cache = new_cache(model)
        x = torch.tensor([[0] * (width - len(rows[i].ids)) + list(rows[i].ids) for i in group], device=device)
        mask = positions = None
        if padded:  # left padding: masked, and each row's positions start at its first real token
            mask = torch.tensor([[0] * (width - len(rows[i].ids)) + [1] * len(rows[i].ids) for i in group],
                                device=device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
        while active:
            logits = _forward(model, x, cache, mask, positions)
            last = logits[:, -1]
            picks = _next_tokens(last, active, rows, sampling, gens)
            stats.tokens += len(active)
            stats.slot_steps += n
            keep: list[int] = []
            for slot, (i, tok) in enumerate(zip(active, picks, strict=True)):
                outs[i].append(tok)
                if tok in rows[i].stop or len(outs[i]) >= rows[i].limit:
                    on_row(i, outs[i], time.perf_counter() - started)
                    done.add(i)
                    stats.rows += 1
                else:
                    keep.append(slot)
            active = [active[s] for s in keep]
            if not active:
                break
            if len(keep) < len(picks):  # drop the finished rows from the batch and from the cache
                index = torch.tensor(keep, device=device)
                cache.reorder_cache(index)
                picks = [picks[s] for s in keep]
                if mask is not None and positions is not None:
                    mask, positions = mask[index], positions[index]
            x = torch.tensor([[t] for t in picks], device=device)
            if mask is not None and positions is not None:
                mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=-1)
                positions = positions[:, -1:] + 1
    stats.groups += 1
    stats.seconds += time.perf_counter() - started
    stats.group_started = None


def _forward(model, x, cache, mask, positions):
    """No mask (no padding): the batch-1 loops' own call."""
    return forward(model, x, cache=cache, logits_to_keep=1, attention_mask=mask, position_ids=positions).logits


def _next_tokens(last, active: list[int], rows: Sequence[Row], sampling: Sampling | None, gens: dict) -> list[int]:
    """Each active row's next token: argmax, or one draw from its own generator on its own logits (as
    ``sampling.sample`` draws at batch 1: a [1, V] row, moved to the CPU in fp32 first)."""
    import torch

    if all(rows[i].seed is None for i in active):
        return last.argmax(-1).tolist()
    assert sampling is not None  # decode_rows refuses seeded rows without their law
    host = last.detach().to("cpu", torch.float32)  # one transfer for the batch; the same values as per row
    out = []
    for slot, i in enumerate(active):
        row = host[slot:slot + 1]
        out.append(int(row[0].argmax()) if rows[i].seed is None else sample(row, sampling, gens[i])[0])
    return out
