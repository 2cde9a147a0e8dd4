"""The eval's last progress line: each drafter's headline τ and the run folder, never a raw dictionary."""

from __future__ import annotations

from pathlib import Path

from orchestrator.evaluation.operation import result_line


def test_the_line_names_each_drafters_tau_and_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = {"drafters": {"ours": {"metrics": {"tau_macro": 3.7109301139473554}},
                            "zlab": {"metrics": {"tau_macro": 5.1234}}}}
    assert result_line(results, tmp_path / "runs" / "r1") == "result: ours τ 3.71, zlab τ 5.12 → runs/r1"


def test_figures_a_host_got_wrong_are_question_marks_and_outside_paths_stay_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    results = {"drafters": {"a": {"metrics": {"tau_macro": "3.7"}}, "b": {"metrics": None}, "c": [1],
                            "d": {"metrics": {"tau_macro": float("nan")}}}}
    line = result_line(results, Path("/elsewhere/runs/r2"))
    assert line == "result: a τ ?, b τ ?, c τ ?, d τ ? → /elsewhere/runs/r2"
    assert result_line({}, Path("/x")) == "result: no drafter figures → /x"
