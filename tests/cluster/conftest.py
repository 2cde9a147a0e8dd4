"""What the cluster tests share on top of the session's sandbox Slurm (``slurm``, tests/fixtures_slurm.py): a login
session to it, a slurm: section, and the inventory with its cluster hosts."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.inventory import load_inventory
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm
from orchestrator.testing.slurm import cluster_inventory as cluster_inventory_file
from orchestrator.transport import Connector


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
