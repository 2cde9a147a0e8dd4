"""Shared fixtures: real OpenSSH test hosts (see orchestrator/sandbox.py and ssh-testbed.md).

- ``sandbox``: one kpro6 + ct129 pair for the whole session. Do not break it (no stopped hosts,
  regenerated keys or downed links): use ``fresh_sandbox`` for that.
- ``fresh_sandbox``: a new pair per test, torn down after it (also when the test fails).

Both are network-namespace isolated when possible; ``box.isolated`` / ``box.reason`` say otherwise.
Point the dfo CLI at them with ``DFO_INVENTORY=str(box.inventory_path)``.
"""

from __future__ import annotations

import os
import shutil

import pytest

from orchestrator.sandbox import SSHD, Sandbox


def require_sshd() -> None:
    """Skip (with the fix) when this machine cannot run real test hosts."""
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} not found: apt-get install -y openssh-server (needed for real-sshd tests)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: apt-get install -y openssh-client (needed for real-sshd tests)")


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory):
    require_sshd()
    with Sandbox(tmp_path_factory.mktemp("sandbox")) as box:
        yield box


@pytest.fixture
def fresh_sandbox(tmp_path):
    require_sshd()
    with Sandbox(tmp_path / "sandbox") as box:
        yield box
