"""A local user on the eval host impersonating the engine dfo starts (issue 19, finding 2).

The engine's port is chosen free, released, and given to vLLM in argv, which every local user reads with
ps; vLLM binds it only after seconds of imports. A port thief watches the process list for the engine's
command line, binds its port first and answers in vLLM's place. Before the fix it got the prompts (and
could forge completions and counters) and, with ``--reference vllm``, the user's ``$DFO_REFERENCE_API_KEY``.
Now each engine gets its own random key through its environment, the socket on the port must belong to
the process dfo started, and a server that accepts a wrong key is refused.

Real processes, no vLLM: the thief is tests/payload/openai_server.py serving the tiny fixture target in
this test process (another session than the engine's); the engine is either a script that stays "in its
imports" (so the thief wins the race) or that same server run as vLLM would be (argv, $VLLM_API_KEY).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the stand-in servers need the payload stack (pip install -e '.[payload]')")
pytest.importorskip("transformers")

from payload.openai_server import OpenAIServer, load_model  # noqa: E402

from remote_payload.engines.listener import Listener, PortCheck, check_port  # noqa: E402
from remote_payload.engines.run import EnginePrompt, run_prompts  # noqa: E402
from remote_payload.engines.server import EngineError, EngineServer, ServerConfig  # noqa: E402
from remote_payload.errors import PayloadError  # noqa: E402
from remote_payload.eval import engine_stage, stages  # noqa: E402
from remote_payload.eval.context import EvalContext  # noqa: E402
from remote_payload.eval.settings import REFERENCE_API_KEY_ENV, EvalSettings  # noqa: E402

PAYLOAD_TESTS = Path(__file__).resolve().parents[1] / "payload"
USER_KEY = "user-secret-for-the-named-server-7731"
START_TIMEOUT_S = 300.0  # a busy 2-core box may take a while to import torch in the stand-in

# vLLM's seconds of imports before it binds: here, until the thief listens, and then on (it never binds).
IMPORTING_ENGINE = """#!/bin/sh
[ "$1" = "-m" ] || exit 0  # engine_version's `python -c ...`: no version
while [ ! -e "$THIEF_READY" ]; do sleep 0.05; done
echo "still importing vllm"
exec sleep 600
"""

# tests/payload/openai_server.py run as `python -m vllm.entrypoints.openai.api_server ARGS` would be.
STAND_IN_ENGINE = """#!{python}
import os, sys
if sys.argv[1:3] != ["-m", "vllm.entrypoints.openai.api_server"]:
    os.execv(sys.executable, [sys.executable] + sys.argv[1:])  # engine_version's `python -c ...`
