"""Shared fixtures: real OpenSSH test hosts (see orchestrator/testing/ and docs/architecture.md, Tests).

- ``sandbox``: one kpro6 + ct129 pair for the whole session. Do not break it (no stopped hosts,
  regenerated keys or downed links): use ``fresh_sandbox`` for that.
- ``fresh_sandbox``: a new pair per test, torn down after it (also when the test fails).
- ``connector``: a ``Connector`` to the session sandbox's hosts, closed after the test.

Both are network-namespace isolated when possible; ``box.isolated`` / ``box.reason`` say otherwise.
Point the dfo CLI at them with ``DFO_INVENTORY=str(box.inventory_path)``.
"""

from __future__ import annotations

import pytest
from sshd_support import require_sshd

from orchestrator.core.inventory import load_inventory
from orchestrator.testing.sandbox import Sandbox
from orchestrator.transport import Connector

# Session fixtures other modules share (the provisioned CPU venv on ct129, the wheelhouse cache).
pytest_plugins = ["fixtures_provision", "fixtures_eval"]


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


@pytest.fixture
def connector(sandbox):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        yield conn
