"""Stages of the eval pipeline run alone on the fixtures (remote_payload/eval/stages.py, drafters.py), each on a
context prepared by hand, and checked against the same figures computed directly."""

from __future__ import annotations

import io
import json

import pytest
import torch
from payload_helpers import MAX_NEW

from remote_payload.errors import PayloadError
from remote_payload.eval import stages
from remote_payload.eval.context import EvalContext, References
from remote_payload.eval.drafters import evaluate_drafter
from remote_payload.eval.offline import draft_sample, replay
from remote_payload.eval.settings import EvalSettings
from remote_payload.metrics.chain import summarize
from remote_payload.progress import Progress

N = 2  # samples


def _settings(fixture_dir, eval_cache, tmp_path, drafter="zlab-drafter", **kw) -> EvalSettings:
    return EvalSettings(target=str(fixture_dir / "target"), drafters=[("d", str(fixture_dir / drafter))],
                        samples=N, max_new_tokens=MAX_NEW, device="cpu", dtype="float32",
                        cache_dir=str(eval_cache), out=str(tmp_path / "out"), **kw)


def test_check_inputs_alone_validates_drafters_before_any_weights(fixture_dir, eval_cache, tmp_path):
    out = io.StringIO()
    ctx = EvalContext(settings=_settings(fixture_dir, eval_cache, tmp_path), progress=Progress(stream=out))
    stages.start(ctx)
    stages.check_inputs(ctx)
    assert list(ctx.drafters) == ["d"] and ctx.drafters["d"].spec.fc_layer_ids == [1, 3, 5]
    assert len(ctx.prompts) == N and ctx.prompt_info["source"] == "builtin"
    assert ctx.target is None and ctx.references.refs == []  # the target's weights are not loaded here
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(e["stage"], e["status"]) for e in events] == [("load", "start"), ("load", "drafter")]

    # A drafter that does not fit the target fails here, naming the drafter.
    bad = _settings(fixture_dir, eval_cache, tmp_path)
    bad.drafter_specs = {"d": str(tmp_path / "spec.json")}
    (tmp_path / "spec.json").write_text(json.dumps({"mask_token_id": 10**6}))
    ctx = EvalContext(settings=bad)
    stages.start(ctx)
    with pytest.raises(PayloadError, match="drafter 'd'.*10*"):
        stages.check_inputs(ctx)


def _context_after_references(fixture_dir, eval_cache, tmp_path, target, samples, loaded, **kw) -> EvalContext:
    """What check_inputs, load_target and local_references leave behind, from the session's fixtures."""
    ctx = EvalContext(settings=_settings(fixture_dir, eval_cache, tmp_path, **kw))
    stages.start(ctx)
    ctx.target, ctx.tokenizer, ctx.target_config = target, target.tokenizer, target.config
    ctx.drafters = {"d": loaded["zlab"]}
    ctx.prompts = [p for p, _, _ in samples[:N]]
    ctx.references = References(refs=[ref for _, ref, _ in samples[:N]])
    return ctx


def test_extract_features_alone_matches_direct_extraction(fixture_dir, eval_cache, tmp_path, target, samples,
                                                          loaded):
    ctx = _context_after_references(fixture_dir, eval_cache, tmp_path, target, samples, loaded)
    stages.extract_features(ctx)
    ex = ctx.extraction
    assert ex.layer_ids == [1, 3, 5] and ex.cache_hits == N  # the session already extracted them into eval_cache
    for i, (_, _, feats) in enumerate(samples[:N]):
        got = ex.store.get(i)
        assert all(torch.equal(got[lid], feats.layers[lid]) for lid in ex.layer_ids)
    assert ctx.timings["extract_s"] >= 0 and ex.probe_features == {}  # no --diagnose: no probe layers


def test_evaluate_drafter_alone_matches_a_direct_replay(fixture_dir, eval_cache, tmp_path, target, samples, loaded,
                                                        runtime_for):
    ctx = _context_after_references(fixture_dir, eval_cache, tmp_path, target, samples, loaded, online_check=True)
    stages.extract_features(ctx)
    run = evaluate_drafter(ctx, "d")
    rt = runtime_for(loaded["zlab"])
    direct = [replay(draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids))) for _, ref, feats in samples[:N]]
    assert run.rounds == direct
    assert run.summary["metrics"]["tau_macro"] == summarize(direct, rt.block_size)["tau_macro"]
    assert run.summary["online_check"]["all_rounds_identical"] is True and len(run.online) == N
    assert ctx.results == {"d": run} and set(run.summary["timings"]) >= {"eval_s", "draft_s", "tree_s", "online_s"}
