"""`dfo demo --engine vllm`: what the demo builds and evaluates, and the offline-vs-engine lines it prints.

The engine story swaps the hybrid Qwen3.5 fixtures for the payload fixtures' ``engine`` set (a dense Qwen3
with head_dim 64: vLLM's CPU attention needs head_dim >= 32) and evaluates one drafter, ``ours``: the
training checkpoint built on kpro6, stripped there and relayed to ct129, where vLLM loads the stripped
folder as DFlash speculative config. One drafter because each costs an engine start (~1-2 min on 2 cores)
on top of the plain server's.

Pure logic (no hosts): the plan and the rendering are tested without an engine.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from orchestrator.evaluation.engine_report import engine_rows, engine_title
from orchestrator.evaluation.plan import DrafterRef
from remote_payload.engines.registry import NAMES

# --what for `python -m remote_payload fixtures` per host (dependencies are built too)
FIXTURES = {None: {"ct129": "target,zlab-drafter,random-drafter,dflash2-drafter", "kpro6": "training-checkpoint"},
            "vllm": {"ct129": "engine-target", "kpro6": "engine-trained-drafter"}}
# The registry's engines that run on the demo's CPU hosts (SGLang's DFlash needs CUDA).
ENGINES = tuple(n for n in NAMES if n in FIXTURES)
# Requests in flight per level of the demo's engine sweep: one at a time, and all 6 prompts at once.
CONCURRENCY = "1,6"
# Two more DFlash servers, offering 1 and 3 drafts per step: with three drafted K timed, the K plan predicts
# each from a line that did not see it (two extra engine starts).
ENGINE_K = "1,3"


@dataclass(frozen=True)
class DemoPlan:
    engine: str | None
    fixtures: dict[str, tuple[str, str]]   # host -> (folder, fixture items)
    target: str                            # on ct129
    drafters: list[DrafterRef]
    engine_concurrency: str | None = None  # --engine-concurrency of the demo's eval
    engine_k: str | None = None  # --engine-k of the demo's eval


def demo_plan(models: str, ckpts: str, engine: str | None = None) -> DemoPlan:
    """Fixtures per host, target and drafters of the demo (``models`` on ct129, ``ckpts`` on kpro6)."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"demo: unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    fixtures = {"ct129": (models, FIXTURES[engine]["ct129"]), "kpro6": (ckpts, FIXTURES[engine]["kpro6"])}
    if engine is None:
        return DemoPlan(None, fixtures, posixpath.join(models, "target"), [
            DrafterRef("ours", "kpro6", posixpath.join(ckpts, "trained-drafter", "checkpoint.pt")),
            DrafterRef("zlab", None, posixpath.join(models, "zlab-drafter")),
            DrafterRef("random", None, posixpath.join(models, "random-drafter")),
            DrafterRef("dflash2", None, posixpath.join(models, "dflash2-drafter"))])
    return DemoPlan(engine, fixtures, posixpath.join(models, "engine-target"), [
        DrafterRef("ours", "kpro6", posixpath.join(ckpts, "engine-trained-drafter", "checkpoint.pt"))],
        engine_concurrency=CONCURRENCY, engine_k=ENGINE_K)


# ------------------------------------------------------------------------------------ rendering


