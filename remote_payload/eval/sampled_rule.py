"""τ under the sampled rule (z-lab's current loop at T > 0), exact in expectation given each continuation.

The rule: each slot's draft is drawn from the drafter's law q (its logits processed like the target's), the
target accepts draft d while u·q(d) < p(d), emits a token from max(0, p − q) (normalised) at the first rejection,
and a bonus from p when every draft is accepted. It is lossless, so the output y is a draw of the target's own
sampling and dfo keeps drawing y from the target (``inputs/sampled_reference.py``). Given y the round boundaries
are random: a token of y came from an accepted draft or from a residual draw. They are integrated out.

For anchor a (a position of y, relative to the first continuation token y_0, which the prefill emits) and slot j
the drafter's law q_{a,j} depends on y_0..y_a only, and the target's p_t on y_{<t}: one teacher-forced pass each
(the drafter at every anchor, batched; the target once). The probability that a round at a emits exactly
y_{a+1..a+m} is

    e(a, m) = Π_{j<m} min(p, q_{a,j})(y_{a+j}) · max(0, p − q_{a,m})(y_{a+m})      m ≤ B−1
    e(a, B) = Π_{j<B} min(p, q_{a,j})(y_{a+j}) · p(y_{a+B})                        (all accepted, bonus)

(the rejection's normaliser Σ max(0, p − q) = 1 − Σ min(p, q) is the probability of rejecting, so it cancels);
the round that reaches y's last token is cut there and its last factor is p(y_end) (accepted or residual, the
slot emits y_end with probability p). A forward pass over positions, carrying the round count, gives the
distribution of the number of rounds R given y; forward × backward gives each round's posterior, hence the
expected histogram and per-position acceptance. Σ over segmentations is Π_{t≥1} p_t(y_t): checked on every
response (``TOLERANCE``, log space). With one-hot q (greedy drafts) exactly one segmentation survives: the
teacher-forced replay of the greedy rule, so one estimator serves both rules.

Everything runs in float64 log space. Memory: the drafter's [anchors, B−1, V] laws exist one chunk of anchors
at a time (``CHUNK_BYTES``) and are reduced on their device to three scalars per (anchor, slot): q(y), p(y) and
Σ min(p, q) (the expected acceptance of the slot under the drafter's own draws).

The drafter side is one method every draft source implements (DFlash: ``models/drafter.py``)::

    slot_logprobs(ctx, tokens, anchors, sampling) -> FloatTensor [len(anchors), B-1, V]   (log q, -inf off support)

q_{a,j} is the law slot j's draft is drawn from when the drafts before it were accepted, i.e. equal to
y_{a+1..a+j-1}: a drafter whose slot law depends on the previous draft (a selector walk) gives it along ``tokens``.
The online loop draws blocks with the sibling ``draw_block`` (``eval/online.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from remote_payload.errors import PayloadError
from remote_payload.inputs.reference import forward
from remote_payload.inputs.sampling import Sampling, processed
from remote_payload.models.target import Target

TOLERANCE = 1e-6  # |log Σ_segmentations − log p(y)| allowed per response (float64 DP; float32 laws)
CHUNK_BYTES = {"cpu": 1 << 28, "cuda": 1 << 31}  # per chunk of anchors: the drafter's laws and the target rows
RULES = ("greedy", "sampled")


class TargetLaw:
    """The target's processed law p_t at every continuation position from one teacher-forced pass: the final
    hidden states are kept ([L, H]); the [n, V] rows are made on demand (never [L, V] at once)."""

    def __init__(self, target: Target, tokens: Sequence[int], prompt_len: int, sampling: Sampling):
        norm = getattr(target.model.get_decoder(), "norm", None)
        if norm is None:
            raise PayloadError("the target has no final norm to read its hidden states from")
        kept: list[torch.Tensor] = []
        handle = norm.register_forward_hook(lambda _m, _i, out: kept.append(out[0] if isinstance(out, tuple) else out))
        try:
            with torch.inference_mode():
                forward(target.model, torch.tensor([list(tokens)], device=target.input_device), logits_to_keep=1)
        finally:
            handle.remove()
        # row t predicts y_t = tokens[prompt_len + t]: the hidden state one position before it
        self.hidden = kept[-1][0, prompt_len - 1:len(tokens) - 1].detach()
        self.head = target.model.get_output_embeddings()
        self.sampling = sampling
        self.y = torch.tensor(list(tokens[prompt_len:]), dtype=torch.long)

    def probs(self, rows: torch.Tensor) -> torch.Tensor:
        """[n, V] processed probabilities of continuation positions ``rows`` (float32, the head's device)."""
        h = self.hidden[rows.to(self.hidden.device)]
        with torch.inference_mode():
            return processed(self.head(h.to(self.head.weight.device)), self.sampling)


@dataclass
class SlotScalars:
    """Per response (L continuation tokens, anchors 0..L-2, slots 1..B-1), float64 on the CPU."""

    log_p: torch.Tensor  # [L]: log p_t(y_t)
    log_q: torch.Tensor  # [L-1, B-1]: log q_{a,j}(y_{a+j}); -inf where a + j > L - 1
    overlap: torch.Tensor  # [L-1, B-1]: Σ_v min(p_{a+j}, q_{a,j})(v); nan where a + j > L - 1

    @property
    def block_size(self) -> int:
        return self.log_q.shape[1] + 1


def slot_scalars(source, ctx, tokens: Sequence[int], prompt_len: int, law: TargetLaw,
                 sampling: Sampling) -> SlotScalars:
    """The three per-(anchor, slot) scalars from ``source.slot_logprobs``, one chunk of anchors at a time."""
    L, B1 = len(tokens) - prompt_len, source.block_size - 1
    y = law.y
    log_p = torch.empty(L, dtype=torch.float64)
    budget = CHUNK_BYTES["cuda" if law.head.weight.device.type == "cuda" else "cpu"]
    step = max(1, budget // (4 * max(1, law.head.weight.shape[0])))
    for s in range(0, L, step):
        rows = torch.arange(s, min(L, s + step))
        p = law.probs(rows)
        log_p[rows] = p.gather(1, y[rows, None].to(p.device))[:, 0].double().log().cpu()
    log_q = torch.full((max(L - 1, 0), B1), float("-inf"), dtype=torch.float64)
    overlap = torch.full((max(L - 1, 0), B1), float("nan"), dtype=torch.float64)
    V = law.head.weight.shape[0]
    g = max(1, budget // (16 * B1 * V))  # q, p, their minimum and exp(q) alive at once
    for s in range(0, L - 1, g):
        rel = torch.arange(s, min(L - 1, s + g))
        lq = source.slot_logprobs(ctx, tokens, (rel + prompt_len).tolist(), sampling)  # [g, B-1, V]
        pos = rel[:, None] + torch.arange(1, B1 + 1)[None]  # [g, B-1] position each slot predicts
        valid = pos <= L - 1
        posc = pos.clamp(max=L - 1)
        p = law.probs(posc.reshape(-1)).view(len(rel), B1, -1).to(lq.device)
        q_y = lq.gather(2, y[posc][..., None].to(lq.device))[..., 0].double().cpu()
        over = torch.minimum(p, lq.exp()).sum(-1).double().cpu()
        log_q[rel] = q_y.masked_fill(~valid, float("-inf"))
        overlap[rel] = over.masked_fill(~valid, float("nan"))
    return SlotScalars(log_p, log_q, overlap)


def greedy_scalars(log_p: torch.Tensor, drafts: torch.Tensor, y: torch.Tensor) -> SlotScalars:
    """The greedy rule's scalars: q is one-hot at the draft (``drafts`` [L-1, B-1] top-1 ids, anchors 0..L-2)."""
    L, B1 = log_p.shape[0], drafts.shape[1]
    pos = torch.arange(max(L - 1, 0))[:, None] + torch.arange(1, B1 + 1)[None]
    valid = pos <= L - 1
    hit = (drafts == y[pos.clamp(max=L - 1)]) & valid
    log_q = torch.where(hit, 0.0, float("-inf")).double()
    overlap = torch.where(valid, log_p[pos.clamp(max=L - 1)].exp().where(hit, 0.0), float("nan")).double()
    return SlotScalars(log_p.double(), log_q, overlap)


# --------------------------------------------------------------------------------------------- the DP


def round_log_probs(sc: SlotScalars) -> tuple[torch.Tensor, torch.Tensor]:
    """log e(a, m) [L-1, B] (m = 1..B in column m-1; -inf past the end) and, for the round that ends at y's last
    token, the share of p(y_end) that is an accepted draft (min(p, q)/p) [L-1] (0 where none)."""
    L, B = sc.log_p.shape[0], sc.block_size
    A = L - 1
    log_min = torch.minimum(sc.log_q, sc.log_p[_slot_pos(A, B)])  # log min(p, q)(y), -inf past the end
    p_y = sc.log_p[_slot_pos(A, B)].exp()
    resid = (p_y - sc.log_q.exp()).clamp(min=0.0)
    log_resid = resid.log()
    cum = torch.cat([torch.zeros(A, 1, dtype=torch.float64), log_min.cumsum(1)], dim=1)  # [A, B]: Σ_{j<m}
    log_e = torch.full((A, B), float("-inf"), dtype=torch.float64)
    log_e[:, :B - 1] = cum[:, :B - 1] + log_resid
    bonus = sc.log_p[_slot_pos(A, B + 1)[:, -1]]  # p(y_{a+B}), clamped past the end (masked below)
    log_e[:, B - 1] = cum[:, B - 1] + bonus
    r = L - 1 - torch.arange(A)  # tokens left after each anchor
    m = torch.arange(1, B + 1)[None]
    log_e = log_e.masked_fill(m > r[:, None], float("-inf"))
    ends = r <= B  # the anchors whose round can reach the end: cut there, last factor p(y_end)
    end_share = torch.zeros(A, dtype=torch.float64)
    if ends.any():
        a = torch.nonzero(ends)[:, 0]
        ra = r[a]
        log_e[a, ra - 1] = cum[a, ra - 1] + sc.log_p[L - 1]
        inside = ra <= B - 1  # the last token sits on a draft slot (else it is the bonus)
        share = (log_min[a, (ra - 1).clamp(max=B - 2)] - sc.log_p[L - 1]).exp()
        end_share[a] = torch.where(inside, share, torch.zeros_like(share))
    return log_e, end_share


def _slot_pos(A: int, B: int) -> torch.Tensor:
    """[A, B-1] position each slot j = 1..B-1 of anchor a predicts, clamped to the last (A)."""
    return (torch.arange(A)[:, None] + torch.arange(1, B)[None]).clamp(max=A)


@dataclass
class Segmentation:
    """The round structure given y, integrated: what the per-response figures are made of."""

    log_total: float  # log Σ over segmentations
    log_target: float  # log Π_{t>=1} p_t(y_t)
    round_count: list[float]  # P(R = r | y), r = 0..L-1
    posterior: torch.Tensor  # [L-1, B] P(a round at a produces m | y)
    end_share: torch.Tensor  # [L-1]

    @property
    def error(self) -> float:
        return abs(self.log_total - self.log_target) if math.isfinite(self.log_total) else math.inf


def segment(sc: SlotScalars) -> Segmentation:
    """Forward (position × round count) and backward passes over y (module doc)."""
    L, B = sc.log_p.shape[0], sc.block_size
    log_target = float(sc.log_p[1:].sum())
    if L < 2:
        return Segmentation(0.0, log_target, [1.0], torch.zeros(0, B, dtype=torch.float64),
                            torch.zeros(0, dtype=torch.float64))
    log_e, end_share = round_log_probs(sc)
    ninf = float("-inf")
    alpha = torch.full((L,), ninf, dtype=torch.float64)
    alpha[0] = 0.0
    counts = torch.full((L, L), ninf, dtype=torch.float64)  # [position, rounds]: log P(reach t in r rounds)
    counts[0, 0] = 0.0
    for t in range(1, L):
        lo = max(0, t - B)
        src = torch.arange(lo, t)
        e = log_e[src, t - src - 1]  # [k]
        alpha[t] = torch.logsumexp(alpha[src] + e, 0)
        shifted = counts[src, :-1] + e[:, None]  # one more round
        counts[t, 1:] = torch.logsumexp(shifted, 0)
    beta = torch.full((L,), ninf, dtype=torch.float64)
    beta[L - 1] = 0.0
    for a in range(L - 2, -1, -1):
        hi = min(L - 1, a + B)
        dst = torch.arange(a + 1, hi + 1)
        beta[a] = torch.logsumexp(log_e[a, dst - a - 1] + beta[dst], 0)
    log_total = float(alpha[L - 1])
    A = L - 1
    dst = (torch.arange(A)[:, None] + torch.arange(1, B + 1)[None]).clamp(max=L - 1)
    posterior = (alpha[:A, None] + log_e + beta[dst] - log_total).exp()
    dist = (counts[L - 1] - log_total).exp().tolist()
    return Segmentation(log_total, log_target, dist, posterior, end_share)


def response_figures(seg: Segmentation, block_size: int) -> dict:
    """One response's additive figures, as expectations given y: τ = E[produced / rounds], the expected
    rounds, the expected histogram and per-position hits/eligible counts (metrics.sampled_rule sums them)."""
    B, L = block_size, len(seg.round_count)
    produced = L - 1
    dist = seg.round_count
    tau = sum(pr * produced / r for r, pr in enumerate(dist) if r > 0 and pr > 0) if produced else None
    tau_var = (max(0.0, sum(pr * (produced / r) ** 2 for r, pr in enumerate(dist) if r > 0 and pr > 0) - tau * tau)
               if tau is not None else None)  # Var(produced / R | y): what one loop run adds around tau
    post = seg.posterior
    A = post.shape[0]
    r_left = (L - 1 - torch.arange(A)).double()
    m = torch.arange(1, B + 1, dtype=torch.float64)[None].expand(A, B)
    accepted = torch.minimum(m - 1, torch.tensor(B - 1.0)).clone()  # residual at m (<B): m-1; bonus: B-1
    ends = torch.isclose(m, r_left[:, None])
    start = post.sum(1)
    hits, eligible = [], []
    at_end, r_end, share = post[ends], r_left[ends.any(1)], seg.end_share[ends.any(1)]
    acc_hi = torch.minimum(r_end, torch.tensor(B - 1.0))  # the end round, its last token an accepted draft
    acc_lo = torch.minimum(r_end - 1, torch.tensor(B - 1.0))  # … or a residual draw (the bonus: both B - 1)
    expected_accepted = float((post * accepted * ~ends).sum()
                              + (at_end * (share * acc_hi + (1 - share) * acc_lo)).sum())
    for k in range(1, B):
        plain = (post * ((accepted >= k) & ~ends)).sum()
        end_hits = (at_end * (share * (acc_hi >= k) + (1 - share) * (acc_lo >= k))).sum()
        hits.append(float(plain + end_hits))
        eligible.append(float((start * (torch.minimum(r_left, torch.tensor(B - 1.0)) >= k)).sum()))
    histogram = [float(post[:, i].sum()) for i in range(B)]
    return {"tau": tau, "tau_var": tau_var, "produced": produced,
            "rounds": float(sum(r * pr for r, pr in enumerate(dist))),
            "accepted": expected_accepted,
            "round_count": dist, "hits": hits, "eligible": eligible, "tau_histogram": histogram,
            "log_total": seg.log_total, "log_target": seg.log_target, "check_error": seg.error,
            "check_ok": seg.error <= TOLERANCE}


def estimate(sc: SlotScalars, where: str = "response") -> dict:
    """``response_figures`` of one response; a failed total-probability check raises (it means a bug or
    inconsistent laws, never a figure to report)."""
    seg = segment(sc)
    if not math.isfinite(seg.log_target):
        t = int(torch.nonzero(~torch.isfinite(sc.log_p[1:]))[0, 0]) + 1
        raise PayloadError(f"{where}: continuation token {t} has probability 0 under the target's law at this "
                           "temperature, top-k and top-p on this host, so no round structure can produce it (a "
                           "continuation drawn elsewhere, e.g. by a server whose numerics put that token outside "
                           "the nucleus here): draw the references with this host's target, or use --draft-rule "
                           "greedy")
    if seg.error > TOLERANCE:
        raise PayloadError(f"{where}: the segmentations' total probability log {seg.log_total:.9g} differs from the "
                           f"target's log p(y) {seg.log_target:.9g} by {seg.error:.3g} (tolerance {TOLERANCE:g}): "
                           "the drafter's and the target's laws are not aligned with the continuation")
    return response_figures(seg, sc.block_size)


def sample_entry(target: Target, source, features: dict, tokens: Sequence[int], prompt_len: int,
                 sampling: Sampling, where: str) -> dict:
    """One sample's sampled-rule entry (samples.jsonl ``drafters.NAME.sampled_rule``): the expectations given its
    continuation, the round count's distribution summarised, and the check's error."""
    law = TargetLaw(target, tokens, prompt_len, sampling)
    sc = slot_scalars(source, source.prepare(features), tokens, prompt_len, law, sampling)
    fig = estimate(sc, where)
    dist = fig.pop("round_count")
    mean = fig["rounds"]
    fig["rounds_sd"] = math.sqrt(max(0.0, sum(r * r * p for r, p in enumerate(dist)) - mean * mean))
    means = torch.nanmean(sc.overlap, 0).tolist() if sc.overlap.numel() else []
    fig["slot_overlap"] = [None if math.isnan(x) else round(x, 6) for x in means]  # mean Σ min(p, q) per slot
    return {k: (round(v, 12) if isinstance(v, float) else v) for k, v in fig.items()}
