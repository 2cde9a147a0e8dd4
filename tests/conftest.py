"""Shared fixtures: real OpenSSH test hosts (see orchestrator/testing/ and docs/architecture.md, Tests).

- ``sandbox``: one kpro6 + ct129 pair for the whole session. Do not break it (no stopped hosts,
  regenerated keys or downed links): use ``fresh_sandbox`` for that.
- ``fresh_sandbox``: a new pair per test, torn down after it (also when the test fails).
- ``connector``: a ``Connector`` to the session sandbox's hosts, closed after the test.

Both are network-namespace isolated when possible; ``box.isolated`` / ``box.reason`` say otherwise.
Point the dfo CLI at them with ``DFO_INVENTORY=str(box.inventory_path)``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sshd_support import require_sshd

from orchestrator.core.inventory import load_inventory
from orchestrator.jobs.operation import cancel_job
from orchestrator.testing.sandbox import Sandbox
from orchestrator.transport import Connector

# Session fixtures other modules share (the provisioned CPU venv on ct129, the wheelhouse cache, the sandbox Slurm).
pytest_plugins = ["fixtures_provision", "fixtures_eval", "fixtures_slurm"]

# The quick tier (`scripts/test.sh --quick`, `-m quick`): pure logic and the in-process CLI. A test leaves it
# when it asks (directly or through another fixture) for anything below: real sshd hosts, the engine, the fixture
# models (a build on an empty cache), a payload subprocess or a venv. Everything else is quick by default.
FULL_ONLY_FIXTURES = frozenset({
    "sandbox", "fresh_sandbox", "connector", "eval_hosts", "provisioned_ct129", "provision_cache",
    "fixture_dir", "eval_cache", "target", "samples", "loaded", "runtime_for", "run_payload",
    "engine_python", "engine_fixtures", "servers", "target_model", "fla_python", "qwen3_target", "impostor_models",
})
# Folders whose tests start processes or build models without going through those fixtures.
FULL_ONLY_FOLDERS = ("engine", "fla_cpu", "testing", "demo")
# One worker runs all of a group, so the engine venv and servers are built and started once per run.
XDIST_GROUPS = {"engine": "engine"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    tests_root = Path(__file__).parent
    for item in items:
        folder = Path(str(item.fspath)).relative_to(tests_root).parts[0]
        heavy = (FULL_ONLY_FIXTURES & set(item.fixturenames) or folder in FULL_ONLY_FOLDERS
                 or item.get_closest_marker("sshd") or item.get_closest_marker("slow")
                 or item.get_closest_marker("engine"))
        if not heavy:
            item.add_marker(pytest.mark.quick)
        group = (XDIST_GROUPS.get(folder) or ("engine" if item.get_closest_marker("engine") else None)
                 or _module_group(item))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker (its collection is what the scheduler hands out)
        _slow_singles_first(items)


def _slow_singles_first(items) -> None:
    """Under xdist: the tests in no group, slow ones first. xdist queues the groups by size, then every single test
    in collection order, so the minute-long watch and cluster tests (last in the folders' order) were handed out
    last and one worker ran them alone while the other had finished: a minute and a half of one idle core in a
    measured run. Grouped tests keep their places (a module's own order, the engine group's)."""
    singles = [i for i, item in enumerate(items) if not item.get_closest_marker("xdist_group")]
    ordered = sorted((items[i] for i in singles), key=lambda item: item.get_closest_marker("slow") is None)
    for i, item in zip(singles, ordered, strict=True):
        items[i] = item


def _module_group(item) -> str | None:
    """A module whose tests share a module-scoped fixture runs on one worker: spread over two, each worker
    computed the fixture again (the sampled-rule agreement draws cost minutes each time)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(d.scope == "module" for chain in defs.values() for d in chain):
        return item.nodeid.split("::")[0]
    return None


WORKER_FIGURES: list[str] = []  # measured figures the xdist workers handed back (the engine's timings)
SHARED_SETUPS: dict[str, float] = {}  # seconds of each session/module fixture set-up of this process
SETUP_SHOWN_S = 5.0  # the summary lists the shared set-ups that took longer (where the suite's budget goes)
WORKER_SETUPS: list[tuple[str, dict]] = []


class SetupTimer:
    """Times the shared fixtures, so a new cold build paid inside the suite shows in the summary. A plugin, not a
    hook of this conftest: a session fixture's set-up runs the session's hooks, which a conftest below the
    rootdir is not part of."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        started = time.monotonic()
        yield
        if fixturedef.scope in ("session", "module"):
            where = (fixturedef.argname if fixturedef.scope == "session"
                     else f"{request.node.nodeid}::{fixturedef.argname}")
            SHARED_SETUPS[where] = SHARED_SETUPS.get(where, 0.0) + time.monotonic() - started


def pytest_configure(config):
    config.pluginmanager.register(SetupTimer(), "dfo-setup-timer")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", {})
    figures = output.get("engine_timings")
    if figures:
        WORKER_FIGURES.append(figures)
    if output.get("shared_setups"):
        gateway = getattr(node, "gateway", None)
        WORKER_SETUPS.append((getattr(gateway, "id", "a worker"), output["shared_setups"]))


def pytest_sessionfinish(session):
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # an xdist worker: the controller prints them
        output["shared_setups"] = dict(SHARED_SETUPS)


def pytest_terminal_summary(terminalreporter):
    for figures in WORKER_FIGURES:
        terminalreporter.write_line("engine timings: " + figures)
    # Each fixture's own time: pytest sets up the fixtures it asks for before it.
    for worker, setups in WORKER_SETUPS or [("this process", SHARED_SETUPS)]:
        slow = sorted(((s, n) for n, s in setups.items() if s >= SETUP_SHOWN_S), reverse=True)
        if slow:
            terminalreporter.write_line(f"shared fixture set-ups over {SETUP_SHOWN_S:g} s ({worker}): "
                                        + ", ".join(f"{n} {s:.0f} s" for s, n in slow))


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory):
    require_sshd()
    with Sandbox(tmp_path_factory.mktemp("sandbox")) as box:
        yield box


@pytest.fixture(autouse=True)
def _stop_resident_workers(request: pytest.FixtureRequest):
    """After a test on the session sandbox: cancel the resident workers its watchers left (series folders
    under its tmp_path). An eval worker holds ct129's GPU lock until it idles out, minutes later, and the
    next test's watcher would find the lock taken."""
    uses_sandbox = "sandbox" in request.fixturenames and "tmp_path" in request.fixturenames
    # Asked for before the test runs, so both are torn down after this fixture, not before.
    tmp_path: Path | None = request.getfixturevalue("tmp_path") if uses_sandbox else None
    box = request.getfixturevalue("sandbox") if uses_sandbox else None
    yield
    if tmp_path is None or box is None:
        return
    records = [p for name in ("worker.json", "strip-worker.json") for p in tmp_path.rglob(f"series/*/{name}")]
    if not records:
        return
    with Connector(load_inventory(box.inventory_path)) as conn:
        for path in records:
            record = json.loads(path.read_text())
            cancel_job(conn, record["host"], record["job_id"])


@pytest.fixture
def fresh_sandbox(tmp_path):
    require_sshd()
    with Sandbox(tmp_path / "sandbox") as box:
        yield box


@pytest.fixture
def connector(sandbox):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        yield conn
