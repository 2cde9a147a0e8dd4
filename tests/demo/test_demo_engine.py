"""`dfo demo --engine vllm` without hosts or an engine: its plan names fixture items the payload builds, and its
offline-vs-engine lines render what the payload's agreement function computes. (The full engine demo takes
~10-20 min on 2 cores: run by hand, `./scripts/demo.sh --engine vllm`, its output in docs/demo.md.)"""

from __future__ import annotations

import pytest
from cli_runner import dfo

from orchestrator.demo.engine_story import FIXTURES, demo_plan, side_by_side
from remote_payload.fixtures import build as fx
from remote_payload.metrics import engine_agreement


def _built(items: str) -> list[str]:
    return fx._resolve(items.split(","))


def test_default_plan_is_the_demo_of_before():
    plan = demo_plan("/m", "/c")
    assert plan.engine is None and plan.target == "/m/target"
    assert plan.fixtures == {"ct129": ("/m", "target,zlab-drafter,random-drafter,dflash2-drafter"),
                             "kpro6": ("/c", "training-checkpoint")}
    assert [(d.name, d.host, d.path) for d in plan.drafters] == [
        ("ours", "kpro6", "/c/trained-drafter/checkpoint.pt"), ("zlab", None, "/m/zlab-drafter"),
        ("random", None, "/m/random-drafter"), ("dflash2", None, "/m/dflash2-drafter")]


@pytest.mark.parametrize("engine", [None, "vllm"])
def test_plan_names_items_the_payload_builds_where_they_are_used(engine):
    plan = demo_plan("/m", "/c", engine)
    on_ct129, on_kpro6 = _built(plan.fixtures["ct129"][1]), _built(plan.fixtures["kpro6"][1])
    assert plan.target.split("/")[-1] in on_ct129
    for d in plan.drafters:
        item = d.path.split("/")[2]
        assert item in (on_kpro6 if d.host == "kpro6" else on_ct129)


def test_engine_plan_uses_the_engine_set_and_the_relayed_drafter():
    plan = demo_plan("/m", "/c", "vllm")
    assert plan.target == "/m/engine-target"
    assert [(d.name, d.host, d.path) for d in plan.drafters] == [
        ("ours", "kpro6", "/c/engine-trained-drafter/checkpoint.pt")]
    assert set(_built(FIXTURES["vllm"]["kpro6"])) <= {"tokenizer", *fx.ENGINE}
    with pytest.raises(ValueError, match="unknown engine 'sglang'"):
        demo_plan("/m", "/c", "sglang")


def _results(engine_rounds: list[list[int]], offline_rounds: list[list[int]]) -> dict:
    positions = 7
    engine = [engine_agreement.sample_counts(r, positions) for r in engine_rounds]
    ag = engine_agreement.compare([f"s{i}" for i in range(len(engine))], engine, offline_rounds, positions)
    return {"engine": {"name": "vllm", "version": "0.32.0", "start_seconds": {"plain": 41.2, "ours": 52.7}},
            "drafters": {"ours": {"metrics": {"tau_macro": 2.1, "tau_micro": 2.0},
                                  "engine": {"agreement": ag, "outputs": {"samples": 2, "match_reference": 2},
                                             "tokens_per_s": {"plain": 40.0, "dflash": 60.0, "speedup": 1.5}}},
                         "zlab": {"metrics": {"tau_macro": 2.1}}}}


def test_side_by_side_shows_both_taus_speed_and_verdict():
    rounds = [[3, 0, 7, 1], [2, 2, 5]]
    results = _results(rounds, rounds)
    lines = side_by_side(results)
    text = "\n".join(lines)
    off = results["drafters"]["ours"]["engine"]["agreement"]["offline"]
    row = next(line for line in lines if line.strip().startswith("ours "))
    assert f"{off['tau_macro']:.3f} / {off['tau_micro']:.3f}" in row and "2.100 / 2.000" in row
    assert "within tolerance" in row and "7/7" in row and "zlab" not in text  # no engine block: not shown
    assert "tokens/s plain 40.0, dflash 60.0 (x1.50)" in text and "2 of 2 samples identical" in text
    assert "vllm 0.32.0" in lines[0] and lines[-1].strip() == "engine starts: plain 41 s, ours 53 s"


