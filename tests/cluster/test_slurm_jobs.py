"""Array jobs against the real sandbox Slurm: a finished array, a pending partition, a failing task, a cancel
and a resume that re-runs only the missing task."""

from __future__ import annotations

import time

import pytest

from orchestrator.cluster.operation import (
    cancel,
    follow,
    resubmit,
    submit,
    task_records,
    task_states,
    wait_for_records,
)
from orchestrator.cluster.plan import BatchRequest


def _request(section, name: str, command: tuple[str, ...], tasks=(0, 1)) -> BatchRequest:
    return BatchRequest(name, f"{section.shared}/jobs/{name}", tuple(tasks), command)


def test_array_runs_one_task_per_shard_and_records_job_node_and_state(login, section):
    request = _request(section, "ok", ("bash", "-c", "echo shard $1 > $2/result.txt", "_", "{task}", "{task_dir}"))
    submitted = submit(login, section, request)
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=60)
    assert {task: state.state for task, state in final.items()} == {0: "COMPLETED", 1: "COMPLETED"}
    assert all(state.node == "node1" and state.exit_code == 0 and state.array_job_id == submitted.array_job_id
               for state in final.values())
    records = task_records(login, request.job_dir, request.tasks)
    assert all(record.exit_code == 0 and record.node == "node1" for record in records.values())
    for task in (0, 1):
        assert login.run(["cat", f"{request.job_dir}/tasks/{task}/result.txt"]).text == f"shard {task}\n"


def test_a_down_partition_leaves_the_tasks_pending_with_its_reason_until_cancelled(login, section):
    down = section.model_copy(update={"partition": "down"})
    submitted = submit(login, down, _request(section, "pending", ("true",)))
    deadline = time.monotonic() + 20
    while True:
        states = task_states(login, submitted.array_job_id)
        if states and all(s.reason == "PartitionDown" for s in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert states and all(s.state == "PENDING" and s.reason == "PartitionDown" for s in states.values())
    cancel(login, submitted.array_job_id)
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=30)
    assert {s.state for s in final.values()} == {"CANCELLED"}


def test_a_failing_task_is_reported_with_its_exit_code_and_resume_reruns_only_it(login, section):
    # Task 1 fails the first time only (a flag file on the shared filesystem says it already failed once).
    script = 'if [ "$1" = 1 ] && [ ! -e "$2/../../failed-once" ]; then touch "$2/../../failed-once"; exit 3; fi; ' \
             'echo done > "$2/result.txt"'
    request = _request(section, "resume", ("bash", "-c", script, "_", "{task}", "{task_dir}"))
    first = follow(login, submit(login, section, request), poll=0.5, max_poll=1, timeout=60)
    assert first[0].state == "COMPLETED"
    assert first[1].state == "FAILED" and first[1].exit_code == 3 and not first[1].killed_by_scheduler
    started0 = login.run(["cat", f"{request.job_dir}/tasks/0/started.json"]).text
    again = resubmit(login, section, request)
    assert again is not None and again.tasks == (1,)
    second = follow(login, again, poll=0.5, max_poll=1, timeout=60)
    assert second[1].state == "COMPLETED"
    assert login.run(["cat", f"{request.job_dir}/tasks/0/started.json"]).text == started0  # task 0 not re-run
    assert resubmit(login, section, request) is None  # nothing missing any more


def test_a_cancelled_running_task_leaves_no_finished_record(login, section):
    request = _request(section, "cancel", ("sleep", "60"), tasks=(0,))
    submitted = submit(login, section, request)
    deadline = time.monotonic() + 20
    while task_states(login, submitted.array_job_id).get(0, None) is None or \
            task_states(login, submitted.array_job_id)[0].state != "RUNNING":
        assert time.monotonic() < deadline, "the task never started"
        time.sleep(0.3)
    cancel(login, submitted.array_job_id, task=0)
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=30)
    assert final[0].state == "CANCELLED"
    record = task_records(login, request.job_dir, request.tasks)[0]
    assert record.started and record.exit_code is None  # half-done: resume would run it again


def test_the_follower_hears_of_a_tasks_end_from_its_record_not_at_the_end_of_its_interval(login, section):
    """follow() sleeps between squeue calls in wait_for_records: a task's started and finished records end the
    wait when they appear (the login node looks at the task's folder, Slurm's controller is not asked), never
    sooner than its floor, whatever the login node answers."""
    submitted = submit(login, section, _request(section, "records", ("sleep", "2"), tasks=(0,)))
    seen: dict[int, set[str]] = {}
    assert wait_for_records(login, submitted, seen, 25, at_least=0) and "started" in seen[0]
    if "finished" not in seen[0]:
        started = time.monotonic()
        assert wait_for_records(login, submitted, seen, 25, at_least=0)
        assert time.monotonic() - started < 20, "the wait ran to its end instead of ending on the finished record"
    assert seen == {0: {"started", "finished"}}
    started = time.monotonic()
    assert not wait_for_records(login, submitted, seen, 1.0, at_least=0)  # nothing new: the whole wait
    assert time.monotonic() - started >= 1.0
    started = time.monotonic()  # a follower that has seen nothing hears news at once, but waits out its floor
    assert wait_for_records(login, submitted, {}, 25, at_least=1.5)
    assert time.monotonic() - started >= 1.5
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=60)
    assert final[0].state == "COMPLETED"


@pytest.mark.slow
def test_a_task_past_its_time_limit_is_reported_as_killed_by_the_scheduler(time_limit_job):
    # Slurm's smallest limit is one minute: the job (one task, `sleep 300`, time limit 1) was submitted when the
    # session's Slurm started (tests/fixtures_slurm.py), so most of that minute is behind it by now.
    login, request, submitted = time_limit_job
    final = follow(login, submitted, poll=1, max_poll=2, timeout=240)
    assert final[0].state == "TIMEOUT" and final[0].killed_by_scheduler
    assert task_records(login, request.job_dir, request.tasks)[0].exit_code is None
