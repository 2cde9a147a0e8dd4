"""The ``--reference`` client (server_reference.fetch_references) against a real vLLM server.

What the loopback stand-in (tests/payload/openai_server.py) cannot prove: that vLLM accepts the request
as dfo sends it (token-id prompt, greedy fields, ``stop_token_ids``, ``return_token_ids``), returns the ids
the round-trip check needs, rejects a bad token id with an answer the client turns into a clear error,
and that a server killed mid-run leaves a cache the next run resumes from. The stand-in keeps the faults
vLLM cannot be made to show (HTTP 500s, truncated JSON, non-canonical ids, delays).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from conftest import MAX_NEW

from remote_payload.errors import PayloadError
from remote_payload.inputs import server_reference as sr
from remote_payload.models.target import render_prompt

# A test that starts a server (setup counts) may wait minutes for it on a busy 2-core box.
pytestmark = pytest.mark.timeout(1800)


@dataclass(frozen=True)
class _Prompt:
    id: str
    text: str

    def message_dicts(self) -> list[dict]:
        return [{"role": "user", "content": self.text}]


@pytest.fixture(scope="module")
def prompts():
    from remote_payload.inputs.prompts import load_prompts

    return load_prompts("builtin")[0]


@pytest.fixture(scope="module")
def greedy(target_model, prompts):
    """dfo's own greedy continuations (fp32 transformers), the references vLLM must reproduce."""
    from remote_payload.inputs.reference import greedy_decode

    return {p.id: greedy_decode(target_model, render_prompt(target_model.tokenizer, p.message_dicts(), False),
                                MAX_NEW) for p in prompts}


def _fetch(srv, chosen, tokenizer, stop_ids, cache, **endpoint):
    """References from the server ``srv`` with its own API key (vLLM started by dfo refuses /v1 without it)."""
    endpoint.setdefault("retry_backoff_s", 0.05)
    endpoint.setdefault("concurrency", 1)
    on_sample = endpoint.pop("on_sample", None)
    return sr.fetch_references(sr.Endpoint(url=srv.url, api_key=srv.api_key, **endpoint), chosen, tokenizer,
                               enable_thinking=False, max_tokens=MAX_NEW, stop_ids=stop_ids, cache_dir=cache,
                               on_sample=on_sample)


def test_vllm_references_equal_dfo_greedy(servers, target_model, prompts, greedy, tmp_path):
    srv = servers.get("plain")
    batch = _fetch(srv, prompts, target_model.tokenizer, target_model.stop_ids, tmp_path, concurrency=2)
    assert batch.model == srv.cfg.served_name  # discovered through GET /v1/models
    assert batch.requests == len(prompts)
    for got in batch.samples:
        ref = greedy[got.sample_id]
        assert got.prompt_ids == ref.prompt_ids, got.sample_id
        assert got.continuation == ref.continuation, got.sample_id
        assert got.stop_reason == ref.stop_reason, got.sample_id
        assert got.ids_source == "server", got.sample_id  # vLLM honours return_token_ids
        assert got.roundtrip["ok"] is True and got.roundtrip["prompt_ids_match"] is True, got.roundtrip
    assert {r.stop_reason for r in batch.samples} == {ref.stop_reason for ref in greedy.values()}
    assert batch.summary()["roundtrip_mismatches"] == [] and batch.unchecked == []
    again = _fetch(srv, prompts, target_model.tokenizer, target_model.stop_ids, tmp_path)
    assert again.requests == 0 and all(r.cached for r in again.samples)


def test_text_prompt_format_tokenised_by_vllm(servers, target_model, prompts, greedy, tmp_path):
    """vLLM tokenises the rendered template itself; the prompt ids it reports equal ours."""
    srv = servers.get("plain")
    batch = _fetch(srv, prompts[:3], target_model.tokenizer, target_model.stop_ids, tmp_path,
                   prompt_format="text")
    for got in batch.samples:
        assert got.roundtrip["prompt_ids_match"] is True, got.sample_id
        assert got.continuation == greedy[got.sample_id].continuation, got.sample_id


