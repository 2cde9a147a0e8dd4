"""The engine block of a run's report (``--engine NAME`` / ``--reference NAME``), from results.json alone.

Engine τ (each request's own acceptance) is shown next to the offline τ in the same convention (``vllm``:
every accepted draft counted, τ = 1 + accepted / rounds), each figure with the bound the agreement rule
allows it (``±``, computed from the rounds that differ: ``remote_payload.metrics.engine_agreement``), the
verdict, the outputs against the reference continuations, tokens/s without and with the drafter, the
speedup against concurrency (a table and ``engine_speedup.png``), the samples whose per-step acceptance
differs from the offline rounds, the once-per-run counter cross-check, and the server start times and log
names. Results written before the rule had bounds show the figures without ``±`` and the fixed tolerance of
then; results written before the sweep have no concurrency table.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.host_text import clean, fmt_number, md_code, md_text
from remote_payload.engines.registry import ENGINES

PLOT = "engine_speedup.png"

FIRST_POSITIONS = 4


def _fmt(x, digits: int = 2) -> str:
    return fmt_number(x, f".{digits}f")  # "?" for a figure of the host's that is not a number


def _first_line(text) -> str:
    return (str(text).splitlines() or [""])[0]


def _pm(bound, digits: int = 2) -> str:
    """`` ±b`` beside a figure; nothing where the results carry no bound (written before the rule had them)."""
    return "" if bound is None else f" ±{_fmt(bound, digits)}"


# The fixed tolerance that results.json files written before the bounds were judged by.
FIXED_TOLERANCE = ("rounds within 5% + 1 per sample (summed; samples outside are listed), p_k within 0.08, "
                   "τ micro within 0.15")
NEAR_TIE = ("the engine runs its own implementation of the drafter, and near-tie drafter logits can flip a draft "
            "there, which re-anchors the rest of that sample")


def tolerance_text(agreement: dict) -> str:
    """What the ± beside each figure means, from the agreement's own ``tolerance`` and ``samples`` blocks."""
    if agreement.get("sampled"):  # T > 0: expectations compared (remote_payload.metrics.sampled)
        return (f"tolerance: {clean(str(agreement.get('rule') or ''))}; the engine's τ and the offline figures it is "
                "compared with follow the greedy draft rule (vLLM's DFlash rule)")
    tol = agreement.get("tolerance") or {}
    if "alpha" not in tol:
        return f"tolerance: {FIXED_TOLERANCE} — {NEAR_TIE}; aggregates agree closely"
    samples = agreement.get("samples") or {}
    if not samples.get("differing"):
        return f"tolerance: every sample identical round by round, so every figure must be equal (±0) — {NEAR_TIE}"
    n_e, n_o = (list(tol.get("differing_rounds") or []) + [None, None])[:2]
    return (f"tolerance: each ± is a two-sample bound at a {fmt_number(tol['alpha'], '.0%')} overall false-alarm "
            f"rate (z {_fmt(tol.get('z'))} for each of the {tol.get('figures_tested')} figures p_k and τ micro) on "
            f"the {n_e}/{n_o} engine/offline rounds of the {samples['differing']} sample(s) that differ, scaled by "
            f"their share of the run ({fmt_number(tol.get('share'), '.0%')}; identical samples add no difference); "
            f"rounds through rounds = tokens / τ — {NEAR_TIE}")


