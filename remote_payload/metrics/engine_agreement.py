"""Engine acceptance vs offline acceptance in the same (``vllm``) convention, with a stated tolerance.

vLLM counts per engine step: rounds, accepted drafts (every accepted draft, also past the end token), and
per position k the rounds accepting >= k drafts. The offline replay's ``vllm`` convention counts the same
quantities over the same rounds (interfaces §1), so on identical numerics they are equal round by round.

Why a tolerance and not equality: the engine runs its own implementation of the drafter (fused attention,
another summation order). Where the drafter's top-2 logits nearly tie, that flips a draft: the round
accepts one more or one fewer token, and every later round of that sample is anchored elsewhere. Such a
flip moves one sample's figures a little and the aggregates hardly at all (measured on the Qwen3 fixture,
12 prompts, fp32: 4 of 12 samples identical round by round, one sample 21 vs 19 rounds, micro τ 5.105 vs
5.146). So each sample's rounds are checked against 5 % + 1 and the ones outside are listed, and the verdict
is on the aggregates: rounds within the sum of those per-sample bounds, each position's acceptance rate p_k
within 0.08 absolute and micro τ within 0.15. Beyond that the two disagree for a reason worth a look
(another drafter config, features from other layers, a masked slot).

Pure Python: no torch; tests build the inputs by hand.
"""

from __future__ import annotations

from typing import Sequence

TOLERANCE = {"rounds_rel": 0.05, "rounds_abs": 1, "p_abs": 0.08, "tau_micro_abs": 0.15}
WHY = ("the engine runs its own implementation of the drafter: near-tie drafter logits (top-2 margins of a few "
       "hundredths) can flip a draft there, which shifts the rest of that sample's rounds; aggregates agree closely")


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


def rounds_bound(offline_rounds: int, tol: dict = TOLERANCE) -> float:
    return tol["rounds_rel"] * offline_rounds + tol["rounds_abs"]


def compare(ids: Sequence[str], engine: Sequence[dict], offline: Sequence[Sequence[int]], positions: int,
            tol: dict = TOLERANCE) -> dict:
    """Engine vs offline over the samples given (ids, engine counters, offline accepted per round, in order).

    ``positions``: drafts per round (num_speculative_tokens = block_size - 1). Returns both sides' figures,
    the differences, the samples outside the per-sample bound (listed in ``notes``: one flip can move a
    sample by two rounds), ``problems`` (aggregates beyond the tolerance, one line each) and
    ``within_tolerance`` (no problems).
    """
    if not (len(ids) == len(engine) == len(offline)):
        raise ValueError(f"compare: {len(ids)} ids, {len(engine)} engine and {len(offline)} offline samples")
    eng, off = engine_figures(engine, positions), figures(offline, positions)
    problems: list[str] = []
    identical, outside = 0, []
    for sid, e, o in zip(ids, engine, offline, strict=True):
        mine = sample_counts(o, positions)
        if e["rounds"] == mine["rounds"] and list(e["per_position_counts"])[:positions] == mine["per_position_counts"]:
            identical += 1
        if abs(e["rounds"] - mine["rounds"]) > rounds_bound(mine["rounds"], tol):
            outside.append({"id": sid, "engine_rounds": e["rounds"], "offline_rounds": mine["rounds"]})
    notes = [f"{len(outside)} sample(s) whose rounds differ by more than {tol['rounds_rel']:.0%} + "
             f"{tol['rounds_abs']}: " + ", ".join(f"{x['id']} ({x['engine_rounds']} vs {x['offline_rounds']})"
                                                  for x in outside[:5])] if outside else []
    bound = sum(rounds_bound(len(o), tol) for o in offline)
    if abs(eng["rounds"] - off["rounds"]) > bound:
        problems.append(f"rounds {eng['rounds']} vs {off['rounds']} (allowed ±{bound:.1f})")
    tau = _diff(eng["tau_micro"], off["tau_micro"])
    if tau is not None and abs(tau) > tol["tau_micro_abs"]:
        problems.append(f"τ micro {eng['tau_micro']:.3f} vs {off['tau_micro']:.3f} (allowed ±{tol['tau_micro_abs']})")
    per_position = []
    for pe, po in zip(eng["per_position"], off["per_position"], strict=True):
        d = _diff(pe["p"], po["p"])
        ok = d is None or abs(d) <= tol["p_abs"]
        per_position.append({"k": pe["k"], "engine": pe["p"], "offline": po["p"], "diff": d, "ok": ok})
        if not ok:
            problems.append(f"p{pe['k']} {pe['p']:.3f} vs {po['p']:.3f} (allowed ±{tol['p_abs']})")
    return {"engine": eng, "offline": off,
            "tau_micro_diff": tau, "tau_macro_diff": _diff(eng["tau_macro"], off["tau_macro"]),
            "per_position": per_position,
            "samples": {"compared": len(ids), "identical": identical, "outside_tolerance": outside},
            "tolerance": {**tol, "why": WHY}, "problems": problems, "notes": notes,
            "within_tolerance": not problems}


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