def test_out_of_vocabulary_id_is_a_clear_error(servers, target_model, engine_fixtures, tmp_path):
    """A tokenizer with more ids than the served model (a mismatched pair): vLLM refuses, dfo says which."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(engine_fixtures / "target"), local_files_only=True)
    tok.add_tokens(["<|not-in-the-model|>"], special_tokens=True)
    vocab = target_model.model.config.vocab_size
    oov = tok.convert_tokens_to_ids("<|not-in-the-model|>")
    assert oov >= vocab
    bad = _Prompt("oov-sample", "say <|not-in-the-model|> twice")
    srv = servers.get("plain")
    with pytest.raises(PayloadError) as err:
        _fetch(srv, [bad], tok, target_model.stop_ids, tmp_path, retries=0)
    msg = str(err.value)
    assert "'oov-sample'" in msg and "HTTP 400" in msg and str(oov) in msg, msg
    assert "0 of 1 sample(s) done" in msg
    assert srv.proc.poll() is None  # the server survives a refused request


def test_a_model_name_the_server_does_not_serve_is_a_clear_error(servers, target_model, prompts, tmp_path):
    """--reference-model naming another model: vLLM answers 404, the client names the sample and the model."""
    srv = servers.get("plain")
    with pytest.raises(PayloadError) as err:
        _fetch(srv, prompts[:1], target_model.tokenizer, target_model.stop_ids, tmp_path, model="not-served",
               retries=0)
    msg = str(err.value)
    assert "(model 'not-served')" in msg and "HTTP 404" in msg and "`not-served` does not exist" in msg, msg
    assert f"sample {prompts[0].id!r}" in msg and "0 of 1 sample(s) done" in msg
    assert not list((tmp_path / sr.CACHE_SUBDIR).glob("*.json"))  # nothing cached from a refusal


def test_a_prompt_beyond_the_context_length_is_a_clear_error(servers, target_model, tmp_path):
    """vLLM refuses a prompt longer than --max-model-len with HTTP 400; the client passes its reason on."""
    srv = servers.get("plain")
    long = _Prompt("too-long", "fizz buzz " * 1500)
    ids = render_prompt(target_model.tokenizer, long.message_dicts(), False)
    assert len(ids) > srv.cfg.max_model_len
    with pytest.raises(PayloadError) as err:
        _fetch(srv, [long], target_model.tokenizer, target_model.stop_ids, tmp_path, retries=0)
    msg = str(err.value)
    assert "'too-long'" in msg and "HTTP 400" in msg, msg
    assert f"maximum context length is {srv.cfg.max_model_len} tokens" in msg, msg
    assert srv.proc.poll() is None


def test_without_the_engines_key_the_client_gets_a_clear_401(servers, target_model, prompts, tmp_path):
    """The engine dfo started answers nobody without its per-run key (here: the client sends none)."""
    srv = servers.get("plain")
    with pytest.raises(PayloadError) as err:
        sr.fetch_references(sr.Endpoint(url=srv.url, model=srv.cfg.served_name, retries=0), prompts[:1],
                            target_model.tokenizer, enable_thinking=False, max_tokens=MAX_NEW,
                            stop_ids=target_model.stop_ids, cache_dir=tmp_path)
    msg = str(err.value)
    assert "HTTP 401" in msg and f"sample {prompts[0].id!r}" in msg and srv.api_key not in msg, msg


def test_server_killed_mid_run_resumes_from_the_cache(servers, target_model, prompts, greedy, tmp_path):
    """SIGKILL the plain server after two answers; the re-run asks another vLLM (same served model) for the rest.

    Runs last in this module: it kills the session's plain server (a later user restarts it).
    """
    chosen = prompts[:4]
    victim = servers.get("plain")

    def kill_after_two(done, total, ref):
        if done == 2:
            victim.kill()

    with pytest.raises(PayloadError) as err:
        _fetch(victim, chosen, target_model.tokenizer, target_model.stop_ids, tmp_path, retries=1,
               on_sample=kill_after_two)
    msg = str(err.value)
    assert f"sample {chosen[2].id!r}" in msg and "connection refused" in msg, msg
    assert "2 of 4 sample(s) done and cached" in msg and "re-run" in msg
    other = servers.get("dflash")  # a different server and port: the cache key has no URL
    batch = _fetch(other, chosen, target_model.tokenizer, target_model.stop_ids, tmp_path)
    assert batch.requests == 2 and [r.cached for r in batch.samples] == [True, True, False, False]
    for got in batch.samples:
        assert got.continuation == greedy[got.sample_id].continuation, got.sample_id
