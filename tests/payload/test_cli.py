"""`python -m remote_payload ...` as the controller runs it: exit codes, one-line errors, JSON progress, results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from payload_helpers import REPO, json_lines, read_results

EVAL_FAST = ["--dtype", "float32", "--threads", "1", "--max-new-tokens", "160"]


def _one_error_line(proc, *fragments):
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dfo-payload error: "), lines[0]
    assert "Traceback" not in proc.stderr
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


def test_help_and_info_work_without_torch():
    blocker = ("import sys, runpy; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
               "sys.argv = ['remote_payload'] + sys.argv[1:]; runpy.run_module('remote_payload', run_name='__main__')")
    for args in (["--help"], ["eval", "--help"], ["info", "--json"]):
        proc = subprocess.run([sys.executable, "-c", blocker, *args], cwd=str(REPO), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["dfo"] == "info" and info["torch"] is None and info["cuda_available"] is False
    assert info["linear_attention_kernel"] == "torch" and info["results_schema"] == "dfo.results/2"


def test_info_reports_versions_and_kernel_path(run_payload):
    proc = run_payload("info", "--json")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["torch"].startswith("2.13.0") and info["transformers"] == "5.24.0"
    assert info["fla_installed"] is False and info["linear_attention_kernel"] == "torch"


def test_eval_end_to_end(fixture_dir, run_payload, tmp_path, eval_cache):
    out = tmp_path / "run"
    proc = run_payload(
        "eval", "--target", fixture_dir / "target",
        "--drafter", f"ours={fixture_dir / 'trained-drafter' / 'checkpoint.pt'}",  # spec.json beside it
        "--drafter", f"rand={fixture_dir / 'random-drafter'}",
        "--samples", "3", "--online-check", "--cache-dir", eval_cache, "--out", out, *EVAL_FAST)
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc.stdout)
    progress = [r for r in records if r["dfo"] == "progress"]
    assert progress and all({"stage", "done", "total"} <= r.keys() for r in progress)
    stages = {r["stage"] for r in progress}
    assert {"load", "reference", "extract", "eval:ours", "eval:rand", "online:ours", "online:rand"} <= stages
    assert [r for r in progress if r["stage"] == "eval:ours"][-1]["done"] == 3
    assert records[-1]["dfo"] == "result" and records[-1]["results"] == str(out / "results.json")

    results, samples = read_results(out)
    assert results["schema"] == "dfo.results/2" and results["status"] == "ok"
    assert set(results["drafters"]) == {"ours", "rand"}
    ours, rand = results["drafters"]["ours"], results["drafters"]["rand"]
    m = ours["metrics"]
    assert {"tau_macro", "tau_micro", "per_position", "tau_histogram", "rounds", "samples", "definitions"} <= m.keys()
    assert m["samples"] == 3 and sum(m["tau_histogram"].values()) == m["rounds"]
    assert m["tau_macro"] > 2.0 > rand["metrics"]["tau_macro"]
    assert ours["spec"]["fc_layer_ids"] == [1, 3, 5] and ours["spec"]["reserved_layer_ids"] == [7]
    assert ours["source"]["spec_file"].endswith("spec.json") and ours["source"]["format"] == "training"
    assert ours["online_check"]["all_rounds_identical"] and ours["online_check"]["all_outputs_equal_reference"]
    assert rand["online_check"]["all_rounds_identical"]
    t = results["target"]
    assert t["kernel_path"] == "torch" and t["num_layers"] == 8 and t["hidden_size"] == 64
    assert t["weights_digest"]["algorithm"] == "sha256" and len(t["weights_digest"]["value"]) == 64
    s = results["settings"]
    assert s["enable_thinking"] is False and s["max_new_tokens"] == 160 and s["shard"] == {"index": 0, "count": 1}
    assert s["dtype"] == "float32" and s["device"] == "cpu" and s["prompts"]["source"] == "builtin"
    assert results["versions"]["transformers"] == "5.24.0" and "total_s" in results["timings"]

    # issue 6: tree metrics per drafter and per sample, and the comparison of the two drafters
    assert m["tree"]["topk"]["k"] == 8 and m["tree"]["budgeted"]["budget"] == 16 and m["tree"]["budgeted"]["exact"]
    assert m["tree"]["topk"]["tau_macro"] >= m["tau_macro"]  # top-8 accepts at least the chain's drafts
    assert s["tree"] == {"k": 8, "budget": 16, "K": 16} and s["draft_topk"] == 16
    (pair,) = results["comparison"]["pairs"]
    assert (pair["a"], pair["b"]) == ("ours", "rand") and pair["tau_macro"]["ci"][1] < 0
    assert "warnings" not in results and "diagnostics" not in results

    assert [x["id"] for x in samples] == ["code-fizzbuzz", "code-reverse-string", "code-palindrome"]
    assert samples[0]["reference"]["source"] == "local"
    assert samples[0]["drafters"]["rand"]["tree"]["topk"]["k"] == 8
    line = samples[0]["drafters"]["ours"]
    assert len(line["accepted"]) == len(line["produced"]) == len(line["anchors"]) == line["rounds"]
    assert sum(line["produced"]) == samples[0]["continuation_tokens"] - 1
    assert line["online"]["rounds_identical"] is True


def test_eval_shards_and_reuses_its_caches(fixture_dir, run_payload, tmp_path):
    cache = tmp_path / "cache"
    args = ["eval", "--target", fixture_dir / "target", "--drafter", f"z={fixture_dir / 'zlab-drafter'}",
            "--samples", "6", "--shard", "1/3", "--cache-dir", cache, *EVAL_FAST]
    first = run_payload(*args, "--out", tmp_path / "a")
    assert first.returncode == 0, first.stderr
    res_a, samples_a = read_results(tmp_path / "a")
    assert [x["index"] for x in samples_a] == [1, 4]  # every 3rd of the first 6, from 1
    assert res_a["settings"]["shard"] == {"index": 1, "count": 3}
    assert res_a["extraction"]["cache_hits"] == 0 and res_a["reference"]["cache_hits"] == 0

    second = run_payload(*args, "--out", tmp_path / "b")
    res_b, _ = read_results(tmp_path / "b")
    assert res_b["extraction"]["cache_hits"] == 2 and res_b["reference"]["cache_hits"] == 2
    assert not [r for r in json_lines(second.stdout) if r["dfo"] == "warning"]
    assert res_b["drafters"]["z"]["metrics"] == res_a["drafters"]["z"]["metrics"]

    third = run_payload(*[a if a != "float32" else "bfloat16" for a in args], "--out", tmp_path / "c")
    assert third.returncode == 0, third.stderr
    warnings = [r["message"] for r in json_lines(third.stdout) if r["dfo"] == "warning"]
    assert any("reference cache" in w and "dtype float32 -> bfloat16" in w for w in warnings)
    assert any("feature cache" in w and "dtype float32 -> bfloat16" in w and "re-extracting" in w for w in warnings)


def test_mismatched_drafter_fails_with_one_line(fixture_dir, run_payload, tmp_path):
    spec = json.loads((fixture_dir / "trained-drafter" / "spec.json").read_text())
    spec["reserve_last_target_layer"] = False
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    proc = run_payload("eval", "--target", fixture_dir / "target",
                       "--drafter", f"ours={fixture_dir / 'trained-drafter' / 'checkpoint.pt'}",
                       "--drafter-spec", f"ours={tmp_path / 'spec.json'}", "--out", out, *EVAL_FAST)
    _one_error_line(proc, "dfo-payload error: drafter 'ours': ",
                    "fc expects 192 = 3 × 64 inputs but the spec lists 4 layers")
    assert not (out / "results.json").exists()


def test_bad_arguments_and_paths_fail_with_one_line(fixture_dir, run_payload, tmp_path):
    _one_error_line(run_payload("eval", "--target", fixture_dir / "target"), "--drafter")
    zlab = f"z={fixture_dir / 'zlab-drafter'}"
    _one_error_line(run_payload("eval", "--target", tmp_path / "nope", "--drafter", zlab),
                    "target path", "does not exist")
    _one_error_line(run_payload("eval", "--target", fixture_dir / "target", "--drafter", "z",
                                "--shard", "0/1"), "--drafter expects NAME=PATH")
    _one_error_line(run_payload("eval", "--target", fixture_dir / "target", "--drafter",
                                f"z={fixture_dir / 'zlab-drafter'}", "--shard", "3/2"), "--shard 3/2")
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b"}\n')
    _one_error_line(run_payload("eval", "--target", fixture_dir / "target", "--drafter",
                                f"z={fixture_dir / 'zlab-drafter'}", "--prompts", bad, *EVAL_FAST),
                    "prompts.jsonl line 2", "needs \"messages\"")


def test_strip_checkpoint_cli(fixture_dir, run_payload, tmp_path):
    out = tmp_path / "stripped"
    proc = run_payload("strip-checkpoint", fixture_dir / "trained-drafter" / "checkpoint.pt", out)
    assert proc.returncode == 0, proc.stderr
    result = json_lines(proc.stdout)[-1]
    assert result["dfo"] == "result" and result["status"] == "written" and len(result["sha256"]) == 64
    assert json.loads((out / "dfo-source.json").read_text())["sha256"] == result["sha256"]

    import torch
    weird = tmp_path / "weird.pt"
    torch.save({"net": {}, "optim": {}}, weird)
    _one_error_line(run_payload("strip-checkpoint", weird, tmp_path / "x"), "unknown layout",
                    "top-level keys found: net, optim")


def test_cpu_run_never_binds_fla_kernels(fixture_dir, run_payload, tmp_path, eval_cache):
    """A host with fla + triton installed but no GPU: the payload must keep transformers on the torch path."""
    fake = tmp_path / "site"
    ops = fake / "fla" / "ops" / "gated_delta_rule"
    ops.mkdir(parents=True)
    (fake / "fla" / "__init__.py").write_text("")
    (fake / "fla" / "ops" / "__init__.py").write_text("")
    (ops / "__init__.py").write_text(
        "def chunk_gated_delta_rule(*a, **k):\n    raise RuntimeError('0 active drivers')\n"
        "fused_recurrent_gated_delta_rule = chunk_gated_delta_rule\n")
    # This fake fla exposes its kernels without triton (a real fla needs triton for that), so importing
    # it is exactly the "fla + triton on a CPU host" situation; a fake triton would break torch's own probes.
    env = {"PYTHONPATH": str(fake)}

    # control: imported without the payload's policy, transformers binds the (fake) fla kernel
    probe = ("import transformers.models.qwen3_5.modeling_qwen3_5 as m; from remote_payload.models.kernels import "
             "bound_kernels; print(bound_kernels(m)['torch_chunk_gated_delta_rule'])")
    ctl = subprocess.run([sys.executable, "-c", probe], cwd=str(REPO), capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": f"{fake}:{REPO}"})
    assert ctl.stdout.strip().startswith("fla:"), ctl.stdout + ctl.stderr

    info_site = tmp_path / "info-site"
    shutil.copytree(fake, info_site)
    (info_site / "triton").mkdir()
    (info_site / "triton" / "__init__.py").write_text("")  # info only looks for packages, never imports them
    info = json.loads(run_payload("info", "--json", env={"PYTHONPATH": str(info_site)}).stdout)
    assert info["fla_installed"] and info["triton_installed"] and info["linear_attention_kernel"] == "torch"
    assert "would break CPU forwards" in info["linear_attention_reason"]

    out = tmp_path / "run"
    proc = run_payload("eval", "--target", fixture_dir / "target", "--drafter", f"z={fixture_dir / 'zlab-drafter'}",
                       "--samples", "1", "--cache-dir", eval_cache, "--out", out, *EVAL_FAST, env=env)
    assert proc.returncode == 0, proc.stderr
    results, _ = read_results(out)
    assert results["target"]["kernel_path"] == "torch"
    assert set(results["target"]["kernels"].values()) == {"torch"}
    assert results["versions"]["transformers"] == "5.24.0"


def test_fixtures_cli_copies_from_cache(fixture_dir, run_payload, tmp_path):
    out = tmp_path / "fx"
    proc = run_payload("fixtures", "--out", out, "--what", "zlab-drafter,training-checkpoint")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["items"]) == {"tokenizer", "target", "trained-drafter", "zlab-drafter"}
    expected = json.loads((fixture_dir / "manifest.json").read_text())["items"]
    for item, entry in manifest["items"].items():
        assert entry["digest"] == expected[item]["digest"], item
    assert (out / "trained-drafter" / "checkpoint.pt").exists() and (out / "trained-drafter" / "spec.json").exists()
    shutil.rmtree(out)
