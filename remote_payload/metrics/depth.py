"""τ by context depth: each round binned by its anchor's absolute position, with CIs over samples. Pure stdlib.

A round's depth is its anchor's absolute position in the sample: the prompt's tokens plus the continuation tokens
committed before the round (``Round.anchor``, as samples.jsonl stores it). That is the context the drafter sees when
it drafts the block, so a drafter whose sliding-window layers are run as full attention, or whose feature window is
capped, shows it here as τ falling from one bucket to the next.

Buckets. The standard layout is < 1k, 1k–4k, 4k–16k, 16k–64k, ≥ 64k (k = 1024 tokens). A run whose anchors span
fewer than ``MIN_STANDARD_BUCKETS`` of them (every short run: the fixtures' samples are tens to hundreds of tokens,
a benchmark at 2,048 new tokens spans two) is binned by powers of two instead, [2^j, 2^(j+1)), with everything
below 16 in one bucket: the power-of-two edges include the standard ones (1k = 2^10 … 64k = 2^16), so a finer
bucket always lies inside one standard bucket. The layout depends on the samples' token counts only (never on a
drafter's rounds), so every drafter of a run, and every shard of a merged run, is binned alike.

Figures per bucket (``DEFINITION``): over the samples with at least one round anchored in the bucket, τ macro =
mean over those samples of the sample's mean τ_round over its rounds in the bucket (the committed convention, as
the headline τ macro); τ micro = Σ τ_round / rounds in the bucket; p1 = P(round accepts ≥ 1 draft) over the
bucket's rounds. 95% percentile bootstrap CIs over the bucket's samples (at T > 0 over prompts, a prompt's draws
resampled together: ``sampled.clusters_of``), one set of resamples for the three figures (``stats.bootstrap_cis``).

At T > 0 the rounds binned are the teacher-forced replay on each drawn continuation under the greedy rule (the
drafter's argmax, accepted while equal to the draw): exact per draw, as at T = 0. Under the sampled rule a
continuation fixes no round boundaries (they are integrated out, ``eval/sampled_rule.py``), so no round has an
anchor to bin: the depth figures then walk the greedy rule's rounds, like the zlab-2604/vllm counts and DDTree,
and say so (``rule``).
"""

from __future__ import annotations

from typing import Sequence

from remote_payload.errors import PayloadError
from remote_payload.metrics.chain import Round
from remote_payload.metrics.sample_rounds import rounds_from_entry
from remote_payload.metrics.sampled import cluster_sums, clusters_of
from remote_payload.metrics.stats import bootstrap_cis

STANDARD_EDGES = (1024, 4096, 16384, 65536)
MIN_STANDARD_BUCKETS = 3
FINE_FLOOR = 16  # power-of-two layout: every anchor below it in one bucket
RESAMPLES = 2000
CONFIDENCE = 0.95

DEFINITION = ("τ by context depth: each round binned by its anchor's absolute position (prompt tokens + continuation "
              "tokens committed before the round); per bucket, over the samples with a round anchored there: τ macro = "
              "mean over those samples of the sample's mean τ_round in the bucket (committed convention), τ micro = "
              "Σ τ_round / rounds, p1 = P(round accepts ≥ 1 draft) over the bucket's rounds; 95% percentile bootstrap "
              "CIs over the bucket's samples (at T > 0 over prompts, a prompt's draws together)")
LAYOUT_RULE = ("standard buckets < 1k, 1k–4k, 4k–16k, 16k–64k, ≥ 64k (k = 1024 tokens) when the samples' anchors span "
               f"at least {MIN_STANDARD_BUCKETS} of them; else powers of two [2^j, 2^(j+1)) (below {FINE_FLOOR}: one "
               "bucket), which nest inside the standard ones")
GREEDY_ROUNDS = ("rounds of the greedy rule's teacher-forced replay on each sample (at T > 0 on each draw: exact per "
                 "draw)")
SAMPLED_RULE_ROUNDS = ("the sampled rule integrates the round boundaries out (no round has an anchor given the draw), "
                       "so these buckets walk the greedy rule's rounds on the same draws (like zlab-2604, vllm and "
                       "DDTree), not the sampled rule's headline τ")


def label(lo: int, hi: int | None) -> str:
    """'< 1k', '1k–4k', '≥ 64k', '32–64' (k = 1024 where the bound is a multiple of it)."""
    def text(n: int) -> str:
        return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)

    if lo == 0 and hi is not None:
        return f"< {text(hi)}"
    if hi is None:
        return f"≥ {text(lo)}"
    return f"{text(lo)}–{text(hi)}"


def _standard_index(position: int) -> int:
    return sum(1 for e in STANDARD_EDGES if position >= e)


def _fine_bounds(position: int) -> tuple[int, int]:
    if position < FINE_FLOOR:
        return 0, FINE_FLOOR
    lo = 1 << (position.bit_length() - 1)
    return lo, lo * 2


