"""The Slurm place of the executor seam (orchestrator/executors/slurm.py) on the real sandbox Slurm: a run's array
job record is the cluster's, and cancelling it through the seam cancels every task (scancel over SSH)."""

from __future__ import annotations

import time

from orchestrator.cluster.operation import login_session, submit, task_states
from orchestrator.cluster.plan import BatchRequest
from orchestrator.executors import registry
from orchestrator.executors.slurm import SlurmExecutor


def test_the_slurm_place_cancels_every_task_of_an_eval_array(cluster_connector):
    section = cluster_connector.inventory.host("hpc").slurm
    login = login_session(cluster_connector, "hpc")
    request = BatchRequest("place-cancel", f"{section.shared}/dfo-jobs/place-cancel", (0, 1), ("sleep", "120"))
    array = submit(login, section, request).array_job_id
    job = {"job_id": array, "slurm": {"array_job_id": array, "job_dir": request.job_dir, "shards": 2}}
    place = registry.for_job(job)
    assert isinstance(place, SlurmExecutor)
    place.cancel(cluster_connector, "hpc", job)
    deadline = time.monotonic() + 30
    while True:
        states = task_states(login, array)
        if len(states) == 2 and all(s.state == "CANCELLED" for s in states.values()):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.3)