def engine_rows(results: dict) -> list[dict]:
    """One row per drafter that ran in the engine (or failed there: ``error``)."""
    rows = []
    drafters = results.get("drafters")
    for name, d in (drafters if isinstance(drafters, dict) else {}).items():
        e = d.get("engine") if isinstance(d, dict) else None
        if not e or not isinstance(e, dict):  # the host wrote results.json: an engine block may be any JSON
            continue
        if e.get("error"):
            rows.append({"drafter": name, "error": e["error"]})
            continue
        ag = e.get("agreement") or {}
        eng, off = ag.get("engine") or e.get("total") or {}, ag.get("offline") or {}
        outputs, tps = e.get("outputs") or {}, e.get("tokens_per_s") or {}
        positions = ag.get("per_position") or []
        samples = ag.get("samples") or {}
        bounds = [p.get("bound") for p in positions[:FIRST_POSITIONS]]
        rows.append({
            "drafter": name, "engine_tau_micro": eng.get("tau_micro"), "offline_tau_micro": off.get("tau_micro"),
            "engine_tau_macro": eng.get("tau_macro"), "offline_tau_macro": off.get("tau_macro"),
            "positions": ([(p.get("engine"), p.get("offline")) for p in positions[:FIRST_POSITIONS]]
                          + [(None, None)] * FIRST_POSITIONS)[:FIRST_POSITIONS],
            "position_bounds": (bounds + [None] * FIRST_POSITIONS)[:FIRST_POSITIONS],
            "rounds": (eng.get("rounds"), off.get("rounds")),
            "tau_micro_bound": (ag.get("tau_micro") or {}).get("bound"),
            "rounds_bound": (ag.get("rounds") or {}).get("bound"),
            "identical": samples.get("identical"), "compared": samples.get("compared"),
            "outputs": (outputs.get("match_reference"), outputs.get("samples")),
            "plain_tps": tps.get("plain"), "dflash_tps": tps.get("dflash"), "speedup": tps.get("speedup"),
            "agrees": ag.get("within_tolerance"), "problems": ag.get("problems") or [], "notes": ag.get("notes") or [],
            "offline_source": ag.get("offline_source"), "exported": e.get("exported"),
            "per_position": positions, "tolerance": tolerance_text(ag) if ag else None,
            "concurrency": [r for r in (e.get("concurrency") or []) if isinstance(r, dict)],
            "counter_check": e.get("counter_check") if isinstance(e.get("counter_check"), dict) else None,
            "per_step": ag.get("per_step") if isinstance(ag.get("per_step"), dict) else None,
            "synthetic": e.get("synthetic_check") if isinstance(e.get("synthetic_check"), dict) else None,
        })
    return rows


def engine_title(results: dict) -> str:
    """The engine's name as written ("vLLM"): the registry's for a known name, else the host's text."""
    engine = results.get("engine")
    run = engine if isinstance(engine, dict) else {}
    name = run.get("name") or next((d["engine"].get("engine") for d in (results.get("drafters") or {}).values()
                                    if isinstance(d, dict) and isinstance(d.get("engine"), dict)), None) or "vllm"
    known = ENGINES.get(name) if isinstance(name, str) else None
    return known.title if known else str(name)


def _mismatch_text(ids) -> str:
    return "all" if ids == [] else "–" if ids is None else f"{len(ids)} differ" if isinstance(ids, list) else "?"


def concurrency_markdown(rows: list[dict]) -> list[str]:
    """The speedup-vs-concurrency table: one line per drafter and level (empty without a sweep)."""
    swept = [(r, c) for r in rows if "error" not in r for c in r["concurrency"]]
    if not swept:
        return []
    out = ["", "Speedup vs concurrency (every prompt at each level; outputs against the reference at every level):",
           "", "| drafter | requests in flight | tok/s plain | tok/s dflash | speedup | mean acceptance length | "
           "time per output token plain / dflash (ms) | outputs = reference plain / dflash |",
           "|---|---|---|---|---|---|---|---|"]
    for r, c in swept:
        tpot = c.get("tpot_ms") if isinstance(c.get("tpot_ms"), dict) else {}
        miss = c.get("reference_mismatches") if isinstance(c.get("reference_mismatches"), dict) else {}
        out.append(f"| {md_text(r['drafter'])} | {md_text(c.get('concurrency'))} | "
                   f"{_fmt(c.get('plain_tokens_per_s'), 1)} | {_fmt(c.get('dflash_tokens_per_s'), 1)} | "
                   f"{_fmt(c.get('speedup'))}× | {_fmt(c.get('mean_acceptance_length'))} | "
                   f"{_fmt(tpot.get('plain'), 1)} / {_fmt(tpot.get('dflash'), 1)} | "
                   f"{_mismatch_text(miss.get('plain'))} / {_mismatch_text(miss.get('dflash'))} |")
    return out


