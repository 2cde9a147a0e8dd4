"""Reference completions from an OpenAI-compatible endpoint (remote_payload/inputs/server_reference.py, its
tails: remote_payload/inputs/server_tails.py).

Against openai_server.OpenAIServer, a loopback stand-in for SGLang that serves the tiny fixture target
with transformers' own generate(): its continuations must equal the payload's greedy references token
for token; failures (server death, timeouts, HTTP errors, malformed answers) must give one clear error
and keep the samples already done; tokenisation round-trip problems must be reported per sample.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest
from openai_server import MODEL_NAME, Faults, OpenAIServer, load_model
from payload_helpers import MAX_NEW, REPO

from remote_payload.errors import PayloadError
from remote_payload.inputs import openai_client as oc
from remote_payload.inputs import server_reference as sr
from remote_payload.inputs import server_tails
from remote_payload.inputs.prompts import load_prompts


@pytest.fixture(scope="module")
def served(fixture_dir):
    return load_model(fixture_dir / "target")


@pytest.fixture
def start_server(served):
    servers = []

    def start(**faults) -> OpenAIServer:
        srv = OpenAIServer(*served, Faults(**faults)).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture(scope="module")
def prompts():
    return load_prompts("builtin")[0]


@pytest.fixture
def fetch(target, tmp_path):
    """fetch_references with the fixture target's tokenizer and end tokens; quick retries for tests."""

    def run(url, chosen, max_tokens, cache=tmp_path / "cache", warnings=None, strict=False, thinking=False,
            **endpoint):
        endpoint.setdefault("retry_backoff_s", 0.01)
        endpoint.setdefault("timeout_s", 120)
        endpoint.setdefault("concurrency", 1)
        return sr.fetch_references(oc.Endpoint(url=url, **endpoint), chosen, target.tokenizer,
                                   enable_thinking=thinking, max_tokens=max_tokens, stop_ids=target.stop_ids,
                                   cache_dir=cache, strict_roundtrip=strict,
                                   warn=None if warnings is None else warnings.append)

    return run


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cache_files(tmp_path):
    return sorted((tmp_path / "cache" / sr.CACHE_SUBDIR).glob("*.json"))


# ------------------------------------------------------------------------------------------ equality, cache


TAIL = 7  # tokens past the stop asked for (the fixture drafters' block size - 1)


def test_tails_equal_the_payloads_own_and_are_cached(samples, target, start_server, fetch, tmp_path):
    """The tail request (prompt + continuation as ids, no stop ids, ignore_eos) gives the target's greedy tokens
    past the stop, past an end token too: the same as the payload's own local tail; a re-run asks nothing."""
    from remote_payload.inputs.reference import greedy_tail

    srv = start_server()
    chosen = samples[:3]
    batch = fetch(srv.url, [p for p, _, _ in chosen], MAX_NEW)
    tails = server_tails.fetch_tails(oc.Endpoint(url=srv.url, concurrency=2, retry_backoff_s=0.01), batch, TAIL,
                           tmp_path / "cache")
    assert tails.reason is None and tails.requested == 3 and tails.cache_hits == 0 and tails.notes == []
    for (p, ref, _), got in zip(chosen, tails.tails, strict=True):
        assert got == greedy_tail(target, ref.tokens, TAIL), p.id
    assert {ref.stop_reason for _, ref, _ in chosen} == {"eos"}  # the tails run past the end token
    body = srv.bodies[-1]
    assert body["prompt"] in [ref.tokens for _, ref, _ in chosen] and body["max_tokens"] == TAIL
    assert body["ignore_eos"] is True and body["stop_token_ids"] == [] and body["return_token_ids"] is True
    requests = srv.completion_requests
    again = server_tails.fetch_tails(oc.Endpoint(url=srv.url), batch, TAIL - 2, tmp_path / "cache")  # shorter: a prefix
    assert again.tails == [t[:TAIL - 2] for t in tails.tails] and again.cache_hits == 3
    assert srv.completion_requests == requests


