"""``eval --diagnose`` and the run checks: each planted fault is flagged, a correct drafter is not.

Faults are planted in copies of the fixture drafters (config or weights edited): target layer ids shifted
by one, training metadata naming the fla kernel path and thinking mode, fp16 weights, an embed_tokens copy
that differs from the target's, a wrong mask id (on a copy of the target whose vocabulary has padding rows
beyond the tokenizer, as Qwen's has), and a mask-filled slot 0 (the test-only $DFO_PAYLOAD_TEST_FAULT).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from payload_helpers import MAX_NEW, drafter_copy, json_lines, read_results

from remote_payload.diagnose import findings as dg
from remote_payload.diagnose.tensors import TensorStats, stats_findings
from remote_payload.errors import PayloadError
from remote_payload.eval.pipeline import run_eval
from remote_payload.eval.settings import EvalSettings, parse_expect_p1
from remote_payload.models.checkpoint import load_drafter
from remote_payload.models.export import strip_checkpoint
from remote_payload.models.spec import zlab_default_layer_ids

WARNINGS = "warning"


def _codes(results, drafter, severity=WARNINGS):
    return {f["code"] for f in results["diagnostics"]["findings"]
            if f["drafter"] == drafter and f["severity"] == severity}


@pytest.fixture(scope="module")
def planted(fixture_dir, tmp_path_factory, target):
    """Drafter copies, each with one kind of fault (and one with correct metadata as a control)."""
    work = tmp_path_factory.mktemp("planted")
    zlab, spec = fixture_dir / "zlab-drafter", fixture_dir / "speculators-drafter"
    sha = dg.template_sha256(target.tokenizer)

    def meta(**block):
        return lambda c: c.update(training=block)

    return {
        "ok": zlab,
        "shifted": drafter_copy(zlab, work / "shifted",  # HF hidden_states indices where decoder-layer ids belong
                                config=lambda c: c["dflash_config"].update(target_layer_ids=[2, 4, 6])),
        "fla": drafter_copy(zlab, work / "fla", config=meta(feature_kernel_path="fla", enable_thinking=True)),
        "fp16": drafter_copy(zlab, work / "fp16", config=meta(feature_kernel_path="torch", enable_thinking=False,
                                                              chat_template_sha256=sha),
                             weights=lambda w: {k: v.to(torch.float16) for k, v in w.items()}),
        "spec": spec,
        "copies": drafter_copy(spec, work / "copies", weights=lambda w: {
            **w, "embed_tokens.weight": w["embed_tokens.weight"] * 1.05}),
    }


@pytest.fixture(scope="module")
def diagnosed(fixture_dir, planted, eval_cache, tmp_path_factory):
    """One `python -m remote_payload eval --diagnose` over every planted drafter, as the controller runs it."""
    import os
    import subprocess
    import sys

    from payload_helpers import REPO

    out = tmp_path_factory.mktemp("diagnosed") / "run"
    drafters = [a for n, p in planted.items() for a in ("--drafter", f"{n}={p}")]
    args = ["eval", "--target", fixture_dir / "target", *drafters,
            "--samples", "2", "--max-new-tokens", MAX_NEW, "--dtype", "float32", "--threads", "1", "--allow-fp16",
            "--cache-dir", eval_cache, "--out", out, "--diagnose", "--diagnose-rounds", "3",
            "--expect-p1", "0.6", "--expect-p1", "shifted=0.9"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "remote_payload", *map(str, args)], cwd=str(REPO),
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results, lines = read_results(out)
    return proc, results, lines


def test_each_planted_fault_is_flagged_and_the_correct_drafter_is_not(diagnosed):
    _proc, results, _lines = diagnosed
    assert _codes(results, "ok") == set()
    assert _codes(results, "spec") == set()
    assert {"layer-shift", "p1-below-expected"} <= _codes(results, "shifted")
    assert _codes(results, "fla") == {"kernel-path-mismatch", "thinking-mismatch"}
    assert _codes(results, "fp16") == {"fp16-weights"}  # its metadata matches the run: no other finding
    assert "embedding-mismatch" in _codes(results, "copies")
    assert "no-training-metadata" in _codes(results, "ok", "info") and "mask-token" in _codes(results, "ok", "info")
    assert "no-training-metadata" not in _codes(results, "fla", "info")
    assert set(results["diagnostics"]["codes"]) == set(dg.FINDING_CODES)


def test_probe_numbers_behind_the_findings(diagnosed):
    _proc, results, _lines = diagnosed
    d = results["diagnostics"]["drafters"]
    ok, shifted = d["ok"]["probes"]["variants"], d["shifted"]["probes"]["variants"]
    # the eval's drafts are exactly a re-draft of the design's block; the shifted ids lose to ids - 1
    assert ok["slot0=token"]["agreement_with_as_run"] == 1.0 and ok["as-run"]["positions"] > dg.MIN_POSITIONS
    assert shifted["slot0=token"]["agreement_with_as_run"] == 1.0
    assert shifted["layers-1"]["layers"] == [1, 3, 5] and ok["layers+1"]["layers"] == [2, 4, 6]
    assert shifted["layers-1"]["depth1_accuracy"] == ok["slot0=token"]["depth1_accuracy"]  # same features, weights
    assert shifted["layers-1"]["depth1_accuracy"] > shifted["slot0=token"]["depth1_accuracy"] + dg.BETTER_ABS
    assert ok["slot0=token"]["depth1_accuracy"] > max(ok["layers-1"]["depth1_accuracy"],
                                                      ok["layers+1"]["depth1_accuracy"]) + dg.BETTER_ABS
    assert d["shifted"]["p1"]["expected"] == 0.9 and d["ok"]["p1"]["expected"] == 0.6
    emb = d["copies"]["embeddings"]["embed_tokens.weight"]
    assert emb["match"] is False and emb["used_by_the_eval"] is True and emb["rows_differing"] > 0
    assert d["spec"]["embeddings"]["embed_tokens.weight"]["match"] is True
    assert d["spec"]["embeddings"]["lm_head.weight"]["match"] is True  # compared through the d2t map
    assert d["ok"]["embeddings"] == {"embed_tokens.weight": None, "lm_head.weight": None}
    assert d["fla"]["training_metadata"] == {"feature_kernel_path": "fla", "enable_thinking": True}
    hs = results["diagnostics"]["hidden_states"]
    assert sorted(map(int, hs["layers"])) == [1, 2, 3, 4, 5, 6]  # every layer some drafter's fc uses
    for st in hs["layers"].values():
        assert st["nan"] == st["inf"] == 0 and st["std"] > 0 and st["abs_max"] > 0
    assert d["ok"]["fc_output"]["nan"] == 0 and d["ok"]["fc_output"]["std"] == pytest.approx(1.0, abs=0.1)


def test_decoded_rounds_sit_next_to_the_targets_tokens(diagnosed, target):
    _proc, results, lines = diagnosed
    drafts = results["diagnostics"]["drafters"]["ok"]["drafts"]
    assert [s["sample"] for s in drafts] == [line["id"] for line in lines] == results["diagnostics"]["samples"]
    tok = target.tokenizer
    for smp, line in zip(drafts, lines, strict=False):
        entry = line["drafters"]["ok"]
        assert [r["anchor"] for r in smp["rounds"]] == entry["anchors"][:3]
        assert [r["accepted"] for r in smp["rounds"]] == entry["accepted"][:3]
        for r in smp["rounds"]:
            assert r["drafts_text"] == [tok.decode([t]) for t in r["drafts"]] and len(r["drafts"]) == 7
            agree = 0
            while agree < len(r["target"]) and r["drafts"][agree] == r["target"][agree]:
                agree += 1
            assert agree == r["accepted"]
    first = drafts[0]["rounds"][0]
    assert "".join(first["target_text"]) == tok.decode(first["target"])
    assert first["anchor"] == lines[0]["prompt_tokens"]  # the first anchor is the first continuation token


def test_report_is_printed_and_kept_in_the_results(diagnosed):
    proc, results, _lines = diagnosed
    text = results["diagnostics"]["text"]
    assert text.startswith("dfo diagnostics — 2 sample(s) probed")
    for fragment in ("Findings", "Target hidden states", "Drafter 'shifted'", "layers-1", "first rounds of",
                     "[layer-shift] 'shifted'", "[kernel-path-mismatch] 'fla'", "draft :", "target:"):
        assert fragment in text, fragment
    printed = [ln for ln in proc.stdout.splitlines() if not ln.startswith("{")]
    assert printed == text.splitlines()  # the same report, as free text on stdout
    warned = [r["message"] for r in json_lines(proc.stdout) if r["dfo"] == "warning"]
    assert any(w.startswith("[layer-shift] drafter 'shifted'") for w in warned)
    assert any(w.startswith("[fp16-weights] drafter 'fp16'") for w in warned)
    assert results["warnings"] == warned
    assert results["settings"]["diagnose"] == {"samples": 2, "rounds": 3}
    assert results["settings"]["expect_p1"] == {"*": 0.6, "shifted": 0.9}


# ------------------------------------------------------------------------------- in-process planted faults


def _run(fixture_dir, target_dir, drafters, out, cache, **kw):
    return run_eval(EvalSettings(target=str(target_dir), drafters=[(n, str(p)) for n, p in drafters.items()],
                                 samples=2, max_new_tokens=MAX_NEW, dtype="float32", cache_dir=str(cache),
                                 out=str(out), diagnose=True, **kw))


def test_mask_filled_slot0_in_the_harness_is_flagged(fixture_dir, eval_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("DFO_PAYLOAD_TEST_FAULT", "slot0-mask")
    results = _run(fixture_dir, fixture_dir / "target", {"ok": fixture_dir / "zlab-drafter"}, tmp_path / "out",
                   eval_cache)
    assert "slot0-harness" in _codes(results, "ok")
    v = results["diagnostics"]["drafters"]["ok"]["probes"]["variants"]
    assert v["slot0=mask"]["agreement_with_as_run"] == 1.0 and v["slot0=token"]["agreement_with_as_run"] < dg.AGREE_OK
    assert results["settings"]["test_fault"] == "slot0-mask"
    assert any(w.startswith("TEST FAULT slot0-mask") for w in results["warnings"])
    monkeypatch.setenv("DFO_PAYLOAD_TEST_FAULT", "nonsense")
    with pytest.raises(PayloadError, match="unknown test fault"):
        _run(fixture_dir, fixture_dir / "target", {"ok": fixture_dir / "zlab-drafter"}, tmp_path / "x", eval_cache)


@pytest.fixture(scope="module")
def padded_target(fixture_dir, tmp_path_factory):
    """The fixture target with 8 embedding rows beyond its 512-token tokenizer (as Qwen pads its vocabulary)."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("padded") / "target"
    shutil.copytree(fixture_dir / "target", out)
    w = load_file(str(out / "model.safetensors"))
    emb, head = w["model.embed_tokens.weight"], w["lm_head.weight"]
    gen = torch.Generator().manual_seed(5)
    w["model.embed_tokens.weight"] = torch.cat([emb, torch.randn(8, emb.shape[1], generator=gen) * emb.std()])
    w["lm_head.weight"] = torch.cat([head, head[5:6].repeat(8, 1)])  # rows of a token the target never emits
    save_file(w, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["vocab_size"] = 520
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_wrong_mask_id_is_flagged(fixture_dir, padded_target, tmp_path):
    # 515 passes validation (inside the embedding, beyond the tokenizer) but is not the mask the drafter learned
    wrong = drafter_copy(fixture_dir / "zlab-drafter", tmp_path / "wrong",
                         config=lambda c: c["dflash_config"].update(mask_token_id=515))
    results = _run(fixture_dir, padded_target, {"ok": fixture_dir / "zlab-drafter", "wrong": wrong},
                   tmp_path / "out", tmp_path / "cache")
    assert "mask-id" in _codes(results, "wrong") and "mask-id" not in _codes(results, "ok")
    d = results["diagnostics"]["drafters"]["wrong"]
    assert d["mask"]["id"] == 515 and d["mask"]["kind"].startswith("beyond the tokenizer")
    assert d["mask"]["piece"] is None
    alt = d["probes"]["variants"]["mask=5"]
    assert alt["piece"] == "<|MASK|>" and alt["depth1_accuracy"] > d["probes"]["variants"]["slot0=token"][
        "depth1_accuracy"] + dg.BETTER_ABS
    finding = next(f for f in results["diagnostics"]["findings"] if f["code"] == "mask-id")
    assert "mask id 5 ('<|MASK|>')" in finding["message"] and "configured 515" in finding["message"]
    assert results["drafters"]["wrong"]["metrics"]["tau_macro"] < results["drafters"]["ok"]["metrics"]["tau_macro"]


# ------------------------------------------------------------------------------- pure checks


def _facts(**kw):
    base = dict(kernel_path="torch", enable_thinking=False, dtype="bfloat16", chat_template_sha256="a" * 64)
    return dg.RunFacts(**{**base, **kw})


def test_run_checks_fp16_and_metadata(loaded):
    assert [f.code for f in dg.run_level_checks(_facts(dtype="float16"))] == ["fp16-run"]
    assert dg.run_level_checks(_facts()) == []
    spec = loaded["zlab"].spec
    codes = [f.code for f in dg.drafter_checks("x", spec, {"chat_template_sha256": "b" * 64}, _facts())]
    assert codes == ["chat-template-mismatch"]
    same = {"feature_kernel_path": "torch", "enable_thinking": False, "chat_template_sha256": "A" * 64}
    assert dg.drafter_checks("x", spec, same, _facts()) == []
    assert [f.code for f in dg.drafter_checks("x", spec, {"feature_kernel_path": "torch"},
                                               _facts(kernel_path="fla"))] == ["kernel-path-mismatch"]


def test_p1_check_threshold():
    metrics = {"per_position": [{"k": 1, "p": 0.59}]}
    assert dg.p1_check("x", metrics, 1.0, "flag").code == "p1-below-expected"
    assert dg.p1_check("x", {"per_position": [{"k": 1, "p": 0.61}]}, 1.0, "flag") is None
    assert dg.p1_check("x", metrics, None, None) is None
    assert dg.p1_check("x", {"per_position": [{"k": 1, "p": None}]}, 0.9, "flag") is None


def test_layer_id_heuristic(loaded):
    import dataclasses

    spec = loaded["zlab"].spec
    default = zlab_default_layer_ids(64, 5)
    assert default == [1, 16, 31, 46, 61]
    plus = dataclasses.replace(spec, fc_layer_ids=[i + 1 for i in default], reserved_layer_ids=[])
    assert dg.layer_id_heuristic("x", plus, 64).code == "layer-ids-look-shifted"
    minus = dataclasses.replace(spec, fc_layer_ids=[0, 15, 30, 45], reserved_layer_ids=[60])
    assert "minus one" in dg.layer_id_heuristic("x", minus, 64).message
    assert dg.layer_id_heuristic("x", dataclasses.replace(spec, fc_layer_ids=default), 64) is None


def test_tensor_stats_and_nonfinite_findings():
    st = TensorStats()
    st.add(torch.tensor([1.0, -3.0, float("nan"), float("inf")]))
    st.add(torch.tensor([[2.0]]))
    j = st.to_json()
    assert (j["nan"], j["inf"], j["values"], j["abs_max"]) == (1, 1, 5, 3.0)
    assert j["mean"] == pytest.approx(0.0) and j["std"] == pytest.approx((14 / 3) ** 0.5, rel=1e-5)  # 6 digits kept
    codes = [f.code for f in stats_findings({1: st}, "bfloat16")]
    assert codes == ["nonfinite-features"]
    big = TensorStats()
    big.add(torch.tensor([7e4]))
    assert [(f.code, f.severity) for f in stats_findings({3: big}, "float16")] == [("fp16-range", "warning")]


def test_expect_p1_parsing():
    assert parse_expect_p1(["0.7", "ours=0.5"]) == {"*": 0.7, "ours": 0.5}
    for bad, msg in ((["x"], "not a number"), (["1.5"], r"\(0, 1\]"), (["=0.5"], "X or NAME=X"),
                     (["0.5", "0.6"], "given twice")):
        with pytest.raises(PayloadError, match=msg):
            parse_expect_p1(bad)


def test_training_metadata_is_validated_and_survives_stripping(fixture_dir, tmp_path):
    bad = drafter_copy(fixture_dir / "zlab-drafter", tmp_path / "bad",
                       config=lambda c: c.update(training={"feature_kernel_path": "triton"}))
    with pytest.raises(PayloadError, match=r"config.json: training.feature_kernel_path must be one of fla, torch"):
        load_drafter(bad)
    worse = drafter_copy(fixture_dir / "zlab-drafter", tmp_path / "worse",
                         config=lambda c: c.update(training={"enable_thinking": "yes"}))
    with pytest.raises(PayloadError, match="training.enable_thinking must be true or false"):
        load_drafter(worse)
    # a training checkpoint's spec carries the block; strip-checkpoint keeps it in the z-lab config it writes
    spec = json.loads((fixture_dir / "trained-drafter" / "spec.json").read_text())
    spec["training"] = {"feature_kernel_path": "fla", "expected_p1": 0.8, "run": "step-20000"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    ck = fixture_dir / "trained-drafter" / "checkpoint.pt"
    assert load_drafter(ck, tmp_path / "spec.json").source["training_metadata"] == spec["training"]
    strip_checkpoint(ck, tmp_path / "stripped", tmp_path / "spec.json")
    assert json.loads((tmp_path / "stripped" / "config.json").read_text())["training"] == spec["training"]
    assert load_drafter(tmp_path / "stripped").source["training_metadata"] == spec["training"]
    # and a --drafter-spec file may add it to a z-lab folder without editing the download
    (tmp_path / "meta.json").write_text(json.dumps({"training": {"enable_thinking": True}}))
    assert load_drafter(fixture_dir / "zlab-drafter", tmp_path / "meta.json").source["training_metadata"] == {
        "enable_thinking": True}
