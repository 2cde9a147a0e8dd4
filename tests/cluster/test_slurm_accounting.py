"""sacct from a real accounting database: a sandbox Slurm with MariaDB and slurmdbd (started for this module
only; skipped with the reason where mariadb-server or slurmdbd is not installed) whose controller forgets a
finished job after 2 s, so that `dfo jobs status` must ask the database."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.cluster.operation import cancel, follow, login_session, submit, task_states
from orchestrator.cluster.plan import BatchRequest
from orchestrator.core.inventory import load_inventory
from orchestrator.testing.slurm import SandboxSlurm, cluster_inventory, missing_reason, start_in_sandbox
from orchestrator.testing.slurm_accounting import accounting_missing_reason
from orchestrator.transport import Connector

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

# Task 0 succeeds, task 1 fails with exit code 3, task 2 sleeps until the test cancels it. (A time limit's
# TIMEOUT is read by the same parser from either source; tests/cluster/test_slurm_jobs.py waits one out.)
TASKS = 'case "$1" in 0) exit 0;; 1) exit 3;; *) sleep 300;; esac'


@pytest.fixture(scope="module")
def accounting_slurm(sandbox, tmp_path_factory: pytest.TempPathFactory):
    if reason := missing_reason() or accounting_missing_reason():
        pytest.skip(reason)
    started = time.monotonic()
    cluster = start_in_sandbox(sandbox, tmp_path_factory.mktemp("acct-slurm"), accounting=True, min_job_age=2)
    print(f"\nsandbox Slurm with an accounting database up in {time.monotonic() - started:.1f} s")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def accounting_inventory(sandbox, accounting_slurm: SandboxSlurm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cluster_inventory(sandbox, accounting_slurm,
                             tmp_path_factory.mktemp("acct-inventory") / "inventory.yaml", name="acct", variants={})


def _wait_for(condition, what: str, timeout: float):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.5)
    return result


def test_a_forgotten_array_is_read_from_the_accounting_database_with_each_tasks_end(accounting_inventory):
    with Connector(load_inventory(accounting_inventory)) as connector:
        section = connector.inventory.host("acct").slurm.model_copy(update={"time_limit": "1"})
        login = login_session(connector, "acct")
        name = f"acct-{secrets.token_hex(3)}"
        request = BatchRequest(name, f"{section.shared}/dfo-jobs/{name}", (0, 1, 2),
                               ("bash", "-c", TASKS, "_", "{task}"))
        submitted = submit(login, section, request)
        _wait_for(lambda: (s := task_states(login, submitted.array_job_id).get(2)) and s.state == "RUNNING",
                  "task 2 never ran", 60)
        cancel(login, submitted.array_job_id, task=2)
        followed = follow(login, submitted, poll=1, max_poll=2, timeout=240)
        ended = time.monotonic()
        _wait_for(lambda: not task_states(login, submitted.array_job_id), "slurmctld never forgot the array", 120)

        print(f"array ended; slurmctld forgot it {time.monotonic() - ended:.0f} s later")
    status = dfo("jobs", "status", f"acct:{submitted.array_job_id}", "--json", inventory=accounting_inventory)
    assert status.returncode == 0, status.stderr
    answer = json.loads(status.stdout)
    assert answer["source"] == "accounting"
    tasks = {int(t): v for t, v in answer["tasks"].items()}
    assert {t: (v["state"], v["exit_code"], v["node"], v["job_id"]) for t, v in tasks.items()} == {
        0: ("COMPLETED", 0, "node1", followed[0].job_id), 1: ("FAILED", 3, "node1", followed[1].job_id),
        2: ("CANCELLED", 0, "node1", followed[2].job_id)}
    assert not any(t["killed_by_scheduler"] for t in tasks.values())

    text = dfo("jobs", "status", f"acct:{submitted.array_job_id}", inventory=accounting_inventory)
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    assert "from sacct, the accounting database" in text.stdout
    assert f"task 1 (job {followed[1].job_id}): FAILED on node1, exit 3" in text.stdout
    assert f"task 2 (job {followed[2].job_id}): CANCELLED on node1" in text.stdout
