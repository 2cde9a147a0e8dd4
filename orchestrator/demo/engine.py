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

from orchestrator.evaluation.plan import DrafterRef

ENGINES = ("vllm",)
# --what for `python -m remote_payload fixtures` per host (dependencies are built too)
FIXTURES = {None: {"ct129": "target,zlab-drafter,random-drafter", "kpro6": "training-checkpoint"},
            "vllm": {"ct129": "engine-target", "kpro6": "engine-trained-drafter"}}


@dataclass(frozen=True)
class DemoPlan:
    engine: str | None
    fixtures: dict[str, tuple[str, str]]   # host -> (folder, fixture items)
    target: str                            # on ct129
    drafters: list[DrafterRef]


def demo_plan(models: str, ckpts: str, engine: str | None = None) -> DemoPlan:
    """Fixtures per host, target and drafters of the demo (``models`` on ct129, ``ckpts`` on kpro6)."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"demo: unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    fixtures = {"ct129": (models, FIXTURES[engine]["ct129"]), "kpro6": (ckpts, FIXTURES[engine]["kpro6"])}
    if engine is None:
        return DemoPlan(None, fixtures, posixpath.join(models, "target"), [
            DrafterRef("ours", "kpro6", posixpath.join(ckpts, "trained-drafter", "checkpoint.pt")),
            DrafterRef("zlab", None, posixpath.join(models, "zlab-drafter")),
            DrafterRef("random", None, posixpath.join(models, "random-drafter"))])
    return DemoPlan(engine, fixtures, posixpath.join(models, "engine-target"), [
        DrafterRef("ours", "kpro6", posixpath.join(ckpts, "engine-trained-drafter", "checkpoint.pt"))])


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
    plain vs dflash and the agreement verdict; [] when the run has no engine figures."""
    drafters = {n: d for n, d in (results.get("drafters") or {}).items() if isinstance(d.get("engine"), dict)}
    if not drafters:
        return []
    eng = results.get("engine") or {}
    lines = [f"offline vs engine ({eng.get('name') or 'vllm'} {eng.get('version') or '?'}); τ as macro / micro, "
             "the vllm convention is 1 + accepted drafts / rounds, as vLLM's spec-decode metrics count"]
    rows = [["drafter", "offline committed", "offline vllm", "engine vllm", "rounds off/eng", "agreement"]]
    details: list[str] = []
    for name, d in drafters.items():
        block = d["engine"]
        if block.get("error"):
            rows.append([name, _tau((d.get("metrics") or {}).get("conventions", {}).get("committed")),
                         "", "", "", "engine failed"])
            details.append(f"{name}: engine failed: {str(block['error']).splitlines()[0]}")
            continue
        rows.append(_row(name, d))
        details += _details(name, block)
    return lines + ["  " + r for r in _table(rows)] + ["  " + x for x in details]


def _row(name: str, d: dict) -> list[str]:
    metrics = d.get("metrics") or {}
    conv = metrics.get("conventions") or {}
    committed = conv.get("committed") or {"tau_macro": metrics.get("tau_macro"), "tau_micro": metrics.get("tau_micro")}
    ag = d["engine"].get("agreement") or {}
    off, en = ag.get("offline") or {}, ag.get("engine") or {}
    verdict = "within tolerance" if ag.get("within_tolerance") else "OUTSIDE tolerance"
    return [name, _tau(committed), _tau(off), _tau(en), f"{off.get('rounds', '—')}/{en.get('rounds', '—')}", verdict]


def _details(name: str, block: dict) -> list[str]:
    ag = block.get("agreement") or {}
    out = []
    pp = ag.get("per_position") or []
    if pp:
        out.append(f"{name}: p_k offline|engine  " + "  ".join(
            f"k{p['k']} {_num(p.get('offline'), '.2f')}|{_num(p.get('engine'), '.2f')}" for p in pp))
    tps = block.get("tokens_per_s") or {}
    speedup = tps.get("speedup")
    out.append(f"{name}: tokens/s plain {_num(tps.get('plain'), '.1f')}, dflash {_num(tps.get('dflash'), '.1f')}"
               + (f" (x{speedup:.2f})" if speedup else ""))
    outputs = block.get("outputs") or {}
    if outputs:
        out.append(f"{name}: engine outputs equal the reference in {outputs.get('match_reference')} of "
                   f"{outputs.get('samples')} samples")
    smp = ag.get("samples") or {}
    tol = ag.get("tolerance") or {}
    if smp:
        out.append(f"{name}: {smp.get('identical')} of {smp.get('compared')} samples identical round by round; "
                   f"tolerance: rounds ±{tol.get('rounds_rel', 0):.0%}+{tol.get('rounds_abs')} per sample, "
                   f"p_k ±{tol.get('p_abs')}, τ micro ±{tol.get('tau_micro_abs')}")
    out += [f"{name}: {p}" for p in ag.get("problems") or []]
    return out
