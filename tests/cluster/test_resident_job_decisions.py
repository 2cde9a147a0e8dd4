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
    assert "give slurm.resident_time_limit more than the target's load" in said.warnings[0]
    preempted, _ = _worker(tmp_path / "p", TaskState(0, "56", "55", "PREEMPTED"), handed=1)
    preempted.fell_through("no resident worker took drafter step_9")
    assert preempted.disabled is None  # not the job's doing: replaced


def test_a_job_found_idled_out_when_a_checkpoint_comes_is_replaced_for_that_checkpoint(tmp_path, monkeypatch):
    # The watcher checked the job before (it served); it idled out since. The next checkpoint gets a new job at
    # once rather than an array of its own. The deploy and the submission are the edges: stood in for here.
    import orchestrator.watch.resident as resident_module

    monkeypatch.setattr(resident_module, "supported", lambda plan: None)
    job, said = _worker(tmp_path, None, handed=1)
    job._checked = True
    states = {"55": TaskState(0, "56", "55", "COMPLETED", node="node1"), "60": TaskState(0, "60", "60", "RUNNING")}
    job._task = lambda: states[job.record["job_id"]]  # type: ignore[method-assign,index]
    job._prepare = lambda plan: ("/shared/venv/bin/python", "release-1")  # type: ignore[method-assign]
    job._args = lambda plan: ["eval-worker"]  # type: ignore[method-assign]
    submitted: list[str] = []

    def start(plan, host, python, key, args):
        submitted.append(host)
        job._keep({"host": host, "job_id": "60", "job_dir": "/shared/dfo-jobs/w2/tasks/0", "key": key,
                   "python": python, "slurm_job": "60_0"})
        return True

    job._start = start  # type: ignore[method-assign]
    stand_in = type("Plan", (), {"jobs": [type("Job", (), {"host": "hpc"})()]})()
    assert job.ensure(stand_in) is True  # type: ignore[arg-type]
    assert submitted == ["hpc"] and job.record and job.record["job_id"] == "60"
    assert "resident job 55 ended before it took a checkpoint (COMPLETED on node1); a new one is submitted for " \
           "this checkpoint" in said.warnings[0]


def test_the_resident_job_gets_its_own_time_limit_where_the_inventory_gives_one():
    from pydantic import ValidationError

    from orchestrator.cluster.plan import BatchRequest, batch_script
    from orchestrator.core.slurm_section import SlurmSection, resident_section

    section = SlurmSection(shared="/shared", time_limit="2:00:00", resident_time_limit="1-00")
    request = BatchRequest("dfo-worker-s", "/shared/dfo-jobs/w", (0,), ("python", "-m", "remote_payload"))
    assert "--time=1-00\n" in batch_script(resident_section(section), request)
    assert "--time=2:00:00\n" in batch_script(section, request)  # the eval arrays keep theirs
    plain = SlurmSection(shared="/shared", time_limit="2:00:00")
    assert "--time=2:00:00\n" in batch_script(resident_section(plain), request)
    with pytest.raises(ValidationError, match="expected a time limit"):
        SlurmSection(shared="/shared", resident_time_limit="1-00 --wrap=x")


def test_a_handover_that_fell_through_without_a_record_leaves_the_watcher_to_arrays(tmp_path):
    job, said = _worker(tmp_path, None)
    job._forget()
    job.fell_through("no resident worker took drafter step_9")
    assert job.disabled == "no resident worker took drafter step_9"
    assert "one eval job per checkpoint" in said.warnings[0]
