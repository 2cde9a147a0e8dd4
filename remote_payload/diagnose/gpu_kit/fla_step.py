"""Step ``fla``: the payload on the tiny hybrid fixture with fla bound to real Triton kernels.

1. ``fixture``: the fixture target (8 layers L L L F L L L F) and a random drafter, built on the spot;
2. ``payload_eval``: ``python -m remote_payload eval --kernel fla`` on them (a fresh process: the payload's own
   kernel policy, ``device_map``, bf16 extraction, results.json) — what results.json says about the path taken;
3. ``table_float32`` / ``table_bfloat16``: gpu-check's per-layer fla-vs-torch comparison
   (``gpu_check.compare_paths``), by the procedure the CPU tests use (``layer_table``);
4. ``vs_cpu_interpreter``: those tables beside the figures Triton's CPU interpreter gives for the same
   procedure (``data/cpu_interpreter_figures.json``), and the tests' bands checked on the real kernels.

The CPU figures were recorded with this module's ``layer_table`` run under the tests' shim (the command is in
the JSON), so both sides are one procedure; whether they are one set of weights is reported
(``same_weights``: the fixture is trained on the spot, and another torch may round its last bits otherwise).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from remote_payload.diagnose.gpu_kit import fixtures as kit_fixtures
from remote_payload.diagnose.gpu_kit.part import Part

CPU_FIGURES = Path(__file__).resolve().parent / "data" / "cpu_interpreter_figures.json"
DTYPES = ("float32", "bfloat16")
# The procedure of tests/fla_cpu/probe.py: the first built-in prompt, 24 greedy tokens through the torch path.
TABLE_NEW_TOKENS = {"gpu": 24, "smoke": 8}
EVAL = {"gpu": {"samples": 4, "max_new_tokens": 64, "timeout_s": 120},
        "smoke": {"samples": 1, "max_new_tokens": 8, "timeout_s": 240}}
# The bands tests/fla_cpu/test_fla_path.py asserts on the interpreter (relative = mean |Δ| / max |value|).
FP32_MAX_RELATIVE = 1e-4
BF16_RELATIVE_BAND = (1e-4, 0.1)


def relative(row: dict) -> float:
    return row["mean_abs_diff"] / row["max_abs_value"] if row["max_abs_value"] else 0.0


def layer_table(target_dir: str, dtype: str, device: str, kernel: str, new_tokens: int) -> dict:
    """gpu-check's per-layer comparison of the bound kernels with the torch path, one prompt, one dtype."""
    from remote_payload.diagnose.gpu_check import compare_paths
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.models import kernels
    from remote_payload.models.target import load_target, render_prompt

    t = load_target(target_dir, device=device, dtype=dtype, kernel=kernel)
    prompts, _ = load_prompts("builtin")
    ids = render_prompt(t.tokenizer, prompts[0].message_dicts(), False)
    with kernels.torch_linear_attention(t.model):  # the reference through the torch path, as the CPU tests do
        ref = greedy_decode(t, ids, new_tokens)
    report = compare_paths(t, [ref], list(range(t.config.num_layers)))
    for row in report["per_layer"]:
        row["relative"] = relative(row)
    return {"dtype": dtype, "device": device, "kernel_path": t.kernel_path, "kernels": t.kernel_details,
            "fla_tf32_dots": _fla_tf32(), "weights_digest": t.digest.get("value"), "tokens": len(ref.tokens),
            "new_tokens": new_tokens, **report}


def _fla_tf32() -> bool | None:
    """Whether fla runs some fp32 products in TF32 (it does on Ampere and newer NVIDIA GPUs): fp32 then drifts more
    from the torch path than the interpreter, which computes fp32 exactly. None when fla is not loaded."""
    mod = sys.modules.get("fla.utils")
    return None if mod is None else bool(getattr(mod, "IS_TF32_SUPPORTED", False))


