"""An engine's server-wide speculative-decoding counters from its Prometheus ``/metrics`` page.

The names are vLLM's, behind the engine's prefix (``Engine.counters_prefix``, ``vllm:``); per engine step
(one draft + verify of one request = one "draft"):
- ``spec_decode_num_drafts_total``: rounds;
- ``spec_decode_num_draft_tokens_total``: drafted tokens (rounds x num_speculative_tokens);
- ``spec_decode_num_accepted_tokens_total``: accepted drafts (bonus tokens excluded);
- ``spec_decode_num_accepted_tokens_per_pos_total{position="i"}``: rounds whose draft at 0-based
  position i was accepted, i.e. rounds that accepted >= i+1 drafts;
- ``generation_tokens_total``: tokens generated (used to know a finished request is fully counted).
Counters carry ``model_name`` and ``engine`` labels; they are summed over engines. Acceptance is read per
request (the reply's own figures); the difference of two readings around a whole batch of requests is the
once-per-run cross-check that the per-request figures add up (engines.run.counter_check).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "generation_tokens_total"
_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) for every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


@dataclass
class SpecCounters:
    """One reading (or the difference of two) of the spec-decode counters, as integers."""
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)  # index i: rounds accepting >= i+1 drafts
    generated: int = 0
    spec_enabled: bool = False  # the page carries spec-decode counters at all

    def _combine(self, other: "SpecCounters", sign: int) -> "SpecCounters":
        n = max(len(self.per_position), len(other.per_position))
        mine = self.per_position + [0] * (n - len(self.per_position))
        theirs = other.per_position + [0] * (n - len(other.per_position))
        return SpecCounters(self.drafts + sign * other.drafts, self.draft_tokens + sign * other.draft_tokens,
                            self.accepted + sign * other.accepted,
                            [a + sign * b for a, b in zip(mine, theirs, strict=True)],
                            self.generated + sign * other.generated, self.spec_enabled or other.spec_enabled)

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        return self._combine(before, -1)

    def __add__(self, other: "SpecCounters") -> "SpecCounters":
        return self._combine(other, 1)

    def summary(self) -> dict:
        """vLLM's own convention: τ = 1 + accepted / drafts (micro), p_k = per-position count / drafts."""
        d = self.drafts
        return {"rounds": d, "drafts_proposed": self.draft_tokens, "drafts_accepted": self.accepted,
                "tau_micro": (1 + self.accepted / d) if d else None,
                "per_position": [{"k": i + 1, "accepted_ge_k": c, "eligible": d, "p": (c / d) if d else None}
                                 for i, c in enumerate(self.per_position)],
                "tokens_generated": self.generated}


def read_counters(text: str, prefix: str, model_name: str | None = None) -> SpecCounters:
    """The counters of one /metrics page under ``prefix`` (only the samples of ``model_name`` when given)."""
    c = SpecCounters()
    per_pos: dict[int, float] = {}
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, GENERATED: 0.0}
    for name, labels, value in parse_prometheus(text):
        if not name.startswith(prefix) or (model_name and labels.get("model_name", model_name) != model_name):
            continue
        short = name[len(prefix):]
        if short in totals:
            totals[short] += value
            c.spec_enabled = c.spec_enabled or short != GENERATED
        elif short == PER_POS and labels.get("position", "").isdigit():
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    c.drafts, c.draft_tokens = int(totals[DRAFTS]), int(totals[DRAFT_TOKENS])
    c.accepted, c.generated = int(totals[ACCEPTED]), int(totals[GENERATED])
    c.per_position = [int(per_pos.get(i, 0.0)) for i in range(max(per_pos) + 1)] if per_pos else []
    return c
