"""`dfo eval --dataset humaneval@8` and `--suite zlab` end to end on the sandbox hosts: HumanEval's rows read
from the package here and uploaded, z-lab's selection and formatting on the host, the exported sets read from
files on ct129, mt-bench's second turns asked with the first turn's answer, per-dataset figures in
results.json, report.md, the terminal and `runs compare`."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from cli_runner import dfo
from dataset_rows import ROWS, write_sets

from remote_payload.inputs.datasets.registry import ADAPTERS, package_source

pytestmark = [pytest.mark.sshd, pytest.mark.slow]
SUITE = ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"]


def _eval(sandbox, hosts, runs, *extra):
    proc = dfo(sandbox, "eval", "--host", "ct129", "--target", hosts["target"], "--drafter",
               f"zlab={hosts['zlab']}", "--dtype", "float32", "--threads", "1", "--json", *extra, runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(json.loads(proc.stdout)["path"])
    results = json.loads((run_dir / "results.json").read_text())
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    return run_dir, results, samples


def test_humaneval_at_8_is_zlabs_selection_of_the_package_rows(sandbox, eval_hosts, tmp_path):
    runs = tmp_path / "runs"
    run_dir, results, samples = _eval(sandbox, eval_hosts, runs, "--dataset", "humaneval@8", "--max-new-tokens", "16")
    (record,) = results["settings"]["datasets"]
    expected = [f"HumanEval/{i}" for i in (146, 67, 68, 94, 54, 50, 97, 71)]  # random.seed(0); shuffle; first 8
    assert record["row_ids"] == expected and record["rows"] == 164 and record["selection"]["seed"] == 0
    local, _ = package_source(ADAPTERS["humaneval"])
    assert record["source"]["sha256"] == hashlib.sha256(local.read_bytes()).hexdigest()  # the package's file
    assert [s["id"] for s in samples] == [f"humaneval/{i}" for i in expected]
    assert all(s["dataset"] == "humaneval" and s["host"] == "ct129" for s in samples)
    block = results["drafters"]["zlab"]["metrics"]["by_dataset"]["humaneval"]
    taus = [s["drafters"]["zlab"]["tau"] for s in samples]
    assert block["samples"] == 8 and block["tau_macro"]["value"] == pytest.approx(sum(taus) / 8)
    report = (run_dir / "report.md").read_text()
    assert "## Benchmarks" in report and "| drafter | humaneval |" in report and "zlab-transformers" in report
    shown = dfo(sandbox, "runs", "show", run_dir.name, runs=runs)
    assert shown.returncode == 0 and "humaneval τ [CI]" in shown.stdout, shown.stdout


def test_a_missing_or_empty_dataset_file_is_refused_before_anything_moves(sandbox, eval_hosts, tmp_path):
    """A dataset file with no rows (0 bytes, blank lines, a gzip of nothing, `[]`, an empty folder, a gzip that
    is not one) is refused by the pre-flight on the host, naming the host, the path and what it holds."""
    folder = sandbox.hosts["ct129"].models / "exported-datasets"  # the sandbox hosts share this filesystem
    files = write_sets(folder)
    (folder / "empty.jsonl").write_text("")
    (folder / "blank.jsonl").write_text("\n  \n\n")
    (folder / "nothing.jsonl.gz").write_bytes(gzip.compress(b"\n"))
    (folder / "array.json").write_text(" [ \n ] ")
    (folder / "notgzip.jsonl.gz").write_bytes(b"{not gzip}")
    (folder / "empty-folder" / "snapshots" / "abc").mkdir(parents=True, exist_ok=True)
    given = [a for name in SUITE[:-1] for a in ("--dataset-file", f"{name}={files[name]}")]
    runs = tmp_path / "runs"
    for path, seen in ((f"{folder}/empty.jsonl", "is empty"), (f"{folder}/none.jsonl", "does not exist"),
                       (f"{folder}/blank.jsonl", "holds no rows: only blank lines"),
                       (f"{folder}/nothing.jsonl.gz", "holds no rows: a gzip file that decompresses to nothing"),
                       (f"{folder}/array.json", "holds no rows: an empty JSON array"),
                       (f"{folder}/notgzip.jsonl.gz", "is not a readable gzip file"),
                       (f"{folder}/empty-folder", "is a folder with no rows file in it")):
        proc = dfo(sandbox, "eval", "--host", "ct129", "--target", eval_hosts["target"], "--drafter",
                   f"zlab={eval_hosts['zlab']}", "--suite", "zlab", *given, "--dataset-file", f"mt-bench={path}",
                   runs=runs)
        said = " ".join(proc.stderr.split())  # the longer lines may fold
        assert proc.returncode == 2 and f"ct129: --dataset-file mt-bench {path} {seen}" in said, proc.stderr[-2000:]
        assert "nothing was uploaded or relayed" in proc.stderr


def test_suite_zlab_with_exported_files_on_the_eval_host(sandbox, eval_hosts, tmp_path):
    folder = sandbox.hosts["ct129"].models / "exported-datasets"  # the sandbox hosts share this filesystem
    files = write_sets(folder)
    given = [a for name in SUITE for a in ("--dataset-file", f"{name}={files[name]}")]
    runs = tmp_path / "runs"
    run_dir, results, samples = _eval(sandbox, eval_hosts, runs, "--suite", "zlab", *given, "--max-new-tokens", "12")
    assert [d["name"] for d in results["settings"]["datasets"]] == SUITE and results["settings"]["suite"] == "zlab"
    for record in results["settings"]["datasets"]:
        assert record["source"]["sha256"] == hashlib.sha256(files[record["name"]].read_bytes()).hexdigest()
        assert record["samples"] == len(ROWS[record["name"]]) * (2 if record["name"] == "mt-bench" else 1)
    by_dataset = results["drafters"]["zlab"]["metrics"]["by_dataset"]
    assert list(by_dataset) == SUITE and set(by_dataset["mt-bench"]["by_category"]) == {"writing", "math"}
    turns = {s["id"]: s for s in samples if s["dataset"] == "mt-bench"}
    first, second = turns["mt-bench/81/turn1"], turns["mt-bench/81/turn2"]
    # the second turn's prompt holds the first turn's prompt and answer (its reference continuation)
    assert second["prompt_tokens"] > first["prompt_tokens"] + first["continuation_tokens"] - 1
    assert second["turn"] == 2 and second["category"] == "writing"
    report = (run_dir / "report.md").read_text()
    assert "| drafter | gsm8k | math500 | humaneval | mbpp | mt-bench |" in report
    assert "mt-bench by category" in report
    compared = dfo("runs", "compare", run_dir.name, run_dir.name, runs=runs)
    assert compared.returncode == 0 and "zlab on mt-bench:" in compared.stdout and "Δ +0.00" in compared.stdout, \
        compared.stdout
