"""Session fixture: the sandbox's ct129 with the payload's CPU venv (torch 2.13.0+cpu), built once.

Use it from any test module (the eval tests need it too). Until tests/conftest.py lists this module in
``pytest_plugins``, a module imports it with ``from fixtures_provision import provisioned_ct129``;
building twice cannot happen either way: provisioning is idempotent (a second call is "up-to-date"
in well under a second) and the result is cached per sandbox in this module.

The wheelhouse (≈250 MB, pip-downloaded for the host's Python) lives under $DFO_TEST_CACHE when set
(reused across test runs), else under the session's temporary directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.core.inventory import load_inventory
from orchestrator.provision.operation import ProvisionResult, provision
from orchestrator.transport import Connector

_RESULTS: dict[str, tuple[ProvisionResult, Path]] = {}


def wheelhouse_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.environ.get("DFO_TEST_CACHE"):
        path = Path(os.environ["DFO_TEST_CACHE"]).expanduser()
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.getbasetemp() / "dfo-wheelhouse-cache"


@pytest.fixture(scope="session")
def provisioned_ct129(sandbox, tmp_path_factory) -> ProvisionResult:
    """ct129's venv provisioned offline from a pushed wheelhouse; ``.python`` is its interpreter.

    The first result (status "installed") is what this returns, so tests can see what was done.
    """
    key = str(sandbox.root)
    if key not in _RESULTS:
        cache = wheelhouse_cache_dir(tmp_path_factory)
        with Connector(load_inventory(sandbox.inventory_path)) as connector:
            result = provision(connector, "ct129", offline=True, wheelhouse_cache=cache)
        _RESULTS[key] = (result, cache)
    return _RESULTS[key][0]


@pytest.fixture(scope="session")
def provision_cache(provisioned_ct129, sandbox) -> Path:
    """The controller-side wheelhouse cache the session venv was built from."""
    return _RESULTS[str(sandbox.root)][1]
