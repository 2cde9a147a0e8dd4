"""Reference completions from an OpenAI-compatible serving endpoint (SGLang, vLLM) instead of local decoding.

The eval host often already serves the target with SGLang; its greedy continuations are then far cheaper
than decoding token by token with transformers. The target's hidden states are still extracted locally,
over exactly the tokens the server produced.

Request format (the choice, and why):
- The chat template is applied HERE, with ``enable_thinking`` passed explicitly, and the prompt is sent
  to ``POST {base}/completions`` as a list of token ids (``prompt_format="ids"``, the default). Both SGLang
  and vLLM accept token-id prompts on /v1/completions and then skip their own tokenisation, so the server
  continues exactly the prompt tokens we later extract features over. /v1/chat/completions is not used:
  there the server applies its own template and thinking switch, which is what the eval must control.
  ``prompt_format="text"`` sends the rendered template text instead, for servers that refuse id prompts;
  the server then tokenises, and the prompt ids it reports (when it reports them) are checked against ours.
- Greedy: ``temperature 0, top_p 1, n 1``, no penalties, ``max_tokens``, and the target's end tokens as
  ``stop_token_ids`` (no stop strings: a string can match inside ordinary text).
- ``return_token_ids: true`` asks the server for the generated ids (``choices[0].token_ids``) and the prompt
  ids it used (``choices[0].prompt_token_ids``); SGLang and vLLM (>= 0.10.2) both name them so. Servers that
  do not know the field ignore it; the continuation ids then come from re-tokenising the text, and the
  round trip cannot be checked (said once per run, and per sample in the results).
- ``skip_special_tokens: false`` / ``spaces_between_special_tokens: false`` / ``no_stop_trim: true`` keep
  the text a faithful rendering of the ids (special tokens such as ``</think>`` included), which is what
  the round-trip check compares.

Round trip: the server's text re-tokenised with our tokenizer vs the server's token ids. A mismatch (e.g.
the model emitted a non-canonical split of its text, or the server's tokenizer differs from ours) is
reported per sample, not fatal unless ``strict_roundtrip``: the server's ids are what the target
generated, so those are the reference tokens either way.

Resumable: each finished sample is written to its own cache file (atomic rename) keyed by (endpoint model,
prompt digest, settings); the endpoint URL is not in the key, so a server restarted on another port still
hits the cache. Stdlib only (urllib, json); the tokenizer is passed in.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from remote_payload.inputs import cache as cachemod
from remote_payload.errors import PayloadError

SCHEMA = "dfo.server-reference/1"
PROMPT_FORMATS = ("ids", "text")
CACHE_SUBDIR = "server-references"
EXCERPT_CHARS = 300
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# Fields of a cache entry that must equal the current request for reuse (the key hashes them too).
CACHE_FIELDS = ("schema", "model", "prompt_sha256", "settings")


@dataclass(frozen=True)
class Endpoint:
    """Where and how to ask for references. ``model`` None: the single model listed by ``/models``."""
    url: str
    model: str | None = None
    timeout_s: float = 900.0  # per request; a non-streaming request is silent until generation ends
    prompt_format: str = "ids"
    concurrency: int = 4  # requests in flight; the server batches them
    retries: int = 2  # extra attempts after a connection failure or HTTP 5xx (not after a timeout)
    retry_backoff_s: float = 2.0
    api_key: str | None = field(default=None, repr=False)


@dataclass
class ServerReference:
    """One sample's reference from the server, in the shape the eval needs (see ``to_reference``)."""
    sample_id: str
    prompt_ids: list[int]
    continuation: list[int]  # includes the stop token when the server stopped on one (like reference.py)
    text: str  # the server's text, as returned
    finish_reason: str  # the server's: "stop" | "length"
    stop_reason: str  # reference.py's vocabulary: "eos" | "max_new_tokens"
    ids_source: str  # "server" (token_ids returned) | "retokenized-text" (server returned text only)
    roundtrip: dict  # see roundtrip_check(); {"checked": False, ...} when the server gave no ids
    notes: list[str] = field(default_factory=list)
    cached: bool = False
    seconds: float = 0.0

    @property
    def roundtrip_ok(self) -> bool | None:
        return self.roundtrip.get("ok")

    def to_reference(self):
        """The same ``Reference`` object the local greedy path returns, so the eval uses it unchanged."""
        from remote_payload.inputs.reference import Reference

        return Reference(list(self.prompt_ids), list(self.continuation), self.stop_reason, self.seconds, self.cached)

    def to_json(self) -> dict:
        """Per-sample facts for samples.jsonl (no token arrays: the eval records those itself)."""
        return {"source": "server", "ids_source": self.ids_source, "finish_reason": self.finish_reason,
                "roundtrip": self.roundtrip, "notes": self.notes, "cached": self.cached,
                "seconds": round(self.seconds, 3)}


