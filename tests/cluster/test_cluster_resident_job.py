"""`dfo watch --host CLUSTER --resident-job` against the real sandbox Slurm: the resident eval worker is one
Slurm job on the compute node, the handover clients run on the login node (ct129's namespace) and judge it by
Slurm's state of that job and its heartbeat on the shared filesystem.

One story, rounds of `--once` sharing the cost: the worker's job is submitted and serves two checkpoints with
the target loaded once; a watcher run without the option cancels it, and the next one with it submits a new
job; a replacement that dies as it takes a checkpoint (FAILED to Slurm) leaves that checkpoint to a one-off
array job, whose τ equals the resident worker's on the same weights."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.evaluation.runs import load_run
from orchestrator.watch.series import load_series
from remote_payload.resident import TEST_EXIT_ENV

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def _squeue_state(slurm, job: str) -> str:
    return slurm.shell(f"squeue -h -j {job} -o %T").stdout.decode().strip()


def test_a_resident_job_serves_checkpoints_is_replaced_when_cancelled_and_falls_back_when_it_fails(
        eval_hosts, cluster_inventory, sandbox, slurm, tmp_path):
    folder = Path(sandbox.hosts["kpro6"].checkpoints, f"cluster-resident-{tmp_path.name[-12:]}")
    folder.mkdir()
    trained = Path(eval_hosts["ours"].split(":", 1)[1])
    shutil.copy(trained.with_name("spec.json"), folder / "spec.json")
    runs = tmp_path / "runs"
    args = ["watch", f"kpro6:{folder}/", "--host", "hpc", "--resident-job", "--target", eval_hosts["target"],
            "--series", "hpc-resident", "--pattern", "step_*.pt", "--settle", "1", "--worker-idle", "300",
            "--samples", "4", "--max-new-tokens", "32", "--dtype", "float32", "--threads", "1", "--once"]

    def add(step: int) -> None:
        shutil.copy(trained, folder / f"step_{step}.pt")
        time.sleep(1.5)  # past --settle 1

    def watch(env: dict | None = None):
        proc = dfo(*args, inventory=cluster_inventory, runs=runs, env=env)
        logs = sorted(Path(slurm.root, "shared").rglob("dfo-worker-*/tasks/0/slurm.log"))
        assert proc.returncode == 0, proc.stderr[-3000:] + "".join(f"\n{p}:\n{p.read_text()[-1500:]}" for p in logs)
        return proc

    # The checks a contradiction or an SSH host gets before anything connects.
    wrong = dfo(*[a if a != "hpc" else "ct129" for a in args], inventory=cluster_inventory, runs=runs)
    assert wrong.returncode == 2 and "--resident-job: ct129 is not a Slurm cluster" in wrong.stderr
    both = dfo(*args, "--shards", "2", inventory=cluster_inventory, runs=runs)
    assert both.returncode == 2 and "one resident job serves the whole eval" in both.stderr

    add(100)
    dry = dfo(*args, "--dry-run", inventory=cluster_inventory, runs=runs)
    assert dry.returncode == 0 and "resident worker: one Slurm job on hpc" in dry.stdout, dry.stderr[-2000:]
    assert "dfo-worker" not in slurm.shell("squeue -h -o %j").stdout.decode()  # a dry run submits nothing

    # Round 1: the worker's job is submitted, takes step_100.
    first = watch()
    assert "resident eval job hpc:" in first.stderr
    series = load_series(runs / "series" / "hpc-resident")
    entry = series["checkpoints"]["step_100.pt"]
    assert entry["status"] == "done" and entry["resident"] is True
    record = load_run(runs / entry["run"]).record["resident_worker"]
    array, slurm_job = record["job_id"], record["slurm_job"]
    assert re.match(r"^[0-9]+_0\Z", slurm_job) and slurm_job.startswith(array + "_")
    # The worker's own record: written on the compute node, naming its Slurm job and node.
    state = json.loads(Path(record["job_dir"], "worker", "worker.json").read_text())
    assert state["slurm_job"] == slurm_job and state["node"] == "node1" and state["state"] == "ready"
    assert _squeue_state(slurm, slurm_job) == "RUNNING"  # it stays for the next checkpoint
    # The handover client ran on the login node and was told which job to expect.
    handover = load_run(runs / entry["run"]).record["jobs"]["hpc"]
    assert handover["argv"][-2:] == ["--slurm-job", slurm_job] and "slurm" not in handover

    # Round 2: the same job serves step_200, the target not loaded again.
    add(200)
    round2 = watch()
    series = load_series(runs / "series" / "hpc-resident")
    second = load_run(runs / series["checkpoints"]["step_200.pt"]["run"])
    assert second.record["resident_worker"]["job_id"] == array, round2.stderr[-3000:]
    assert second.results()["resident_worker"]["served_before"] == 1

    # A watcher of the series run without --resident-job cancels the job an earlier one asked for: it would hold
    # its allocation idle.
    plain = dfo(*[a for a in args if a != "--resident-job"], inventory=cluster_inventory, runs=runs)
    assert plain.returncode == 0 and f"resident job hpc:{array} cancelled" in plain.stderr, plain.stderr[-2000:]
    assert _squeue_state(slurm, slurm_job) in ("", "CANCELLED")

    # Round 3: the next checkpoint with --resident-job gets a new job. That one dies as it takes the checkpoint
    # (a test kill point): FAILED to Slurm, the handover gives up and a one-off array evaluates it, and the
    # watcher stays with arrays.
    add(300)
    third = watch(env={TEST_EXIT_ENV: "worker-take"})
    series = load_series(runs / "series" / "hpc-resident")
    entry = series["checkpoints"]["step_300.pt"]
    assert entry["status"] == "done" and not entry.get("resident"), third.stderr[-3000:]
    replaced = re.search(r"resident eval job hpc:([0-9]+) submitted", third.stderr)
    assert replaced and replaced.group(1) != array
    assert re.search(rf"resident job {replaced.group(1)} ended under a handover \(FAILED on node1\); one array job "
                     r"per checkpoint from now on", third.stderr), third.stderr[-3000:]
    one_off = load_run(runs / entry["run"]).record["jobs"]["hpc"]["slurm"]
    assert {t["state"] for t in one_off["tasks"].values()} == {"COMPLETED"}
    # The same weights give the same τ through the resident job and through a one-off array.
    taus = {name: series["checkpoints"][f"{name}.pt"]["measures"]["tau_macro"] for name in ("step_100", "step_300")}
    assert taus["step_100"] == pytest.approx(taus["step_300"], abs=1e-9), taus
