"""`dfo runs compare A B`: the same drafters across two runs, paired by prompt id (pure).

The paired Δτ is in the committed convention (the headline τ); the zlab τ (macro, paired the same way) and
the vllm τ (micro) of both runs ride along where the runs have them.
"""

from __future__ import annotations

from orchestrator.evaluation.report import HEADLINE, SHOWN, _obj, _real, convention_figure, digest_value
from orchestrator.evaluation.runs import Run
from remote_payload.metrics.stats import bootstrap_mean_ci, mean, verdict

# Settings that make two runs' numbers incomparable when they differ.
_SETTINGS = ("enable_thinking", "max_new_tokens", "dtype", "prompts")


def _per_sample_tau(samples: list[dict], drafter: str, convention: str = HEADLINE) -> dict[str, float]:
    out = {}
    for s in samples:
        entry = _obj(_obj(_obj(s).get("drafters")).get(drafter))
        if convention == HEADLINE:
            tau = _real(entry.get("tau"))
        else:
            produced = _obj(_obj(entry.get("conventions")).get(convention)).get("produced")
            values = [_real(x) for x in produced] if isinstance(produced, list) else []
            tau = sum(values) / len(values) if values and None not in values else None  # type: ignore[arg-type]
        if tau is not None:
            out[str(s.get("id"))] = tau
    return out


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
    """zlab and vllm figures of both runs ({"a", "b"}, each None when missing) and zlab's paired Δ."""
    out = {}
    for conv, key in SHOWN.items():
        fa = convention_figure(_metrics(ra, name), conv)
        fb = convention_figure(_metrics(rb, name), conv)
        out[conv] = {"figure": key, "a": fa["value"], "b": fb["value"], "exact": [fa["exact"], fb["exact"]],
                     "unavailable": [fa["reason"], fb["reason"]]}
        if key == "tau_macro" and fa["value"] is not None and fb["value"] is not None:
            out[conv].update(_paired(_per_sample_tau(sa, name, conv), _per_sample_tau(sb, name, conv)))
    return out


def compare_runs(a: Run, b: Run) -> dict:
    ra, rb = a.results(), b.results()
    sa, sb = a.samples(), b.samples()
    notes = []
    for key in _SETTINGS:
        va, vb = _obj(ra.get("settings")).get(key), _obj(rb.get("settings")).get(key)
        if va != vb:
            notes.append(f"settings differ: {key} = {va!r} in A, {vb!r} in B")
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
        rows.append(row)
    return {"a": a.name, "b": b.name, "convention": HEADLINE, "drafters": rows, "notes": notes,
            "definition": f"Δτ = mean over prompts present in both runs of (τ_B − τ_A) per prompt (macro τ, {HEADLINE} "
                          "convention; zlab's Δ likewise); 95% percentile bootstrap over prompts, 2000 resamples"}
