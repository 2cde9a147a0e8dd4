"""The GPU check kit (scripts/gpu-check.sh, remote_payload/diagnose/gpu_kit/) on this CPU machine.

The smoke runs every step of the real script at toy size, so the script, the steps and the merge cannot rot
without a GPU; the rest pins what the GPU run relies on and CI can check: the published configurations build
the real shapes, the projection's arithmetic, the suite's token table, the recorded CPU-interpreter figures,
and that building the fixtures never blocks fla in the step's own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
KIT = REPO / "remote_payload" / "diagnose" / "gpu_kit"
STEPS = ("env", "fla", "kernel_path", "cost")
SMOKE_TIMEOUT_S = 900


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault("DFO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures"))  # the cached fixtures, as every test
    return env


def _script(*args, timeout=SMOKE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=_env(), cwd=str(REPO))


def _no_errors(step: dict) -> None:
    assert step["status"] == "ok" and step["rc"] == 0 and not step["errors"], json.dumps(step["errors"])[:3000]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check-smoke")
    proc = _script(out, "--smoke", "--python", sys.executable)
    return proc, out


@pytest.mark.slow
def test_smoke_runs_every_step_and_writes_one_json(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # What comes back from a device run: a few plain files at the top of the output folder.
    assert sorted(p.name for p in out.iterdir()) == ["gpu-check.json", "gpu-check.log", "gpu-check.md"]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["schema"] == "dfo.gpu-check/1" and report["mode"] == "smoke"
    assert list(report["steps"]) == list(STEPS)
    for name in STEPS:
        step = report["steps"][name]
        _no_errors(step)
        assert step["seconds"] is not None and step["limit_s"] > 0
    md = (out / "gpu-check.md").read_text()
    assert all(f"| {name} | ok |" in md for name in STEPS)
    log = (out / "gpu-check.log").read_text()
    assert all(f"step {name}: exit 0" in log for name in STEPS)


@pytest.mark.slow
def test_smoke_figures_have_the_gpu_runs_shape(smoke):
    _, out = smoke
    report = json.loads((out / "gpu-check.json").read_text())
    env, fla, kp, cost = (report["steps"][n]["sections"] for n in STEPS)
    assert env["versions"]["payload_pins"]["transformers"] == "5.24.0" and env["bf16_matmul"]["tflops"] > 0
    # fla step: the payload's eval ran (on the torch path here: no fla on CPU) and both tables cover 8 layers
    assert fla["payload_eval"]["extraction_kernel_path"] == "torch" and fla["payload_eval"]["device"] == "cpu"
    for dtype in ("float32", "bfloat16"):
        table = fla[f"table_{dtype}"]
        assert [r["layer"] for r in table["per_layer"]] == list(range(8))
        assert all(r["max_abs_diff"] == 0 for r in table["per_layer"])  # torch against torch: nothing to differ
        beside = fla["vs_cpu_interpreter"]["dtypes"][dtype]
        assert [r["layer"] for r in beside["layers"]] == list(range(8)) and isinstance(beside["same_weights"], bool)
    # kernel path: the four feature paths with τ and CIs, drift for every layer, the table for docs/troubleshooting.md
    exp = kp["experiment"]
    assert set(exp["rows"]) == {"a", "b", "c", "d"}
    assert all(r["point"]["tau"] >= 1 and r["ci95"]["tau"] is not None for r in exp["rows"].values())
    assert [d["layer"] for d in exp["drift"]] == list(range(8)) and "| (c) torch fp32 |" in exp["table"]
    # cost at (toy) size: the drafter's fc layers of the toy target, 2 bytes each in bf16
    assert cost["sizes"]["feature_bytes_per_token"] == 3 * 64 * 2
    assert cost["sizes"]["cache_file_bytes_per_token"] == 3 * 64 * 2 + 16
    assert cost["build"]["layers"] == 8 and cost["build"]["kernel_path"] == "torch"
    for key in ("extraction", "decode"):
        assert cost[key]["tokens_per_s"] > 0
    assert cost["drafter"]["chain"]["tokens_per_s"] > 0 and cost["drafter"]["ddtree"]["k"] == 8
    assert cost["drafter"]["warm_ups"] == cost["drafter"]["ddtree"]["warm_ups"] == 2
    # the DFlash2 drafter of the same layers: a bigger module (convolutions, selector codebooks over the vocabulary),
    # its chain beside DFlash's, its sampled-rule estimator passing the total-probability check
    d2 = cost["dflash2_drafter"]
    assert d2["drafter_parameters"] > cost["drafter"]["drafter_parameters"] and d2["chain"]["tokens_per_s"] > 0
    assert d2["chain_rate_vs_dflash"] > 0 and "ddtree" not in d2 and d2["warm_ups"] == 2
    assert cost["dflash2_sampled_rule"]["check_error"] <= cost["dflash2_sampled_rule"]["tolerance"]
    assert report["summary"]["dflash2_chain_vs_dflash"] == d2["chain_rate_vs_dflash"]
    total = report["projection"]["total"]
    assert all(total[k] is not None for k in ("reference_s", "extraction_s", "drafter_eval_s", "total_s"))
    tokens = sum(d["tokens"] for d in json.loads((KIT / "data" / "zlab_suite_tokens.json").read_text())["datasets"]
                 .values())
    assert total["cache_bytes"] == tokens * (3 * 64 * 2 + 16)
    assert report["summary"]["zlab_suite_hours"] == pytest.approx(total["total_s"] / 3600)
    # batched decoding at the toy batches (1, 2, 4): a rate each, and the suite and the card protocol projected at it
    by_batch = cost["batched_decode"]["by_batch"]
    assert list(by_batch) == ["1", "2", "4"] and all(b["tokens_per_s"] > 0 for b in by_batch.values())
    projected = report["projection"]["by_decode_batch"]
    assert list(projected) == ["1", "2", "4"]
    assert all(p["zlab_suite_hours"] > 0 and p["card_protocol_hours"] > 0 for p in projected.values())
    assert "## Batched decoding" in (out / "gpu-check.md").read_text()


def test_every_timed_draft_pass_comes_after_two_warm_ups_with_its_own_topk(monkeypatch):
    """The cost step's chain and DDTree passes: each timed pass follows an untimed one on a short sample and one
    on the whole sample with the same top-k (the first call at the whole sample's shapes pays set-up on a GPU)."""
    from types import SimpleNamespace

    from remote_payload.diagnose.gpu_kit import cost_step
    from remote_payload.eval import offline
    from remote_payload.metrics import tree

    calls: list[tuple[int, int]] = []

    def draft_sample(runtime, layers, tokens, prompt_len, topk=1):
        calls.append((len(tokens), topk))
        return SimpleNamespace(seconds=1.0)

    monkeypatch.setattr(offline, "draft_sample", draft_sample)
    monkeypatch.setattr(offline, "replay", lambda drafts: [1, 2])
    monkeypatch.setattr(tree, "sample_tree_rounds", lambda drafts, **kw: SimpleNamespace(topk=[1], budgeted=[1]))
    feats = SimpleNamespace(tokens=list(range(100)), prompt_len=10, layers={})
    out: dict = {}
    cost_step.measure_drafter(None, SimpleNamespace(block_size=4), feats, 16, {"k": 8}, out)
    short = 10 + 2 * 4
    assert calls == [(short, 1), (100, 1), (100, 1), (short, 16), (100, 16), (100, 16)]
    assert out["warm_ups"] == out["ddtree"]["warm_ups"] == cost_step.WARM_UPS == 2


def test_no_budget_left_skips_every_step_and_still_writes_the_json(tmp_path):
    proc = _script(tmp_path, "--smoke", "--python", sys.executable, "--budget", "25", timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert {n: s["status"] for n, s in report["steps"].items()} == dict.fromkeys(STEPS, "skipped")
    assert report["projection"] is None and "step env skipped" in (tmp_path / "gpu-check.log").read_text()


@pytest.mark.parametrize("args, phrase", [((), "OUT_DIR is required"), (("out", "--budget", "8m"), "whole seconds"),
                                          (("out", "--frobnicate"), "unknown option --frobnicate")])
def test_bad_arguments_are_refused_with_a_reason(tmp_path, args, phrase):
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                          env=_env())
    assert proc.returncode == 2 and phrase in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def _gpu_step(name, part):
    return subprocess.run([sys.executable, "-m", "remote_payload.diagnose.gpu_kit", "step", name, "--part", str(part),
                           "--mode", "gpu"], capture_output=True, text=True, timeout=120, env=_env(), cwd=str(REPO))


def test_a_gpu_step_without_cuda_fails_with_a_clear_reason(tmp_path):
    proc = _gpu_step("cost", tmp_path / "cost.json")
    data = json.loads((tmp_path / "cost.json").read_text())
    assert proc.returncode == 1 and data["status"] == "failed" and not data["sections"]
    assert "needs a CUDA device" in data["errors"]["step"]["message"]
    # env still reports what the machine offers before it says what is missing
    proc = _gpu_step("env", tmp_path / "env.json")
    data = json.loads((tmp_path / "env.json").read_text())
    assert proc.returncode == 1 and data["sections"]["versions"]["payload_pins"]["transformers"] == "5.24.0"
    assert "no CUDA device" in data["errors"]["device"]["message"] and "bf16_matmul" not in data["sections"]


@pytest.mark.slow
def test_a_step_stopped_by_sigterm_keeps_its_figures_and_leaves_no_scratch(tmp_path):
    """What the script's timeout does to an overrunning step: SIGTERM mid-way, here during the fla step's eval."""
    part, scratch = tmp_path / "fla.json", tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "remote_payload.diagnose.gpu_kit", "step", "fla", "--part",
                             str(part), "--mode", "smoke"], env={**_env(), "TMPDIR": str(scratch)}, cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = 600  # polls of 0.1 s: a bound on a hang, not a timing assertion
        while deadline and not (part.exists() and "section_s" in json.loads(part.read_text() or "{}")
                                .get("sections", {}).get("fixture", {})):
            if proc.poll() is not None:
                pytest.fail(f"the step ended (exit {proc.returncode}) before its fixture section was saved")
            time.sleep(0.1)
            deadline -= 1
        proc.terminate()  # the eval's child process is running now
        assert proc.wait(timeout=120) == 128 + 15
    finally:
        proc.kill()
    data = json.loads(part.read_text())
    assert data["status"] == "running" and not data["errors"]  # stopped, not failed: the script says "timeout"
    assert "section_s" in data["sections"]["fixture"] and "payload_eval" in data["sections"]
    assert not any(p.name.startswith("dfo-gpu-kit-") for p in scratch.iterdir())