sys.path.insert(0, {tests!r})
import openai_server
openai_server.serve_as_engine(sys.argv[3:])
"""


@pytest.fixture(scope="module")
def impostor_models(tmp_path_factory):
    """The tiny fixture target (and a drafter for the eval's input checks), loaded once."""
    from remote_payload.fixtures import build as fx

    out = tmp_path_factory.mktemp("impostor-fixtures")
    fx.build(out, ["target", "random-drafter"], use_cache=True)
    model, tokenizer = load_model(out / "target")
    return out, model, tokenizer


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def _command_lines():
    for entry in Path("/proc").iterdir():
        try:
            yield (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue


class PortThief:
    """What any local user can do: find the engine's argv in the process list, bind its port first, answer."""

    def __init__(self, marker: str, model, tokenizer, ready: Path):
        self.marker, self.model, self.tokenizer, self.ready = marker, model, tokenizer, ready
        self.server: OpenAIServer | None = None
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for argv in _command_lines():
                if self.marker in argv and "--port" in argv:
                    port, name = int(argv[argv.index("--port") + 1]), argv[argv.index("--served-model-name") + 1]
                    self.server = OpenAIServer(self.model, self.tokenizer, model_name=name, port=port).start()
                    self.ready.touch()
                    return
            time.sleep(0.02)

    def stop(self) -> None:
        self._thread.join(timeout=5)
        if self.server is not None:
            self.server.stop()


def _thief(tmp_path, impostor_models, monkeypatch) -> tuple[str, PortThief]:
    engine_python = _script(tmp_path / "engine-python", IMPORTING_ENGINE)
    monkeypatch.setenv("THIEF_READY", str(tmp_path / "thief-ready"))
    return engine_python, PortThief(engine_python, impostor_models[1], impostor_models[2], tmp_path / "thief-ready")


def test_a_port_thief_gets_no_prompt(tmp_path, impostor_models, monkeypatch):
    """--engine: the thief on the engine's port is refused before anything is sent (it got the prompts)."""
    engine_python, thief = _thief(tmp_path, impostor_models, monkeypatch)
    srv = EngineServer(ServerConfig(python=engine_python, target=str(impostor_models[0] / "target")),
                       tmp_path / "vllm.log")
    prompt = EnginePrompt("secret-prompt", list(impostor_models[2]("the prompt only the engine may see")["input_ids"]))
    refused = None
    try:
        srv.start(timeout_s=START_TIMEOUT_S)
        run_prompts(srv, [prompt], 4, [0])
    except EngineError as exc:
        refused = str(exc)
    finally:
        srv.stop()
        thief.stop()
    assert thief.server is not None, "the thief never found the engine's port in the process list"
    assert thief.server.requests == [], f"the impostor was asked: {thief.server.requests}"
    assert thief.server.answered == []  # no prompt reached it
    assert refused is not None and f"127.0.0.1:{srv.port} is held by another process" in refused, refused
    assert f"uid {os.getuid()}" in refused and "nothing was sent to it" in refused
    assert srv.proc.returncode is not None  # the engine dfo started is stopped


def _reference_settings(tmp_path, impostor_models, engine_python: str) -> EvalSettings:
    return EvalSettings(target=str(impostor_models[0] / "target"),
                        drafters=[("r", str(impostor_models[0] / "random-drafter"))],
                        samples=2, max_new_tokens=8, device="cpu", dtype="float32", threads=1,
                        cache_dir=str(tmp_path / "cache"), out=str(tmp_path / "out"), reference_engine="vllm",
                        engine_python=engine_python, engine_start_timeout=START_TIMEOUT_S)


def test_reference_vllm_gives_a_port_thief_neither_the_users_key_nor_prompts(tmp_path, impostor_models, monkeypatch):
    """--reference vllm: the user's $DFO_REFERENCE_API_KEY went as Bearer to whoever held the engine's port."""
    monkeypatch.setenv(REFERENCE_API_KEY_ENV, USER_KEY)
    engine_python, thief = _thief(tmp_path, impostor_models, monkeypatch)
    ctx = EvalContext(settings=_reference_settings(tmp_path, impostor_models, engine_python))
    stages.start(ctx)
    stages.check_inputs(ctx)
    refused = None
    try:
        engine_stage.engine_references(ctx, engine_stage.EngineRun())
    except PayloadError as exc:
        refused = str(exc)
    finally:
        thief.stop()
    assert thief.server is not None, "the thief never found the engine's port in the process list"
    sent = [r["authorization"] for r in thief.server.requests]
    assert not any(USER_KEY in (a or "") for a in sent), f"the user's key went to the impostor: {sent}"
    assert thief.server.requests == [] and thief.server.answered == []
    assert refused is not None and "is held by another process" in refused and USER_KEY not in refused


def test_the_engine_gets_its_own_key_on_every_request_and_the_users_on_none(tmp_path, impostor_models, monkeypatch):
    """A whole --reference vllm eval against the stand-in engine: readiness probes with a wrong key first, then
    the per-run key; every request carries the per-run key, none the user's; the key is in no output."""
    from remote_payload.eval.pipeline import run_eval

    monkeypatch.setenv(REFERENCE_API_KEY_ENV, USER_KEY)
    log = tmp_path / "engine-requests.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_REQUESTS", str(log))
    stand_in = _script(tmp_path / "engine-python", STAND_IN_ENGINE.format(python=sys.executable,
                                                                          tests=str(PAYLOAD_TESTS)))
    results = run_eval(_reference_settings(tmp_path, impostor_models, stand_in))
    first, *requests = [json.loads(line) for line in log.read_text().splitlines()]
    key = first["api_key"]
    assert key and key != USER_KEY and not any(key in arg for arg in first["argv"])
    bearer = f"Bearer {key}"
    assert requests[0]["path"] == requests[1]["path"] == "/v1/models"
    assert requests[0]["authorization"] not in (None, bearer)  # the wrong-key probe, answered 401
    assert all(r["authorization"] == bearer for r in requests[1:]), requests
    assert sum(r["path"] == "/v1/completions" for r in requests) >= 2  # the references (and their tails)
    assert not any(USER_KEY in json.dumps(r) for r in requests)
    assert results["reference"]["server"]["started_by_payload"] == "vllm"
    outputs = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert {"results.json", "samples.jsonl", "vllm-plain.log"} <= {p.name for p in outputs}
    for path in outputs:
        text = path.read_text(errors="replace")
        assert key not in text and USER_KEY not in text, path


def test_an_engine_that_ignores_the_key_is_refused_before_the_key_is_sent(tmp_path, impostor_models, monkeypatch):
    """Our own process on the port, but serving without the key (a vLLM that ignores $VLLM_API_KEY): refused."""
    log = tmp_path / "engine-requests.jsonl"
    monkeypatch.setenv("FAKE_ENGINE_REQUESTS", str(log))
    monkeypatch.setenv("FAKE_ENGINE_IGNORES_KEY", "1")
    stand_in = _script(tmp_path / "engine-python", STAND_IN_ENGINE.format(python=sys.executable,
                                                                          tests=str(PAYLOAD_TESTS)))
    srv = EngineServer(ServerConfig(python=stand_in, target=str(impostor_models[0] / "target")), tmp_path / "vllm.log")
    with pytest.raises(EngineError) as err:
        srv.start(timeout_s=START_TIMEOUT_S)
    msg = str(err.value)
    assert f"127.0.0.1:{srv.port} answered GET /v1/models with a wrong API key (HTTP 200, not 401)" in msg, msg
    assert srv.api_key not in msg
    requests = [json.loads(line) for line in log.read_text().splitlines()][1:]
    assert [r["path"] for r in requests] == ["/v1/models"]  # the wrong-key probe only
    assert srv.api_key not in json.dumps(requests)
    assert srv.proc.returncode is not None


def test_check_port_tells_the_engines_socket_from_anothers(tmp_path):
    """Real sockets: ours (this process's session), another session's view of them, and addresses that do not
    take a connection to 127.0.0.1."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # a session that holds no socket
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            assert check_port(port, os.getsid(0)) == PortCheck(listening=False, foreign=())  # bound, not listening
            s.listen()
            inode = os.stat(f"/proc/self/fd/{s.fileno()}").st_ino
            assert check_port(port, os.getsid(0)) == PortCheck(listening=True, foreign=())
            assert check_port(port, other.pid) == PortCheck(True, (Listener(inode=inode, uid=os.getuid()),))
        with socket.socket() as elsewhere:  # 127.0.0.2 does not take connections to 127.0.0.1
            elsewhere.bind(("127.0.0.2", 0))
            elsewhere.listen()
            assert check_port(elsewhere.getsockname()[1], other.pid) == PortCheck(False, ())
        if socket.has_ipv6:
            with socket.socket(socket.AF_INET6) as any6:  # [::] (dual stack) does
                try:
                    any6.bind(("::", 0))
                except OSError:
                    pytest.skip("no IPv6 on this host")
                any6.listen()
                found = check_port(any6.getsockname()[1], other.pid)
                assert found is not None and found.listening and len(found.foreign) == 1
    finally:
        other.kill()
        other.wait()
    assert check_port(port, os.getsid(0), proc=tmp_path) is None  # no /proc/net/tcp: cannot tell
