"""Per-dataset figures from sample lines (results, runs compare, watch) and the cache's size limit: pure logic
on hand-made records, each figure checked against the same average taken here."""

from __future__ import annotations

import json
import os
import time

from orchestrator.evaluation.compare import compare_runs, dataset_lines
from orchestrator.evaluation.report import benchmarks_markdown, summary_table
from orchestrator.evaluation.runs import Run
from orchestrator.watch.measures import dataset_measures, dataset_taus, judge_datasets
from remote_payload.inputs.cache import enforce_limit, mark_used
from remote_payload.metrics.aggregate import dataset_breakdown


def _line(i, dataset, tau, category=None, zlab=None, engine=None):
    produced = [int(tau)] * 2
    entry = {"tau": tau, "produced": produced, "conventions": {"zlab-2604": {"produced": [zlab or tau] * 2}}}
    if engine is not None:
        entry["engine"] = engine
    return {"index": i, "id": f"{dataset}/{i}", "dataset": dataset, "category": category,
            "drafters": {"d": entry}}


LINES = [_line(0, "gsm8k", 3.0), _line(1, "gsm8k", 5.0), _line(2, "mt-bench", 2.0, "writing", zlab=2.5),
         _line(3, "mt-bench", 4.0, "math", engine={"rounds": 10, "drafts_accepted": 15}),
         _line(4, "mt-bench", 6.0, "math", engine={"rounds": 10, "drafts_accepted": 25})]


def test_the_breakdown_averages_each_dataset_and_category_over_its_own_samples():
    out = dataset_breakdown(LINES, "d")
    assert list(out) == ["gsm8k", "mt-bench"]
    assert out["gsm8k"]["tau_macro"]["value"] == 4.0 and out["gsm8k"]["samples"] == 2
    lo, hi = out["gsm8k"]["tau_macro"]["ci"]
    assert 3.0 <= lo <= 4.0 <= hi <= 5.0
    mt = out["mt-bench"]
    assert mt["tau_macro"]["value"] == 4.0 and mt["zlab_2604_tau_macro"]["value"] == (2.5 + 4.0 + 6.0) / 3
    assert mt["by_category"]["math"]["tau_macro"]["value"] == 5.0 and mt["by_category"]["writing"]["samples"] == 1
    assert mt["by_category"]["writing"]["tau_macro"]["ci"] is None  # one sample: no interval
    assert mt["engine_tau"] == 1 + 40 / 20 and mt["engine_samples"] == 2 and "engine_tau" not in out["gsm8k"]
    assert dataset_breakdown([{k: v for k, v in LINES[0].items() if k != "dataset"}], "d") is None


def _results(lines):
    return {"drafters": {"d": {"metrics": {"tau_macro": 4.0, "by_dataset": dataset_breakdown(lines, "d")}}},
            "settings": {"datasets": [{"name": "gsm8k", "split": "test", "hub_id": "openai/gsm8k", "config": "main",
                                       "rows": 2, "samples": 2, "source": {"sha256": "ab" * 32, "files": ["/x"]},
                                       "selection": {"rule": "zlab-transformers", "seed": 0, "requested": None}}]}}


def test_the_report_has_zlabs_table_shape_datasets_as_columns():
    md = "\n".join(benchmarks_markdown(_results(LINES)))
    assert "## Benchmarks" in md and "| drafter | gsm8k | mt-bench |" in md
    gsm = dataset_breakdown(LINES, "d")["gsm8k"]["tau_macro"]
    assert f"| d | 4.00 [{gsm['ci'][0]:.2f}, {gsm['ci'][1]:.2f}] | 4.00 [" in md
    assert "mt-bench by category" in md and "| drafter | math | writing |" in md
    assert "engine τ" in md and "| d | – | 3.00 |" in md
    assert "zlab-transformers seed 0" in md and "sha256 abababababababab" in md
    header = [c.header for c in summary_table(_results(LINES)).columns]
    assert "gsm8k τ [CI]" in header and "mt-bench τ [CI]" in header


