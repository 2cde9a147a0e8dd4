"""`dfo jobs status|cancel CLUSTER:ARRAY[_TASK]` against the real sandbox Slurm (scancel over SSH), and sacct
as the answer once Slurm's controller has forgotten an array."""

from __future__ import annotations

import json
import time

import pytest
from cli_runner import dfo

from orchestrator.cluster.jobs import ArrayRef, array_status
from orchestrator.cluster.operation import follow, login_session, submit, task_states
from orchestrator.cluster.plan import BatchRequest
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm, missing_reason


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_jobs_status_and_cancel_of_a_cluster_array_use_squeue_and_scancel(cluster_connector, cluster_inventory):
    section = cluster_connector.inventory.host("hpc").slurm
    login = login_session(cluster_connector, "hpc")
    request = BatchRequest("cancel-cli", f"{section.shared}/dfo-jobs/cancel-cli", (0, 1), ("sleep", "120"))
    array = submit(login, section, request).array_job_id

    def running() -> bool:
        states = task_states(login, array)
        return len(states) == 2 and all(s.state == "RUNNING" for s in states.values())

    _wait_for(running, "both tasks never ran")
    status = dfo("jobs", "status", f"hpc:{array}", "--json", inventory=cluster_inventory)
    assert status.returncode == 0, status.stderr
    tasks = json.loads(status.stdout)["tasks"]
    assert {t: (v["state"], v["node"]) for t, v in tasks.items()} == {"0": ("RUNNING", "node1"),
                                                                      "1": ("RUNNING", "node1")}

    dry = dfo("jobs", "cancel", f"hpc:{array}", "--dry-run", inventory=cluster_inventory)
    assert dry.returncode == 0, dry.stderr
    assert f"scancel {array}" in dry.stdout and "nothing cancelled" in dry.stdout
    assert running()  # the dry run cancelled nothing

    one = dfo("jobs", "cancel", f"hpc:{array}_1", inventory=cluster_inventory)
    assert one.returncode == 0, one.stderr
    assert "1 task(s) cancelled" in one.stdout and "task 1" in one.stdout and "CANCELLED" in one.stdout
    states = task_states(login, array)
    assert states[1].state == "CANCELLED" and states[0].state == "RUNNING"

    rest = dfo("jobs", "cancel", array, "--host", "hpc", "--json", inventory=cluster_inventory)
    assert rest.returncode == 0, rest.stderr
    assert {t: v["state"] for t, v in json.loads(rest.stdout)["tasks"].items()} == {"0": "CANCELLED"}
    again = dfo("jobs", "cancel", f"hpc:{array}", inventory=cluster_inventory)
    assert again.returncode == 0 and "nothing to cancel" in again.stdout

    bad = dfo("jobs", "cancel", "hpc:12;id", inventory=cluster_inventory)
    assert bad.returncode == 2 and "array job id" in bad.stderr


@pytest.mark.slow
def test_a_forgotten_array_is_read_from_sacct_with_each_tasks_state_and_exit_code(tmp_path):
    if reason := missing_reason():
        pytest.skip(reason)
    # A Slurm that forgets a finished job after 2 s (the session's remembers it 10 min), on this machine.
    slurm = SandboxSlurm(tmp_path / "slurm", min_job_age=2).start()
    try:
        login = LocalLoginSession(slurm)
        shared = str(slurm.root / "shared")
        section = SlurmSection(shared=shared, partition="debug", time_limit="1")
        request = BatchRequest("forgotten", f"{shared}/dfo-jobs/forgotten", (0, 1),
                               ("bash", "-c", "exit $(( $1 * 3 ))", "_", "{task}"))
        submitted = submit(login, section, request)
        first = follow(login, submitted, poll=0.5, max_poll=1, timeout=60)
        _wait_for(lambda: not task_states(login, submitted.array_job_id), "slurmctld never forgot the job", 120)

        states, source = array_status(login, f"{shared}/dfo-jobs", ArrayRef("cluster", submitted.array_job_id))
        assert source == "completion"  # this Slurm has no accounting database: the job completion log answers
        assert {t: (s.state, s.exit_code, s.node, s.job_id) for t, s in states.items()} == {
            0: ("COMPLETED", 0, "node1", first[0].job_id), 1: ("FAILED", 3, "node1", first[1].job_id)}
        # Following an array Slurm forgot ends with sacct's answer too (a run pulled long after it finished).
        again = follow(login, submitted, poll=0.1, max_poll=0.2, timeout=30)
        assert (again[1].state, again[1].exit_code) == ("FAILED", 3) and again[0].state == "COMPLETED"
        with pytest.raises(Exception, match="knows no such job"):
            array_status(login, f"{shared}/dfo-jobs", ArrayRef("cluster", "999999"))
    finally:
        slurm.stop()
