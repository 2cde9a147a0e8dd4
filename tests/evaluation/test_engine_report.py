"""The engine block of the controller report, rendered from a results.json built with the payload's own
comparison (metrics.engine_agreement) on hand-made counts: each figure with its bound."""

from __future__ import annotations

from orchestrator.evaluation.engine_report import engine_markdown, engine_rows, engine_text
from remote_payload.metrics.engine_agreement import compare, engine_figures, sample_counts

B1 = 3


def _results(engine_rounds, offline_rounds, positions: int = B1) -> dict:
    eng = [sample_counts(r, positions) for r in engine_rounds]
    ids = [chr(ord("a") + i) for i in range(len(eng))]
    agreement = {**compare(ids, eng, offline_rounds, positions), "convention": "vllm", "offline_source": "vllm"}
    return {
        "engine": {"name": "vllm", "version": "0.32.0", "served_name": "dfo-t-123",
                   "used_for": ["references", "drafters"],
                   "plain": {"tokens_per_s": 40.0}, "start_seconds": {"plain": 41.2, "ours": 55.0},
                   "logs": ["vllm-ours.log", "vllm-plain.log"]},
        "drafters": {
            "ours": {"engine": {"total": engine_figures(eng, positions), "agreement": agreement,
                                "exported": "training format", "outputs": {"samples": 2, "match_reference": 2},
                                "tokens_per_s": {"plain": 40.0, "dflash": 60.0, "speedup": 1.5}}},
            "broken": {"engine": {"error": "vLLM server exited with status 1 before it was healthy\nlog tail"}},
            "offline-only": {"metrics": {}},
        }}


def test_engine_vs_offline_side_by_side():
    results = _results([[3, 0, 1], [2, 2]], [[3, 0, 1], [2, 2]])
    rows = engine_rows(results)
    assert [r["drafter"] for r in rows] == ["ours", "broken"]
    md = "\n".join(engine_markdown(results))
    assert "## Engine (vLLM)" in md and "vllm 0.32.0" in md and "plain 41.2 s, ours 55.0 s" in md
    # every sample identical round by round: nothing may differ, every bound is 0
    assert "| ours | 2.60 / 2.60 ±0.00 | 2.67 / 2.67 | 0.80 / 0.80 ±0.00 | 0.60 / 0.60 ±0.00 | 0.20 / 0.20 ±0.00 | " \
           "– / – | 5 / 5 ±0.0 | 2/2 |" in md
    assert "| 40.0 | 60.0 | 1.50× | within tolerance |" in md
    assert "exported to a z-lab folder for vLLM (training format)" in md
    assert "broken: engine run failed: vLLM server exited with status 1 before it was healthy" in md
    assert "ours: tolerance: every sample identical round by round, so every figure must be equal (±0)" in md
    assert "near-tie drafter logits" in md
    (text, failed) = engine_text(results)
    assert text.startswith("engine ours (vllm convention): τ micro 2.60 vs offline 2.60 ±0.00, p1 0.80 vs 0.80 ±0.00")
    assert "within tolerance" in text and "failed" in failed


def test_flipped_samples_show_the_bound_beside_each_figure():
    # issue 26's case: 1 of 4 samples identical, the engine's τ 5.348 vs 5.511 offline
    offline = [[7, 7, 0, 5, 7, 2, 7, 7, 6, 1], [7, 5, 7, 0, 7, 7, 7, 7, 2, 7, 0, 7],
               [0, 7, 0, 5, 2, 7, 5, 5, 7, 0, 7, 4], [7, 0, 5, 0, 2, 6, 7, 2, 0, 6, 7]]
    engine = [offline[0], [7, 5, 7, 0, 7, 7, 7, 0, 7, 6, 0, 7], [0, 7, 1, 3, 2, 6, 2, 2, 7, 3, 6, 1, 7],
              [7, 0, 2, 6, 7, 2, 6, 0, 7, 0, 7]]
    results = _results(engine, offline, positions=7)
    ag = results["drafters"]["ours"]["engine"]["agreement"]
    md = "\n".join(engine_markdown(results))
    tau, rounds, p = ag["tau_micro"], ag["rounds"], ag["per_position"]
    assert 0 < abs(tau["diff"]) < tau["bound"]
    assert f"| ours | 5.35 / 5.51 ±{tau['bound']:.2f} | " in md
    assert " | ".join(f"{x['engine']:.2f} / {x['offline']:.2f} ±{x['bound']:.2f}" for x in p[:4]) in md
    assert f"| 46 / 45 ±{rounds['bound']:.1f} | 1/4 |" in md and "within tolerance" in md
    assert "ours: tolerance: each ± is a two-sample bound at a 1% overall false-alarm rate (z 3.23 for each of the 8 " \
           "figures p_k and τ micro) on the 36/35 engine/offline rounds of the 3 sample(s) that differ, scaled by " \
           "their share of the run (78%; identical samples add no difference)" in md
    (text, _) = engine_text(results)
    assert f"τ micro 5.35 vs offline 5.51 ±{tau['bound']:.2f}, p1 0.83 vs 0.80 ±{p[0]['bound']:.2f}" in text


def test_results_written_before_the_bounds_show_the_fixed_tolerance_of_then():
    results = _results([[3, 0, 1], [2, 2]], [[3, 0, 1], [2, 2]])
    ag = results["drafters"]["ours"]["engine"]["agreement"]
    for key in ("tau_micro", "rounds"):
        del ag[key]
    for p in ag["per_position"]:
        del p["bound"]
    ag["tolerance"] = {"rounds_rel": 0.05, "rounds_abs": 1, "p_abs": 0.08, "tau_micro_abs": 0.15, "why": "…"}
    md = "\n".join(engine_markdown(results))
    assert "| ours | 2.60 / 2.60 | 2.67 / 2.67 | 0.80 / 0.80 | 0.60 / 0.60 | 0.20 / 0.20 | – / – | 5 / 5 | 2/2 |" in md
    assert "ours: tolerance: rounds within 5% + 1 per sample (summed; samples outside are listed), p_k within 0.08, " \
           "τ micro within 0.15" in md


def test_disagreement_is_shown_with_its_reasons():
    results = _results([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0]], [[3, 3], [3, 1]])
    md = "\n".join(engine_markdown(results))
    ag = results["drafters"]["ours"]["engine"]["agreement"]
    assert "**outside tolerance**" in md and "ours: outside the tolerance:" in md
    assert f"τ micro 1.000 vs 3.500 (±{ag['tau_micro']['bound']:.3f})" in md


def test_no_engine_block_no_section():
    assert engine_markdown({"drafters": {"x": {"metrics": {}}}}) == []


def test_a_run_whose_every_drafter_was_refused_says_no_server_started():
    skipped = "every drafter was refused before its server, so the plain one (the baseline) was not started"
    results = {"engine": {"name": "vllm", "version": "0.32.0", "served_name": "dfo-t-123", "used_for": ["drafters"],
                          "plain": None, "start_seconds": {}, "servers": {}, "logs": [], "plain_skipped": skipped},
               "drafters": {"d2": {"engine": {"engine": "vllm", "error": "drafter 'd2' is a DFlash2 drafter …"}}}}
    md = engine_markdown(results)
    assert f"- no server started: {skipped}" in md and not any(line.startswith("- server start") for line in md)
    assert "d2: engine run failed: drafter 'd2' is a DFlash2 drafter" in "\n".join(md)
