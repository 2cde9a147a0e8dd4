"""What the watcher does with a resident Slurm job that ended (cluster/resident_job.py), by Slurm's state of it:
a preemption or a lost node, and a time limit or an idle exit after the job served, are replaced at the next
checkpoint; a failure, someone's scancel, running out of memory, or a time limit before it served leave the
watcher to one array job per checkpoint. Pure decisions: Slurm's answers are given, nothing connects."""

from __future__ import annotations

import pytest

from orchestrator.cluster.replies import TaskState
from orchestrator.cluster.resident_job import ResidentJob
from orchestrator.core.events import QuietEvents


class Said(QuietEvents):
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def _worker(tmp_path, state: TaskState | None, handed: int = 2) -> tuple[ResidentJob, Said]:
    said = Said()
    job = ResidentJob(None, tmp_path, tmp_path / "runs", said, idle=300)  # type: ignore[arg-type]
    job._keep({"host": "hpc", "job_id": "55", "job_dir": "/shared/dfo-jobs/w/tasks/0", "key": "k",
               "python": "/shared/venv/bin/python", "slurm_job": "55_0"})
    job._task = lambda: state  # type: ignore[method-assign]
    job.handed = handed  # checkpoints handed to it, the failing one included
    return job, said


@pytest.mark.parametrize("ended", ["TIMEOUT", "PREEMPTED", "NODE_FAIL", "COMPLETED", None])
def test_a_job_the_scheduler_ended_or_that_idled_out_after_serving_is_replaced_next_time(tmp_path, ended):
    state = TaskState(0, "56", "55", ended, node="node3") if ended else None
    job, said = _worker(tmp_path, state)
    job.fell_through("no resident worker took drafter step_9")
    assert job.disabled is None and job.record is None and not (tmp_path / "worker.json").exists()
    assert "a new one is submitted for the next checkpoint" in said.warnings[0]
    assert (ended or "no longer known to Slurm") in said.warnings[0]


@pytest.mark.parametrize("ended", ["FAILED", "CANCELLED", "OUT_OF_MEMORY"])
def test_a_job_that_failed_or_was_cancelled_leaves_the_watcher_to_arrays(tmp_path, ended):
    job, said = _worker(tmp_path, TaskState(0, "56", "55", ended, node="node3", exit_code=1))
    job.fell_through("no resident worker took drafter step_9")
    assert job.disabled and ended in job.disabled and job.record is None
    assert "one array job per checkpoint from now on" in said.warnings[0]
    assert "/shared/dfo-jobs/w/tasks/0/slurm.log" in said.warnings[0]


def test_a_job_still_running_that_took_nothing_is_cancelled_not_left_holding_its_gpus(tmp_path):
    job, said = _worker(tmp_path, TaskState(0, "56", "55", "RUNNING", node="node3"))
    cancelled: list[bool] = []
    job.running = lambda: True  # type: ignore[method-assign]
    job.stop = lambda: (cancelled.append(True), job._forget())  # type: ignore[method-assign,func-returns-value]
    job.fell_through("no resident worker took drafter step_9")
    assert cancelled == [True] and job.disabled and "still ran (RUNNING) and is cancelled" in job.disabled


@pytest.mark.parametrize("ended", ["TIMEOUT", "COMPLETED"])
def test_a_job_that_ended_before_it_ever_served_is_not_submitted_again(tmp_path, ended):
    # Its first handover failed: a time limit shorter than the target's load would end every new job the same way.
    job, said = _worker(tmp_path, TaskState(0, "56", "55", ended, node="node3"), handed=1)
    job.fell_through("no resident worker took drafter step_9")
    assert job.disabled and ended in job.disabled
    assert "raise slurm.time_limit above the target's load" in said.warnings[0]
    preempted, _ = _worker(tmp_path / "p", TaskState(0, "56", "55", "PREEMPTED"), handed=1)
    preempted.fell_through("no resident worker took drafter step_9")
    assert preempted.disabled is None  # not the job's doing: replaced
