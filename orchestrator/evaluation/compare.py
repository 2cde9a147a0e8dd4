"""`dfo runs compare A B`: the same drafters across two runs, paired by prompt id (pure).

The paired Δτ is in the committed convention (the headline τ, = zlab: z-lab's loop since August 2026); the
zlab-2604 τ (z-lab's April 2026 loop; macro, paired the same way) and the vllm τ (micro) of both runs ride along
where the runs have them. A run written before results schema ``dfo.results/2`` reads its old ``zlab`` figures
as ``zlab-2604`` (``Run.results``/``Run.samples``), so an old run and a new one compare like with like. Runs on
benchmark datasets are also paired per dataset (``by_dataset``): a drafter's Δτ on gsm8k is never mixed with its
Δτ on mt-bench.

At T > 0 a run's lines are draws (several per prompt, each with its seed): they are paired by prompt, each side's
τ being the mean over that prompt's draws, so the bootstrap over prompts carries the draws' noise; where both runs
drew with the same law and seed the draws are the same continuations (the noise cancels further), which the notes
say. A greedy run's prompt pairs with the same prompt of a sampled one (Δτ is then the temperature's effect).

Two runs at T > 0 under different draft rules (``settings.draft_rule``; a run from before the option followed the
greedy rule) measure different things: ``compare_runs`` refuses them unless ``across_rules`` is given, and then
says so in the notes.
"""

from __future__ import annotations

from orchestrator.core.errors import InputError
from orchestrator.evaluation.report import HEADLINE, SHOWN, convention_figure, digest_value
from orchestrator.evaluation.report_values import _obj, _real
from orchestrator.evaluation.runs import Run
from remote_payload.metrics.stats import bootstrap_mean_ci, mean, verdict

# Settings that make two runs' numbers incomparable when they differ (sampling: absent in a greedy run).
_SETTINGS = ("enable_thinking", "max_new_tokens", "dtype", "prompts", "sampling")


def _per_sample_tau(samples: list[dict], drafter: str, convention: str = HEADLINE) -> dict[str, float]:
    """τ per prompt: a line's own (greedy), or at T > 0 the mean over the prompt's draws (keyed by its prompt id)."""
    groups: dict[str, list[float]] = {}
    for s in samples:
        tau = _line_tau(_obj(s), drafter, convention)
        if tau is None:
            continue
        prompt = _obj(s).get("prompt_id")
        key = str(prompt) if prompt is not None and isinstance(_obj(s).get("draw"), int) else str(_obj(s).get("id"))
        groups.setdefault(key, []).append(tau)
    return {k: sum(v) / len(v) for k, v in groups.items()}


def _line_tau(s: dict, drafter: str, convention: str) -> float | None:
    entry = _obj(_obj(s.get("drafters")).get(drafter))
    if convention == HEADLINE:
        return _real(entry.get("tau"))
    produced = _obj(_obj(entry.get("conventions")).get(convention)).get("produced")
    values = [_real(x) for x in produced] if isinstance(produced, list) else []
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _draws_note(ra: dict, rb: dict, sa: list[dict], sb: list[dict]) -> list[str]:
    """At T > 0: whether the two runs drew the same continuations (same law and seeds) or independent ones."""
    la, lb = _obj(_obj(ra.get("settings")).get("sampling")), _obj(_obj(rb.get("settings")).get("sampling"))
    if not la and not lb:
        return []
    seeds_a = {(str(_obj(s).get("prompt_id")), _obj(s).get("draw")): _obj(s).get("seed") for s in sa}
    seeds_b = {(str(_obj(s).get("prompt_id")), _obj(s).get("draw")): _obj(s).get("seed") for s in sb}
    common = [k for k in seeds_a if k in seeds_b]
    same = sum(1 for k in common if seeds_a[k] is not None and seeds_a[k] == seeds_b[k])
    law_a = {k: la.get(k) for k in ("temperature", "top_p", "top_k")}
    law_b = {k: lb.get(k) for k in ("temperature", "top_p", "top_k")}
    if la and lb and law_a == law_b and same:
        return [f"paired by prompt and seed: {same} draw(s) share their seed and law in both runs (the same "
                "continuations where the targets agree); each prompt's τ is the mean over its draws"]
    return ["paired by prompt: each prompt's τ is the mean over its draws, and the runs' draws are independent "
            "(other law or seeds), so their sampling noise adds to the CI"]


def _of_dataset(samples: list[dict], dataset: str) -> list[dict]:
    return [s for s in samples if _obj(s).get("dataset") == dataset]


def _datasets(samples: list[dict]) -> list[str]:
    return list(dict.fromkeys(d for s in samples if isinstance(d := _obj(s).get("dataset"), str)))