@pytest.mark.parametrize("faults,expected,failing", [
    ({"reject_ignore_eos": True}, "HTTP 400 .*ignore_eos", 0),
    ({"token_ids": False}, "returned no token ids", 0),
    ({"fail_after": 1}, "HTTP 500", 1),
])
def test_tails_unavailable_when_the_server_cannot_continue(samples, start_server, fetch, tmp_path, faults, expected,
                                                           failing):
    """A server that refuses the tail request gives no tails and the reason, never an exception; after the
    first failure no more tail requests are sent."""
    srv = start_server()
    batch = fetch(srv.url, [p for p, _, _ in samples[:3]], 24)
    refusing = start_server(**faults)
    tails = server_tails.fetch_tails(oc.Endpoint(url=refusing.url, concurrency=1, retries=0), batch, TAIL,
                                     tmp_path / "c2")
    assert tails.tails is None and tails.requested == failing
    assert re.search(expected, tails.reason) and f"sample {samples[failing][0].id!r}" in tails.reason, tails.reason
    assert "ignore_eos" in tails.reason and refusing.completion_requests == failing + 1  # the rest not asked for


def test_server_continuations_equal_payload_greedy_references(samples, target, start_server, tmp_path):
    srv = start_server()
    seen = []
    chosen = [p for p, _, _ in samples]

    def run():
        return sr.fetch_references(oc.Endpoint(url=srv.url, concurrency=2, timeout_s=300), chosen, target.tokenizer,
                                   enable_thinking=False, max_tokens=MAX_NEW, stop_ids=target.stop_ids,
                                   cache_dir=tmp_path / "cache", on_sample=lambda d, t, r: seen.append((d, t)))

    batch = run()
    assert batch.model == MODEL_NAME  # discovered through GET /v1/models
    assert batch.requests == len(samples) and srv.completion_requests == len(samples)
    assert [r.sample_id for r in batch.samples] == [p.id for p in chosen]
    for (p, ref, _), got in zip(samples, batch.samples, strict=False):
        assert got.prompt_ids == ref.prompt_ids, p.id
        assert got.continuation == ref.continuation, p.id
        assert got.stop_reason == ref.stop_reason, p.id
        assert got.ids_source == "server" and got.roundtrip["ok"] is True, (p.id, got.roundtrip)
        assert got.roundtrip["prompt_ids_match"] is True
        assert got.to_reference().tokens == ref.tokens
    assert "eos" in {r.stop_reason for r in batch.samples}  # the stop-token path was exercised
    body = srv.bodies[0]  # greedy, no penalties, the target's end tokens, ids in and out
    assert body["prompt"] in [ref.prompt_ids for _, ref, _ in samples]
    assert (body["temperature"], body["top_p"], body["n"], body["max_tokens"]) == (0.0, 1.0, 1, MAX_NEW)
    assert (body["presence_penalty"], body["frequency_penalty"], body["repetition_penalty"]) == (0.0, 0.0, 1.0)
    assert body["stop_token_ids"] == target.stop_ids and "stop" not in body
    assert body["return_token_ids"] is True and body["skip_special_tokens"] is False
    assert sorted(seen) == [(i + 1, len(samples)) for i in range(len(samples))]
    assert batch.summary()["roundtrip_mismatches"] == []

    again = run()  # everything from the cache: no request reaches the server
    assert again.requests == 0 and srv.completion_requests == len(samples)
    assert all(r.cached for r in again.samples)
    assert [r.continuation for r in again.samples] == [r.continuation for r in batch.samples]


def test_text_prompt_format_gives_the_same_tokens(samples, start_server, fetch):
    srv = start_server()
    chosen = [p for p, _, _ in samples[:3]]
    batch = fetch(srv.url, chosen, 24, prompt_format="text")
    for (p, ref, _), got in zip(samples, batch.samples, strict=False):
        assert got.prompt_ids == ref.prompt_ids
        assert got.roundtrip["prompt_ids_match"] is True
        assert got.continuation == ref.continuation[:24], p.id
    assert all(isinstance(b["prompt"], str) for b in srv.bodies)  # text sent, the server tokenised it


def test_enable_thinking_reaches_the_prompt(target, prompts, start_server, fetch):
    from remote_payload.models.target import render_prompt

    srv = start_server()
    msgs = prompts[0].message_dicts()
    fetch(srv.url, prompts[:1], 4, thinking=True)
    fetch(srv.url, prompts[:1], 4, thinking=False)
    with_thinking, without = (b["prompt"] for b in srv.bodies)
    assert with_thinking == render_prompt(target.tokenizer, msgs, True)
    assert without == render_prompt(target.tokenizer, msgs, False) and without != with_thinking


def test_cache_key_has_settings_not_url(samples, start_server, fetch):
    chosen = [samples[0][0]]
    first = start_server()
    fetch(first.url, chosen, 8)
    other_port = start_server()  # same model, other URL: the cache still applies
    assert fetch(other_port.url, chosen, 8).requests == 0 and other_port.completion_requests == 0
    longer = fetch(other_port.url, chosen, 12)  # other settings: asked again
    assert longer.requests == 1 and longer.samples[0].continuation == samples[0][1].continuation[:12]


