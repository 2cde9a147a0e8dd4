"""The real Slurm the cluster tests submit to: started once per session, skipped with a reason where it cannot run."""

from __future__ import annotations

import pytest

from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm, missing_reason


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = SandboxSlurm(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def login(slurm: SandboxSlurm) -> LocalLoginSession:
    return LocalLoginSession(slurm)


@pytest.fixture
def section(slurm: SandboxSlurm) -> SlurmSection:
    return SlurmSection(shared=str(slurm.root / "shared"), partition="debug", time_limit="1")
