"""One JSON (and a markdown summary) from what the steps left: their part files and the script's status files.

Read after every step, so the JSON on disk always holds every figure measured so far. A step's status comes
from the script's record of its process (exit code, seconds, limit): ``ok``, ``failed`` (an exit code, or a
section that raised), ``timeout`` (killed at its limit: its part keeps what it had measured), ``skipped`` (too
little of the overall budget left to start it), ``not-run``.
Imports neither torch nor the payload's models: it must work whatever broke in the steps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from remote_payload.diagnose.gpu_kit import projection

STEPS = ("env", "fla", "kernel_path", "cost")
SCHEMA = "dfo.gpu-check/1"
TIMEOUT_CODES = (124, 137)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def step_entry(part: dict | None, status: dict | None) -> dict:
    if status is None:
        state = "not-run" if part is None else "running"
    elif status.get("skipped"):
        state = "skipped"
    elif status.get("rc") in TIMEOUT_CODES:
        state = "timeout"
    elif status.get("rc") == 0 and part is not None and not part.get("errors"):
        state = "ok"
    else:
        state = "failed"
    entry = {"status": state, **{k: (status or {}).get(k) for k in ("rc", "seconds", "limit_s")}}
    if part is None and status is not None and not status.get("skipped"):
        entry["errors"] = {"step": {"message": "the step left no part file (it failed before its first figure; "
                                               "see the log)"}}
    if part is not None:
        entry.update(sections=part.get("sections", {}), errors=part.get("errors", {}), notes=part.get("notes", []))
    return entry


def summary(steps: dict, proj: dict | None) -> dict:
    """The headline figures, each None where its step or section left none."""
    def sec(step, name):
        return (steps.get(step) or {}).get("sections", {}).get(name) or {}

    dev, mm = sec("env", "device"), sec("env", "bf16_matmul")
    ev, beside = sec("fla", "payload_eval"), sec("fla", "vs_cpu_interpreter")
    exp = sec("kernel_path", "experiment")
    ex, dec, dr = sec("cost", "extraction"), sec("cost", "decode"), sec("cost", "drafter")
    out = {"gpu": dev.get("name"), "bf16_matmul_tflops": mm.get("tflops"),
           "fla_eval_kernel_path": ev.get("extraction_kernel_path"),
           "fla_vs_torch_max_relative": {
               "here": {k: (beside.get("bands_here") or {}).get(f"{k}_max_relative") for k in ("fp32", "bf16")},
               "cpu_interpreter": {k: (beside.get("bands_cpu_interpreter") or {}).get(f"{k}_max_relative")
                                   for k in ("fp32", "bf16")}},
           "tau_by_feature_path": {r["label"]: {"tau": r["point"]["tau"], "ci95": r["ci95"]["tau"]}
                                   for r in (exp.get("rows") or {}).values()},
           "extraction_tokens_per_s": ex.get("tokens_per_s"), "extraction_cuda_peak_bytes": ex.get("cuda_peak_bytes"),
           "extraction_cuda_peak_over_weights_bytes": (ex["cuda_peak_bytes"] - ex["cuda_allocated_before_bytes"]
                                                       if ex.get("cuda_peak_bytes") and
                                                       ex.get("cuda_allocated_before_bytes") else None),
           "decode_tokens_per_s": dec.get("tokens_per_s"),
           "drafter_chain_tokens_per_s": (dr.get("chain") or {}).get("tokens_per_s"),
           "drafter_ddtree_tokens_per_s": (dr.get("ddtree") or {}).get("tokens_per_s"),
           "feature_bytes_per_token": sec("cost", "sizes").get("feature_bytes_per_token"),
           "sampled_rule_s": sec("cost", "sampled_rule").get("total_s"),
           "dflash2_chain_tokens_per_s": (sec("cost", "dflash2_drafter").get("chain") or {}).get("tokens_per_s"),
           "dflash2_chain_vs_dflash": sec("cost", "dflash2_drafter").get("chain_rate_vs_dflash"),
           "dflash2_sampled_rule_s": sec("cost", "dflash2_sampled_rule").get("total_s"),
           "dflash2_sampled_rule_check_error": sec("cost", "dflash2_sampled_rule").get("check_error")}
    if proj is not None:
        out["zlab_suite_hours"] = proj["total"]["hours"]
        out["zlab_suite_cache_gib"] = proj["total"]["cache_gib"]
    return out


def assemble(parts: Path, mode: str, started: float | None) -> dict:
    steps = {name: step_entry(_read(parts / f"{name}.json"), _read(parts / f"{name}.status")) for name in STEPS}
    cost = steps["cost"].get("sections")
    proj = projection.project(projection.rates_from(cost), projection.suite()) if cost else None
    if cost and proj is not None:
        proj["by_decode_batch"] = projection.by_batch(cost, projection.suite())
    now = time.time()
    return {"schema": SCHEMA, "mode": mode,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)) if started else None,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "wall_s": round(now - started, 1) if started else None,
            "steps": steps, "projection": proj, "summary": summary(steps, proj)}


def _num(v, fmt="{:.3g}") -> str:
    return "–" if v is None else fmt.format(v)


def _gib(v) -> str:
    return "–" if not v else f"{v / 2**30:.1f}"


def markdown(report: dict) -> str:
    """A short human summary: step statuses, the headline figures, the kernel-path table."""
    s = report["summary"]
    lines = [f"# gpu-check ({report['mode']}), written {report['written']}", "",
             "| step | status | seconds | limit |", "|---|---|---|---|"]
    for name, st in report["steps"].items():
        lines.append(f"| {name} | {st['status']} | {_num(st.get('seconds'), '{:.0f}')} | "
                     f"{_num(st.get('limit_s'), '{:.0f}')} |")
        for sec, err in (st.get("errors") or {}).items():
            lines.append(f"|   ↳ {sec} | {err.get('type', 'error')}: {str(err.get('message'))[:160]} | | |")
    rel = s["fla_vs_torch_max_relative"]
    lines += ["", f"- GPU: {s['gpu'] or '–'}; bf16 matmul {_num(s['bf16_matmul_tflops'])} TFLOP/s",
              f"- payload eval on the fixture: extraction kernel path {s['fla_eval_kernel_path'] or '–'}",
              f"- fla vs torch, max relative drift over layers: here fp32 {_num(rel['here']['fp32'])}, bf16 "
              f"{_num(rel['here']['bf16'])}; CPU interpreter fp32 {_num(rel['cpu_interpreter']['fp32'])}, bf16 "
              f"{_num(rel['cpu_interpreter']['bf16'])}",
              f"- {'real' if report['mode'] == 'gpu' else 'toy'} size: extraction "
              f"{_num(s['extraction_tokens_per_s'], '{:.0f}')} tok/s (CUDA peak "
              f"{_gib(s['extraction_cuda_peak_bytes'])} GiB, {_gib(s['extraction_cuda_peak_over_weights_bytes'])} "
              f"GiB over the weights), greedy decode "
              f"{_num(s['decode_tokens_per_s'], '{:.1f}')} tok/s, drafter eval chain "
              f"{_num(s['drafter_chain_tokens_per_s'], '{:.0f}')} / DDTree-8 "
              f"{_num(s['drafter_ddtree_tokens_per_s'], '{:.0f}')} tok/s, "
              f"{_num(s['feature_bytes_per_token'], '{:,}')} feature bytes per token"]
    if s.get("dflash2_chain_tokens_per_s") is not None:
        lines.append(f"- DFlash2 drafter of the same layers: chain {_num(s['dflash2_chain_tokens_per_s'], '{:.0f}')} "
                     f"tok/s ({_num(s['dflash2_chain_vs_dflash'], '{:.2f}')}× DFlash's); sampled-rule estimator "
                     f"{_num(s['dflash2_sampled_rule_s'], '{:.2f}')} s per sample (DFlash "
                     f"{_num(s['sampled_rule_s'], '{:.2f}')} s), check error "
                     f"{_num(s['dflash2_sampled_rule_check_error'], '{:.1e}')}")
    if "zlab_suite_hours" in s:
        lines.append(f"- z-lab suite (upper bound, every answer at max-new): {_num(s['zlab_suite_hours'], '{:.1f}')} h,"
                     f" cache {_num(s['zlab_suite_cache_gib'], '{:.1f}')} GiB")
    batches = (report.get("projection") or {}).get("by_decode_batch") or {}
    if batches:
        lines += ["", "## Batched decoding (the reference stage, greedy, random real-size target)", "",
                  "| batch | decode tok/s | CUDA peak GiB | z-lab suite h | card protocol h (one set of draws) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {b} | {_num(r['decode_tokens_per_s'], '{:.1f}')} | {_gib(r['cuda_peak_bytes'])} | "
                  f"{_num(r['zlab_suite_hours'], '{:.2f}')} | {_num(r['card_protocol_hours'], '{:.2f}')} |"
                  for b, r in batches.items()]
    exp = report["steps"]["kernel_path"].get("sections", {}).get("experiment") or {}
    if exp.get("table"):
        lines += ["", f"## Kernel path (τ per feature path; the 'fla' rows ran on the {exp.get('kernel_path')} path, "
                      f"{exp.get('device')})", "", exp["table"]]
    return "\n".join(lines) + "\n"