@dataclass
class ReferenceBatch:
    url: str
    model: str
    prompt_format: str
    settings: dict
    samples: list[ServerReference]
    requests: int  # completions requested in this run (the rest came from the cache)
    cache_dir: str | None

    @property
    def mismatched(self) -> list[str]:
        return [s.sample_id for s in self.samples if s.roundtrip.get("ok") is False]

    @property
    def unchecked(self) -> list[str]:
        return [s.sample_id for s in self.samples if not s.roundtrip.get("checked")]

    def summary(self) -> dict:
        """The results.json block describing where the references came from."""
        return {"source": "server", "url": self.url, "model": self.model,
                "request": f"POST /completions, prompt as {'token ids' if self.prompt_format == 'ids' else 'text'}, "
                           "chat template applied by the payload",
                "prompt_format": self.prompt_format, "settings": self.settings, "samples": len(self.samples),
                "requested": self.requests, "cache_hits": sum(1 for s in self.samples if s.cached),
                "tokens_generated": sum(len(s.continuation) for s in self.samples if not s.cached),
                "roundtrip_mismatches": self.mismatched, "roundtrip_unchecked": len(self.unchecked),
                "ids_source": _count(s.ids_source for s in self.samples), "cache_dir": self.cache_dir}


class _RequestFailed(Exception):
    def __init__(self, message: str, retryable: bool, kind: str = ""):
        super().__init__(message)
        self.retryable = retryable
        self.kind = kind or message  # what went wrong, to tell a repeated failure from a different one


# ----------------------------------------------------------------------------------------------- URLs/HTTP