# ------------------------------------------------------------------------------------------ failures


def test_server_dies_mid_run_then_rerun_resumes(samples, start_server, fetch, tmp_path):
    chosen = [p for p, _, _ in samples[:4]]
    dying = start_server(die_after=2)
    with pytest.raises(PayloadError) as err:
        fetch(dying.url, chosen, 12, retries=1)
    msg = str(err.value)
    assert dying.url in msg and f"sample {chosen[2].id!r}" in msg
    assert "closed the connection without a response" in msg and "connection refused" in msg
    assert "2 of 4 sample(s) done and cached" in msg and "re-run" in msg
    assert len(_cache_files(tmp_path)) == 2

    restarted = start_server()
    batch = fetch(restarted.url, chosen, 12)
    assert restarted.answered == [samples[2][1].prompt_ids, samples[3][1].prompt_ids]  # finished ones not redone
    assert [r.cached for r in batch.samples] == [True, True, False, False]
    for (_, ref, _), got in zip(samples, batch.samples, strict=False):
        assert got.continuation == ref.continuation[:12]


def test_timeout_is_a_clear_error_and_not_retried(samples, start_server, fetch):
    srv = start_server(delay_s=5)
    with pytest.raises(PayloadError) as err:
        fetch(srv.url, [samples[0][0]], 8, timeout_s=0.5, retries=2, model=MODEL_NAME)
    msg = str(err.value)
    assert "no response within 0.5 s" in msg and srv.url in msg and repr(samples[0][0].id) in msg
    assert srv.completion_requests == 1


def test_http_500_names_status_and_body(samples, start_server, fetch, tmp_path):
    srv = start_server(fail_after=0)
    with pytest.raises(PayloadError) as err:
        fetch(srv.url, [samples[0][0]], 8, retries=1)
    msg = str(err.value)
    assert "HTTP 500" in msg and "simulated failure" in msg and "POST /v1/completions" in msg
    assert "after 2 attempts" in msg and srv.completion_requests == 2
    assert "0 of 1 sample(s) done" in msg and _cache_files(tmp_path) == []


def test_transient_500_is_retried(samples, start_server, fetch):
    srv = start_server(fail_requests={1})
    batch = fetch(srv.url, [samples[0][0]], 8, retries=1)
    assert srv.completion_requests == 2 and batch.samples[0].continuation == samples[0][1].continuation[:8]


def test_dropped_connection_is_a_clear_error(samples, start_server, fetch):
    srv = start_server(close_requests={1, 2})
    with pytest.raises(PayloadError, match="closed the connection without a response.*after 2 attempts"):
        fetch(srv.url, [samples[0][0]], 8, retries=1)


def test_connection_refused(samples, fetch):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(PayloadError, match=r"cannot list its models: connection refused: nothing listens at 127"):
        fetch(url, [samples[0][0]], 8, retries=0)
    with pytest.raises(PayloadError) as err:
        fetch(url, [samples[0][0]], 8, retries=0, model=MODEL_NAME)
    assert "connection refused" in str(err.value) and repr(samples[0][0].id) in str(err.value)


@pytest.mark.parametrize("kind,expected", [("json", "is not valid JSON"), ("fields", 'no "choices" field')])
def test_malformed_response(samples, start_server, fetch, tmp_path, kind, expected):
    srv = start_server(malformed=kind)
    with pytest.raises(PayloadError) as err:
        fetch(srv.url, [samples[0][0]], 8)
    assert expected in str(err.value) and repr(samples[0][0].id) in str(err.value)
    assert _cache_files(tmp_path) == []  # a malformed answer is never cached


def test_wrong_model_name(samples, start_server, fetch):
    srv = start_server()
    with pytest.raises(PayloadError, match=r"HTTP 404.*The model `qwen-nope` does not exist"):
        fetch(srv.url, [samples[0][0]], 8, model="qwen-nope")


# ------------------------------------------------------------------------------------------ round trip