def _num(x, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def _tau(fig: dict | None) -> str:
    """"macro / micro" of a figures block ({tau_macro, tau_micro, ...})."""
    if not isinstance(fig, dict) or fig.get("available") is False:
        return "n/a"
    return f"{_num(fig.get('tau_macro'))} / {_num(fig.get('tau_micro'))}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def side_by_side(results: dict) -> list[str]:
    """Offline τ (committed and vllm conventions) beside engine τ per drafter, per-position p_k, tokens/s
    plain vs dflash and the agreement verdict; [] when the run has no engine figures. The figures are
    evaluation.engine_report's rows (the report's engine block); the committed τ is the drafter's metrics'."""
    rows = engine_rows(results)
    if not rows:
        return []
    eng = results.get("engine") or {}
    lines = [f"offline vs engine ({eng.get('name') or 'vllm'} {eng.get('version') or '?'}); τ as macro / micro, "
             f"the vllm convention is 1 + accepted drafts / rounds, as {engine_title(results)}'s per-request "
             "spec-decode metrics count"]
    table = [["drafter", "offline committed", "offline vllm", "engine vllm", "rounds off/eng", "agreement"]]
    details: list[str] = []
    for r in rows:
        committed = _tau(_committed(results["drafters"][r["drafter"]]))
        if "error" in r:
            table.append([r["drafter"], committed, "", "", "", "engine failed"])
            details.append(f"{r['drafter']}: engine failed: {str(r['error']).splitlines()[0]}")
            continue
        verdict = {True: "within tolerance", False: "OUTSIDE tolerance"}.get(r["agrees"], "—")
        table.append([r["drafter"], committed, _tau2(r["offline_tau_macro"], r["offline_tau_micro"]),
                      _tau2(r["engine_tau_macro"], r["engine_tau_micro"]), f"{r['rounds'][1]}/{r['rounds'][0]}",
                      verdict])
        details += _details(r)
    starts = eng.get("start_seconds") or {}
    if starts:
        details.append("engine starts: " + ", ".join(f"{k} {_num(v, '.0f')} s" for k, v in starts.items()))
    return (lines + ["  " + x for x in _table(table)] + ["  " + x for x in details] + concurrency_table(rows)
            + prediction_table(results))


def prediction_table(results: dict) -> list[str]:
    """The K plan: predicted vs measured speedup at each concurrency and measured K, with the error, and
    the best K per concurrency as vLLM's schedule ([] without an engine sweep)."""
    plans = results.get("k_plans")
    if not isinstance(plans, dict) or not plans:
        return []
    table = [["drafter", "in flight", "K", "predicted", "measured", "error", "best K (predicted speedup)"]]
    schedules = []
    for name, plan in plans.items():
        best = {r["concurrency"]: r for r in plan.get("predicted") or []}
        for c in plan.get("check") or []:
            b = best.get(c["concurrency"]) or {}
            table.append([str(name), str(c["concurrency"]), str(c["k"]) + ("" if c.get("held_out") else "*"),
                          f"x{c['predicted_speedup']:.2f}", f"x{c['measured_speedup']:.2f}",
                          f"{c['relative_error'] * 100:+.1f}%",
                          f"{b.get('best_k')} (x{_num(b.get('best_speedup'), '.2f')})"])
        schedules.append(f"{name}: num_speculative_tokens_per_batch_size = "
                         f"{plan.get('num_speculative_tokens_per_batch_size')}")
    if len(table) == 1:
        return []
    return (["predicted vs measured speedup (cost model: step time linear in K, fitted on the engine's plain and "
             "per-K timings without the K predicted; * = calibration point):"]
            + ["  " + x for x in _table(table)] + ["  " + x for x in schedules])


def concurrency_table(rows: list[dict]) -> list[str]:
    """Speedup vs concurrency per drafter: tokens/s plain and dflash, speedup, mean acceptance length, time per
    output token and whether every output equals the reference at that level ([] without a sweep)."""
    table = [["drafter", "in flight", "tok/s plain", "tok/s dflash", "speedup", "accept len", "TPOT ms plain/dflash",
              "outputs = reference"]]
    for r in rows:
        for c in r.get("concurrency") or []:
            tpot = c.get("tpot_ms") or {}
            miss = c.get("reference_mismatches") or {}
            same = miss.get("plain") == [] and miss.get("dflash") == []
            table.append([r["drafter"], str(c.get("concurrency")), _num(c.get("plain_tokens_per_s"), ".1f"),
                          _num(c.get("dflash_tokens_per_s"), ".1f"),
                          f"x{c['speedup']:.2f}" if isinstance(c.get("speedup"), (int, float)) else "—",
                          _num(c.get("mean_acceptance_length"), ".2f"),
                          f"{_num(tpot.get('plain'), '.1f')}/{_num(tpot.get('dflash'), '.1f')}",
                          "all" if same else f"{len(miss.get('dflash') or [])} dflash, {len(miss.get('plain') or [])} "
                          "plain differ"])
    if len(table) == 1:
        return []
    return ["speedup vs concurrency (every prompt sent at each level, greedy):"] + ["  " + x for x in _table(table)]


def _committed(drafter: dict) -> dict:
    metrics = drafter.get("metrics") or {}
    return (metrics.get("conventions") or {}).get("committed") or metrics


def _tau2(macro, micro) -> str:
    return _tau({"tau_macro": macro, "tau_micro": micro})


def _details(r: dict) -> list[str]:
    name = r["drafter"]
    out = []
    if r["per_position"]:
        out.append(f"{name}: p_k offline|engine  " + "  ".join(
            f"k{p['k']} {_num(p.get('offline'), '.2f')}|{_num(p.get('engine'), '.2f')}" for p in r["per_position"]))
    speedup = r["speedup"]
    out.append(f"{name}: tokens/s plain {_num(r['plain_tps'], '.1f')}, dflash {_num(r['dflash_tps'], '.1f')}"
               + (f" (x{speedup:.2f})" if speedup else ""))
    if r["outputs"][1]:
        out.append(f"{name}: engine outputs equal the reference in {r['outputs'][0]} of {r['outputs'][1]} samples")
    if r["compared"] is not None:
        out.append(f"{name}: {r['identical']} of {r['compared']} samples identical round by round; {r['tolerance']}")
    out += [f"{name}: {p}" for p in r["problems"]]
    return out