def base_url(url: str) -> str:
    """``http://host:port`` -> ``http://host:port/v1``; a trailing ``/completions`` or ``/models`` is dropped."""
    parsed = urllib.parse.urlsplit(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PayloadError(f"reference server URL {url!r}: expected http(s)://HOST:PORT[/v1], e.g. "
                           "http://127.0.0.1:30000/v1")
    try:
        parsed.port
    except ValueError:
        raise PayloadError(f"reference server URL {url!r}: the port is not a number") from None
    path = parsed.path.rstrip("/")
    for tail in ("/completions", "/chat/completions", "/models"):
        if path.endswith(tail):
            path = path[: -len(tail)]
            break
    if not path:
        path = "/v1"
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


def _opener(url: str):
    # Loopback endpoints (the usual case: SGLang on the eval host itself) never go through an env proxy.
    host = urllib.parse.urlsplit(url).hostname or ""
    handlers = [urllib.request.ProxyHandler({})] if host in LOOPBACK else []
    return urllib.request.build_opener(*handlers)


def _excerpt(data: bytes | str) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return (text[:EXCERPT_CHARS] + "…") if len(text) > EXCERPT_CHARS else (text or "(empty body)")


def _http_json(method: str, url: str, body: dict | None, timeout: float, api_key: str | None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    where = urllib.parse.urlsplit(url)
    try:
        with _opener(url).open(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        try:
            detail = _excerpt(exc.read())
        except OSError:
            detail = "(body unreadable)"
        raise _RequestFailed(f"HTTP {exc.code} {exc.reason} from {method} {where.path}: {detail}",
                             retryable=exc.code >= 500 and exc.code != 501, kind=f"http {exc.code}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ConnectionRefusedError):
            msg = f"connection refused: nothing listens at {where.hostname}:{where.port} (is the server running?)"
        elif isinstance(reason, TimeoutError):
            msg = f"no connection within {timeout:g} s to {where.hostname}:{where.port}"
        elif isinstance(reason, socket.gaierror):
            msg = f"cannot resolve host {where.hostname!r} ({reason})"
        else:
            msg = f"cannot connect to {where.hostname}:{where.port} ({type(reason).__name__}: {reason})"
        raise _RequestFailed(msg, retryable=not isinstance(reason, socket.gaierror),
                             kind=type(reason).__name__) from None
    except TimeoutError:
        raise _RequestFailed(f"no response within {timeout:g} s (timeout per request; raise it for long "
                             "generations or a busy server)", retryable=False) from None
    except http.client.RemoteDisconnected:
        raise _RequestFailed("the server closed the connection without a response (did it crash or restart?)",
                             retryable=True) from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise _RequestFailed(f"connection broken while reading the response ({type(exc).__name__}: {exc})",
                             retryable=True) from None
    except OSError as exc:
        raise _RequestFailed(f"network error ({type(exc).__name__}: {exc})", retryable=True) from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _RequestFailed(f"response to {method} {where.path} is not valid JSON ({exc}): {_excerpt(raw)}",
                             retryable=False) from None


def _with_retries(endpoint: Endpoint, call: Callable[[], Any]) -> Any:
    first: _RequestFailed | None = None
    for attempt in range(endpoint.retries + 1):
        try:
            return call()
        except _RequestFailed as exc:
            first = first or exc
            if exc.retryable and attempt < endpoint.retries:
                time.sleep(endpoint.retry_backoff_s * (attempt + 1))
                continue
            if attempt == 0:
                raise
            earlier = f"; the first failed with: {first}" if first.kind != exc.kind else ""
            raise _RequestFailed(f"{exc} (after {attempt + 1} attempts{earlier})", False) from None
    raise AssertionError("unreachable")


def list_models(endpoint: Endpoint) -> list[str]:
    base = base_url(endpoint.url)
    try:
        obj = _with_retries(endpoint, lambda: _http_json("GET", base + "/models", None, min(endpoint.timeout_s, 60),
                                                         endpoint.api_key))
    except _RequestFailed as exc:
        raise PayloadError(f"reference server {base}: cannot list its models: {exc}") from None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise PayloadError(f"reference server {base}: GET /models did not return {{\"data\": [{{\"id\": ...}}]}}: "
                           f"{_excerpt(json.dumps(obj))}")
    return [m["id"] for m in data]


def resolve_model(endpoint: Endpoint) -> str:
    if endpoint.model:
        return endpoint.model
    models = list_models(endpoint)
    if len(models) != 1:
        found = ", ".join(models) if models else "none"
        raise PayloadError(f"reference server {base_url(endpoint.url)} serves {len(models)} models ({found}); "
                           "name the target's with --reference-model")
    return models[0]


# ----------------------------------------------------------------------------------------------- pure logic


# Constant request fields: greedy, no penalties, text that renders the ids faithfully, ids back.
REQUEST_FIELDS = {"temperature": 0.0, "top_p": 1.0, "n": 1, "stream": False, "presence_penalty": 0.0,
                  "frequency_penalty": 0.0, "repetition_penalty": 1.0, "ignore_eos": False,
                  "skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True,
                  "return_token_ids": True}


def request_body(model: str, prompt: list[int] | str, max_tokens: int, stop_ids: Sequence[int]) -> dict:
    """The /completions request: prompt, max_tokens and the target's end tokens as stop_token_ids."""
    return {"model": model, "prompt": prompt, "max_tokens": int(max_tokens),
            "stop_token_ids": [int(i) for i in stop_ids], **REQUEST_FIELDS}


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)


def parse_completion(obj: Any) -> dict:
    """The fields we use from a /completions response; raises ValueError naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "error" in obj and "choices" not in obj:
        raise ValueError(f"the server answered with an error: {_excerpt(json.dumps(obj['error']))}")
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError(f"expected \"choices\" with exactly one object (n=1), got {_excerpt(json.dumps(choices))}"
                         if "choices" in obj else f"no \"choices\" field (keys: {', '.join(sorted(obj)) or 'none'})")
    ch = choices[0]
    if not isinstance(ch.get("text"), str):
        raise ValueError(f"choices[0].text missing or not a string ({_excerpt(json.dumps(ch.get('text')))})")
    finish = ch.get("finish_reason")
    if finish == "abort":
        raise ValueError(f"the server aborted the generation (finish_reason abort): {_excerpt(json.dumps(ch))}")
    if finish not in ("stop", "length"):
        raise ValueError(f"choices[0].finish_reason is {finish!r}, expected \"stop\" or \"length\"")
    out = {"text": ch["text"], "finish_reason": finish, "token_ids": None, "prompt_token_ids": None,
           "matched_stop": ch.get("matched_stop", ch.get("stop_reason"))}
    for key in ("token_ids", "prompt_token_ids"):
        if ch.get(key) is not None:
            if not _int_list(ch[key]):
                raise ValueError(f"choices[0].{key} is not a list of token ids: {_excerpt(json.dumps(ch[key]))}")
            out[key] = list(ch[key])
    return out


def retokenize(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def roundtrip_check(tokenizer, text: str, server_ids: Sequence[int], stop_ids: Sequence[int]) -> dict:
    """Does the server's text re-tokenise to the server's ids?

    A difference only in a trailing stop token is tolerated (servers may leave the stop token out of the
    text or out of the ids). On a mismatch ``first_difference`` is the first differing token index and
    ``detail`` shows both sides there.
    """
    server = [int(i) for i in server_ids]
    ours = retokenize(tokenizer, text)
    stops = set(int(i) for i in stop_ids)
    result = {"checked": True, "ok": True, "first_difference": None, "server_tokens": len(server),
              "retokenized_tokens": len(ours), "detail": None}
    if server == ours:
        return result
    if server and server[-1] in stops and server[:-1] == ours:
        result["detail"] = "equal apart from the stop token, which the text leaves out"
        return result
    if ours and ours[-1] in stops and ours[:-1] == server:
        result["detail"] = "equal apart from the stop token, which the ids leave out"
        return result
    i = next((k for k, (a, b) in enumerate(zip(server, ours)) if a != b), min(len(server), len(ours)))

    def show(ids):
        piece = ids[i:i + 4]
        return f"{piece} {tokenizer.decode(piece, skip_special_tokens=False)!r}" if piece else "(end)"

    result.update(ok=False, first_difference=i,
                  detail=f"at token {i}: server ids {show(server)} vs re-tokenised text {show(ours)}")
    return result


def derive(sample_id: str, prompt_ids: list[int], raw: dict, tokenizer, stop_ids: Sequence[int],
           max_tokens: int) -> ServerReference:
    """Turn a parsed response into a reference: continuation ids, stop reason, round trip, notes."""
    stops = [int(i) for i in stop_ids]
    notes: list[str] = []
    roundtrip: dict
    if raw["token_ids"] is not None:
        ids, source = list(raw["token_ids"]), "server"
        roundtrip = roundtrip_check(tokenizer, raw["text"], ids, stops)
    else:
        ids, source = retokenize(tokenizer, raw["text"]), "retokenized-text"
        roundtrip = {"checked": False, "ok": None, "first_difference": None, "server_tokens": None,
                     "retokenized_tokens": len(ids),
                     "detail": "the server returned no token ids: continuation ids are the re-tokenised text"}
    used_prompt = list(prompt_ids)
    server_prompt = raw.get("prompt_token_ids")
    if server_prompt is not None and server_prompt != used_prompt:
        # The continuation follows the server's prompt tokens, so those are the ones to extract features over.
        j = next((k for k, (a, b) in enumerate(zip(server_prompt, used_prompt)) if a != b),
                 min(len(server_prompt), len(used_prompt)))
        notes.append(f"the server's prompt ids differ from ours at token {j} ({len(server_prompt)} vs "
                     f"{len(used_prompt)} tokens); the server's are used")
        roundtrip = {**roundtrip, "ok": False, "prompt_ids_match": False,
                     "detail": "; ".join(filter(None, [roundtrip.get("detail"), notes[-1]]))}
        used_prompt = list(server_prompt)
    elif server_prompt is not None:
        roundtrip = {**roundtrip, "prompt_ids_match": True}
    if raw["finish_reason"] == "stop" and (not ids or ids[-1] not in stops):
        matched = raw.get("matched_stop")
        if isinstance(matched, int) and not isinstance(matched, bool):
            ids.append(matched)
            notes.append(f"stop token {matched} appended (the server reported it but left it out)")
            if matched not in stops:
                notes.append(f"the server stopped on token {matched}, which is not one of the target's end tokens "
                             f"{stops}")
        elif len(stops) == 1:
            ids.append(stops[0])
            notes.append(f"stop token {stops[0]} appended (the server stopped without returning it)")
        else:
            notes.append(f"the server stopped ({'on ' + repr(matched) if matched else 'reason not given'}) but "
                         "did not say on which end token; the continuation ends without one")
    if len(ids) > max_tokens:
        raise ValueError(f"the server returned {len(ids)} tokens for max_tokens {max_tokens}")
    # As reference.py: "eos" when the continuation ends on an end token (even one hit exactly at max_tokens).
    stop_reason = "eos" if raw["finish_reason"] == "stop" or (ids and ids[-1] in stops) else "max_new_tokens"
    return ServerReference(sample_id=sample_id, prompt_ids=used_prompt, continuation=ids, text=raw["text"],
                           finish_reason=raw["finish_reason"], stop_reason=stop_reason, ids_source=source,
                           roundtrip=roundtrip, notes=notes)


def settings_for(max_tokens: int, stop_ids: Sequence[int], prompt_format: str, enable_thinking: bool) -> dict:
    """Everything besides model and prompt that changes the server's answer (part of the cache key)."""
    return {"max_tokens": int(max_tokens), "stop_token_ids": sorted(int(i) for i in stop_ids),
            "prompt_format": prompt_format,
            "enable_thinking": bool(enable_thinking), "request_fields": dict(REQUEST_FIELDS)}


def prompt_digest(prompt_ids: Sequence[int], prompt_text: str | None) -> str:
    h = hashlib.sha256(cachemod.tokens_digest(prompt_ids).encode())
    if prompt_text is not None:
        h.update(b"\0" + prompt_text.encode())
    return h.hexdigest()


def cache_file(cache_dir: Path, model: str, prompt_sha: str, settings: dict) -> Path:
    key = hashlib.sha256(json.dumps([model, prompt_sha, settings], sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / CACHE_SUBDIR / f"{cachemod.safe_name(model)[-40:]}-{key}.json"


def _count(items) -> dict:
    out: dict = {}
    for it in items:
        out[it] = out.get(it, 0) + 1
    return out


# ----------------------------------------------------------------------------------------------- the run


@dataclass
class _Job:
    index: int
    sample_id: str
    prompt_ids: list[int]
    prompt: list[int] | str
    prompt_sha: str
    path: Path | None


def _render(tokenizer, prompt, enable_thinking: bool, prompt_format: str) -> tuple[list[int], str | None]:
    from remote_payload.models.target import render_prompt  # the eval's own rendering, so local and server references agree

    messages = prompt.message_dicts()
    ids = render_prompt(tokenizer, messages, enable_thinking)
    if prompt_format == "ids":
        return ids, None
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)
    if retokenize(tokenizer, text) != ids:
        raise PayloadError(f"prompt {prompt.id!r}: the rendered template text does not tokenise to the prompt ids "
                           "the eval uses; use --reference-prompt-format ids")
    return ids, text


def _load_cached(job: _Job, model: str, settings: dict) -> dict | None:
    if job.path is None or not job.path.exists():
        return None
    try:
        found = json.loads(job.path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    expected = {"schema": SCHEMA, "model": model, "prompt_sha256": job.prompt_sha, "settings": settings}
    if cachemod.mismatches(expected, found, CACHE_FIELDS) or found.get("prompt_ids") != job.prompt_ids:
        return None
    try:
        return {"raw": parse_completion(found.get("response")), "seconds": float(found.get("seconds", 0.0))}
    except (ValueError, TypeError):
        return None


def fetch_references(endpoint: Endpoint, prompts: Sequence[Any], tokenizer, *, enable_thinking: bool,
                     max_tokens: int, stop_ids: Sequence[int], cache_dir: str | Path | None = None,
                     strict_roundtrip: bool = False,
                     on_sample: Callable[[int, int, ServerReference], None] | None = None,
                     warn: Callable[[str], None] | None = None) -> ReferenceBatch:
    """Greedy references for ``prompts`` (objects with ``.id`` and ``.message_dicts()``, e.g. prompts.Prompt).

    Returns them in prompt order. Samples found in ``cache_dir`` are not requested again; each finished
    sample is cached as soon as it arrives, so a failure part-way (server died, timeout) loses nothing:
    the PayloadError says how many samples are done, and a re-run requests only the rest.
    """
    if max_tokens < 1:
        raise PayloadError("reference max_tokens must be >= 1")
    if endpoint.prompt_format not in PROMPT_FORMATS:
        raise PayloadError(f"reference prompt format must be one of {', '.join(PROMPT_FORMATS)}, "
                           f"not {endpoint.prompt_format!r}")
    if endpoint.concurrency < 1 or endpoint.retries < 0 or endpoint.timeout_s <= 0:
        raise PayloadError("reference endpoint: concurrency >= 1, retries >= 0 and timeout > 0 required")
    if not stop_ids:
        raise PayloadError("reference endpoint: the target has no end tokens to stop on")
    base = base_url(endpoint.url)
    model = resolve_model(endpoint)
    cache_root = Path(cache_dir) if cache_dir is not None else None
    settings = settings_for(max_tokens, stop_ids, endpoint.prompt_format, enable_thinking)
    say = warn or (lambda _msg: None)

    jobs: list[_Job] = []
    for i, p in enumerate(prompts):
        ids, text = _render(tokenizer, p, enable_thinking, endpoint.prompt_format)
        sha = prompt_digest(ids, text)
        path = cache_file(cache_root, model, sha, settings) if cache_root is not None else None
        jobs.append(_Job(i, str(p.id), ids, ids if text is None else text, sha, path))

    results: list[ServerReference | None] = [None] * len(jobs)
    done = 0

    def record(job: _Job, ref: ServerReference, seconds: float, cached: bool) -> None:
        nonlocal done
        ref.cached, ref.seconds = cached, seconds
        results[job.index] = ref
        done += 1
        if on_sample:
            on_sample(done, len(jobs), ref)

    pending: list[_Job] = []
    for job in jobs:
        hit = _load_cached(job, model, settings)
        try:
            ref = derive(job.sample_id, job.prompt_ids, hit["raw"], tokenizer, stop_ids, max_tokens) if hit else None
        except ValueError:
            ref = None
        if ref is None:
            pending.append(job)
        else:
            record(job, ref, hit["seconds"], True)

    def fail(job: _Job, what: str) -> PayloadError:
        kept = (f"{done} of {len(jobs)} sample(s) done and cached under {cache_root / CACHE_SUBDIR}; re-run to "
                "resume from there" if cache_root is not None else
                f"{done} of {len(jobs)} sample(s) were done (no cache dir: they are not kept)")
        return PayloadError(f"reference server {base} (model {model!r}): sample {job.sample_id!r}: {what}; {kept}")

    def request(job: _Job) -> tuple[Any, float]:
        body = request_body(model, job.prompt, max_tokens, stop_ids)
        start = time.perf_counter()
        obj = _with_retries(endpoint, lambda: _http_json("POST", base + "/completions", body, endpoint.timeout_s,
                                                         endpoint.api_key))
        return obj, time.perf_counter() - start

    first_error: PayloadError | None = None
    requested = 0
    if pending:
        with ThreadPoolExecutor(max_workers=min(endpoint.concurrency, len(pending)),
                                thread_name_prefix="dfo-reference") as pool:
            queue = list(pending)
            running: dict[Future, _Job] = {}
            while queue or running:
                while queue and first_error is None and len(running) < endpoint.concurrency:
                    job = queue.pop(0)
                    running[pool.submit(request, job)] = job
                    requested += 1
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    job = running.pop(fut)
                    try:
                        obj, seconds = fut.result()
                        # Checked before caching: a response that cannot become a reference is not kept.
                        ref = derive(job.sample_id, job.prompt_ids, parse_completion(obj), tokenizer, stop_ids,
                                     max_tokens)
                    except _RequestFailed as exc:
                        first_error = first_error or fail(job, str(exc))
                        continue
                    except ValueError as exc:
                        first_error = first_error or fail(job, f"malformed response from POST /completions: {exc}")
                        continue
                    if job.path is not None:
                        cachemod.atomic_write_json(job.path, {
                            "schema": SCHEMA, "model": model, "prompt_sha256": job.prompt_sha, "settings": settings,
                            "sample_id": job.sample_id, "url": base, "prompt_ids": job.prompt_ids,
                            "response": obj,  # as received; parsed again (and re-checked) on reuse
                            "seconds": round(seconds, 3), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                       time.gmtime())})
                    record(job, ref, seconds, False)
    if first_error is not None:
        raise first_error

    batch = ReferenceBatch(url=base, model=model, prompt_format=endpoint.prompt_format, settings=settings,
                           samples=[r for r in results if r is not None], requests=requested,
                           cache_dir=str(cache_root / CACHE_SUBDIR) if cache_root is not None else None)
    if batch.unchecked:
        say(f"reference server {base} returned no token ids for {len(batch.unchecked)} sample(s) (it ignores "
            "return_token_ids; SGLang and vLLM >= 0.10.2 support it): continuation ids are the re-tokenised text "
            "and the tokenisation round trip is unchecked")
    bad = batch.mismatched
    if bad:
        details = "; ".join(f"{s.sample_id}: {s.roundtrip.get('detail')}" for s in batch.samples
                            if s.sample_id in bad[:3])
        msg = (f"{len(bad)} sample(s) whose server text does not re-tokenise to the server's token ids "
               f"({details}{'; …' if len(bad) > 3 else ''})")
        if strict_roundtrip:
            raise PayloadError(f"reference server {base}: {msg}; the eval stops because strict round trip was "
                               f"asked for (sample(s): {', '.join(bad)})")
        say(msg + "; their references use the server's token ids")
    for ref in batch.samples:
        for note in ref.notes:
            say(f"reference {ref.sample_id}: {note}")
    return batch
