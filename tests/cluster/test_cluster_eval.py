"""`dfo eval --host CLUSTER --shards 2` against the real sandbox Slurm, with the real payload and the tiny
fixture models: the merged run matches the single-host run on the same prompts, and records every task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import dfo

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _args(hosts, *where: str) -> list[str]:
    return ["eval", *where, "--target", hosts["target"], "--drafter", f"zlab={hosts['zlab']}",
            "--drafter", hosts["random"], "--samples", "4", "--max-new-tokens", "32", "--dtype", "float32",
            "--threads", "1", "--json"]


def _taus(run_dir: Path) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    return {name: d["metrics"]["tau_macro"] if "tau_macro" in d["metrics"] else d["metrics"]
            for name, d in results["drafters"].items()}


def test_a_two_task_array_gives_the_single_host_taus_and_records_each_task(eval_hosts, cluster_inventory, sandbox,
                                                                            tmp_path):
    one = dfo(*_args(eval_hosts, "--host", "ct129"), inventory=sandbox.inventory_path, runs=tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = dfo(*_args(eval_hosts, "--host", "hpc", "--shards", "2"), inventory=cluster_inventory,
              runs=tmp_path / "cluster")
    assert two.returncode == 0, two.stderr[-3000:]
    single, merged = Path(json.loads(one.stdout)["path"]), Path(json.loads(two.stdout)["path"])
    assert _taus(merged) == _taus(single)
    results = json.loads((merged / "results.json").read_text())
    assert set(results["hosts"]) == {"hpc[0]", "hpc[1]"}
    for task in (0, 1):
        record = results["hosts"][f"hpc[{task}]"]
        assert record["shard"] == [task, 2] and record["job_id"].isdigit()
        assert record["slurm"]["node"] == "node1" and record["slurm"]["state"] == "COMPLETED"
    tasks = json.loads((merged / "run.json").read_text())["jobs"]["hpc"]["slurm"]["tasks"]
    assert {t["state"] for t in tasks.values()} == {"COMPLETED"} and {t["node"] for t in tasks.values()} == {"node1"}
    assert "task 0" in two.stderr and "COMPLETED" in two.stderr
    assert all(t["queued_s"] >= 0 and t["finished_at"] >= t["started_at"] for t in tasks.values())
    # The figures the docs quote (printed with -s; speed is not asserted).
    timings = {k: h["timings"]["total_s"] for k, h in results["hosts"].items()}
    alone = json.loads((single / "results.json").read_text())["hosts"]["ct129"]["timings"]["total_s"]
    print(f"\ncluster tasks: queued {[t['queued_s'] for t in tasks.values()]} s, task wall "
          f"{[round(t['finished_at'] - t['started_at'], 2) for t in tasks.values()]} s, payload total {timings} s; "
          f"one host: payload total {alone} s")


def test_dry_run_prints_the_batch_script(eval_hosts, cluster_inventory, tmp_path):
    proc = dfo(*[a for a in _args(eval_hosts, "--host", "hpc", "--shards", "2") if a != "--json"], "--dry-run",
               inventory=cluster_inventory, runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --array=0-1" in proc.stdout and "--shard \"$task\"/2" in proc.stdout.replace("'", "")


def test_a_cancelled_task_fails_the_run_and_resume_reruns_only_it(eval_hosts, cluster_inventory, slurm, tmp_path):
    runs = tmp_path / "runs"
    # hpc-serial runs one task at a time, so task 1 is still pending when it is cancelled.
    started = dfo(*_args(eval_hosts, "--host", "hpc-serial", "--shards", "2"), "--detach",
                  inventory=cluster_inventory, runs=runs)
    assert started.returncode == 0, started.stderr[-3000:]
    run = json.loads(started.stdout)
    array = run["jobs"]["hpc-serial"]["slurm"]["array_job_id"]
    assert slurm.shell(f"scancel {array}_1").ok
    failed = dfo("runs", "pull", run["run"], inventory=cluster_inventory, runs=runs)
    assert failed.returncode == 1
    assert "task 1" in failed.stderr and "CANCELLED" in failed.stderr and "--resume" in failed.stderr
    assert not (Path(run["path"]) / "results.json").exists()  # nothing half-done is merged
    task0 = json.loads((Path(run["path"]) / "run.json").read_text())["jobs"]["hpc-serial"]["slurm"]["tasks"]["0"]
    resumed = dfo("runs", "pull", run["run"], "--resume", "--json", inventory=cluster_inventory, runs=runs)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "task(s) 1 submitted again" in resumed.stderr
    tasks = json.loads((Path(run["path"]) / "run.json").read_text())["jobs"]["hpc-serial"]["slurm"]["tasks"]
    assert tasks["0"] == task0 and tasks["1"]["state"] == "COMPLETED" and tasks["1"]["job_id"] != task0["job_id"]
    assert json.loads((Path(run["path"]) / "results.json").read_text())["drafters"]["zlab"]["metrics"]["samples"] == 4
