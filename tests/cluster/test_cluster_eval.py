"""Evals on the real sandbox Slurm, with the real payload and the tiny fixture models: the demo's cluster story
(a two-task array merged, beside the single-host run on the same prompts: the same τ table, every task
recorded), `--dry-run`'s batch script, and a cancelled task re-run alone by `runs pull --resume`."""

from __future__ import annotations

import io
import json
from datetime import datetime
from pathlib import Path

import pytest
from cli_runner import dfo
from rich.console import Console

from orchestrator.core.inventory import load_inventory
from orchestrator.demo.cluster_story import cluster_evals, tau_table
from orchestrator.evaluation.plan import EvalRequest, parse_drafter
from orchestrator.jobs.operation import job_status
from orchestrator.transport import Connector
from orchestrator.ui.console_events import ConsoleEvents

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _args(hosts, *where: str) -> list[str]:
    return ["eval", *where, "--target", hosts["target"], "--drafter", f"zlab={hosts['zlab']}",
            "--drafter", hosts["random"], "--samples", "4", "--max-new-tokens", "32", "--dtype", "float32",
            "--threads", "1", "--json"]


def _taus(run_dir: Path) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    return {name: d["metrics"]["tau_macro"] if "tau_macro" in d["metrics"] else d["metrics"]
            for name, d in results["drafters"].items()}


def test_the_demo_cluster_story_gives_the_single_host_tau_table_and_records_each_task(eval_hosts, cluster_inventory,
                                                                                       tmp_path):
    """The demo's `--cluster slurm` evals (cluster_story.cluster_evals): a two-task array on hpc, merged, then
    the same eval on ct129 alone; the τ tables are equal and the run records every task's job, node, state."""
    inv = load_inventory(cluster_inventory)
    request = EvalRequest(hosts=["ct129"], target=eval_hosts["target"], samples=4, max_new_tokens=32,
                          dtype="float32", threads=1,
                          drafters=[parse_drafter(f"zlab={eval_hosts['zlab']}", inv),
                                    parse_drafter(eval_hosts["random"], inv)])
    notes = io.StringIO()
    with Connector(inv) as connector:
        runs = cluster_evals(connector, request, inv, tmp_path / "runs", ConsoleEvents(Console(file=notes, width=200)))
    merged, single = runs.merged.results(), runs.single.results()
    assert _taus(runs.merged.path) == _taus(runs.single.path)
    assert tau_table(merged) == tau_table(single) and len(tau_table(merged)) == 2
    assert merged["drafters"]["zlab"]["metrics"]["samples"] == 4
    assert "identical (2 drafters)" in runs.lines()[0]
    assert set(merged["hosts"]) == {"hpc[0]", "hpc[1]"}
    for task in (0, 1):
        record = merged["hosts"][f"hpc[{task}]"]
        assert record["shard"] == [task, 2] and record["job_id"].isdigit()
        assert record["slurm"]["node"] == "node1" and record["slurm"]["state"] == "COMPLETED"
    tasks = runs.merged.record["jobs"]["hpc"]["slurm"]["tasks"]
    assert {t["state"] for t in tasks.values()} == {"COMPLETED"} and {t["node"] for t in tasks.values()} == {"node1"}
    assert all(t["queued_s"] >= 0 and t["finished_at"] >= t["started_at"] for t in tasks.values())
    task_text = "\n".join(runs.lines()[1:])
    assert all(f"job {t['job_id']} on node1, COMPLETED, exit 0" in task_text for t in tasks.values())
    assert "hpc task 0" in notes.getvalue() and "COMPLETED" in notes.getvalue()
    # The figures the docs quote (printed with -s; speed is not asserted).
    timings = {k: h["timings"]["total_s"] for k, h in merged["hosts"].items()}
    with Connector(inv) as connector:
        job = job_status(connector, "ct129", runs.single.record["jobs"]["ct129"]["job_id"])
    wall = (datetime.fromisoformat(job.finished) - datetime.fromisoformat(job.started)).total_seconds()
    print(f"\ncluster tasks: queued {[t['queued_s'] for t in tasks.values()]} s, task wall "
          f"{[round(t['finished_at'] - t['started_at'], 2) for t in tasks.values()]} s, payload total {timings} s; "
          f"one host: job wall {wall:.0f} s (1 s resolution), payload total "
          f"{single['hosts']['ct129']['timings']['total_s']} s\n" + "\n".join(runs.lines()))


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
