"""Engine acceptance vs offline acceptance in the same (``vllm``) convention, with a tolerance from the counts.

vLLM counts per engine step: rounds, accepted drafts (every accepted draft, also past the end token), and
per position k the rounds accepting >= k drafts. The offline replay's ``vllm`` convention counts the same
quantities over the same rounds (``conventions.py``), so on identical numerics they are equal round by round.

Why a tolerance and not equality: the engine runs its own implementation of the drafter (fused attention,
another summation order). Where the drafter's top-2 logits nearly tie, that flips a draft: the round
accepts one more or one fewer token, and every later round of that sample is anchored elsewhere. How much
that moves a figure depends on how many rounds were measured (one round of 45 moves micro τ by ~0.1, one
of 1000 by ~0.005), so the tolerance is a bound computed from the counts, not a constant.

The rule. Null model: both sides run the same drafter over the same text (only samples whose engine output
equals the reference are compared). A sample with no flip is equal round by round: it adds the same counts
to both sides and no difference. A flip changes one round and re-anchors the rest of that sample; from
there on each side's rounds are draws from the same per-round acceptance process (same drafter, same
text), just not the same draws. So the figures are tested on the rounds of the *differing* samples only
(engine counters != offline counts), as two samples from one process:

- p_k (rounds accepting >= k / rounds), x_e of n_e engine rounds vs x_o of n_o offline rounds: the
  two-sample binomial bound |x_e/n_e - x_o/n_o| <= z·sqrt(p(1-p)(1/n_e + 1/n_o)), p pooled with add-one
  smoothing, p = (x_e + x_o + 1) / (n_e + n_o + 2), so an observed p of 0 or 1 never gives a zero-width bound.
- micro τ (1 + mean accepted drafts per round): both histograms of accepted per round are exact, the
  offline side has every round and the engine's counters give #rounds accepting exactly j = c_j - c_{j+1}.
  |mean_e - mean_o| <= z·s·sqrt(1/n_e + 1/n_o), s² the pooled within-side variance with two pseudo-rounds,
  at 0 and at P drafts (the add-one smoothing of a count bounded by 0..P: never a zero variance).
- z: one overall false-alarm rate ``ALPHA`` (0.01) over the P + 1 figures tested, split by Bonferroni: each
  figure two-sided at ALPHA / (P + 1) (z = 3.23 for P = 7). The figures are correlated, so the split is
  conservative.

The bound is wider than the flip noise, for two reasons it leaves in on purpose: a differing sample's rounds
before its first flip are equal on both sides yet counted as independent draws, and after a flip the two
sides often fall back into step (same text, same drafter), so their rounds are positively correlated. A
real fault (features from other layers, a masked slot, another drafter config) moves every round of every
sample, so it still stands far outside. Measured: simulated under the null with nothing shared (each flip at
a sample's first round) 0.3-0.7 % of 1000 runs false-alarm at 4 to 48 prompts, with the flip anywhere none;
on the engine fixture (tests/engine/test_agreement_rule.py, 12 prompts x 96 tokens) real-drafter flips
stay within 0.6 of their bound, target layer ids off by one read τ 1.61 vs 4.52 (bound ±0.47).

Whole-run figures: the identical samples add the same counts to both sides, so the whole-run difference is
the differing rounds' difference times their share of the rounds, share = (n_e + n_o) / (R_e + R_o) (exact
when n_e = n_o, to first order otherwise). Each figure's ``bound`` is the differing rounds' bound times that
share, in the whole-run figure's units; the verdict is the test on the differing rounds (``differing``
holds its figures, and a problem line quotes both).

Rounds: every round commits its accepted drafts + 1 token and both sides commit the same tokens, so per
sample rounds + accepted = tokens + e, 0 <= e <= P (a last round's drafts past the end count in full).
Rounds are tokens / τ: testing them adds nothing to the τ test. Their bound is the τ bound carried through
that tie, |ΔR| <= (n·b_τ + P·d) / τ (d differing samples, n their rounds per side, τ their pooled micro τ,
b_τ the τ bound); it is checked all the same, for counters that do not add up (a request counted twice
keeps τ and p_k and doubles the rounds). Per sample, rounds beyond 5 % + 1 are listed in ``notes`` (one
flip can move a sample by two rounds): information, not the verdict.

Fed per request: the engine figures are each reply's own (vLLM's ``metrics.speculative_decoding``,
SGLang's ``meta_info``), not counter differences, so they hold at any concurrency. Where the engine also
lists each round's accepted drafts (vLLM's ``per_step_accepted``), ``per_step_differences`` names the
samples whose sequence is not the offline one, with the first round that differs: information beside the
verdict (a near-tie flip is a differing sample the rule allows).

Pure Python: no torch; tests build the inputs by hand.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

ALPHA = 0.01  # overall false-alarm rate of the verdict, over all figures tested
SAMPLE_NOTE = {"rounds_rel": 0.05, "rounds_abs": 1}  # per-sample rounds beyond this are listed in notes
RULE = ("two-sample bounds on the rounds of the samples that differ (identical samples add no difference): "
        "p_k binomial with add-one smoothing, micro τ on the pooled per-round variance, at one overall "
        "false-alarm rate split over the figures tested; rounds through their tie with τ (same tokens)")
WHY = ("the engine runs its own implementation of the drafter: near-tie drafter logits (top-2 margins of a few "
       "hundredths) can flip a draft there, which re-anchors the rest of that sample's rounds; how far that moves "
       "a figure depends on how many rounds differ")


def figures(accepted_per_sample: Sequence[Sequence[int]], positions: int) -> dict:
    """vLLM-style counts from per-round accepted drafts: rounds, accepted, per-position counts, τ micro/macro."""
    rounds = sum(len(a) for a in accepted_per_sample)
    acc = sum(sum(a) for a in accepted_per_sample)
    counts = [sum(1 for a in accepted_per_sample for x in a if x >= k) for k in range(1, positions + 1)]
    return _summary(rounds, acc, counts, [(len(a), sum(a)) for a in accepted_per_sample])


def engine_figures(samples: Sequence[dict], positions: int) -> dict:
    """The same from per-request engine counters: each {"rounds", "drafts_accepted", "per_position_counts"}."""
    counts = [0] * positions
    for s in samples:
        for i, c in enumerate(list(s["per_position_counts"])[:positions]):
            counts[i] += c
    return _summary(sum(s["rounds"] for s in samples), sum(s["drafts_accepted"] for s in samples), counts,
                    [(s["rounds"], s["drafts_accepted"]) for s in samples])


def _summary(rounds: int, accepted: int, counts: list[int], per_sample: list[tuple[int, int]]) -> dict:
    macro = [1 + a / r for r, a in per_sample if r]
    return {"rounds": rounds, "drafts_accepted": accepted,
            "tau_micro": 1 + accepted / rounds if rounds else None,
            "tau_macro": sum(macro) / len(macro) if macro else None,
            "per_position": [{"k": k, "accepted_ge_k": c, "p": c / rounds if rounds else None}
                             for k, c in enumerate(counts, 1)]}


def sample_counts(accepted: Sequence[int], positions: int) -> dict:
    """One sample's offline rounds in the engine's per-request shape."""
    return {"rounds": len(accepted), "drafts_accepted": sum(accepted),
            "per_position_counts": [sum(1 for x in accepted if x >= k) for k in range(1, positions + 1)]}


def rounds_bound(offline_rounds: int, note: dict = SAMPLE_NOTE) -> float:
    """The per-sample rounds difference beyond which a sample is listed in the notes."""
    return note["rounds_rel"] * offline_rounds + note["rounds_abs"]


def z_value(figures_tested: int, alpha: float = ALPHA) -> float:
    """Two-sided normal quantile for one figure when ``alpha`` is split evenly over ``figures_tested``."""
    return NormalDist().inv_cdf(1 - alpha / (2 * figures_tested))


def histogram(sample: dict, positions: int) -> list[int]:
    """#rounds accepting exactly j drafts, j = 0..P, from per-request counters (c_k = rounds accepting >= k)."""
    c = [sample["rounds"], *_counts(sample, positions), 0]
    return [c[j] - c[j + 1] for j in range(positions + 1)]


