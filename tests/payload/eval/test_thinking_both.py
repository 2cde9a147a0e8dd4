"""``--enable-thinking both`` through the real eval on the fixtures: per mode the τ of a run of that mode alone, and
the paired difference with its CI; on longctx prompts, so the dataset's depth is checked through the pipeline too."""

from __future__ import annotations

import pytest
from payload_helpers import read_results

from remote_payload.eval.pipeline import run_eval
from remote_payload.eval.settings import EvalSettings
from remote_payload.metrics.stats import bootstrap_mean_ci

DEPTH = 160


def _run(fixture_dir, eval_cache, out, thinking):
    settings = EvalSettings(target=str(fixture_dir / "target"), drafters=[("z", str(fixture_dir / "zlab-drafter"))],
                            datasets=[f"longctx:{DEPTH}@3"], max_new_tokens=16, dtype="float32", device="cpu",
                            cache_dir=str(eval_cache), out=str(out), enable_thinking=thinking)
    results = run_eval(settings)
    return results, read_results(out)[1]


def test_both_modes_in_one_run_equal_two_runs_and_pair_their_difference(fixture_dir, eval_cache, tmp_path):
    both, lines = _run(fixture_dir, eval_cache, tmp_path / "both", "both")
    alone = {mode: _run(fixture_dir, eval_cache, tmp_path / str(mode), mode) for mode in (False, True)}
    assert len(lines) == 6 and {line["thinking"] for line in lines} == {False, True}
    assert all(line["prompt_tokens"] == DEPTH for line in lines)  # longctx: exactly the depth, in either mode
    block = both["drafters"]["z"]["metrics"]["by_thinking"]
    for mode, key in ((False, "off"), (True, "on")):
        results, _ = alone[mode]
        assert block[key]["tau_macro"]["value"] == pytest.approx(results["drafters"]["z"]["metrics"]["tau_macro"])
        assert block[key]["samples"] == 3
    taus = {mode: {line["row_id"]: line["drafters"]["z"]["tau"] for line in alone[mode][1]} for mode in alone}
    diffs = [taus[True][r] - taus[False][r] for r in taus[False]]
    paired = block["paired"]
    assert paired["prompts"] == 3
    assert paired["difference"] == pytest.approx(sum(diffs) / 3)
    assert paired["ci"] == pytest.approx(list(bootstrap_mean_ci(diffs)))
    assert paired["ci"][0] <= paired["difference"] <= paired["ci"][1]
    assert both["settings"]["enable_thinking"] == "both"
    _report_and_profile_show_both(both, lines, tmp_path / "report")


def _report_and_profile_show_both(results, lines, run_dir):
    """What the controller makes of the run: the table's columns, report.md's sections and plot, the profile."""
    import io

    from rich.console import Console

    from orchestrator.evaluation.profile import build_profile
    from orchestrator.evaluation.report import summary_table, write_report
    from orchestrator.evaluation.report_depth import THINKING_COLUMNS

    run_dir.mkdir()
    report = write_report(run_dir, results, lines).read_text()
    paired = results["drafters"]["z"]["metrics"]["by_thinking"]["paired"]
    assert "## Thinking modes" in report and f"{paired['difference']:+.2f} [{paired['ci'][0]:.2f}, " in report
    assert "## τ by context depth" in report and "| z | " in report.split("## τ by context depth")[1]
    assert (run_dir / "tau_by_depth.png").read_bytes()[:4] == b"\x89PNG" and "](tau_by_depth.png)" in report
    out = io.StringIO()
    Console(file=out, width=400).print(summary_table(results))
    assert all(col in out.getvalue() for col in THINKING_COLUMNS), out.getvalue()
    profile = build_profile(results, lines, "z")
    assert set(profile["per_category"]) == {"longctx (thinking off)", "longctx (thinking on)"}
    assert profile["x_dfo"]["by_thinking"]["paired"] == paired
    depth = profile["x_dfo"]["by_context_depth"]
    assert depth["buckets"][0]["lo"] <= DEPTH and depth["buckets"][0]["tau_macro"]["value"] is not None
