"""`dfo watch --host CLUSTER --shards 2` against the real sandbox Slurm: a checkpoint on kpro6 is relayed once to
the cluster's shared filesystem and evaluated as one two-task array job, the baselines as another; the series
records it like any other eval. The sandbox hosts share this machine's filesystem, so the test writes the
checkpoint into kpro6's folder directly."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.cluster.plan import jobs_root
from orchestrator.core.inventory import load_inventory
from orchestrator.evaluation.runs import load_run
from orchestrator.watch.series import load_series

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def test_watch_on_a_cluster_evaluates_each_checkpoint_as_one_array_job(eval_hosts, cluster_inventory, sandbox,
                                                                       tmp_path):
    folder = Path(sandbox.hosts["kpro6"].checkpoints, f"cluster-watch-{tmp_path.name[-12:]}")
    folder.mkdir()
    trained = Path(eval_hosts["ours"].split(":", 1)[1])
    shutil.copy(trained, folder / "step_100.pt")
    shutil.copy(trained.with_name("spec.json"), folder / "spec.json")  # the drafter spec beside it
    time.sleep(1.5)  # past --settle 1
    runs = tmp_path / "runs"
    args = ["watch", f"kpro6:{folder}/", "--host", "hpc", "--shards", "2", "--target", eval_hosts["target"],
            "--drafter", eval_hosts["random"], "--series", "hpc-run", "--pattern", "step_*.pt", "--settle", "1",
            "--samples", "4", "--max-new-tokens", "32", "--dtype", "float32", "--threads", "1"]
    not_cluster = dfo(*[a if a != "hpc" else "ct129" for a in args], "--once", inventory=cluster_inventory,
                      runs=runs)
    assert not_cluster.returncode == 2 and "ct129 is not a Slurm cluster" in not_cluster.stderr
    once = dfo(*args, "--once", inventory=cluster_inventory, runs=runs)
    logs = sorted(Path(jobs_root(load_inventory(cluster_inventory).host("hpc").workdir))
                  .glob("dfo-eval-*/tasks/*/slurm.log"))
    assert once.returncode == 0, once.stderr[-3000:] + "".join(f"\n{p}:\n" + p.read_text()[-1500:] for p in logs[-2:])
    assert "no resident worker" in once.stderr

    series = load_series(runs / "series" / "hpc-run")
    entry = series["checkpoints"]["step_100.pt"]
    assert entry["status"] == "done" and not entry.get("resident")
    for run_name in (entry["run"], series["baselines"]["run"]):
        record = load_run(runs / run_name).record
        slurm = record["jobs"]["hpc"]["slurm"]
        assert slurm["shards"] == 2 and slurm["array_job_id"].isdigit()
        assert {t["state"] for t in slurm["tasks"].values()} == {"COMPLETED"} and len(slurm["tasks"]) == 2
    # Relayed once, into the cluster's relay folder on its shared filesystem, and removed after the eval.
    assert entry["relayed_to"].startswith(str(sandbox.hosts["ct129"].root_dir))
    assert not Path(entry["relayed_to"]).exists()
    results = json.loads((load_run(runs / entry["run"]).path / "results.json").read_text())
    assert set(results["hosts"]) == {"hpc[0]", "hpc[1]"}
    assert results["drafters"]["step_100"]["metrics"]["samples"] == 4
