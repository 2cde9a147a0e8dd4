"""The OpenAI-compatible ``/v1`` client the server references use: URLs, HTTP with retries, the request and
the parsing of a ``/completions`` reply. Stdlib only (urllib, json).

Request format (the choice, and why):
- The chat template is applied HERE, with ``enable_thinking`` passed explicitly, and the prompt is sent
  to ``POST {base}/completions`` as a list of token ids (``prompt_format="ids"``, the default). Both SGLang
  and vLLM accept token-id prompts on /v1/completions and then skip their own tokenisation, so the server
  continues exactly the prompt tokens we later extract features over. /v1/chat/completions is not used:
  there the server applies its own template and thinking switch, which is what the eval must control.
  ``prompt_format="text"`` sends the rendered template text instead, for servers that refuse id prompts;
  the server then tokenises, and the prompt ids it reports (when it reports them) are checked against ours.
- Greedy: ``temperature 0, top_p 1, n 1``, no penalties, ``max_tokens``, and the target's end tokens as
  ``stop_token_ids`` (no stop strings: a string can match inside ordinary text). At T > 0 (``--temperature``):
  ``temperature``, ``top_p``, ``top_k`` (-1: off) and a ``seed`` per draw instead; vLLM and SGLang both draw a
  seeded request reproducibly, and ``server_reference.py`` refuses a server that does not.
- ``return_token_ids: true`` asks the server for the generated ids (``choices[0].token_ids``) and the prompt
  ids it used (``choices[0].prompt_token_ids``); SGLang and vLLM (>= 0.10.2) both name them so. Servers that
  do not know the field ignore it; the continuation ids then come from re-tokenising the text, and the
  round trip cannot be checked (said once per run, and per sample in the results).
- ``skip_special_tokens: false`` / ``spaces_between_special_tokens: false`` / ``no_stop_trim: true`` keep
  the text a faithful rendering of the ids (special tokens such as ``</think>`` included), which is what
  the round-trip check compares.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from remote_payload.errors import PayloadError

EXCERPT_CHARS = 300
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


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


class RequestFailed(Exception):
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
        _ = parsed.port  # raises on a non-numeric port
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 30x is an error, never followed: urllib would copy ``Authorization`` to whatever host and scheme the
    reply names (also around the plain-http check made on the configured URL)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _opener(url: str):
    # Loopback endpoints (the usual case: SGLang on the eval host itself) never go through an env proxy.
    host = urllib.parse.urlsplit(url).hostname or ""
    handlers: list[urllib.request.BaseHandler] = [_NoRedirect()]
    if host in LOOPBACK:
        handlers.append(urllib.request.ProxyHandler({}))
    return urllib.request.build_opener(*handlers)


def excerpt(data: bytes | str) -> str:
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = " ".join(text.split())
    return (text[:EXCERPT_CHARS] + "…") if len(text) > EXCERPT_CHARS else (text or "(empty body)")


def http_json(method: str, url: str, body: dict | None, timeout: float, api_key: str | None) -> Any:
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
            detail = excerpt(exc.read())
        except OSError:
            detail = "(body unreadable)"
        if 300 <= exc.code < 400:
            detail = (f"redirect to {excerpt(exc.headers.get('Location') or '?')} not followed (the API key "
                      "would go along); give the final URL with --reference")
        raise RequestFailed(f"HTTP {exc.code} {exc.reason} from {method} {where.path}: {detail}",
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
        raise RequestFailed(msg, retryable=not isinstance(reason, socket.gaierror),
                             kind=type(reason).__name__) from None
    except TimeoutError:
        raise RequestFailed(f"no response within {timeout:g} s (timeout per request; raise it for long "
                             "generations or a busy server)", retryable=False) from None
    except http.client.RemoteDisconnected:
        raise RequestFailed("the server closed the connection without a response (did it crash or restart?)",
                             retryable=True) from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise RequestFailed(f"connection broken while reading the response ({type(exc).__name__}: {exc})",
                             retryable=True) from None
    except OSError as exc:
        raise RequestFailed(f"network error ({type(exc).__name__}: {exc})", retryable=True) from None
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestFailed(f"response to {method} {where.path} is not valid JSON ({exc}): {excerpt(raw)}",
                             retryable=False) from None


def with_retries(endpoint: Endpoint, call: Callable[[], Any]) -> Any:
    first: RequestFailed | None = None
    for attempt in range(endpoint.retries + 1):
        try:
            return call()
        except RequestFailed as exc:
            first = first or exc
            if exc.retryable and attempt < endpoint.retries:
                time.sleep(endpoint.retry_backoff_s * (attempt + 1))
                continue
            if attempt == 0:
                raise
            earlier = f"; the first failed with: {first}" if first.kind != exc.kind else ""
            raise RequestFailed(f"{exc} (after {attempt + 1} attempts{earlier})", False) from None
    raise AssertionError("unreachable")


def list_models(endpoint: Endpoint) -> list[str]:
    base = base_url(endpoint.url)
    try:
        obj = with_retries(endpoint, lambda: http_json("GET", base + "/models", None, min(endpoint.timeout_s, 60),
                                                         endpoint.api_key))
    except RequestFailed as exc:
        raise PayloadError(f"reference server {base}: cannot list its models: {exc}") from None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
        raise PayloadError(f"reference server {base}: GET /models did not return {{\"data\": [{{\"id\": ...}}]}}: "
                           f"{excerpt(json.dumps(obj))}")
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


def request_body(model: str, prompt: list[int] | str, max_tokens: int, stop_ids: Sequence[int],
                 sampled: dict | None = None) -> dict:
    """The /completions request: prompt, max_tokens and the target's end tokens as stop_token_ids; greedy, or
    with ``sampled`` (T > 0: ``sampling.Sampling.request_fields()`` and the draw's ``seed``) in its place."""
    return {"model": model, "prompt": prompt, "max_tokens": int(max_tokens),
            "stop_token_ids": [int(i) for i in stop_ids], **REQUEST_FIELDS, **(sampled or {})}


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)


def parse_completion(obj: Any) -> dict:
    """The fields we use from a /completions response; raises ValueError naming what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    if "error" in obj and "choices" not in obj:
        raise ValueError(f"the server answered with an error: {excerpt(json.dumps(obj['error']))}")
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise ValueError(f"expected \"choices\" with exactly one object (n=1), got {excerpt(json.dumps(choices))}"
                         if "choices" in obj else f"no \"choices\" field (keys: {', '.join(sorted(obj)) or 'none'})")
    ch = choices[0]
    if not isinstance(ch.get("text"), str):
        raise ValueError(f"choices[0].text missing or not a string ({excerpt(json.dumps(ch.get('text')))})")
    finish = ch.get("finish_reason")
    if finish == "abort":
        raise ValueError(f"the server aborted the generation (finish_reason abort): {excerpt(json.dumps(ch))}")
    if finish not in ("stop", "length"):
        raise ValueError(f"choices[0].finish_reason is {finish!r}, expected \"stop\" or \"length\"")
    out = {"text": ch["text"], "finish_reason": finish, "token_ids": None, "prompt_token_ids": None,
           "matched_stop": ch.get("matched_stop", ch.get("stop_reason"))}
    for key in ("token_ids", "prompt_token_ids"):
        if ch.get(key) is not None:
            if not _int_list(ch[key]):
                raise ValueError(f"choices[0].{key} is not a list of token ids: {excerpt(json.dumps(ch[key]))}")
            out[key] = list(ch[key])
    return out
