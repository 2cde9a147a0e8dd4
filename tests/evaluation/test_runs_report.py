"""Run folders, the report and plots, and `runs compare` — on synthetic results (pure, no hosts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.evaluation.compare import compare_runs
from orchestrator.evaluation.report import drafter_rows, write_report
from orchestrator.evaluation.runs import find_run, list_runs, new_run, write_json_atomic


def metrics(taus: list[float]) -> dict:
    return {"tau_macro": sum(taus) / len(taus), "tau_micro": sum(taus) / len(taus), "rounds": 10 * len(taus),
            "samples": len(taus), "block_size": 4,
            "per_position": [{"k": 1, "p": 0.5}, {"k": 2, "p": 0.25}, {"k": 3, "p": 0.1}],
            "tau_histogram": {"1": 5, "2": 3, "3": 1, "4": 1},
            "tree": {"topk": {"k": 8, "tau_macro": 3.0, "definition": "top-k"},
                     "budgeted": {"budget": 8, "tau_macro": 2.5, "definition": "budgeted"}}}


def make_run(root: Path, taus: dict[str, list[float]], settings: dict | None = None):
    run = new_run(root, ["ct129"], {"request": {}})
    ids = [f"p{i}" for i in range(len(next(iter(taus.values()))))]
    results = {"schema": "dfo.results/1", "status": "ok", "settings": settings or {"max_new_tokens": 64},
               "target": {"weights_digest": {"algorithm": "sha256", "value": "aa"}},
               "extraction": {"kernel_path": "torch"},
               "drafters": {n: {"metrics": metrics(t), "spec": {"format": "zlab"}} for n, t in taus.items()}}
    samples = [{"id": i, "continuation_tokens": 10, "drafters": {n: {"tau": t[k]} for n, t in taus.items()}}
               for k, i in enumerate(ids)]
    (run.path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    write_report(run.path, results, samples)
    write_json_atomic(run.results_path, results)
    run.set(status="succeeded")
    return run


def test_report_and_plots_are_written(tmp_path):
    run = make_run(tmp_path, {"ours": [2.0, 3.0, 4.0], "zlab": [5.0, 6.0, 7.0]})
    report = (run.path / "report.md").read_text()
    assert "| ours | zlab | 3.00 |" in report and "| zlab | zlab | 6.00 |" in report
    assert "DDTree-8" in report and "budgeted DDTree" in report and "(budget 8)" in report
    assert "![acceptance](acceptance.png)" in report
    for png in ("acceptance.png", "tau_histogram.png"):
        data = (run.path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    rows = drafter_rows(run.results())
    assert [r["drafter"] for r in rows] == ["ours", "zlab"] and rows[0]["ddtree"] == 3.0


def test_compare_pairs_prompts_and_flags_differences(tmp_path):
    a = make_run(tmp_path, {"ours": [2.0, 3.0, 4.0, 3.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0, 5.0, 4.0], "new": [1.0, 1.0, 1.0, 1.0]},
                 settings={"max_new_tokens": 128})
    report = compare_runs(a, b)
    ours = next(r for r in report["drafters"] if r["drafter"] == "ours")
    assert ours["delta"] == pytest.approx(1.0) and ours["paired_samples"] == 4
    assert ours["ci"] == [pytest.approx(1.0), pytest.approx(1.0)] and "higher" in ours["note"]
    assert next(r for r in report["drafters"] if r["drafter"] == "new")["note"] == "only in B"
    assert any("max_new_tokens" in n for n in report["notes"])


def test_find_run_by_prefix_last_and_errors(tmp_path):
    first = make_run(tmp_path, {"ours": [2.0, 2.0]})
    second = make_run(tmp_path, {"ours": [3.0, 3.0]})
    assert [r.name for r in list_runs(tmp_path)] == sorted([first.name, second.name])
    assert find_run(tmp_path, "last").name == max(first.name, second.name)
    assert find_run(tmp_path, second.name[-4:]).name == second.name
    with pytest.raises(InputError, match="no run matches"):
        find_run(tmp_path, "zzzz")
    with pytest.raises(InputError, match="no runs in"):
        find_run(tmp_path / "empty", "last")


def test_runs_cli_show_and_compare(tmp_path):
    a = make_run(tmp_path, {"ours": [2.0, 3.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0]})
    env = {**os.environ, "DFO_RUNS_DIR": str(tmp_path), "COLUMNS": "200"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=60)
    shown = run("runs", "show", a.name)
    assert shown.returncode == 0 and "ours" in shown.stdout and "2.50" in shown.stdout
    compared = run("runs", "compare", a.name, b.name, "--json")
    assert compared.returncode == 0
    assert json.loads(compared.stdout)["drafters"][0]["delta"] == pytest.approx(1.0)
    missing = run("runs", "show", "nope")
    assert missing.returncode == 2 and "no run matches" in missing.stderr
