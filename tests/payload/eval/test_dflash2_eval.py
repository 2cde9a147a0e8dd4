"""A DFlash2 drafter through the whole eval beside a DFlash one: τ in every convention, per-position figures, the
online check, the diagnostics (with what they do not probe), DDTree reported as not defined by name, and a
merge of the results that keeps that statement."""

from __future__ import annotations

from payload_helpers import json_lines, read_results

from orchestrator.evaluation.report import comparison_lines
from remote_payload.eval.drafters import TREE_NOT_DEFINED
from remote_payload.metrics.aggregate import merge_shards

FAST = ["--dtype", "float32", "--threads", "1", "--max-new-tokens", "160"]


def test_a_dflash2_drafter_runs_the_eval_beside_a_dflash_one(fixture_dir, run_payload, tmp_path, eval_cache):
    out = tmp_path / "run"
    proc = run_payload("eval", "--target", fixture_dir / "target", "--drafter", f"z={fixture_dir / 'zlab-drafter'}",
                       "--drafter", f"d2={fixture_dir / 'dflash2-drafter'}", "--samples", "3", "--online-check",
                       "--diagnose", "--diagnose-samples", "1", "--cache-dir", eval_cache, "--out", out, *FAST)
    assert proc.returncode == 0, proc.stderr
    headline = [r["message"] for r in json_lines(proc.stdout) if r.get("status") == "metrics" and
                r.get("stage") == "eval:d2"]
    assert headline and headline[0].endswith("DDTree not defined for DFlash2")
    results, samples = read_results(out)
    d2, z = results["drafters"]["d2"], results["drafters"]["z"]
    assert d2["spec"]["variant"] == "dflash2" and z["spec"]["variant"] == "dflash"
    m = d2["metrics"]
    assert m["tau_macro"] > 2.0 and len(m["per_position"]) == 7 and sum(m["tau_histogram"].values()) == m["rounds"]
    assert {"committed", "zlab-2604", "vllm"} <= m["conventions"].keys()
    assert all(m["conventions"][c]["tau_macro"] is not None for c in ("committed", "zlab-2604", "vllm"))
    assert m["conventions"]["zlab"]["alias_of"] == "committed"
    assert m["tree"] == {"not_defined": TREE_NOT_DEFINED} and "topk" in z["metrics"]["tree"]
    assert d2["online_check"]["all_rounds_identical"] and d2["online_check"]["all_outputs_equal_reference"]
    probes = results["diagnostics"]["drafters"]["d2"]["probes"]
    assert any("selector itself" in line for line in probes["not_applicable"])
    assert "not_applicable" not in results["diagnostics"]["drafters"]["z"]["probes"]
    assert "not probed (DFlash2): the candidate selector itself" in results["diagnostics"]["text"]
    assert all(line["drafters"]["d2"]["tree"] is None for line in samples)
    (pair,) = results["comparison"]["pairs"]
    assert pair["ddtree"]["delta"] is None
    assert pair["ddtree"]["note"] == "DDTree is not defined for DFlash2 (drafter 'd2'): no tree figures are compared"
    (line,) = comparison_lines(results)
    assert "DDTree is not defined for DFlash2 (drafter 'd2')" in line

    merged, _ = merge_shards([(results, samples)])
    mm = merged["drafters"]["d2"]["metrics"]
    assert "not defined for DFlash2 (drafter 'd2')" in merged["comparison"]["pairs"][0]["ddtree"]["note"]
    assert mm["tree"] == {"not_defined": TREE_NOT_DEFINED} and mm["tau_macro"] == m["tau_macro"]