def _by_dataset(sa: list[dict], sb: list[dict], name: str) -> dict:
    """Per dataset both runs hold: the committed and zlab-2604 Δτ macro, paired by sample id inside the dataset."""
    in_b = _datasets(sb)
    out = {}
    for dataset in [d for d in _datasets(sa) if d in in_b]:
        da, db = _of_dataset(sa, dataset), _of_dataset(sb, dataset)
        ta, tb = _per_sample_tau(da, name), _per_sample_tau(db, name)
        out[dataset] = {"tau_a": mean(list(ta.values())), "tau_b": mean(list(tb.values())), **_paired(ta, tb),
                        "zlab-2604": _paired(_per_sample_tau(da, name, "zlab-2604"),
                                             _per_sample_tau(db, name, "zlab-2604"))}
    return out


def dataset_lines(report: dict) -> list[str]:
    """The per-dataset pairs as lines under the table (drafter, dataset, Δτ with CI, pairs, verdict)."""
    lines = []
    for row in report.get("drafters") or []:
        for dataset, d in (row.get("by_dataset") or {}).items():
            ci = d.get("ci")
            april = d.get("zlab-2604") or {}
            lines.append(f"{row['drafter']} on {dataset}: τ {_num(d.get('tau_a'))} → {_num(d.get('tau_b'))}, "
                         f"Δ {_num(d.get('delta'), '+.2f')}" + (f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else "")
                         + f" over {d.get('paired_samples')} pairs ({d.get('verdict')}); zlab-2604 Δ "
                         f"{_num(april.get('delta'), '+.2f')}")
        e = row.get("engine")
        if isinstance(e, dict):
            ci = e.get("ci")
            side = "{engine} {version}, K {k}, runner {model_runner}"
            lines.append(f"{row['drafter']} in the engine (A: {side.format(**e['a'])}; B: {side.format(**e['b'])}): "
                         f"per-request acceptance Δ {_num(e.get('delta'), '+.3f')}"
                         + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "")
                         + f" over {e.get('paired_samples')} pairs: {e.get('verdict')}")
            lines += [f"{row['drafter']}: {n}" for n in e.get("notes") or []]
    return lines


def _num(x, spec: str = ".2f") -> str:
    return format(x, spec) if _real(x) is not None else "–"


def _drafters(results: dict) -> dict[str, dict]:
    """A run's drafters whose entries are objects (results.json came from a host: any shape is possible)."""
    return {str(n): d for n, d in _obj(results.get("drafters")).items() if isinstance(d, dict)}


def _metrics(results: dict, name: str) -> dict:
    return _obj(_drafters(results).get(name, {}).get("metrics"))


def _paired(per_a: dict[str, float], per_b: dict[str, float]) -> dict:
    common = sorted(set(per_a) & set(per_b))
    diffs = [per_b[i] - per_a[i] for i in common]
    ci = bootstrap_mean_ci(diffs)
    return {"paired_samples": len(common), "delta": mean(diffs) if diffs else None, "ci": list(ci) if ci else None,
            "verdict": verdict(ci) if diffs else "no prompt in common"}


def _conventions(ra: dict, rb: dict, sa: list[dict], sb: list[dict], name: str) -> dict:
    """zlab-2604 and vllm figures of both runs ({"a", "b"}, each None when missing) and zlab-2604's paired Δ."""
    out = {}
    for conv, key in SHOWN.items():
        fa = convention_figure(_metrics(ra, name), conv)
        fb = convention_figure(_metrics(rb, name), conv)
        out[conv] = {"figure": key, "a": fa["value"], "b": fb["value"], "exact": [fa["exact"], fb["exact"]],
                     "unavailable": [fa["reason"], fb["reason"]]}
        if key == "tau_macro" and fa["value"] is not None and fb["value"] is not None:
            out[conv].update(_paired(_per_sample_tau(sa, name, conv), _per_sample_tau(sb, name, conv)))
    return out


def _dataset_notes(sa: dict, sb: dict) -> list[str]:
    """A dataset read from other rows (file digest) or with another selection is not the same prompts."""
    recs_a = {r.get("name"): r for r in sa.get("datasets") or [] if isinstance(r, dict)}
    recs_b = {r.get("name"): r for r in sb.get("datasets") or [] if isinstance(r, dict)}
    notes = []
    for name in [n for n in recs_a if n in recs_b]:
        a, b = recs_a[name], recs_b[name]
        if _obj(a.get("source")).get("sha256") != _obj(b.get("source")).get("sha256"):
            notes.append(f"dataset {name}: the runs read different files (sha256 differs): rows may differ")
        if a.get("selection") != b.get("selection") or a.get("split") != b.get("split"):
            notes.append(f"dataset {name}: split or selection differs: only the common samples are paired")
    return notes


def _engine_tau(samples: list[dict], name: str) -> dict[str, float]:
    """Per prompt id: the engine's own acceptance for that request (1 + accepted / rounds)."""
    out = {}
    for s in samples:
        e = _obj(_obj(_obj(s.get("drafters")).get(name)).get("engine"))
        tau = _real(e.get("tau"))
        if tau is not None and s.get("id") is not None:
            out[str(s["id"])] = tau
    return out


def _engine_side(results: dict, name: str) -> dict:
    run, block = _obj(results.get("engine")), _obj(_drafters(results).get(name, {}).get("engine"))
    return {"engine": run.get("name") or block.get("engine"), "version": run.get("version"),
            "k": block.get("num_speculative_tokens"), "model_runner": run.get("model_runner")}


