"""vLLM's DFlash speculative decoding on the tiny Qwen3 fixture vs plain greedy and vs dfo's offline replay.

- Outputs: vLLM plain and vLLM with the drafter both equal the payload's own greedy references (fp32), one
  request at a time and with 4 in flight (the sweep's levels, one DFlash server for both).
- Acceptance: each reply's own ``metrics.speculative_decoding`` (``--per-request-spec-decode-metrics
  detailed``): consistent per request, adding up exactly to the server-wide counters around the first level,
  and compared with dfo's offline replay of the same drafter over the same continuations with the eval's own
  rule and bounds (metrics.engine_agreement) and per step. An engine step and an offline round agree
  whenever the drafter's argmax agrees; two implementations of the drafter (vLLM's fused attention vs dfo's
  torch code) can flip a draft where its top-2 logits nearly tie, and a flipped draft shifts the rest of that
  sample's rounds, so per-sample figures may differ; aggregates must agree within the rule's bounds.
"""

from __future__ import annotations

import json

import pytest
from conftest import MAX_NEW, TIMINGS

from orchestrator.testing.processes import command_line, descendants
from remote_payload.engines.run import EnginePrompt, run_prompts, sweep
from remote_payload.engines.spec_metrics import read_counters
from remote_payload.metrics.engine_agreement import compare, per_step_differences

LEVELS = (1, 4)  # requests in flight; 4 of the 12 prompts at once is what batches on 2 cores

# A test that starts a server (setup counts) may wait minutes for it on a busy 2-core box.
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def references(target_model):
    """(prompt id, prompt ids, greedy continuation) for every built-in prompt, dfo's own decoding, fp32."""
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import greedy_decode
    from remote_payload.models.target import render_prompt

    out = []
    for p in load_prompts("builtin")[0]:
        ids = render_prompt(target_model.tokenizer, p.message_dicts(), False)
        out.append((p.id, ids, greedy_decode(target_model, ids, MAX_NEW)))
    return out


@pytest.fixture(scope="module")
def engine_prompts(references):
    return [EnginePrompt(pid, ids, ref.continuation) for pid, ids, ref in references]


@pytest.fixture(scope="module")
def offline(engine_fixtures, target_model, references):
    """dfo's offline replay of the z-lab drafter folder over the same continuations: rounds per sample."""
    import torch

    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.inputs.features import extract
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime

    ld = load_drafter(engine_fixtures / "zlab-drafter")
    rt = DrafterRuntime(ld, target_model.model.get_input_embeddings(), target_model.model.get_output_embeddings(),
                        dtype=torch.float32)
    rounds = []
    for _, ids, ref in references:
        feats = extract(target_model, ref.tokens, ld.spec.fc_layer_ids, len(ids), with_argmax=False)
        rounds.append(replay(draft_sample(rt, feats.layers, ref.tokens, len(ids))))
    return ld.spec.block_size, rounds


@pytest.fixture(scope="module")
def plain_run(servers, engine_prompts, target_model):
    return run_prompts(servers.get("plain"), engine_prompts, MAX_NEW, target_model.stop_ids)


@pytest.fixture(scope="module")
def dflash_sweep(servers, engine_prompts, target_model):
    return sweep(servers.get("dflash"), engine_prompts, MAX_NEW, target_model.stop_ids, LEVELS)


@pytest.fixture(scope="module")
def dflash_run(dflash_sweep):
    return dflash_sweep["levels"][0]


def test_plain_vllm_equals_dfo_greedy(plain_run, references):
    assert plain_run["reference_mismatches"] == [], [
        (s["id"], s["first_difference"]) for s in plain_run["samples"] if not s["matches_reference"]]
    assert "spec" not in plain_run and not any("spec" in s for s in plain_run["samples"])  # no drafter, no figures
    assert {s["finish_reason"] for s in plain_run["samples"]} == {"stop", "length"} or \
        {r.stop_reason for _, _, r in references} != {"eos", "max_new_tokens"}
    TIMINGS["plain tokens/s"] = plain_run["tokens_per_s"]


def test_dflash_outputs_equal_greedy_at_every_concurrency(dflash_sweep, plain_run):
    assert [lv["concurrency"] for lv in dflash_sweep["levels"]] == list(LEVELS)
    for level in dflash_sweep["levels"]:
        assert level["reference_mismatches"] == [], (level["concurrency"], [
            (s["id"], s["first_difference"]) for s in level["samples"] if not s["matches_reference"]])
        assert [s["continuation"] for s in level["samples"]] == [s["continuation"] for s in plain_run["samples"]]
        TIMINGS[f"dflash tokens/s at {level['concurrency']}"] = level["tokens_per_s"]