def test_merge_keeps_what_a_killed_or_failed_step_measured(tmp_path):
    from remote_payload.diagnose.gpu_kit.merge import assemble, markdown

    def write(name, part, status):
        if part is not None:
            (tmp_path / f"{name}.json").write_text(json.dumps(part))
        if status is not None:
            (tmp_path / f"{name}.status").write_text(json.dumps(status))

    write("env", {"sections": {"device": {"name": "H200"}}, "errors": {}}, {"rc": 0, "seconds": 3.0, "limit_s": 60})
    # killed at its limit after two sections: both kept, the step marked timeout
    write("fla", {"sections": {"fixture": {"folder": "x"}, "payload_eval": {"extraction_kernel_path": "fla"}},
                  "errors": {}}, {"rc": 124, "seconds": 180.0, "limit_s": 180})
    write("kernel_path", {"sections": {"fixture": {}}, "errors": {"experiment": {"type": "RuntimeError",
                                                                                 "message": "fla did not bind"}}},
          {"rc": 1, "seconds": 9.0, "limit_s": 150})
    write("cost", {"sections": {"extraction": {"tokens_per_s": 8000.0}}, "errors": {}}, {"rc": 137, "seconds": 250.0,
                                                                                       "limit_s": 240})
    report = assemble(tmp_path, "gpu", None)
    assert {n: s["status"] for n, s in report["steps"].items()} == {"env": "ok", "fla": "timeout",
                                                                     "kernel_path": "failed", "cost": "timeout"}
    assert report["steps"]["fla"]["sections"]["payload_eval"]["extraction_kernel_path"] == "fla"
    assert report["summary"]["gpu"] == "H200" and report["summary"]["fla_eval_kernel_path"] == "fla"
    # the projection has what one rate gives, and no total without the others
    total = report["projection"]["total"]
    assert total["extraction_s"] is not None and total["total_s"] is None
    assert "fla did not bind" in markdown(report)
    (tmp_path / "env.status").unlink()
    (tmp_path / "env.json").unlink()
    assert assemble(tmp_path, "gpu", None)["steps"]["env"]["status"] == "not-run"


