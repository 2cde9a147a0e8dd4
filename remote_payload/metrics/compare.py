"""Side-by-side comparison of drafters evaluated on the same samples (``results["comparison"]``). Pure stdlib.

Every drafter of one eval saw the same prompts, the same reference continuations and the same cached
target features, so per-sample differences are paired. For each drafter b after the baseline a (the
first drafter), ``delta = metric(b) − metric(a)`` for τ macro, τ micro, DDTree-k (top-k depth τ macro)
and each per-position acceptance p_k, each with a percentile bootstrap CI over samples: a resample draws
samples with replacement and keeps each sample's rounds together (the unit τ macro averages over); all
statistics of a pair are computed on the same resamples. The controller imports this module: keep it free
of torch.

At T > 0 the lines are draws (several per prompt, all drafters measured on the same draw: paired by prompt and
seed); a resample then draws prompts and keeps each one's draws together (``metrics.sampled``'s cluster
bootstrap), since draws of one prompt are not independent.

Input: the per-sample lines of samples.jsonl (see README "samples.jsonl"); per drafter it reads the chain
rounds (``anchors``/``accepted``/``produced``) and, when present, the top-k tree rounds under
``tree.topk``. Rounds are rebuilt and checked by ``sample_rounds.rounds_from_entry``; stored ``tau`` values
are not trusted.
"""

from __future__ import annotations

from operator import add
from typing import Any, Collection, Mapping, Sequence

from remote_payload.errors import PayloadError
from remote_payload.metrics.chain import sample_tau
from remote_payload.metrics.sample_rounds import rounds_from_entry
from remote_payload.metrics.sampled import cluster_sums, clusters_of
from remote_payload.metrics.stats import bootstrap_cis

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


def _definition(resamples: int, confidence: float, seed: int) -> str:
    return ("delta = metric(b) − metric(a), b each drafter after the baseline a, over the samples with at least "
            "one round (the same for every drafter: rounds depend only on the continuation length). τ macro "
            "and DDTree-k deltas = mean over samples of the per-sample difference (paired); τ micro and p_k "
            "deltas = difference of pooled ratios (Σ τ_round / rounds; Σ rounds accepting >= k / eligible "
            f"rounds). CI: {confidence:.0%} percentile bootstrap over samples (a sample's rounds stay "
            f"together), {resamples} resamples, seed {seed}, the same resamples for every statistic of a pair; "
            "a CI that excludes 0 marks a difference larger than the sample-to-sample noise.")


class _Drafter:
    """One drafter's per-sample figures, in sample order."""

    def __init__(self, name: str, lines: Sequence[dict], block_size: int):
        self.name, self.block_size = name, block_size
        P = block_size - 1
        self.tau: list[float | None] = []
        self.produced: list[int] = []
        self.rounds: list[int] = []
        self.hits: list[list[int]] = []
        self.eligible: list[list[int]] = []
        self.tree_tau: list[float | None] = []
        self.tree_k: set = set()
        for line in lines:
            sid = line.get("id", line.get("index"))
            entry = (line.get("drafters") or {}).get(name)
            if entry is None:
                raise PayloadError(f"samples.jsonl: sample {sid} has no results for drafter '{name}' "
                                   f"(drafters there: {', '.join(line.get('drafters') or {}) or 'none'})")
            pt, ct = _token_counts(line, sid)
            rounds = rounds_from_entry(entry, pt, ct, f"samples.jsonl sample {sid}, drafter '{name}'")
            self.tau.append(sample_tau(rounds))
            self.produced.append(sum(r.produced for r in rounds))
            self.rounds.append(len(rounds))
            self.hits.append([sum(1 for r in rounds if r.accepted >= k) for k in range(1, P + 1)])
            self.eligible.append([sum(1 for r in rounds if min(P, r.remaining) >= k) for k in range(1, P + 1)])
            topk = ((entry.get("tree") or {}).get("topk"))
            if topk is None:
                self.tree_tau.append(None)
            else:
                self.tree_k.add(topk.get("k"))
                where = f"samples.jsonl sample {sid}, drafter '{name}', tree.topk"
                tree_rounds = rounds_from_entry(topk, pt, ct, where)
                self.tree_tau.append(sample_tau(tree_rounds))


