"""References drawn at T > 0 by an OpenAI-compatible server (``--reference URL --temperature T``): each request
carries its draw's seed, a server whose draws do not follow the seed is refused before any reference is taken,
and the draws are cached per seed.

The stand-in server samples with transformers' own ``generate(do_sample=True)`` under ``torch.manual_seed(seed)``
(another sampler than the payload's, as a real engine's is); ``seeds="ignore"`` makes it a server that draws from
one running generator whatever the request says, ``seeds="greedy"`` one that ignores the temperature.
"""

from __future__ import annotations

import itertools
import json
import time

import pytest
from openai_server import MODEL_NAME, OpenAIServer, _Reject, load_model

from remote_payload.errors import PayloadError
from remote_payload.inputs import openai_client as oc
from remote_payload.inputs import server_reference as sr
from remote_payload.inputs.prompts import load_prompts
from remote_payload.inputs.sampling import Sampling, draw_seed
from remote_payload.models.target import render_prompt

MAX_TOKENS = 24
LAW = Sampling(1.0)


class SamplingServer(OpenAIServer):
    def __init__(self, *args, seeds: str = "honour", **kwargs):
        super().__init__(*args, **kwargs)
        self.seeds = seeds
        self._running = itertools.count(1000)

    def complete(self, req: dict, number: int) -> dict:
        import torch

        if float(req.get("temperature", 1.0)) == 0.0:
            return super().complete(req, number)
        if req.get("model") != self.model_name or not isinstance(req.get("prompt"), list):
            raise _Reject(400, "token-id prompts for the served model only")
        ids = list(req["prompt"])
        stops = sorted(set(req.get("stop_token_ids") or []) | self.model_stops)
        seed = next(self._running) if self.seeds == "ignore" else int(req["seed"])
        with self._lock, torch.inference_mode():
            torch.manual_seed(seed)
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=int(req["max_tokens"]), min_new_tokens=0,
                                      do_sample=self.seeds != "greedy", temperature=float(req["temperature"]),
                                      top_p=float(req.get("top_p", 1.0)), top_k=max(0, int(req.get("top_k", -1))),
                                      eos_token_id=stops, pad_token_id=min(self.model_stops, default=0))
        new = out[0, len(ids):].tolist()
        stopped = bool(new) and new[-1] in stops
        self.bodies.append(req)
        return {"id": f"cmpl-{number}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [{
                    "index": 0, "text": self.tokenizer.decode(new, skip_special_tokens=False),
                    "finish_reason": "stop" if stopped else "length", "matched_stop": new[-1] if stopped else None,
                    "token_ids": new, "prompt_token_ids": ids}]}


@pytest.fixture(scope="module")
def served(fixture_dir):
    return load_model(fixture_dir / "target")


@pytest.fixture
def start(served):
    running = []

    def go(seeds: str = "honour") -> SamplingServer:
        srv = SamplingServer(*served, seeds=seeds).start()
        running.append(srv)
        return srv

    yield go
    for srv in running:
        srv.stop()


@pytest.fixture(scope="module")
def prompts():
    return load_prompts("builtin")[0][:3]


def _fetch(target, url, prompts, numbers, cache, seed=0):
    endpoint = oc.Endpoint(url=url, concurrency=2, retry_backoff_s=0.01, timeout_s=120)
    return sr.fetch_references(endpoint, prompts, target.tokenizer, enable_thinking=False, max_tokens=MAX_TOKENS,
                               stop_ids=target.stop_ids, cache_dir=cache,
                               sampled=sr.SeededDraws(LAW, seed, numbers))