def test_roundtrip_mismatch_reported_per_sample(samples, start_server, fetch):
    chosen = [p for p, _, _ in samples[:3]]
    srv = start_server(noncanonical_requests={2})
    warnings: list[str] = []
    batch = fetch(srv.url, chosen, 16, warnings=warnings)
    assert batch.mismatched == [chosen[1].id]
    bad = batch.samples[1]
    assert bad.roundtrip["checked"] and bad.roundtrip["ok"] is False
    assert isinstance(bad.roundtrip["first_difference"], int) and "re-tokenised text" in bad.roundtrip["detail"]
    assert bad.continuation != samples[1][1].continuation[:16]  # the server's (non-canonical) ids are kept
    assert [s.roundtrip["ok"] for s in (batch.samples[0], batch.samples[2])] == [True, True]
    assert any(chosen[1].id in w and "does not re-tokenise" in w for w in warnings)
    assert batch.summary()["roundtrip_mismatches"] == [chosen[1].id]
    assert bad.to_json()["roundtrip"]["ok"] is False

    # strict: the same (cached) samples now stop the run, naming the sample
    with pytest.raises(PayloadError, match=rf"strict round trip.*{chosen[1].id}"):
        fetch(srv.url, chosen, 16, strict=True)
    assert srv.completion_requests == 3


def test_server_without_token_ids(samples, start_server, fetch):
    srv = start_server(token_ids=False)
    warnings: list[str] = []
    batch = fetch(srv.url, [p for p, _, _ in samples[:2]], 16, warnings=warnings)
    for (_, ref, _), got in zip(samples, batch.samples, strict=False):
        assert got.ids_source == "retokenized-text" and got.roundtrip["checked"] is False
        assert got.continuation == ref.continuation[:16]
    assert len(batch.unchecked) == 2 and any("returned no token ids" in w for w in warnings)


def test_stop_token_left_out_of_ids(samples, start_server, fetch):
    p, ref, _ = min(samples, key=lambda s: len(s[1].continuation))
    assert ref.stop_reason == "eos"
    srv = start_server(ids_without_stop=True)
    warnings: list[str] = []
    got = fetch(srv.url, [p], MAX_NEW, warnings=warnings).samples[0]
    assert got.continuation == ref.continuation and got.stop_reason == "eos"
    assert got.roundtrip["ok"] is True and "stop token" in got.roundtrip["detail"]
    assert any("appended" in n for n in got.notes) and any("appended" in w for w in warnings)


# ------------------------------------------------------------------------------------------ pure pieces


def test_base_url():
    assert oc.base_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000/v1"
    assert oc.base_url("http://127.0.0.1:30000/v1/") == "http://127.0.0.1:30000/v1"
    assert oc.base_url("http://127.0.0.1:30000/v1/completions") == "http://127.0.0.1:30000/v1"
    for bad in ("127.0.0.1:30000", "ftp://x/v1", "http://127.0.0.1:port/v1"):
        with pytest.raises(PayloadError, match="reference server URL"):
            oc.base_url(bad)


def test_roundtrip_check_pure(target):
    tok, stops = target.tokenizer, target.stop_ids
    text = "def reverse_string(s):\n    return s[::-1]"
    ids = sr.retokenize(tok, text)
    assert sr.roundtrip_check(tok, text, ids, stops)["ok"] is True
    assert sr.roundtrip_check(tok, text, ids + [stops[0]], stops)["ok"] is True  # stop token not in the text
    k = next(i for i, t in enumerate(ids) if len(tok.convert_ids_to_tokens(t)) > 1)
    split = ids[:k] + tok.convert_tokens_to_ids(list(tok.convert_ids_to_tokens(ids[k]))) + ids[k + 1:]
    assert tok.decode(split) == text
    res = sr.roundtrip_check(tok, text, split, stops)
    assert res["ok"] is False and res["first_difference"] == k


@pytest.mark.parametrize("choice,expected", [
    ({"text": "x", "finish_reason": "abort"}, "aborted"),
    ({"text": "x", "finish_reason": None}, "finish_reason is None"),
    ({"text": None, "finish_reason": "stop"}, "text missing"),
    ({"text": "x", "finish_reason": "stop", "token_ids": ["a"]}, "token_ids is not a list of token ids"),
])
def test_parse_completion_errors(choice, expected):
    with pytest.raises(ValueError, match=expected):
        oc.parse_completion({"choices": [choice]})
    with pytest.raises(ValueError, match="exactly one"):
        oc.parse_completion({"choices": [choice, choice]})
    with pytest.raises(ValueError, match="error"):
        oc.parse_completion({"error": {"message": "boom"}})
    assert json.dumps(oc.request_body("m", [1, 2], 4, [7]))  # serialisable


def test_module_is_stdlib_only_at_import():
    code = ("import sys, remote_payload.inputs.server_reference, remote_payload.inputs.server_tails; "
            "heavy = [m for m in ('torch', 'transformers', 'requests') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(REPO))
    assert res.returncode == 0, res.stdout + res.stderr
