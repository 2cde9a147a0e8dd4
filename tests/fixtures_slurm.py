"""The real Slurm the cluster tests (and the engine test of a real vLLM inside a task) submit to: started once per
session and worker, in the network namespace of the session sandbox's ct129 (so ct129, reached over SSH, is the
cluster's login node), and skipped with a reason where it cannot run (not root, slurm-wlm/munge missing).

Slurm's smallest time limit is one minute, so the test of a task killed at its limit waits for one: its job is
submitted as soon as the session's Slurm is up (``time_limit_job``), in the sandbox's hidden partition with a CPU
of its own, and the minute passes while the other tests run."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from orchestrator.cluster.operation import Submitted, submit
from orchestrator.cluster.plan import BatchRequest
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import (
    LIMITS_PARTITION,
    LocalLoginSession,
    SandboxSlurm,
    missing_reason,
    start_in_sandbox,
)


class EarlyJob(NamedTuple):
    login: LocalLoginSession
    request: BatchRequest
    submitted: Submitted


_EARLY: dict[int, EarlyJob] = {}  # id(the session's Slurm) -> its time-limit job


def submit_time_limit_job(cluster: SandboxSlurm) -> EarlyJob:
    """One task that outlives its one-minute limit (``sleep 300``), in the partition no other test uses."""
    shared = str(cluster.root / "shared")
    login = LocalLoginSession(cluster)
    request = BatchRequest("timeout", f"{shared}/jobs/timeout", (0,), ("sleep", "300"))
    section = SlurmSection(shared=shared, partition=LIMITS_PARTITION, time_limit="1")
    return EarlyJob(login, request, submit(login, section, request))


@pytest.fixture(scope="session")
def slurm(sandbox, tmp_path_factory: pytest.TempPathFactory):
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = start_in_sandbox(sandbox, tmp_path_factory.mktemp("slurm"))
    _EARLY[id(cluster)] = submit_time_limit_job(cluster)
    yield cluster
    _EARLY.pop(id(cluster), None)
    cluster.stop()


@pytest.fixture(scope="session")
def time_limit_job(slurm: SandboxSlurm) -> EarlyJob:
    """The job past its time limit, submitted when ``slurm`` started (login session, request, its array)."""
    return _EARLY[id(slurm)]