def test_each_draw_is_requested_with_its_seed_and_cached_per_seed(target, start, prompts, tmp_path):
    srv = start()
    chosen = [p for p in prompts for _ in range(2)]  # two draws of each prompt
    numbers = [0, 1] * len(prompts)
    batch = _fetch(target, srv.url, chosen, numbers, tmp_path / "cache")
    assert batch.seed_check is not None and batch.seed_check["ok"] and batch.requests == len(chosen)
    probe = batch.seed_check["requests"]
    assert len(srv.bodies) == probe + len(chosen) and probe >= 4
    for p, n, ref in zip(chosen, numbers, batch.samples, strict=True):
        ids = render_prompt(target.tokenizer, p.message_dicts(), False)
        assert ref.seed == draw_seed(0, ids, n) and ref.prompt_ids == ids
    bodies = srv.bodies[probe:]
    assert {b["seed"] for b in bodies} == {r.seed for r in batch.samples}
    assert all(b["temperature"] == 1.0 and b["top_p"] == 1.0 and b["top_k"] == -1 for b in bodies)
    assert len({tuple(r.continuation) for r in batch.samples}) > 1  # the draws differ
    assert batch.summary()["settings"]["sampling"] == LAW.request_fields()
    # a re-run: every draw from the cache, not one request (no probe either)
    asked = len(srv.bodies)
    again = _fetch(target, srv.url, chosen, numbers, tmp_path / "cache")
    assert len(srv.bodies) == asked and again.seed_check is None
    assert [r.continuation for r in again.samples] == [r.continuation for r in batch.samples]
    assert all(r.cached for r in again.samples)
    # without the cache the same seeds draw the same continuations; another --seed other ones
    fresh = _fetch(target, srv.url, chosen, numbers, None)
    assert [r.continuation for r in fresh.samples] == [r.continuation for r in batch.samples]
    other = _fetch(target, srv.url, chosen, numbers, None, seed=5)
    assert [r.continuation for r in other.samples] != [r.continuation for r in batch.samples]
    ref = batch.samples[0].to_reference()
    assert ref.seed == batch.samples[0].seed and ref.continuation == batch.samples[0].continuation


@pytest.mark.parametrize("seeds, phrase", [
    ("ignore", "ignores the request's seed: two requests for"),
    ("greedy", "drew the same 24 tokens for 4 different seeds at T=1 on each of 3 prompt(s)"),
])
def test_a_server_whose_draws_do_not_follow_the_seed_is_refused(target, start, prompts, tmp_path, seeds, phrase):
    srv = start(seeds)
    with pytest.raises(PayloadError) as err:
        _fetch(target, srv.url, list(prompts), [0] * len(prompts), tmp_path / "cache")
    assert phrase in str(err.value) and srv.url in str(err.value)
    assert len(srv.bodies) <= sr.SEED_PROBE_PROMPTS * (2 + sr.SEED_PROBE_SEEDS)  # the probe only, no reference
    assert all(b["max_tokens"] == min(sr.SEED_PROBE_TOKENS, MAX_TOKENS) for b in srv.bodies)
    assert not list((tmp_path / "cache").rglob("*.json"))  # nothing cached


def test_the_eval_takes_sampled_references_from_the_server(fixture_dir, start, run_payload, tmp_path):
    """End to end: `eval --reference URL --temperature 1 --samples-per-prompt 2`: draws with their seeds, the figures
    as expectations, and zlab-2604/vllm unavailable with the reason (the server's tails are greedy)."""
    srv = start()
    out = tmp_path / "run"
    proc = run_payload("eval", "--target", fixture_dir / "target", "--drafter", f"z={fixture_dir / 'zlab-drafter'}",
                       "--samples", "2", "--temperature", "1", "--samples-per-prompt", "2", "--reference", srv.url,
                       "--reference-model", MODEL_NAME, "--max-new-tokens", str(MAX_TOKENS), "--dtype", "float32",
                       "--threads", "1", "--cache-dir", tmp_path / "cache", "--out", out)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "results.json").read_text())
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert [x["id"] for x in lines] == ["code-fizzbuzz#0", "code-fizzbuzz#1", "code-reverse-string#0",
                                        "code-reverse-string#1"]
    assert [(x["prompt_index"], x["draw"]) for x in lines] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(x["reference"]["seed"] == x["seed"] for x in lines)
    assert results["settings"]["sampling"]["temperature"] == 1.0 and results["reference"]["server"]["seed_check"]
    m = results["drafters"]["z"]["metrics"]
    assert m["sampled"]["prompts"] == 2 and m["sampled"]["draws"] == 4
    assert m["sampled"]["tau_macro"]["value"] == pytest.approx(m["tau_macro"])
    april = m["conventions"]["zlab-2604"]
    assert april["available"] is False and "drawn at T" in april["reason"]