def test_per_request_acceptance_is_each_requests_own_and_adds_up_to_the_counters(dflash_sweep):
    """Every reply carries its acceptance (per step, drafted, histogram) and the requests' sum equals the
    server-wide counters' difference around the whole first level, exactly."""
    check = dflash_sweep["counter_check"]
    assert check is not None and check["concurrency"] == LEVELS[0] and check["requests"] == 12
    assert check["ok"], check
    assert check["counters"]["rounds"] > 0 and check["counters"]["per_position_counts"][0] > 0
    for level in dflash_sweep["levels"]:
        for s in level["samples"]:
            spec = s["spec"]
            assert spec["rounds"] >= 1 and spec["drafts_proposed"] == spec["rounds"] * 7, s["id"]
            assert len(spec["per_step"]) == spec["rounds"] and sum(spec["per_step"]) == spec["drafts_accepted"]
            counts = spec["per_position_counts"]
            assert sum(counts) == spec["drafts_accepted"] and counts == sorted(counts, reverse=True), s["id"]
            # every committed token after the prefill comes from a round: accepted drafts + one bonus each
            assert spec["rounds"] + spec["drafts_accepted"] >= s["tokens"] - 1, s["id"]
    low, high = (lv["samples"] for lv in dflash_sweep["levels"])
    TIMINGS["per-step acceptance equal at 1 and 4 in flight"] = \
        f"{sum(a['spec']['per_step'] == b['spec']['per_step'] for a, b in zip(low, high, strict=True))}/{len(low)}"


def test_engine_acceptance_matches_offline(dflash_run, offline):
    """The eval's own comparison (metrics.engine_agreement, its bounds from the counts) on the fixture."""
    block, rounds = offline
    ids = [s["id"] for s in dflash_run["samples"]]
    out = compare(ids, [s["spec"] for s in dflash_run["samples"]], [[r.accepted for r in rs] for rs in rounds],
                  block - 1)
    steps = per_step_differences(ids, [s["spec"]["per_step"] for s in dflash_run["samples"]],
                                 [[r.accepted for r in rs] for rs in rounds])
    table = [{"k": p["k"], "engine": p["engine"], "offline": p["offline"]} for p in out["per_position"]]
    print(json.dumps({"rounds": [out["engine"]["rounds"], out["offline"]["rounds"]], "per_position": table,
                      "per_step_differ": steps["differ"]}))
    TIMINGS["samples agreeing exactly"] = f"{out['samples']['identical']}/{len(rounds)}"
    TIMINGS["samples equal step by step"] = f"{steps['equal']}/{steps['compared']}"
    TIMINGS["tau micro engine/offline"] = f"{out['engine']['tau_micro']:.3f}/{out['offline']['tau_micro']:.3f} " \
                                          f"±{out['tau_micro']['bound']:.3f}"
    TIMINGS["p_k engine/offline"] = " ".join(f"p{p['k']} {p['engine']:.3f}/{p['offline']:.3f} ±{p['bound']:.3f}"
                                             for p in out["per_position"])
    assert out["offline"]["drafts_accepted"] > out["offline"]["rounds"] * 0.3, \
        "the fixture drafter accepts too little for this comparison to mean anything"
    # equal step by step is equal in every count: never more samples than the rule found identical
    assert steps["compared"] == len(ids) and steps["equal"] <= out["samples"]["identical"]
    assert out["within_tolerance"], out["problems"]


def test_metrics_page_parses_to_the_run_totals(servers, dflash_sweep):
    """The live /metrics page: counters at least the sweep's totals (the session may have run more)."""
    import urllib.request

    srv = servers.get("dflash")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    page = opener.open(srv.root + "/metrics", timeout=30).read().decode()
    c = read_counters(page, "vllm:", srv.cfg.served_name)
    total = sum(lv["spec"]["rounds"] for lv in dflash_sweep["levels"])
    assert c.spec_enabled and len(c.per_position) == 7
    assert c.drafts >= total and c.accepted >= sum(lv["spec"]["drafts_accepted"] for lv in dflash_sweep["levels"])
    assert read_counters(page, "vllm:", "some-other-model").drafts == 0  # samples are filtered by model_name


def test_the_model_runs_in_the_engine_core_process_not_a_third_one(servers, dflash_sweep):
    """VLLM_ENABLE_V1_MULTIPROCESSING=0 (remote_payload/engines/vllm.py): at tensor parallel 1 the worker runs
    inside the engine core, as vLLM lays it out on a GPU, instead of an interpreter of its own to start."""
    titles = [t for t in map(command_line, descendants(servers.get("dflash").proc.pid)) if t]  # VLLM::… names
    assert [t for t in titles if t.startswith("VLLM::")] == ["VLLM::EngineCore"], titles
