"""The online reference loop: real draft -> target verify -> accept, with exact cache rollback.

This is the cross-check of the offline path: its output must equal plain greedy decoding of the target,
and its per-round (anchor, accepted, produced) must equal the offline replay on the same prompt.

At T > 0 (``sampling``): z-lab's rule. The first token is drawn from the prefill's logits; each round the drafts
stay the drafter's argmax, the target's tokens at every block slot are drawn from the one verify forward (slot
order, one generator seeded with ``seed``), and the round accepts while draft == drawn token, the drawn token at
the first mismatch being the bonus. Each committed token is then drawn from the target's law given the tokens
before it (the drafts before it were accepted, so they are those tokens): the output is a draw of the target's
own sampling at T, and its rounds are the offline replay over that output. Per draw the online and offline
outputs differ (other random numbers); their τ have one law, which ``eval/sampled_check.py`` tests.

With ``draft_rule="sampled"`` (z-lab's current rule at T > 0): each slot's draft is drawn from the drafter's law q
(``slot_logprobs``: its logits processed like the target's), the target's law p at each slot comes from the verify
forward, draft d is accepted while u·q(d) < p(d) (u uniform), the first rejection emits a token from
max(0, p − q) normalised, and a block accepted whole adds a bonus drawn from p at its last slot. The first token
after the prompt is drawn from the target's law. All random numbers come from one generator seeded with ``seed``.
Its expectation is what ``eval/sampled_rule.py`` computes offline.

Rollback after a partially accepted block: full-attention KV caches can be cropped, but the recurrent
state of linear-attention (Gated DeltaNet) layers cannot — ``cache.crop()`` is refused, or with past
recording runs and leaves the state wrong. So for hybrid targets the cache is snapshotted (deep copy)
before verify, restored afterwards and the kept tokens are fed again ("snapshot"); targets with only
attention layers use ``crop``.

Two loop rules (``rule``), the same draft -> verify -> accept step:
- ``committed`` (dfo's, the default): stop once an end token or max_new tokens are committed; the last round
  is cut there, and counts only what it kept.
- ``zlab-2604`` (z-lab's ``dflash_generate`` benchmark loop of April 2026): rounds ``while anchor < prompt +
  max_new``; each round counts every accepted draft, past an end token too; stop after a round that committed an end
  token (the first token included). The output is the committed tokens cut at max_new and after the first end
  token. Its rounds are what the offline ``zlab-2604`` convention (``metrics/conventions.py``) must reproduce.
  (z-lab's loop since August 2026 counts as ``committed`` does.)
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.inputs.reference import forward, new_cache
from remote_payload.inputs.sampling import Sampling, generator, sample
from remote_payload.metrics.chain import Round
from remote_payload.models.target import Target

ROLLBACKS = ("auto", "snapshot", "crop")
RULES = ("committed", "zlab-2604")
DRAFT_RULES = ("greedy", "sampled")


@dataclass
class OnlineResult:
    prompt_len: int
    continuation: list[int]
    rounds: list[Round]
    stop_reason: str
    seconds: float
    target_forwards: int


def rollback_mode(target: Target, mode: str) -> str:
    if mode not in ROLLBACKS:
        raise PayloadError(f"rollback must be one of {', '.join(ROLLBACKS)}")
    if mode == "auto":
        return "snapshot" if target.config.has_linear_attention else "crop"
    return mode


class TargetSession:
    """The target's cache through the online loop: feed tokens, verify a block, keep a prefix of it.

    Forward hooks on the requested decoder layers keep the features of every *committed* position
    (what the drafter's context needs), in order.
    """

    def __init__(self, target: Target, mode: str, layer_ids=()):
        self.target, self.mode = target, rollback_mode(target, mode)
        self.model, self.dev = target.model, target.input_device
        self.cache = new_cache(self.model)
        if self.mode == "crop":
            self.cache.activate_past_recording()  # sliding-window layers keep what a crop must restore
        self.layer_ids = sorted(set(layer_ids))
        self.features: dict = {lid: [] for lid in self.layer_ids}
        self.forwards = 0
        self._last: dict = {}
        self._pending: tuple[Any, list[int], int] | None = None  # (snapshot, block, length before verify)
        self._handles = [target.layers[lid].register_forward_hook(self._hook(lid)) for lid in self.layer_ids]

    def _hook(self, lid):
        def fn(_m, _i, out):
            t = out[0] if isinstance(out, (tuple, list)) else out
            self._last[lid] = t[0].detach()
        return fn

    def close(self):
        for h in self._handles:
            h.remove()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def _forward(self, tokens, logits_to_keep=None):
        import torch

        self.forwards += 1
        return forward(self.model, torch.tensor([tokens], device=self.dev), cache=self.cache,
                       logits_to_keep=logits_to_keep).logits[0]

    def _keep_features(self, n: int):
        for lid in self.layer_ids:
            self.features[lid].append(self._last[lid][:n].to("cpu"))

    def feed(self, tokens, logits_to_keep=None):
        """Commit tokens (no rollback possible); returns their logits."""
        logits = self._forward(tokens, logits_to_keep)
        self._keep_features(len(tokens))
        return logits

    def verify(self, block) -> list[int]:
        """Run a draft block through the target; returns the target's argmax at every slot."""
        return self.verify_logits(block).argmax(-1).tolist()

    def verify_logits(self, block):
        """Run a draft block through the target; returns its logits at every slot ([len(block), V])."""
        snapshot = copy.deepcopy(self.cache) if self.mode == "snapshot" else None
        before = self.length
        logits = self._forward(block)
        self._pending = (snapshot, list(block), before)
        return logits

    def keep(self, kept: int) -> None:
        """Keep the first ``kept`` tokens of the last verified block in the cache, drop the rest."""
        assert self._pending is not None, "keep() follows verify_logits()"
        snapshot, block, before = self._pending
        self._pending = None
        if kept == len(block):
            self._keep_features(kept)  # everything verified stays: the cache is already right
            return
        if self.mode == "snapshot":
            self.cache = snapshot
            self.feed(block[:kept], logits_to_keep=1)
        else:
            self.cache.crop(-(self.length - (before + kept)))  # transformers 5: crop(-tokens_to_remove)
            self._keep_features(kept)

    def context(self, upto: int) -> dict:
        import torch

        return {lid: torch.cat(parts)[:upto] for lid, parts in self.features.items()}


def online_generate(target: Target, source, prompt_ids: list[int], max_new_tokens: int,
                    rollback: str = "auto", rule: str = "committed", sampling: Sampling | None = None,
                    seed: int = 0, draft_rule: str = "greedy") -> OnlineResult:
    """The loop; greedy, or with ``sampling`` at T > 0 the target's tokens drawn with ``seed`` (module doc).
    ``draft_rule="sampled"`` (T > 0 only): sampled drafts verified by rejection sampling."""
    import torch

    if rule not in RULES:
        raise PayloadError(f"online loop rule must be one of {', '.join(RULES)}")
    if draft_rule not in DRAFT_RULES:
        raise PayloadError(f"draft rule must be one of {', '.join(DRAFT_RULES)}")
    drawn = sampling is not None and not sampling.greedy
    rejection = drawn and draft_rule == "sampled"
    gen = generator(seed) if drawn else None

    def targets(logits) -> list[int]:  # the target's token at each row: drawn at T > 0, else its argmax
        return sample(logits, sampling, gen) if drawn and sampling is not None else logits.argmax(-1).tolist()

    stop = set(target.stop_ids)
    B, P = source.block_size, len(prompt_ids)
    start = time.perf_counter()
    session = TargetSession(target, rollback, getattr(getattr(source, "spec", None), "fc_layer_ids", []))
    rounds: list[Round] = []
    try:
        with torch.inference_mode():
            logits = session.feed(list(prompt_ids), logits_to_keep=1)
            committed = list(prompt_ids) + targets(logits[-1:])
            while _another_round(rule, committed, P, max_new_tokens, stop):
                a = len(committed) - 1  # anchor: the last committed token, not yet fed to the target
                ctx = source.prepare(session.context(a))
                if rejection and sampling is not None and gen is not None:
                    raw, new = _rejection_round(source, ctx, session, committed, a, sampling, gen)
                else:
                    ids, _ = source.draft(ctx, committed, [a], topk=1)
                    drafts = ids[0, :, 0].tolist()
                    post = targets(session.verify_logits([committed[a]] + drafts))
                    raw = 0
                    while raw < B - 1 and drafts[raw] == post[raw]:
                        raw += 1
                    new = drafts[:raw] + [post[raw]]  # accepted drafts + the target's bonus token
                if rule == "committed":
                    new = _cut(new, stop, max_new_tokens - (len(committed) - P))
                accepted = min(raw, len(new))
                rounds.append(Round(a, accepted, len(new), -1))
                committed.extend(new)
                if _finished(rule, committed, P, max_new_tokens, stop):
                    break
                session.keep(accepted + 1)  # the anchor and the accepted drafts stay in the cache
    finally:
        session.close()
    cont = _cut(committed[P:], stop, max_new_tokens)
    last = P + len(cont) - 1
    # remaining: tokens after the anchor in the kept output (zlab-2604 rounds may reach past it: at least their own)
    rounds = [Round(r.anchor, r.accepted, r.produced, max(last - r.anchor, r.produced)) for r in rounds]
    reason = "eos" if cont and cont[-1] in stop else "max_new_tokens"
    return OnlineResult(P, cont, rounds, reason, time.perf_counter() - start, session.forwards)


def _rejection_round(source, ctx, session: TargetSession, committed: list[int], a: int, sampling: Sampling,
                     gen) -> tuple[int, list[int]]:
    """One sampled-rule round at anchor ``a``: (drafts accepted, tokens it emits)."""
    import torch

    from remote_payload.inputs.sampling import probabilities

    drafts, q = source.draw_block(ctx, committed, a, sampling, gen)  # q [B-1, V]: each draft's law
    p = probabilities(session.verify_logits([committed[a]] + drafts), sampling)  # [B, V]
    for j, d in enumerate(drafts):
        u = float(torch.rand(1, generator=gen))
        if not u * float(q[j, d]) < float(p[j, d]):
            resid = (p[j] - q[j]).clamp(min=0)
            law = resid if float(resid.sum()) > 0 else p[j]  # p == q: a rejection has probability 0
            return j, drafts[:j] + [int(torch.multinomial(law, 1, generator=gen))]
    return len(drafts), drafts + [int(torch.multinomial(p[-1], 1, generator=gen))]


def _cut(tokens: list[int], stop: set, limit: int) -> list[int]:
    """``tokens`` up to and including the first end token, at most ``limit`` of them."""
    end = next((i for i, t in enumerate(tokens) if t in stop), None)
    return (tokens if end is None else tokens[:end + 1])[:limit]


def _another_round(rule: str, committed: list[int], P: int, max_new: int, stop: set) -> bool:
    if rule == "zlab-2604":  # z-lab in April 2026: while anchor < prompt + max_new; the end-token check after a round
        return len(committed) - 1 < P + max_new
    return committed[-1] not in stop and len(committed) - P < max_new


def _finished(rule: str, committed: list[int], P: int, max_new: int, stop: set) -> bool:
    if rule == "zlab-2604":
        return any(t in stop for t in committed[P:]) or len(committed) - 1 >= P + max_new
    return committed[-1] in stop or len(committed) - P >= max_new
