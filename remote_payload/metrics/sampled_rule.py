"""The draft rules at T > 0 and the summary of the sampled rule's per-response expectations. Pure stdlib.

Two rules verify a block at T > 0, and they give different τ, so every figure at T > 0 says which it follows:

- ``sampled`` (z-lab's current code): drafts drawn from the drafter's law q, accept d while u·q(d) < p(d), the
  first rejection emits from max(0, p − q). Its τ is computed exactly given each continuation
  (``eval/sampled_rule.py``): every per-sample entry holds expectations, not counts.
- ``greedy`` (z-lab's April code; vLLM's DFlash rule, which has no draft probabilities): the drafter's argmax,
  accepted while it equals the token the target draws. Its τ is the teacher-forced replay (``metrics.chain``).

At T = 0 both rules are the same greedy loop: the rule is recorded as ``NOT_APPLICABLE``.
"""

from __future__ import annotations

from typing import Sequence

RULES = ("greedy", "sampled")
DEFAULT = "sampled"
NOT_APPLICABLE = "n/a at T = 0"
DESCRIPTIONS = {
    "sampled": "sampled rule (z-lab's current code): drafts drawn from the drafter's law, accepted while "
               "u·q(d) < p(d), residual max(0, p − q) at the first rejection",
    "greedy": "greedy rule (z-lab's April code; vLLM's DFlash rule): the drafter's argmax, accepted while it "
              "equals the token the target draws",
    NOT_APPLICABLE: "T = 0: greedy drafts and greedy verification (the rule does not apply)",
}
GREEDY_WALKS = ("the zlab-2604/vllm convention counts and the DDTree figures walk the greedy rule's drafts (they have "
                "no sampled-rule form yet)")


def rule_of(temperature: float, draft_rule: str) -> str:
    """The rule a run's figures follow: ``draft_rule`` at T > 0, ``NOT_APPLICABLE`` at T = 0."""
    return draft_rule if temperature > 0 else NOT_APPLICABLE


def rule_summary(entries: Sequence[dict], block_size: int) -> dict:
    """The headline figures (``metrics.chain.summarize``'s keys) from per-response sampled-rule entries:
    τ macro = mean of E[produced/rounds | y]; τ micro = Σ produced / Σ E[rounds]; p_k = Σ E[hits_k] / Σ
    E[eligible_k]; the histogram holds expected round counts."""
    B, P = block_size, block_size - 1
    taus = [e["tau"] for e in entries if e.get("tau") is not None]
    produced = sum(e["produced"] for e in entries)
    rounds = sum(e["rounds"] for e in entries)
    hits = [sum(e["hits"][k] for e in entries) for k in range(P)]
    eligible = [sum(e["eligible"][k] for e in entries) for k in range(P)]
    hist = [sum(e["tau_histogram"][m] for e in entries) for m in range(B)]
    accepted = sum(e["accepted"] for e in entries)
    return {"tau_macro": sum(taus) / len(taus) if taus else None,
            "tau_micro": produced / rounds if rounds else None,
            "mean_accepted": accepted / rounds if rounds else None,
            "rounds": rounds, "samples": len(entries), "samples_with_rounds": len(taus),
            "tokens_produced": produced, "drafts_accepted": accepted, "drafts_proposed": rounds * P,
            "per_position": [{"k": k + 1, "accepted_ge_k": hits[k], "eligible": eligible[k],
                              "p": hits[k] / eligible[k] if eligible[k] else None} for k in range(P)],
            "tau_histogram": {str(m + 1): hist[m] for m in range(B)},
            "block_size": B,
            "max_check_error": max((e.get("check_error") or 0.0 for e in entries), default=None)}
