"""The engine block of the controller report, rendered from a results.json built with the payload's own
comparison (metrics.engine_agreement) on hand-made counts."""

from __future__ import annotations

from orchestrator.evaluation.engine_report import engine_markdown, engine_rows, engine_text
from remote_payload.metrics.engine_agreement import compare, engine_figures, sample_counts

B1 = 3


def _results(engine_rounds, offline_rounds) -> dict:
    eng = [sample_counts(r, B1) for r in engine_rounds]
    agreement = {**compare(["a", "b"], eng, offline_rounds, B1), "convention": "vllm", "offline_source": "vllm"}
    return {
        "engine": {"name": "vllm", "version": "0.32.0", "served_name": "dfo-t-123",
                   "used_for": ["references", "drafters"],
                   "plain": {"tokens_per_s": 40.0}, "start_seconds": {"plain": 41.2, "ours": 55.0},
                   "logs": ["vllm-ours.log", "vllm-plain.log"]},
        "drafters": {
            "ours": {"engine": {"total": engine_figures(eng, B1), "agreement": agreement, "exported": "training format",
                                "outputs": {"samples": 2, "match_reference": 2},
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
    assert "| ours | 2.60 / 2.60 | 2.67 / 2.67 | 0.80 / 0.80 | 0.60 / 0.60 | 0.20 / 0.20 | – / – | 5 / 5 | 2/2 |" in md
    assert "| 40.0 | 60.0 | 1.50× | within tolerance |" in md
    assert "exported to a z-lab folder for vLLM (training format)" in md
    assert "broken: engine run failed: vLLM server exited with status 1 before it was healthy" in md
    assert "near-tie drafter logits" in md
    (text, failed) = engine_text(results)
    assert text.startswith("engine ours (vllm convention): τ micro 2.60 vs offline 2.60") and "within tolerance" in text
    assert "failed" in failed


def test_disagreement_is_shown_with_its_reasons():
    results = _results([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0]], [[3, 3], [3, 1]])
    md = "\n".join(engine_markdown(results))
    assert "**outside tolerance**" in md and "ours: outside the tolerance:" in md and "τ micro" in md


def test_no_engine_block_no_section():
    assert engine_markdown({"drafters": {"x": {"metrics": {}}}}) == []