def _counts(sample: dict, positions: int) -> list[int]:
    return (list(sample["per_position_counts"]) + [0] * positions)[:positions]


def _inconsistent(sample: dict, positions: int) -> str | None:
    """Why an engine sample's counters cannot be one request's rounds (None when they can).

    Raises ValueError for counters that are not whole numbers (the figures may come from another host).
    """
    values = [sample.get("rounds"), sample.get("drafts_accepted"), *list(sample.get("per_position_counts") or [])]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"engine counters of sample {_short(sample.get('id', '?'))} are not whole numbers: "
                         f"rounds {_short(sample.get('rounds'))}, drafts_accepted "
                         f"{_short(sample.get('drafts_accepted'))}, per_position_counts "
                         f"{_short(sample.get('per_position_counts'))}")
    if len(sample.get("per_position_counts") or []) > positions and any(sample["per_position_counts"][positions:]):
        return f"counts beyond position {positions}"
    if any(h < 0 for h in histogram(sample, positions)):
        return f"per-position counts {_counts(sample, positions)} do not fall from the {sample['rounds']} rounds down"
    if sum(_counts(sample, positions)) != sample["drafts_accepted"]:
        return f"{sample['drafts_accepted']} accepted drafts but per-position counts summing to " \
               f"{sum(_counts(sample, positions))}"
    return None


