"""`dfo runs compare A B`: the same drafters across two runs, paired by prompt id (pure).

The paired Δτ is in the committed convention (the headline τ); the zlab τ (macro, paired the same way) and
the vllm τ (micro) of both runs ride along where the runs have them.
"""

from __future__ import annotations

from orchestrator.evaluation.report import HEADLINE, SHOWN, convention_figure, digest_value
from orchestrator.evaluation.runs import Run
from remote_payload.metrics.stats import bootstrap_mean_ci, mean, verdict

# Settings that make two runs' numbers incomparable when they differ.
_SETTINGS = ("enable_thinking", "max_new_tokens", "dtype", "prompts")


def _per_sample_tau(samples: list[dict], drafter: str, convention: str = HEADLINE) -> dict[str, float]:
    out = {}
    for s in samples:
        entry = (s.get("drafters") or {}).get(drafter, {})
        if convention == HEADLINE:
            tau = entry.get("tau")
        else:
            produced = ((entry.get("conventions") or {}).get(convention) or {}).get("produced")
            tau = sum(produced) / len(produced) if produced else None
        if tau is not None:
            out[str(s.get("id"))] = tau
    return out


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
        fa = convention_figure(ra["drafters"][name].get("metrics") or {}, conv)
        fb = convention_figure(rb["drafters"][name].get("metrics") or {}, conv)
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
        va, vb = (ra.get("settings") or {}).get(key), (rb.get("settings") or {}).get(key)
        if va != vb:
            notes.append(f"settings differ: {key} = {va!r} in A, {vb!r} in B")
    ta, tb = ra.get("target") or {}, rb.get("target") or {}
    da, db = digest_value(ta.get("weights_digest")), digest_value(tb.get("weights_digest"))
    if da and db and da != db:
        notes.append("the targets differ (weights digests differ)")
    ka, kb = (ra.get("extraction") or {}).get("kernel_path"), (rb.get("extraction") or {}).get("kernel_path")
    if ka != kb:
        notes.append(f"features came from different linear-attention kernels: {ka} in A, {kb} in B")
    rows = []
    names_a, names_b = list(ra.get("drafters") or {}), list(rb.get("drafters") or {})
    for name in names_a + [n for n in names_b if n not in names_a]:
        row = {"drafter": name}
        if name not in names_a or name not in names_b:
            row["note"] = f"only in {'A' if name in names_a else 'B'}"
            row["tau_a" if name in names_a else "tau_b"] = (
                (ra if name in names_a else rb)["drafters"][name]["metrics"].get("tau_macro"))
            rows.append(row)
            continue
        row["tau_a"] = ra["drafters"][name]["metrics"].get("tau_macro")
        row["tau_b"] = rb["drafters"][name]["metrics"].get("tau_macro")
        paired = _paired(_per_sample_tau(sa, name), _per_sample_tau(sb, name))
        row.update(paired_samples=paired["paired_samples"], delta=paired["delta"], ci=paired["ci"],
                   note=paired["verdict"], conventions=_conventions(ra, rb, sa, sb, name))
        rows.append(row)
    return {"a": a.name, "b": b.name, "convention": HEADLINE, "drafters": rows, "notes": notes,
            "definition": f"Δτ = mean over prompts present in both runs of (τ_B − τ_A) per prompt (macro τ, {HEADLINE} "
                          "convention; zlab's Δ likewise); 95% percentile bootstrap over prompts, 2000 resamples"}