def engine_plot(run_dir: Path, results: dict) -> list[Path]:
    """``engine_speedup.png``: speedup (dflash / plain tokens/s) against requests in flight, one line per drafter;
    [] without a sweep of at least one level or without matplotlib."""
    series = {r["drafter"]: [(c.get("concurrency"), c.get("speedup")) for c in r["concurrency"]
                             if _number(c.get("concurrency")) and c["concurrency"] > 0 and _number(c.get("speedup"))]
              for r in engine_rows(results) if "error" not in r}
    series = {name: pts for name, pts in series.items() if pts}
    if not series:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    # Drafter names are the host's: as mathtext a '$' in one would be parsed, and a malformed one raises.
    with matplotlib.rc_context({"text.parse_math": False}):
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
        for name, pts in series.items():
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", linewidth=2, label=clean(name))
        ax.axhline(1.0, color="grey", linewidth=1, linestyle=":")
        ax.set_xscale("log", base=2)
        xs = sorted({x for pts in series.values() for x, _ in pts})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("requests in flight")
        ax.set_ylabel("speedup (tokens/s dflash / plain)")
        ax.set_title(f"{clean(engine_title(results))}: speedup vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
        fig.tight_layout()
        path = run_dir / PLOT
        fig.savefig(path)
        plt.close(fig)
    return [path]


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def engine_markdown(results: dict) -> list[str]:
    """``## Engine`` section lines for report.md (empty without an engine block)."""
    run = results.get("engine") if isinstance(results.get("engine"), dict) else None
    rows = engine_rows(results)
    if not run and not rows:
        return []
    run = run or {}
    # Host text (names, versions, errors, notes) goes in through md_text/md_code: no HTML, link or extra cell.
    out = [f"## Engine ({md_text(engine_title(results))})", "",
           f"- {md_text(run.get('name') or 'vllm')} {md_text(run.get('version') or '?')}, served as "
           f"{md_code(run.get('served_name'))}; used for: {', '.join(map(md_text, run.get('used_for') or [])) or '–'};"
           f" baseline (no drafter) {_fmt((run.get('plain') or {}).get('tokens_per_s'), 1)} tokens/s",
           "- server start: " + ", ".join(f"{md_text(k)} {_fmt(v, 1)} s"
                                          for k, v in (run.get("start_seconds") or {}).items())
           + "; logs: " + ", ".join(map(md_text, run.get("logs") or [])) + " (in logs/ as HOST-NAME.log)"
           if run.get("servers") or not run.get("plain_skipped") else
           f"- no server started: {md_text(_first_line(run['plain_skipped']))}"]
    if run.get("error"):
        out.append(f"- engine error: {md_text(_first_line(run['error']))}")
    ok_rows = [r for r in rows if "error" not in r]
    if ok_rows:
        pos = " | ".join(f"p{k} eng/off" for k in range(1, FIRST_POSITIONS + 1))
        out += ["", "Engine vs offline, both in the `vllm` convention (τ = 1 + accepted/rounds; drafts past the end "
                "counted):", "",
                f"| drafter | τ micro eng/off | τ macro eng/off | {pos} | rounds eng/off | identical samples | "
                "outputs = reference | tok/s plain | tok/s dflash | speedup | agreement |",
                "|---|---|---|" + "---|" * FIRST_POSITIONS + "---|---|---|---|---|---|---|"]
        for r in ok_rows:
            out.append(
                f"| {md_text(r['drafter'])} | {_fmt(r['engine_tau_micro'])} / {_fmt(r['offline_tau_micro'])}"
                f"{_pm(r['tau_micro_bound'])} | {_fmt(r['engine_tau_macro'])} / {_fmt(r['offline_tau_macro'])} | "
                + " | ".join(f"{_fmt(e)} / {_fmt(o)}{_pm(b)}"
                             for (e, o), b in zip(r["positions"], r["position_bounds"], strict=True))
                + f" | {md_text(r['rounds'][0])} / {md_text(r['rounds'][1])}{_pm(r['rounds_bound'], 1)} | "
                f"{md_text(r['identical'])}/{md_text(r['compared'])} | {md_text(r['outputs'][0])}/"
                f"{md_text(r['outputs'][1])} | {_fmt(r['plain_tps'], 1)} | {_fmt(r['dflash_tps'], 1)} | "
                f"{_fmt(r['speedup'])}× | {_verdict(r)} |")
        out += concurrency_markdown(ok_rows)
        out += [""] + [f"- {md_text(line)}" for line in notes(ok_rows)]
    out += [f"- {md_text(r['drafter'])}: engine run failed: {md_text(_first_line(r['error']))}"
            for r in rows if "error" in r]
    return out


def _verdict(row: dict) -> str:
    if row["agrees"] is None:
        return "–"
    return "within tolerance" if row["agrees"] else "**outside tolerance**"


def notes(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        if r["problems"]:
            out.append(f"{r['drafter']}: outside the tolerance: " + "; ".join(r["problems"]))
        out += [f"{r['drafter']}: {note}" for note in r["notes"]]
        if r["exported"]:
            out.append(f"{r['drafter']}: exported to a z-lab folder for vLLM ({r['exported']})")
        if r["offline_source"] and r["offline_source"] != "vllm":
            out.append(f"{r['drafter']}: offline side from the {r['offline_source']}")
        if r["tolerance"]:
            out.append(f"{r['drafter']}: {r['tolerance']}")
        out += _per_step_notes(r) + _counter_notes(r) + _synthetic_notes(r)
    return out


def _synthetic_notes(r: dict) -> list[str]:
    """``--engine-check synthetic``: the engine's synthetic sampler fed the profile's marginals."""
    syn = r["synthetic"]
    if not syn:
        return []
    if syn.get("unsupported") or syn.get("error"):
        why = _first_line(syn.get("unsupported") or syn["error"])
        return [f"{r['drafter']}: synthetic-sampler check not run: {why}"]
    verdict = "matches the profile" if syn.get("within") else "**does not match the profile**"
    return [f"{r['drafter']}: engine with the synthetic sampler fed the profile's marginals: mean accept "
            f"length {_fmt(syn.get('measured_mean'), 3)} vs the profile's {_fmt(syn.get('expected_mean'), 3)}"
            f"{_pm(syn.get('bound'), 3)} over {syn.get('rounds')} rounds: {verdict}"]


def _per_step_notes(r: dict) -> list[str]:
    steps = r["per_step"]
    if not steps or not steps.get("available"):
        return []
    differ = [d for d in steps.get("differ") or [] if isinstance(d, dict)]
    if not differ:
        return [f"{r['drafter']}: per-step acceptance equal to the offline rounds in all {steps.get('compared')} "
                "samples"]
    shown = ", ".join(f"{d.get('id')} (from round {d.get('first_round')}, {d.get('engine_rounds')} vs "
                      f"{d.get('offline_rounds')} rounds)" for d in differ[:8])
    return [f"{r['drafter']}: per-step acceptance differs from the offline rounds in {len(differ)} of "
            f"{steps.get('compared')} samples: {shown}" + (" …" if len(differ) > 8 else "")]


def _counter_notes(r: dict) -> list[str]:
    check = r["counter_check"]
    if not check:
        return []
    counted = check.get("counters") if isinstance(check.get("counters"), dict) else {}
    if check.get("ok"):
        return [f"{r['drafter']}: per-request acceptance adds up to the server's counters exactly over the "
                f"{check.get('requests')} requests at concurrency {check.get('concurrency')} "
                f"({counted.get('rounds')} rounds, {counted.get('drafts_accepted')} accepted drafts)"]
    return [f"{r['drafter']}: per-request acceptance does NOT add up to the server's counters "
            f"({', '.join(map(str, check.get('differ') or []))}): per request {check.get('per_request')}, "
            f"counters {counted}"]


def engine_text(results: dict) -> list[str]:
    """Short plain lines for a terminal (one per drafter)."""
    lines = []
    for r in engine_rows(results):
        if "error" in r:
            lines.append(f"engine {r['drafter']}: failed: {_first_line(r['error'])}")
            continue
        lines.append(f"engine {r['drafter']} (vllm convention): τ micro {_fmt(r['engine_tau_micro'])} vs offline "
                     f"{_fmt(r['offline_tau_micro'])}{_pm(r['tau_micro_bound'])}, p1 {_fmt(r['positions'][0][0])} vs "
                     f"{_fmt(r['positions'][0][1])}{_pm(r['position_bounds'][0])}; {_fmt(r['dflash_tps'], 1)} vs "
                     f"{_fmt(r['plain_tps'], 1)} tokens/s plain; {_verdict(r).strip('*')}")
        if len(r["concurrency"]) > 1:
            lines.append(f"engine {r['drafter']} speedup: " + ", ".join(
                f"×{_fmt(c.get('speedup'))} at {fmt_number(c.get('concurrency'), 'd')} in flight"
                for c in r["concurrency"]))
    return lines