def engine_pairing(ra: dict, rb: dict, sa: list[dict], sb: list[dict], name: str) -> dict | None:
    """The engines' per-request acceptance paired by prompt (B − A), with its CI, a verdict naming the side
    that lost acceptance, and what each side ran (engine, version, K, model runner); None without engines."""
    ea, eb = _engine_tau(sa, name), _engine_tau(sb, name)
    if not ea or not eb:
        return None
    paired = _paired(ea, eb)
    ci, side_a, side_b = paired["ci"], _engine_side(ra, name), _engine_side(rb, name)
    if ci is not None and ci[1] < 0:
        lost = f"B ({side_b['engine']} {side_b['version']}) lost acceptance"
    elif ci is not None and ci[0] > 0:
        lost = f"A ({side_a['engine']} {side_a['version']}) lost acceptance"
    else:
        lost = paired["verdict"]
    notes = [] if side_a["k"] == side_b["k"] else [f"K differs ({side_a['k']} in A, {side_b['k']} in B): "
                                                    "acceptance per step is not comparable across K"]
    return {**paired, "a": side_a, "b": side_b, "verdict": lost, "notes": notes,
            "figure": "per request: 1 + accepted drafts / steps, as the engine reported it"}


def run_rule(results: dict) -> str:
    """The draft rule a run's figures follow: its settings.draft_rule; greedy for a run at T > 0 from before the
    option existed (the only rule then); "n/a at T = 0" for a greedy run."""
    settings = _obj(results.get("settings"))
    rule = settings.get("draft_rule")
    if isinstance(rule, str):
        return rule
    return "greedy" if settings.get("sampling") else "n/a at T = 0"


def compare_runs(a: Run, b: Run, across_rules: bool = False) -> dict:
    ra, rb = a.results(), b.results()
    sa, sb = a.samples(required=True), b.samples(required=True)
    notes = []
    rule_a, rule_b = run_rule(ra), run_rule(rb)
    if rule_a != rule_b and "n/a at T = 0" not in (rule_a, rule_b):
        if not across_rules:
            raise InputError(f"{a.name} follows the {rule_a} draft rule and {b.name} the {rule_b} one: at T > 0 the "
                             "two rules give different τ, so their Δτ mixes the rule with the drafter",
                             hint="evaluate both with the same --draft-rule, or pass --across-rules to compare anyway")
        notes.append(f"draft rules differ: {rule_a} in A, {rule_b} in B (--across-rules): Δτ includes the rule's "
                     "effect")
    for key in _SETTINGS:
        va, vb = _obj(ra.get("settings")).get(key), _obj(rb.get("settings")).get(key)
        if va != vb:
            notes.append(f"settings differ: {key} = {va!r} in A, {vb!r} in B")
    notes += _dataset_notes(_obj(ra.get("settings")), _obj(rb.get("settings")))
    notes += _draws_note(ra, rb, sa, sb)
    ta, tb = _obj(ra.get("target")), _obj(rb.get("target"))
    da, db = digest_value(ta.get("weights_digest")), digest_value(tb.get("weights_digest"))
    if da and db and da != db:
        notes.append("the targets differ (weights digests differ)")
    ka, kb = _obj(ra.get("extraction")).get("kernel_path"), _obj(rb.get("extraction")).get("kernel_path")
    if ka != kb:
        notes.append(f"features came from different linear-attention kernels: {ka} in A, {kb} in B")
    rows = []
    names_a, names_b = list(_drafters(ra)), list(_drafters(rb))
    for name in names_a + [n for n in names_b if n not in names_a]:
        row: dict = {"drafter": name}
        if name not in names_a or name not in names_b:
            row["note"] = f"only in {'A' if name in names_a else 'B'}"
            row["tau_a" if name in names_a else "tau_b"] = _real(_metrics(ra if name in names_a else rb, name)
                                                                  .get("tau_macro"))
            rows.append(row)
            continue
        row["tau_a"] = _real(_metrics(ra, name).get("tau_macro"))
        row["tau_b"] = _real(_metrics(rb, name).get("tau_macro"))
        paired = _paired(_per_sample_tau(sa, name), _per_sample_tau(sb, name))
        row.update(paired_samples=paired["paired_samples"], delta=paired["delta"], ci=paired["ci"],
                   note=paired["verdict"], conventions=_conventions(ra, rb, sa, sb, name))
        by_dataset = _by_dataset(sa, sb, name)
        if by_dataset:
            row["by_dataset"] = by_dataset
        engine = engine_pairing(ra, rb, sa, sb, name)
        if engine is not None:
            row["engine"] = engine
        rows.append(row)
    return {"a": a.name, "b": b.name, "convention": HEADLINE, "drafters": rows, "notes": notes,
            "draft_rule": {"a": rule_a, "b": rule_b},
            "definition": f"Δτ = mean over prompts present in both runs of (τ_B − τ_A) per prompt (macro τ, {HEADLINE} "
                          "convention, = zlab; zlab-2604's Δ likewise); 95% percentile bootstrap over prompts, "
                          "2000 resamples"}