def test_side_by_side_flags_a_disagreement_and_an_engine_failure():
    results = _results([[0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0]], [[3, 0, 7, 1], [2, 2, 5]])
    results["drafters"]["random"] = {"metrics": {"tau_macro": 1.0}, "engine": {"error": "engine did not start\nlog"}}
    lines = side_by_side(results)
    assert "OUTSIDE tolerance" in next(line for line in lines if line.strip().startswith("ours "))
    assert any(line.strip().startswith("ours: p1 0.000 vs 0.857 (±") for line in lines)
    assert any(line.strip() == "random: engine failed: engine did not start" for line in lines)
    assert side_by_side({"drafters": {"zlab": {"metrics": {}}}}) == []


def test_cli_refuses_an_unknown_engine_and_engine_with_watch():
    bad = dfo("demo", "--engine", "sglang")
    assert bad.returncode == 2 and "--engine sglang: unknown engine" in bad.stderr and "vllm" in bad.stderr
    both = dfo("demo", "--engine", "vllm", "--watch")
    assert both.returncode == 2 and "--engine and --watch" in both.stderr


def test_side_by_side_ends_with_the_speedup_vs_concurrency_table():
    from orchestrator.demo.engine_story import CONCURRENCY, concurrency_table

    assert demo_plan("/m", "/c", "vllm").engine_concurrency == CONCURRENCY == "1,6"
    assert demo_plan("/m", "/c").engine_concurrency is None
    rounds = [[3, 0, 7, 1], [2, 2, 5]]
    results = _results(rounds, rounds)
    results["drafters"]["ours"]["engine"]["concurrency"] = [
        {"concurrency": 1, "plain_tokens_per_s": 40.0, "dflash_tokens_per_s": 90.0, "speedup": 2.25,
         "mean_acceptance_length": 4.5, "tpot_ms": {"plain": 25.0, "dflash": 11.1},
         "reference_mismatches": {"plain": [], "dflash": []}},
        {"concurrency": 6, "plain_tokens_per_s": 160.0, "dflash_tokens_per_s": 170.0, "speedup": 1.06,
         "mean_acceptance_length": 4.5, "tpot_ms": {"plain": 30.0, "dflash": 20.0},
         "reference_mismatches": {"plain": [], "dflash": ["s1"]}}]
    lines = side_by_side(results)
    start = lines.index("speedup vs concurrency (every prompt sent at each level, greedy):")
    rows = [" ".join(line.split()) for line in lines[start + 2:]]
    assert rows == ["ours 1 40.0 90.0 x2.25 4.50 25.0/11.1 all", "ours 6 160.0 170.0 x1.06 4.50 30.0/20.0 1 dflash, 0 "
                    "plain differ"]
    assert concurrency_table([{"drafter": "ours", "concurrency": []}]) == []  # results from before the sweep


def test_the_engine_story_ends_with_predicted_vs_measured_speedup_and_the_schedule():
    from orchestrator.demo.engine_story import ENGINE_K, prediction_table

    assert demo_plan("/m", "/c", "vllm").engine_k == ENGINE_K == "1,3" and demo_plan("/m", "/c").engine_k is None
    plan = {"predicted": [{"concurrency": 1, "best_k": 7, "best_speedup": 2.1},
                          {"concurrency": 6, "best_k": 1, "best_speedup": 1.1}],
            "check": [{"concurrency": 1, "k": 7, "predicted_speedup": 2.0, "measured_speedup": 2.2,
                       "relative_error": -0.0909, "held_out": True},
                      {"concurrency": 6, "k": 7, "predicted_speedup": 0.9, "measured_speedup": 0.9,
                       "relative_error": 0.0, "held_out": False}],
            "num_speculative_tokens_per_batch_size": [[1, 5, 7], [6, 6, 1]]}
    lines = prediction_table({"k_plans": {"ours": plan}})
    rows = [" ".join(line.split()) for line in lines[2:4]]
    assert rows == ["ours 1 7 x2.00 x2.20 -9.1% 7 (x2.10)", "ours 6 7* x0.90 x0.90 +0.0% 1 (x1.10)"]
    assert lines[-1].strip() == "ours: num_speculative_tokens_per_batch_size = [[1, 5, 7], [6, 6, 1]]"
    assert prediction_table({"drafters": {}}) == []
