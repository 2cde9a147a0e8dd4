"""The payload's fla path, end to end on the tiny hybrid target, with fla's kernels on CPU (shim.py).

Each test fails if the binding silently falls back to torch: the recorded path must be "fla", the bound
functions must come from fla, and the hidden states must differ (slightly) from the torch path's.
"""

from __future__ import annotations

import json

import fla_env
import pytest

PROBE = fla_env.HERE / "probe.py"
pytestmark = pytest.mark.slow


def _last_json(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("{", "[")):
            return json.loads(line)
    raise AssertionError(f"no JSON line in the output:\n{stdout[-2000:]}")


def _ok(proc):
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc


def _relative(row: dict) -> float:
    return row["mean_abs_diff"] / row["max_abs_value"]


def test_binding_and_gpu_check_comparison(run_fla, fla_fixtures):
    """fla binds, runs, and gpu-check's comparison gives one row per layer: fp32 ≈ torch, bf16 close."""
    proc = _ok(run_fla([PROBE, "--target", fla_fixtures / "target", "--dtype", "float32", "--dtype", "bfloat16"]))
    fp32, bf16 = _last_json(proc.stdout)
    for rep in (fp32, bf16):
        assert rep["kernel_path"] == "fla"
        delta = {k: v for k, v in rep["kernels"].items() if "gated_delta_rule" in k}
        assert delta and all(v.startswith("fla:fla.") for v in delta.values()), rep["kernels"]
        assert [r["layer"] for r in rep["per_layer"]] == list(range(8))
    # A silent fallback would make both extractions the same torch code: every difference exactly 0.
    assert all(r["max_abs_diff"] > 0 for r in fp32["per_layer"] + bf16["per_layer"])
    assert max(_relative(r) for r in fp32["per_layer"]) < 1e-4  # the same maths in fp32
    rel_bf16 = [_relative(r) for r in bf16["per_layer"]]
    assert 1e-4 < max(rel_bf16) < 0.1, rel_bf16  # bf16 rounding in different places, not a broken kernel
    assert max(rel_bf16) > 10 * max(_relative(r) for r in fp32["per_layer"])


def _eval_args(fixtures, cache, out, kernel):
    return ["-m", "remote_payload", "eval", "--target", fixtures / "target",
            "--drafter", f"d={fixtures / 'zlab-drafter'}",
            "--samples", "1", "--max-new-tokens", "12", "--dtype", "bfloat16", "--kernel", kernel, "--threads", "1",
            "--cache-dir", cache, "--out", out]


def test_eval_records_fla_and_never_reuses_features_across_paths(run_fla, fla_fixtures, tmp_path):
    cache = tmp_path / "cache"
    _ok(run_fla(_eval_args(fla_fixtures, cache, tmp_path / "fla", "fla")))
    fla = json.loads((tmp_path / "fla" / "results.json").read_text())
    assert fla["target"]["kernel_path"] == "fla" and fla["extraction"]["kernel_path"] == "fla"
    assert fla["settings"]["kernel_requested"] == "fla"
    assert fla["extraction"]["cache_hits"] == 0
    [feature_file] = (cache / "features").iterdir()
    assert _feature_meta(feature_file)["kernel_path"] == "fla"

    # auto on a CPU host with fla + triton installed must pick torch, and must not take fla's features.
    _ok(run_fla(_eval_args(fla_fixtures, cache, tmp_path / "auto", "auto")))
    auto = json.loads((tmp_path / "auto" / "results.json").read_text())
    assert auto["target"]["kernel_path"] == "torch" and auto["extraction"]["kernel_path"] == "torch"
    assert auto["extraction"]["cache_hits"] == 0 and auto["reference"]["cache_hits"] == 0
    not_reused = [w for w in auto.get("warnings", []) if "not reused" in w and "kernel_path fla -> torch" in w]
    assert any(w.startswith("feature cache") for w in not_reused), auto.get("warnings")
    assert _feature_meta(feature_file)["kernel_path"] == "torch"
    for res in (fla, auto):
        assert res["drafters"]["d"]["metrics"]["tau_macro"] >= 1.0


def _feature_meta(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        return json.loads(fh.metadata()["dfo"])


def test_kernel_fla_without_the_interpreter_is_refused(run_fla, fla_fixtures, tmp_path):
    """Outside the tests' interpreter, --kernel fla on a CPU host is a clear one-line error."""
    proc = run_fla(_eval_args(fla_fixtures, tmp_path / "c", tmp_path / "o", "fla"), env={"DFO_FLA_SHIM": "off"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert line.startswith("dfo-payload error: --kernel fla needs a CUDA device"), line
    assert not (tmp_path / "o" / "results.json").exists()
