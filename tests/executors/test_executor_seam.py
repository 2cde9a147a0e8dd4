"""The executor seam (orchestrator/executors/): the registry picks the place a job runs from the inventory and a
run's job records, and `dfo eval` runs through whatever place is registered: here a small one of the test's own
that runs the prepared payload command on this machine instead of on the host (the sandbox hosts share this
machine's filesystem, so the host's venv and fixtures are there)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_runner import dfo

from orchestrator.core.errors import InputError, OperationError
from orchestrator.deploy.operation import payload_dir
from orchestrator.executors import registry
from orchestrator.executors.slurm import SlurmExecutor
from orchestrator.executors.ssh import SshExecutor
from orchestrator.jobs.operation import job_status, launch_job, substitute


def test_the_inventory_and_the_job_records_pick_the_place():
    cluster, host = SimpleNamespace(slurm=object()), SimpleNamespace(slurm=None)
    assert isinstance(registry.for_host(cluster), SlurmExecutor)
    assert isinstance(registry.for_host(host), SshExecutor)
    ssh_job = {"job_id": "j1", "job_dir": "/w/jobs/j1"}
    array_job = {"job_id": "42", "slurm": {"array_job_id": "42"}}
    assert isinstance(registry.for_run(SimpleNamespace(record={"jobs": {"ct129": ssh_job}})), SshExecutor)
    assert isinstance(registry.for_run(SimpleNamespace(record={"jobs": {"hpc": array_job}})), SlurmExecutor)
    assert isinstance(registry.for_run(SimpleNamespace(record={})), SshExecutor)  # the default
    # What results.json records of a part beside its figures: a cluster task's Slurm facts, nothing for SSH.
    assert registry.for_job(array_job).part_facts(array_job) == {"slurm": {"array_job_id": "42"}}
    assert registry.for_job(ssh_job).part_facts(ssh_job) == {}


def test_a_registered_place_is_asked_first_and_only_while_registered():
    class Everywhere(SshExecutor):
        name = "everywhere"

    host = SimpleNamespace(slurm=object())
    with registry.registered(Everywhere()) as place:
        assert registry.for_host(host) is place
    assert isinstance(registry.for_host(host), SlurmExecutor)


def test_an_ssh_run_cannot_be_resumed():
    with pytest.raises(InputError, match="--resume is for runs on a Slurm cluster host"):
        SshExecutor().resume(None, SimpleNamespace(name="r1"), events=None)


class LocalPlace:
    """Runs the payload command an eval prepared for a host as a process on this machine."""

    name = "local"

    def __init__(self, workdir: Path, root: Path):
        self.workdir, self.root = str(workdir), root
        self.procs: dict[str, subprocess.Popen] = {}
        self.calls: list[str] = []

    def runs_on(self, inv_host) -> bool:
        return getattr(inv_host, "workdir", None) == self.workdir  # the one host whose workdir it was given

    def owns(self, job: dict) -> bool:
        return job.get("place") == self.name

    def submit(self, connector, job, run_name, argv, *, shards, env, events, force) -> dict:
        self.calls.append("submit")
        folder = self.root / run_name / job.host
        (folder / "results").mkdir(parents=True)
        command = substitute(argv, {"results": str(folder / "results"), "job_dir": str(folder), "job_id": run_name})
        with open(folder / "log", "wb") as log:
            self.procs[job.host] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                    cwd=payload_dir(connector.inventory.hosts[job.host].workdir),
                                                    env={**os.environ, **env})
        return {"job_id": run_name, "job_dir": str(folder), "place": self.name, "argv": argv, "state": "running"}

    def follow_and_collect(self, connector, run, *, events, finish):
        self.calls.append("follow_and_collect")
        jobs = run.record["jobs"]
        for host, job in jobs.items():
            code = self.procs[host].wait(timeout=300)
            job["state"], job["exit_code"] = ("succeeded" if code == 0 else "failed"), code
            if code != 0:
                raise OperationError(f"{host}: local eval exited {code}: "
                                     + (Path(job["job_dir"]) / "log").read_text()[-2000:])
        return finish(run, {h: Path(j["job_dir"]) / "results" for h, j in jobs.items()}, jobs, jobs, events)

    def reattach(self, connector, run, *, events, finish):
        return self.follow_and_collect(connector, run, events=events, finish=finish)

    def resume(self, connector, run, *, events) -> None:
        raise InputError("nothing to resume here")

    def cancel(self, connector, host, job) -> None:
        self.procs[host].kill()

    def part_facts(self, part_job: dict) -> dict:
        return {"place": self.name}

    def resident_worker(self, connector, cfg, folder, events):
        return None

    def open_watch(self, connector, cfg, folder, events) -> None:
        return None


def test_dfo_eval_runs_through_a_registered_place(sandbox, eval_hosts, tmp_path):
    place = LocalPlace(sandbox.hosts["ct129"].workdir, tmp_path / "local-jobs")
    jobs_on_host = sandbox.hosts["ct129"].workdir / "jobs"
    before = sorted(p.name for p in jobs_on_host.iterdir()) if jobs_on_host.is_dir() else []
    with registry.registered(place):
        proc = dfo(sandbox, "eval", "--host", "ct129", "--target", eval_hosts["target"], "--drafter",
                   f"zlab={eval_hosts['zlab']}", "--samples", "2", "--max-new-tokens", "8", "--dtype", "float32",
                   "--threads", "1", "--json", runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert place.calls == ["submit", "follow_and_collect"]
    run_dir = Path(json.loads(proc.stdout)["path"])
    results = json.loads((run_dir / "results.json").read_text())
    assert results["status"] == "ok" and isinstance(results["drafters"]["zlab"]["metrics"]["tau_macro"], float)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(x["host"] == "ct129" for x in samples)  # merged from the place's part
    assert results["hosts"]["ct129"]["place"] == "local"  # the place's part facts reach results.json
    assert json.loads((run_dir / "run.json").read_text())["jobs"]["ct129"]["place"] == "local"
    assert (run_dir / "report.md").is_file()
    # The host ran no job of its own: the eval went where the registry sent it.
    assert (sorted(p.name for p in jobs_on_host.iterdir()) if jobs_on_host.is_dir() else []) == before


def test_the_ssh_place_cancels_an_eval_job_on_its_host(sandbox, connector):
    handle = launch_job(connector, "ct129", ["sleep", "300"], lock=None)
    job = {"job_id": handle.job_id, "job_dir": handle.job_dir}
    place = registry.for_job(job)
    assert isinstance(place, SshExecutor)
    place.cancel(connector, "ct129", job)
    assert job_status(connector, "ct129", handle.job_id).state == "cancelled"
