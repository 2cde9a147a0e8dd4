"""The real Slurm the cluster tests (and the engine test of a real vLLM inside a task) submit to: started once per
session and worker, in the network namespace of the session sandbox's ct129 (so ct129, reached over SSH, is the
cluster's login node), and skipped with a reason where it cannot run (not root, slurm-wlm/munge missing)."""

from __future__ import annotations

import pytest

from orchestrator.testing.slurm import missing_reason, start_in_sandbox


@pytest.fixture(scope="session")
def slurm(sandbox, tmp_path_factory: pytest.TempPathFactory):
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = start_in_sandbox(sandbox, tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()
