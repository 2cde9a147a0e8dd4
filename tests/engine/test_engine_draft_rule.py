"""The engine stage names the draft rule an engine's τ follows at T > 0 beside the one the run asked for."""

from __future__ import annotations

from remote_payload.eval.context import EvalContext
from remote_payload.eval.engine_results import engine_rule
from remote_payload.eval.settings import EvalSettings


def _ctx(engine: str, temperature: float, draft_rule: str = "sampled") -> EvalContext:
    return EvalContext(settings=EvalSettings(target="/m/t", drafters=[("z", "/m/d")], engine=engine,
                                             temperature=temperature, draft_rule=draft_rule))


def test_vllm_runs_the_greedy_rule_and_a_sampled_run_says_its_tau_is_another_rules():
    rule = engine_rule(_ctx("vllm", 1.0))
    assert rule["requested"] == "sampled" and rule["engine"] == "greedy" and rule["same"] is False
    assert "vLLM runs the greedy rule" in rule["note"] and "not compared" in rule["note"]
    same = engine_rule(_ctx("vllm", 1.0, "greedy"))
    assert same["same"] is True and "note" not in same


def test_an_engine_whose_rule_dfo_does_not_know_is_recorded_as_unknown():
    rule = engine_rule(_ctx("sglang", 0.7))
    assert rule["engine"] == "unknown" and rule["same"] is None and "does not know" in rule["note"]