def _token_counts(line: dict, sid) -> tuple[int, int]:
    try:
        pt, ct = int(line["prompt_tokens"]), int(line["continuation_tokens"])
    except (KeyError, TypeError, ValueError):
        raise PayloadError(f"samples.jsonl: sample {sid} lacks integer 'prompt_tokens'/'continuation_tokens'") from None
    return pt, ct


def _classify(ci) -> str | None:
    if ci is None:
        return None
    return "higher" if ci[0] > 0 else "lower" if ci[1] < 0 else "unclear"


def _verdict(a: str, b: str, tau_ci, ddtree_ci, k) -> str:
    tau = _classify(tau_ci)
    if tau is None:
        return "too few samples for a confidence interval"
    text = {"higher": f"{b} accepts more than {a}: τ macro CI excludes 0",
            "lower": f"{b} accepts less than {a}: τ macro CI excludes 0",
            "unclear": f"no clear τ macro difference between {b} and {a} (CI includes 0)"}[tau]
    tree = _classify(ddtree_ci)
    if tree is not None and tree != tau:
        text += {"higher": f"; DDTree-{k}: {b} higher (CI excludes 0)",
                 "lower": f"; DDTree-{k}: {b} lower (CI excludes 0)",
                 "unclear": f"; DDTree-{k}: no clear difference"}[tree]
    return text


def _gain(a: float | None, b: float | None) -> float:
    """b - a on a sample both drafters measured (the only ones _pair uses)."""
    assert a is not None and b is not None
    return b - a


TREE_NOT_DEFINED_NOTE = "DDTree is not defined for DFlash2 ({names}): no tree figures are compared"


def _tree_note(da: _Drafter, db: _Drafter, tree_k: set, not_defined: Collection[str]) -> str:
    """Why a pair has no DDTree difference: a DFlash2 drafter by name, else what is missing."""
    dflash2 = [d.name for d in (da, db) if d.name in not_defined]
    if dflash2:
        return TREE_NOT_DEFINED_NOTE.format(names=" and ".join(f"drafter '{n}'" for n in dflash2))
    return "tree metrics use different k for the two drafters" if len(tree_k) > 1 else \
        "no per-sample tree metrics for both drafters"


