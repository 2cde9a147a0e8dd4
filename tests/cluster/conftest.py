"""The real Slurm the cluster tests submit to: started once per session, in the network namespace of the
session sandbox's ct129 (so ct129, reached over SSH, is the cluster's login node), and skipped with a reason
where it cannot run (not root, slurm-wlm/munge missing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.inventory import load_inventory
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm, missing_reason, start_in_sandbox
from orchestrator.testing.slurm import cluster_inventory as cluster_inventory_file
from orchestrator.transport import Connector


@pytest.fixture(scope="session")
def slurm(sandbox, tmp_path_factory: pytest.TempPathFactory):
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = start_in_sandbox(sandbox, tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture
def login(slurm: SandboxSlurm) -> LocalLoginSession:
    return LocalLoginSession(slurm)


@pytest.fixture
def section(slurm: SandboxSlurm) -> SlurmSection:
    return SlurmSection(shared=str(slurm.root / "shared"), partition="debug", time_limit="1")


@pytest.fixture(scope="session")
def cluster_inventory(sandbox, slurm: SandboxSlurm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sandbox's inventory plus host `hpc` (ct129's SSH and workdir, with a slurm: section) and
    `hpc-serial` (the same, one task at a time: a test cancels task 1 while it is still pending)."""
    return cluster_inventory_file(sandbox, slurm, tmp_path_factory.mktemp("cluster-inventory") / "inventory.yaml")


@pytest.fixture
def cluster_connector(cluster_inventory: Path):
    with Connector(load_inventory(cluster_inventory)) as conn:
        yield conn
