"""The real Slurm the cluster tests submit to: started once per session, in the network namespace of the
session sandbox's ct129 (so ct129, reached over SSH, is the cluster's login node), and skipped with a reason
where it cannot run (not root, slurm-wlm/munge missing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.inventory import load_inventory
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm, missing_reason
from orchestrator.transport import Connector


@pytest.fixture(scope="session")
def slurm(sandbox, tmp_path_factory: pytest.TempPathFactory):
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    ct129 = sandbox.host("ct129")
    cluster = SandboxSlurm(tmp_path_factory.mktemp("slurm"), netns=ct129.netns,
                           address=ct129.gateway or "127.0.0.1").start()
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
    """The sandbox's inventory plus host `hpc`: ct129's SSH and workdir (its release and venv, when the eval
    fixtures built them) with a slurm: section whose shared folder is ct129's root, and the sandbox's SLURM_CONF."""
    text = Path(sandbox.inventory_path).read_text()
    ct129 = load_inventory(sandbox.inventory_path).host("ct129")
    shared = sandbox.hosts["ct129"].root_dir
    text += (f"  hpc:\n    address: {ct129.address}\n    port: {ct129.port}\n    user: {ct129.user}\n"
             f"    identity_file: {ct129.identity_file}\n    known_hosts: {ct129.known_hosts}\n"
             f"    workdir: {ct129.workdir}\n    python: {ct129.python}\n    gpu: false\n"
             f"    paths:\n      checkpoints: {ct129.paths.checkpoints}\n      models: {ct129.paths.models}\n"
             f"    env:\n      SLURM_CONF: {slurm.conf}\n"
             f"    slurm:\n      shared: {shared}\n      partition: debug\n      time_limit: '10'\n")
    # The same cluster, one task at a time: a test cancels task 1 while it is still pending.
    text += text[text.index("  hpc:\n"):].replace("  hpc:\n", "  hpc-serial:\n", 1) + "      max_parallel: 1\n"
    path = tmp_path_factory.mktemp("cluster-inventory") / "inventory.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def cluster_connector(cluster_inventory: Path):
    with Connector(load_inventory(cluster_inventory)) as conn:
        yield conn