def test_projection_adds_up_the_eval_stages():
    from remote_payload.diagnose.gpu_kit.projection import project

    table = {"max_new_tokens": 100, "datasets": {"a": {"samples": 2, "tokens": 2 * (10 + 100)}}}
    rates = {"extraction_tokens_per_s": 1000.0, "decode_seconds_per_token": 0.05, "drafter_tokens_per_s": 400.0,
             "block_size": 16, "cache_file_bytes_per_token": 1016}
    p = project(rates, table)["per_dataset"]["a"]
    # reference: prompt prefill (20) + the tail's fresh prefill (220) at 1000 tok/s, 200 + 2 × 15 greedy tokens
    assert p["reference_s"] == pytest.approx((20 + 220) / 1000 + (200 + 30) * 0.05)
    assert p["extraction_s"] == pytest.approx(220 / 1000) and p["drafter_eval_s"] == pytest.approx(200 / 400)
    assert p["cache_bytes"] == 220 * 1016
    missing = project({**rates, "decode_seconds_per_token": None}, table)
    assert missing["per_dataset"]["a"]["reference_s"] is None and missing["total"]["total_s"] is None


def test_suite_token_table_is_feature_memorys_projection():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import feature_memory

    want = feature_memory.projection(2048)
    have = json.loads((KIT / "data" / "zlab_suite_tokens.json").read_text())
    assert have["max_new_tokens"] == want["max_new_tokens"]
    assert have["datasets"] == {k: {"samples": v["samples"], "tokens": v["tokens"]}
                                for k, v in want["per_dataset"].items()}