def _short(value, limit: int = 60) -> str:
    """repr of a value for an error message, cut short (the figures may come from another host)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _offline_histogram(accepted: Sequence[int], positions: int) -> list[int]:
    h = [0] * (positions + 1)
    for a in accepted:
        if not (isinstance(a, int) and not isinstance(a, bool) and 0 <= a <= positions):
            raise ValueError(f"offline round accepting {_short(a)} drafts: expected a whole number 0..{positions}")
        h[a] += 1
    return h


def _mean_ss(h: Sequence[int]) -> tuple[int, float, float]:
    """(rounds, mean accepted, sum of squared deviations) of a histogram of accepted drafts per round."""
    n = sum(h)
    mean = sum(j * c for j, c in enumerate(h)) / n if n else 0.0
    return n, mean, sum(c * (j - mean) ** 2 for j, c in enumerate(h))


def differing_bounds(eng_hist: Sequence[int], off_hist: Sequence[int], z: float) -> dict:
    """The tests on the differing rounds: per position k and micro τ, each side's figure and the bound.

    ``eng_hist``/``off_hist``: #rounds accepting exactly j drafts, j = 0..P, summed over the differing samples
    (both sides need rounds).
    """
    positions = len(eng_hist) - 1
    n_e, mean_e, ss_e = _mean_ss(eng_hist)
    n_o, mean_o, ss_o = _mean_ss(off_hist)
    inv = 1 / n_e + 1 / n_o
    per_position = []
    for k in range(1, positions + 1):
        x_e, x_o = sum(eng_hist[k:]), sum(off_hist[k:])
        p = (x_e + x_o + 1) / (n_e + n_o + 2)
        per_position.append({"k": k, "engine": x_e / n_e, "offline": x_o / n_o, "diff": x_e / n_e - x_o / n_o,
                             "bound": z * math.sqrt(p * (1 - p) * inv)})
    grand = (mean_e * n_e + mean_o * n_o) / (n_e + n_o)
    var = (ss_e + ss_o + grand ** 2 + (positions - grand) ** 2) / (n_e + n_o)
    tau = {"engine": 1 + mean_e, "offline": 1 + mean_o, "diff": mean_e - mean_o, "bound": z * math.sqrt(var * inv)}
    return {"rounds": [n_e, n_o], "tau_micro": tau, "tau_pooled": 1 + grand, "per_position": per_position}


def compare(ids: Sequence[str], engine: Sequence[dict], offline: Sequence[Sequence[int]], positions: int,
            alpha: float = ALPHA) -> dict:
    """Engine vs offline over the samples given (ids, engine counters, offline accepted per round, in order).

    ``positions``: drafts per round (num_speculative_tokens = block_size - 1). Returns both sides' whole-run
    figures; per figure (``tau_micro``, ``rounds``, each of ``per_position``) the difference, its ``bound``
    (whole-run units) and ``ok``, with the differing rounds' own figures under ``differing``; ``samples``
    (compared, identical, differing, the ones outside 5 % + 1 rounds), ``tolerance`` (the rule, alpha, z, the
    differing rounds and their share), ``problems`` (figures beyond their bound, one line each), ``notes`` and
    ``within_tolerance`` (no problems). Raises ValueError for counts that are not whole numbers.
    """
    if not (len(ids) == len(engine) == len(offline)):
        raise ValueError(f"compare: {len(ids)} ids, {len(engine)} engine and {len(offline)} offline samples")
    if positions < 1:
        raise ValueError(f"compare: {positions} drafts per round; expected at least 1")
    problems: list[str] = []
    identical, differing, outside = 0, [], []
    eng_hist, off_hist = [0] * (positions + 1), [0] * (positions + 1)
    for sid, e, o in zip(ids, engine, offline, strict=True):
        oh = _offline_histogram(o, positions)
        why = _inconsistent(e, positions)
        if why:
            problems.append(f"sample {sid}: engine counters inconsistent ({why})")
            continue
        mine = sample_counts(o, positions)
        if e["rounds"] == mine["rounds"] and _counts(e, positions) == mine["per_position_counts"]:
            identical += 1
            continue
        differing.append(sid)
        eng_hist = [a + b for a, b in zip(eng_hist, histogram(e, positions), strict=True)]
        off_hist = [a + b for a, b in zip(off_hist, oh, strict=True)]
        if abs(e["rounds"] - mine["rounds"]) > rounds_bound(mine["rounds"]):
            outside.append({"id": sid, "engine_rounds": e["rounds"], "offline_rounds": mine["rounds"]})
    eng, off = engine_figures(engine, positions), figures(offline, positions)
    z = z_value(positions + 1, alpha)
    n_e, n_o = sum(eng_hist), sum(off_hist)
    sub = differing_bounds(eng_hist, off_hist, z) if n_e and n_o else None
    if differing and not sub:
        side, other = ("engine", n_o) if not n_e else ("offline side", n_e)
        problems.append(f"the {side} counted no rounds in the {len(differing)} differing sample(s), the other "
                        f"side {other}")
    share = (n_e + n_o) / (eng["rounds"] + off["rounds"]) if eng["rounds"] + off["rounds"] else 0.0

    def check(name: str, e_val, o_val, sub_fig: dict | None) -> dict:
        """One figure: tested on the differing rounds; without them it must not differ at all."""
        diff = _diff(e_val, o_val)
        if sub_fig is None:  # all identical (or no test possible: reported above)
            return {"engine": e_val, "offline": o_val, "diff": diff, "bound": 0.0, "ok": not differing and not diff,
                    "differing": None}
        ok = abs(sub_fig["diff"]) <= sub_fig["bound"]
        bound = sub_fig["bound"] * share
        if not ok:
            line = f"{name} {e_val:.3f} vs {o_val:.3f} (±{bound:.3f})"
            if identical:  # the test is on the differing samples' rounds: quote them too
                line += (f"; on the {n_e}/{n_o} rounds of the {len(differing)} differing sample(s) "
                         f"{sub_fig['engine']:.3f} vs {sub_fig['offline']:.3f} (±{sub_fig['bound']:.3f})")
            problems.append(line)
        return {"engine": e_val, "offline": o_val, "diff": diff, "bound": bound, "ok": ok, "differing": sub_fig}

    tau = check("τ micro", eng["tau_micro"], off["tau_micro"], sub and sub["tau_micro"])
    per_position = [{"k": pe["k"], **check(f"p{pe['k']}", pe["p"], po["p"], sub and sub["per_position"][i])}
                    for i, (pe, po) in enumerate(zip(eng["per_position"], off["per_position"], strict=True))]
    rounds = _rounds_check(eng["rounds"], off["rounds"], sub, len(differing), positions)
    if sub and not rounds["ok"]:
        why = "" if not tau["ok"] else ", while τ agrees: the counters do not add up to the same output tokens"
        problems.append(f"rounds {eng['rounds']} vs {off['rounds']} (±{rounds['bound']:.1f}, the τ bound carried "
                        f"through rounds = tokens / τ{why})")
    notes = [f"{len(outside)} sample(s) whose rounds differ by more than {SAMPLE_NOTE['rounds_rel']:.0%} + "
             f"{SAMPLE_NOTE['rounds_abs']}: " + ", ".join(f"{x['id']} ({x['engine_rounds']} vs {x['offline_rounds']})"
                                                          for x in outside[:5])] if outside else []
    return {"engine": eng, "offline": off,
            "tau_micro_diff": tau["diff"], "tau_macro_diff": _diff(eng["tau_macro"], off["tau_macro"]),
            "tau_micro": tau, "rounds": rounds, "per_position": per_position,
            "samples": {"compared": len(ids), "identical": identical, "differing": len(differing),
                        "outside_tolerance": outside},
            "tolerance": {"rule": RULE, "alpha": alpha, "figures_tested": positions + 1, "z": z,
                          "differing_rounds": [n_e, n_o], "share": share, "sample_note": SAMPLE_NOTE, "why": WHY},
            "problems": problems, "notes": notes, "within_tolerance": not problems}


def per_step_differences(ids: Sequence[str], engine_steps: Sequence[Sequence[int] | None],
                         offline: Sequence[Sequence[int]]) -> dict:
    """Each sample's per-round accepted drafts, engine vs offline (samples whose engine gave none are skipped):
    ``compared``, ``equal`` and ``differ`` ({id, first_round, engine_rounds, offline_rounds}, in order)."""
    pairs = [(sid, list(e), list(o)) for sid, e, o in zip(ids, engine_steps, offline, strict=True) if e is not None]
    differ = [{"id": sid, "first_round": next((i for i, (a, b) in enumerate(zip(e, o, strict=False)) if a != b),
                                              min(len(e), len(o))),
               "engine_rounds": len(e), "offline_rounds": len(o)} for sid, e, o in pairs if e != o]
    return {"available": bool(pairs), "compared": len(pairs), "equal": len(pairs) - len(differ), "differ": differ}


def _rounds_check(e_rounds: int, o_rounds: int, sub: dict | None, differing: int, positions: int) -> dict:
    """Rounds against the τ bound carried through rounds + accepted = tokens + e (0 <= e <= P per sample)."""
    diff = e_rounds - o_rounds
    if sub is None:
        return {"engine": e_rounds, "offline": o_rounds, "diff": diff, "bound": 0.0, "ok": not differing and not diff}
    n = sum(sub["rounds"]) / 2
    bound = (n * sub["tau_micro"]["bound"] + positions * differing) / sub["tau_pooled"]
    return {"engine": e_rounds, "offline": o_rounds, "diff": diff, "bound": bound, "ok": abs(diff) <= bound}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