def _run(tmp_path, name, lines):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({"status": "succeeded"}))
    (folder / "results.json").write_text(json.dumps(_results(lines)))
    (folder / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return Run(folder, {"status": "succeeded"})


def test_runs_compare_pairs_each_dataset_inside_itself(tmp_path):
    later = [_line(i, x["dataset"], x["drafters"]["d"]["tau"] + (1.0 if x["dataset"] == "gsm8k" else 0.0),
                   x["category"]) for i, x in enumerate(LINES)]
    report = compare_runs(_run(tmp_path, "a", LINES), _run(tmp_path, "b", later))
    (row,) = report["drafters"]
    gsm, mt = row["by_dataset"]["gsm8k"], row["by_dataset"]["mt-bench"]
    assert gsm["delta"] == 1.0 and gsm["paired_samples"] == 2 and mt["delta"] == 0.0 and mt["paired_samples"] == 3
    assert gsm["tau_a"] == 4.0 and gsm["tau_b"] == 5.0
    text = dataset_lines(report)
    assert text[0].startswith("d on gsm8k: τ 4.00 → 5.00, Δ +1.00") and "over 2 pairs" in text[0]


def test_watch_measures_and_judges_each_dataset():
    assert dataset_taus(LINES, "d")["gsm8k"] == {"gsm8k/0": 3.0, "gsm8k/1": 5.0}
    m = dataset_measures(LINES, "d")
    assert m["mt-bench"]["tau_macro"]["value"] == 4.0 and m["gsm8k"]["samples"] == 2
    best = dataset_taus(LINES, "d")
    current = {"gsm8k": {k: v + 2.0 for k, v in best["gsm8k"].items()},
               "mt-bench": {k: v - 3.0 for k, v in best["mt-bench"].items()}}
    verdicts = judge_datasets(current, best, best_name="step_1", recent={})
    assert verdicts["gsm8k"]["verdict"] == "up" and verdicts["mt-bench"]["verdict"] == "down"
    assert verdicts["gsm8k"]["delta"] == 2.0 and verdicts["mt-bench"]["regression"]
    assert judge_datasets(current, None, best_name=None, recent={})["gsm8k"]["verdict"] == "first"


def test_the_cache_limit_removes_least_recently_used_files_but_never_kept_ones(tmp_path):
    files = []
    for i in range(5):
        f = tmp_path / "features" / f"f{i}.safetensors"
        f.parent.mkdir(exist_ok=True)
        f.write_bytes(b"x" * 1000)
        os.utime(f, (time.time() - 100 + i, time.time() - 100 + i))  # f0 the least recently used
        files.append(f)
    (tmp_path / "features" / ".f9.safetensors.tmp").write_bytes(b"y" * 5000)  # a writer's temp file: not counted
    out = enforce_limit(tmp_path, 2500, keep=[files[0]])
    assert [f.exists() for f in files] == [True, False, False, False, True]
    assert out == {"limit_bytes": 2500, "bytes_before": 5000, "bytes": 2000, "evicted": 3, "evicted_bytes": 3000,
                   "over_limit": False}
    assert enforce_limit(tmp_path, 500, keep=files)["over_limit"] is True


def test_a_reused_entry_counts_as_recently_used_and_keeps_its_write_time(tmp_path):
    old, newer = tmp_path / "references" / "old.json", tmp_path / "references" / "newer.json"
    old.parent.mkdir()
    for i, f in enumerate((old, newer)):
        f.write_bytes(b"x" * 100)
        os.utime(f, (time.time() - 100 + i, time.time() - 100 + i))
    written = old.stat().st_mtime_ns
    mark_used(old)  # a cache hit
    assert old.stat().st_mtime_ns == written
    enforce_limit(tmp_path, 150)
    assert old.exists() and not newer.exists()