def test_published_configs_build_the_real_shapes():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from remote_payload.diagnose.gpu_kit import real_size
    from remote_payload.models.drafter import DFlashDrafter
    from remote_payload.models.spec import from_zlab

    cfg = AutoConfig.from_pretrained(str(real_size.TARGET_CONFIG))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    text = cfg.text_config
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and len(model.get_decoder().layers) == 64
    assert text.layer_types.count("linear_attention") == 48 and text.hidden_size == 5120
    params = sum(p.numel() for p in model.parameters())
    assert 26.5e9 < params < 27.5e9  # the text model of "27B" (the vision tower and MTP head are not built)
    spec = from_zlab(json.loads(real_size.DRAFTER_CONFIG.read_text()), {}, "drafter config")
    assert spec.fc_layer_ids == [1, 16, 31, 46, 61] and spec.hidden_size == text.hidden_size
    assert [a.kind for a in spec.attn] == ["sliding_attention"] * 4 + ["full_attention"]
    with torch.device("meta"):
        drafter = DFlashDrafter(spec)
    assert drafter.fc.in_features == 25600
    # docs/datasets.md's feature bytes per token for the team's 27B drafter: 5 layers × 5120 × 2 B
    assert len(spec.fc_layer_ids) * text.hidden_size * 2 == 51_200


def test_toy_configs_keep_the_published_layout():
    from remote_payload.diagnose.gpu_kit import real_size

    real, toy = real_size.target_config(False)["text_config"], real_size.target_config(True)["text_config"]
    assert toy["layer_types"] == real["layer_types"][:8]
    assert toy["linear_num_value_heads"] // toy["linear_num_key_heads"] == \
        real["linear_num_value_heads"] // real["linear_num_key_heads"]  # grouped value attention, as at 27B
    assert all(toy[k] == real[k] for k in ("rope_parameters", "attn_output_gate", "full_attention_interval"))


def test_cpu_interpreter_figures_are_the_fla_path_within_the_tests_bands():
    from remote_payload.diagnose.gpu_kit.fla_step import band_checks

    figures = json.loads((KIT / "data" / "cpu_interpreter_figures.json").read_text())
    for table in figures["tables"].values():
        assert table["kernel_path"] == "fla" and [r["layer"] for r in table["per_layer"]] == list(range(8))
        delta = {k: v for k, v in table["kernels"].items() if "gated_delta_rule" in k}
        assert delta and all(v.startswith("fla:fla.") for v in delta.values())
    bands = band_checks(figures["tables"])
    assert bands["fp32_below_1e-4"] and bands["bf16_in_band"] and bands["bf16_over_10x_fp32"]
    assert figures["source"]["versions"]["triton"] and "record-cpu-figures" in figures["source"]["command"]


def test_pins_and_deviations_from_the_lock():
    from remote_payload.diagnose.gpu_kit.env_step import LOCK, deviations, lock_pins

    pins = lock_pins(LOCK.read_text())
    assert pins["transformers"] == "5.24.0" and pins["flash-linear-attention"] == "0.6.0" and "torch" in pins
    installed = {"torch": "2.11.0+cu130", "transformers": pins["transformers"], "triton": "3.6.0",
                 "flash-linear-attention": pins["flash-linear-attention"]}
    found = deviations(installed, pins)
    assert found["torch"] == {"installed": "2.11.0+cu130", "pinned": pins["torch"]} and "transformers" not in found
    assert found["triton"]["installed"] == "3.6.0" and "flash-linear-attention" not in found


@pytest.mark.slow  # builds a fixture model in a subprocess: not the quick tier's kind of test
def test_building_the_fixtures_leaves_the_step_free_to_bind_fla(tmp_path):
    """The fixture build applies the CPU kernel policy: in the step's own process it would block fla for good."""
    code = ("import sys; from pathlib import Path; from remote_payload.diagnose.gpu_kit import fixtures; "
            f"fixtures.build(Path({str(tmp_path / 'fx')!r}), ['target']); "
            "print('blocked' if 'fla' in sys.modules and sys.modules['fla'] is None else 'free')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(),
                          cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "free" and (tmp_path / "fx" / "target" / "config.json").exists()