def layout(spans: Sequence[tuple[int, int]]) -> tuple[str, list[tuple[int, int | None]]]:
    """The run's buckets from each sample's anchor span (first anchor, last anchor): ("standard" | "power-of-two",
    [(lo, hi or None)]) in order, every bucket from the shallowest to the deepest anchor listed."""
    spans = [(a, b) for a, b in spans if b >= a]
    if not spans:
        return "standard", []
    used = {i for a, b in spans for i in range(_standard_index(a), _standard_index(b) + 1)}
    if len(used) >= MIN_STANDARD_BUCKETS:
        edges = (0, *STANDARD_EDGES)
        return "standard", [(edges[i], edges[i + 1] if i + 1 < len(edges) else None)
                            for i in range(min(used), max(used) + 1)]
    lo = _fine_bounds(min(a for a, _ in spans))[0]
    top = _fine_bounds(max(b for _, b in spans))[1]
    out: list[tuple[int, int | None]] = []
    while lo < top:
        hi = FINE_FLOOR if lo == 0 else lo * 2
        out.append((lo, hi))
        lo = hi
    return "power-of-two", out


def anchor_span(prompt_tokens: int, continuation_tokens: int) -> tuple[int, int]:
    """Where a sample's rounds can be anchored: from the first continuation token to the one before the last."""
    return prompt_tokens, prompt_tokens + continuation_tokens - 2


def bucket_figures(per_sample: Sequence[Sequence[Round]], spans: Sequence[tuple[int, int]],
                   clusters: Sequence[int] | None = None, *, seed: int = 0, resamples: int = RESAMPLES,
                   rule: str = "greedy") -> dict:
    """``metrics.by_context_depth`` of one drafter: its rounds per sample (in the samples' order), each sample's
    anchor span (``anchor_span``), and the sample's cluster (T > 0: its prompt; None: each sample alone)."""
    kind, buckets = layout(spans)
    clusters = list(clusters) if clusters is not None else list(range(len(per_sample)))
    out = []
    for lo, hi in buckets:
        rows, members = [], []
        for rounds, cluster in zip(per_sample, clusters, strict=True):
            inside = [r for r in rounds if r.anchor >= lo and (hi is None or r.anchor < hi)]
            if inside:
                produced = sum(r.produced for r in inside)
                rows.append([produced / len(inside), 1.0, float(produced), float(len(inside)),
                             float(sum(1 for r in inside if r.accepted >= 1))])
                members.append(cluster)
        out.append({"label": label(lo, hi), "lo": lo, "hi": hi, **_figures(rows, members, seed, resamples)})
    return {"layout": kind, "layout_rule": LAYOUT_RULE, "buckets": out,
            "rounds_binned": SAMPLED_RULE_ROUNDS if rule == "sampled" else GREEDY_ROUNDS, "rule": "greedy",
            "definition": DEFINITION,
            "ci": f"{CONFIDENCE:.0%} percentile bootstrap over the bucket's samples ({resamples} resamples, "
                  f"seed {seed})"}


def by_context_depth(lines: Sequence[dict], name: str, *, seed: int = 0, rule: str = "greedy") -> dict:
    """``bucket_figures`` of drafter ``name`` from the sample lines (samples.jsonl), each line's rounds checked as
    a complete replay (``sample_rounds.rounds_from_entry``)."""
    per_sample, spans = [], []
    for line in lines:
        sid = line.get("id", line.get("index"))
        entry = (line.get("drafters") or {}).get(name)
        pt, ct = line.get("prompt_tokens"), line.get("continuation_tokens")
        if not isinstance(entry, dict) or not isinstance(pt, int) or not isinstance(ct, int):
            raise PayloadError(f"sample {sid}: no rounds of drafter '{name}' or no integer 'prompt_tokens'/"
                               "'continuation_tokens' (τ by context depth needs both)")
        per_sample.append(rounds_from_entry(entry, pt, ct, f"sample {sid}, drafter '{name}'"))
        spans.append(anchor_span(pt, ct))
    return bucket_figures(per_sample, spans, clusters_of(lines), seed=seed, rule=rule)


def _ratios(tot: Sequence[float]) -> dict:
    return {"tau_macro": tot[0] / tot[1] if tot[1] else None, "tau_micro": tot[2] / tot[3] if tot[3] else None,
            "p1": tot[4] / tot[3] if tot[3] else None}


def _figures(rows: list[list[float]], clusters: list[int], seed: int, resamples: int) -> dict:
    """A bucket's figures with their CIs; ``rows``: per sample [its mean τ_round, 1, Σ τ_round, rounds, p1 hits]."""
    if not rows:
        return {"samples": 0, "rounds": 0, **{k: {"value": None, "ci": None} for k in ("tau_macro", "tau_micro", "p1")}}
    renumber = {c: j for j, c in enumerate(dict.fromkeys(clusters))}
    sums = cluster_sums(rows, [renumber[c] for c in clusters])
    point = _ratios([sum(col) for col in zip(*rows, strict=True)])

    def statistic(idx):
        tot = [0.0] * 5
        for i in idx:
            for j, v in enumerate(sums[i]):
                tot[j] += v
        return _ratios(tot)

    cis = bootstrap_cis(len(sums), statistic, resamples=resamples, confidence=CONFIDENCE, seed=seed)
    return {"samples": len(rows), "rounds": int(sum(r[3] for r in rows)),
            **{k: {"value": point[k], "ci": list(ci) if (ci := cis.get(k)) else None}
               for k in ("tau_macro", "tau_micro", "p1")}}