def band_checks(tables: dict) -> dict:
    """The interpreter tests' assertions, evaluated on these tables (None where a dtype is missing)."""
    fp32, bf16 = tables.get("float32"), tables.get("bfloat16")
    out: dict = {}
    if fp32:
        worst = max(r["relative"] for r in fp32["per_layer"])
        out["fp32_max_relative"] = worst
        out["fp32_below_1e-4"] = worst < FP32_MAX_RELATIVE
        out["fp32_all_layers_differ"] = all(r["max_abs_diff"] > 0 for r in fp32["per_layer"])
    if bf16:
        worst = max(r["relative"] for r in bf16["per_layer"])
        out["bf16_max_relative"] = worst
        out["bf16_in_band"] = BF16_RELATIVE_BAND[0] < worst < BF16_RELATIVE_BAND[1]
        out["bf16_all_layers_differ"] = all(r["max_abs_diff"] > 0 for r in bf16["per_layer"])
    if fp32 and bf16:
        out["bf16_over_10x_fp32"] = out["bf16_max_relative"] > 10 * out["fp32_max_relative"]
    return out


def beside_cpu(tables: dict, cpu: dict) -> dict:
    """Per dtype and layer: the relative drift here, on the interpreter, and their ratio."""
    out: dict = {"cpu_source": cpu.get("source"), "dtypes": {}}
    for dtype, table in tables.items():
        ref = (cpu.get("tables") or {}).get(dtype)
        if not ref:
            continue
        cpu_rel = {r["layer"]: r["relative"] for r in ref["per_layer"]}
        rows = []
        for r in table["per_layer"]:
            c = cpu_rel.get(r["layer"])
            rows.append({"layer": r["layer"], "here": r["relative"], "cpu_interpreter": c,
                         "ratio": (r["relative"] / c) if c else None})
        out["dtypes"][dtype] = {"same_weights": table.get("weights_digest") == ref.get("weights_digest"),
                                "kernel_path_here": table["kernel_path"], "layers": rows,
                                "argmax_differences": {"here": table["teacher_forced_argmax_differences"],
                                                       "cpu_interpreter": ref["teacher_forced_argmax_differences"]}}
    out["bands_here"] = band_checks(tables)
    out["bands_cpu_interpreter"] = band_checks(cpu.get("tables") or {})
    return out


def _payload_eval(fixtures: Path, work: Path, mode: str, device: str, kernel: str) -> dict:
    cfg = EVAL[mode]
    out_dir = work / "eval"
    cmd = [sys.executable, "-m", "remote_payload", "eval", "--target", str(fixtures / "target"),
           "--drafter", f"random={fixtures / 'random-drafter'}", "--samples", str(cfg["samples"]),
           "--max-new-tokens", str(cfg["max_new_tokens"]), "--device", device, "--dtype", "bfloat16",
           "--kernel", kernel, "--cache-dir", str(work / "cache"), "--out", str(out_dir), "--threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg["timeout_s"])
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no stderr)"])[-5:]
        raise RuntimeError(f"payload eval exited {proc.returncode}: {' | '.join(tail)}")
    res = json.loads((out_dir / "results.json").read_text())
    tgt, ex = res["target"], res["extraction"]
    metrics = res["drafters"]["random"]["metrics"]
    return {"command": " ".join(cmd[1:]), "kernel_requested": res["settings"].get("kernel_requested"),
            "target_kernel_path": tgt["kernel_path"], "extraction_kernel_path": ex["kernel_path"],
            "kernels": tgt["kernels"], "device": tgt["device"], "device_map": tgt["device_map"], "dtype": tgt["dtype"],
            "extraction": {k: ex.get(k) for k in ("tokens", "tokens_per_s", "teacher_forced_mismatches",
                                                  "feature_bytes_per_token", "cuda_peak_bytes", "peak_rss_bytes")},
            "tau_macro_random_drafter": metrics.get("tau_macro"), "timings": res.get("timings"),
            "warnings": res.get("warnings", [])}


def run(part: Part, mode: str, device: str, kernel: str, work: Path) -> None:
    from remote_payload.models.target import weights_digest

    fixtures = work / "fixtures"
    with part.section("fixture") as out:
        kit_fixtures.build(fixtures, ["target", "random-drafter"])
        out["target_weights_digest"] = weights_digest(fixtures / "target")["value"]
    if not part.ok("fixture"):
        return
    with part.section("payload_eval") as out:
        out.update(_payload_eval(fixtures, work, mode, device, kernel))
    tables = {}
    for dtype in DTYPES:
        with part.section(f"table_{dtype}") as out:
            tables[dtype] = layer_table(str(fixtures / "target"), dtype, device, kernel, TABLE_NEW_TOKENS[mode])
            out.update(tables[dtype])
    with part.section("vs_cpu_interpreter") as out:
        out.update(beside_cpu(tables, json.loads(CPU_FIGURES.read_text())))
