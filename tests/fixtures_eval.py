"""Session fixture ``eval_hosts``: both sandbox hosts deployed and provisioned, the tiny target and z-lab
drafters built on ct129 and a training-format checkpoint on kpro6 (built once, shared by the eval and watch
tests). Registered in conftest's ``pytest_plugins``.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest

from orchestrator.core.inventory import load_inventory
from orchestrator.jobs.operation import follow_job, launch_job
from orchestrator.provision.operation import provision
from orchestrator.transport import Connector

REPO = Path(__file__).resolve().parents[1]
# The payload tests build the same fixtures; sharing their cache keeps the suite from training twice.
FIXTURE_CACHE = os.environ.get("DFO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures"))




def build_fixtures(connector: Connector, host: str, python: str, out: str, what: str) -> None:
    workdir = connector.inventory.hosts[host].workdir
    handle = launch_job(connector, host, [python, "-m", "remote_payload", "fixtures", "--out", out, "--what", what],
                        cwd=posixpath.join(workdir, "payload"), env={"DFO_FIXTURE_CACHE": FIXTURE_CACHE}, lock=None)
    status = follow_job(connector, host, handle.job_id)
    assert status.ok, "\n".join(status.log_tail)


@pytest.fixture(scope="session")
def eval_hosts(sandbox, provisioned_ct129, provision_cache):
    """Both sandbox hosts with payload, venv and fixtures; returns the paths the tests use."""
    from orchestrator.deploy.manifest import default_payload_root
    from orchestrator.deploy.operation import deploy

    with Connector(load_inventory(sandbox.inventory_path)) as connector:
        outcomes = deploy(connector, ["kpro6", "ct129"], root=default_payload_root())
        assert all(o.ok for o in outcomes.values()), outcomes
        kpro6 = provision(connector, "kpro6", offline=True, wheelhouse_cache=provision_cache)
        models, ckpts = str(sandbox.hosts["ct129"].models), str(sandbox.hosts["kpro6"].checkpoints)
        build_fixtures(connector, "ct129", provisioned_ct129.python, models, "target,zlab-drafter,random-drafter")
        build_fixtures(connector, "kpro6", kpro6.python, ckpts, "training-checkpoint")
    return {
        "target": posixpath.join(models, "target"),
        "ours": f"ours=kpro6:{posixpath.join(ckpts, 'trained-drafter', 'checkpoint.pt')}",
        "zlab": posixpath.join(models, "zlab-drafter"),
        "random": f"random={posixpath.join(models, 'random-drafter')}",
    }
