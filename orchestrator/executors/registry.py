"""The places a job can run, in the order they are asked: the first whose ``runs_on`` takes an inventory host runs
its jobs, the first whose ``owns`` takes a run's job record picks the run up again. SSH, the default, comes last.
A third place (another scheduler, a Kubernetes Job) is one module beside these and one line here."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from orchestrator.executors.base import Executor
from orchestrator.executors.slurm import SlurmExecutor
from orchestrator.executors.ssh import SshExecutor

EXECUTORS: list[Executor] = [
    SlurmExecutor(),  # an inventory host with a slurm: section
    SshExecutor(),  # every other host (the default: last)
]


def for_host(inv_host: Any) -> Executor:
    """The place that runs inventory host INV_HOST's jobs."""
    return next(e for e in EXECUTORS if e.runs_on(inv_host))


def for_job(job: dict) -> Executor:
    """The place that submitted JOB (a run's job record)."""
    return next(e for e in EXECUTORS if e.owns(job))


def for_run(run: Any) -> Executor:
    """The place of RUN's jobs (a run's jobs all run on one kind of place: its eval hosts are all of one kind)."""
    jobs = list(run.record.get("jobs", {}).values())
    return next((e for e in EXECUTORS if any(e.owns(j) for j in jobs)), EXECUTORS[-1])


@contextlib.contextmanager
def registered(executor: Executor) -> Iterator[Executor]:
    """EXECUTOR asked first while the block runs (a place added at run time: tests, plugins)."""
    EXECUTORS.insert(0, executor)
    try:
        yield executor
    finally:
        EXECUTORS.remove(executor)