def _pair(da: _Drafter, db: _Drafter, *, resamples: int, confidence: float, seed: int,
          clusters: list[int] | None = None, tree_not_defined: Collection[str] = ()) -> dict:
    used = [i for i in range(len(da.tau)) if da.tau[i] is not None and db.tau[i] is not None]
    n = len(used)
    P = min(da.block_size, db.block_size) - 1
    tree_k = da.tree_k | db.tree_k
    have_tree = n > 0 and len(tree_k) == 1 and all(
        da.tree_tau[i] is not None and db.tree_tau[i] is not None for i in used)
    # One row of additive per-sample figures; a resample's statistics are ratios of its column sums.
    rows = [[_gain(da.tau[i], db.tau[i]), da.produced[i], da.rounds[i], db.produced[i], db.rounds[i],
             _gain(da.tree_tau[i], db.tree_tau[i]) if have_tree else 0.0,
             *da.hits[i][:P], *da.eligible[i][:P], *db.hits[i][:P], *db.eligible[i][:P]] for i in used]
    counts = [1] * len(rows)
    if clusters is not None:  # T > 0: a prompt's draws resampled together (their sums, and how many)
        kept = [clusters[i] for i in used]
        renumber = {c: j for j, c in enumerate(dict.fromkeys(kept))}
        rows = cluster_sums([[*row, 1.0] for row in rows], [renumber[c] for c in kept])
        counts = [int(row.pop()) for row in rows]

    def statistic(idx):
        tot = [0.0] * (6 + 4 * P)
        for i in idx:
            tot = list(map(add, tot, rows[i]))
        m = sum(counts[i] for i in idx)
        out = {"tau_macro": tot[0] / m if m else None,
               "tau_micro": (tot[3] / tot[4] - tot[1] / tot[2]) if m and tot[2] and tot[4] else None,
               "ddtree": tot[5] / m if m and have_tree else None}
        for j in range(P):
            ha, ea, hb, eb = (tot[6 + j], tot[6 + P + j], tot[6 + 2 * P + j], tot[6 + 3 * P + j])
            out[f"p{j + 1}"] = hb / eb - ha / ea if ea and eb else None
        return out

    point = statistic(list(range(len(rows))))
    cis = bootstrap_cis(len(rows), statistic, resamples=resamples, confidence=confidence, seed=seed) if n else {}

    def stat(name, a_val=None, b_val=None):
        ci = cis.get(name)
        d = {"delta": point[name], "ci": list(ci) if ci else None}
        if a_val is not None or b_val is not None:
            d.update(a=a_val, b=b_val)
        return d

    def mean_of(values):
        return sum(values) / len(values) if values else None

    k = next(iter(tree_k)) if len(tree_k) == 1 else None
    pair = {
        "a": da.name, "b": db.name, "samples": n,
        "tau_macro": stat("tau_macro", mean_of([da.tau[i] for i in used]), mean_of([db.tau[i] for i in used])),
        "tau_micro": stat("tau_micro",
                          sum(da.produced[i] for i in used) / sum(da.rounds[i] for i in used) if n else None,
                          sum(db.produced[i] for i in used) / sum(db.rounds[i] for i in used) if n else None),
        "ddtree": {"k": k, **(stat("ddtree", mean_of([da.tree_tau[i] for i in used]),
                                   mean_of([db.tree_tau[i] for i in used])) if have_tree else
                              {"delta": None, "ci": None,
                               "note": _tree_note(da, db, tree_k, tree_not_defined)})},
        "per_position": [{"k": j + 1, **stat(f"p{j + 1}")} for j in range(P)],
    }
    pair["verdict"] = _verdict(da.name, db.name, cis.get("tau_macro"), cis.get("ddtree"), k)
    return pair


def compare_drafters(sample_lines: Sequence[dict], drafter_names: Sequence[str] | None = None, *,
                     block_sizes: Mapping[str, int], resamples: int = DEFAULT_RESAMPLES,
                     confidence: float = DEFAULT_CONFIDENCE, seed: int = 0,
                     tree_not_defined: Collection[str] = ()) -> dict:
    """The comparison block: baseline = the first drafter, one pair per other drafter.

    ``tree_not_defined``: the drafters (DFlash2) whose results say DDTree is not defined for them; a pair with one
    names it instead of "no per-sample tree metrics".

    ``drafter_names`` defaults to the drafters of the first line, in order; ``block_sizes`` gives each
    drafter's block size (per-position acceptance needs B to know which rounds could reach depth k).
    """
    if drafter_names is None:
        drafter_names = list((sample_lines[0].get("drafters") or {}) if sample_lines else [])
    names = list(drafter_names)
    if not names:
        raise PayloadError("comparison: no drafters to compare")
    missing = [n for n in names if n not in block_sizes]
    if missing:
        raise PayloadError(f"comparison: no block size for drafter(s) {', '.join(missing)}")
    if not 0 < confidence < 1 or resamples < 1:
        raise PayloadError(f"comparison: need 0 < confidence < 1 and resamples >= 1 (got {confidence}, {resamples})")
    per = {n: _Drafter(n, sample_lines, int(block_sizes[n])) for n in names}
    base = names[0]
    clusters = clusters_of(sample_lines)
    grouped = len(set(clusters)) < len(clusters)  # draws at T > 0 (a greedy run's lines are their own clusters)
    out: dict[str, Any] = {
        "baseline": base, "drafters": names, "confidence": confidence, "resamples": resamples, "seed": seed,
        "pairs": [_pair(per[base], per[b], resamples=resamples, confidence=confidence, seed=seed,
                        clusters=clusters if grouped else None, tree_not_defined=tree_not_defined)
                  for b in names[1:]],
        "definition": _definition(resamples, confidence, seed)}
    if grouped:
        out["definition"] += (" At T > 0: the samples are draws, every drafter measured on the same draws (paired by "
                              "prompt and seed); a resample draws prompts and keeps each one's draws together.")
    return out
