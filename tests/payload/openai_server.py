"""A small OpenAI-compatible completion server for the tests; it stands in for SGLang.

The team's eval host serves the target with SGLang; here, a stdlib ``http.server`` on 127.0.0.1 (port 0,
one thread per request) serves the tiny fixture target with transformers on CPU. Generation is
``model.generate(do_sample=False)`` — deliberately not the payload's own greedy loop, so "the server's
continuations equal the payload's references" compares two implementations, as it would against SGLang.

It answers like SGLang's OpenAI layer:
- ``GET /v1/models``: ``{"object": "list", "data": [{"id": MODEL_NAME, ...}]}``;
- ``POST /v1/completions``: ``prompt`` as token ids or text; greedy only (temperature 0, else HTTP 400);
  ``max_tokens``; ``stop_token_ids`` (plus the model's own end tokens unless ``ignore_eos``, which generates
  past them as vLLM and SGLang do); ``skip_special_tokens``;
  ``no_stop_trim`` (else the stop token is left out of the text); ``return_token_ids`` (``token_ids``
  including the stop token, and ``prompt_token_ids``); ``finish_reason`` stop|length and ``matched_stop``.
  Errors are ``{"object": "error", "message", "type", "code"}`` with the HTTP status.
/v1/chat/completions is not served: the payload applies the chat template itself.

Like vLLM it also answers ``GET /health`` (200) and ``GET /metrics`` (``vllm:generation_tokens_total``), and
with ``api_key`` set it refuses ``/v1/*`` without ``Authorization: Bearer <key>`` (HTTP 401), as vLLM does
with ``$VLLM_API_KEY``. ``port`` binds a chosen port (an impostor taking the engine's). Every request is
recorded in ``requests`` (method, path, Authorization header).

Run as a script (``serve_as_engine``) it stands in for ``python -m vllm.entrypoints.openai.api_server``:
it reads vLLM's ``--model``/``--served-model-name``/``--port`` and ``$VLLM_API_KEY``, and appends each
request to the JSON-lines file ``$FAKE_ENGINE_REQUESTS``; ``$FAKE_ENGINE_IGNORES_KEY`` makes it a vLLM that
does not read ``$VLLM_API_KEY`` (serves without a key).

``Faults`` (all keyed by the 1-based number of the completion request) make it misbehave for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

MODEL_NAME = "dfo-tiny-target"


@dataclass
class Faults:
    fail_after: int | None = None  # requests after the N-th get HTTP 500
    fail_requests: set = field(default_factory=set)  # these requests get HTTP 500
    die_after: int | None = None  # request N+1: the server stops listening, then drops that connection
    close_requests: set = field(default_factory=set)  # drop the connection without an answer (server stays up)
    delay_s: float = 0.0  # sleep before answering (to exceed the client's timeout)
    malformed: str | None = None  # "json": truncated JSON body; "fields": valid JSON without "choices"
    noncanonical_requests: set = field(default_factory=set)  # first multi-char token emitted as single chars
    token_ids: bool = True  # honour return_token_ids (False: like a server that ignores the field)
    ids_without_stop: bool = False  # leave the stop token out of token_ids (it is still in matched_stop)
    reject_ignore_eos: bool = False  # HTTP 400 for ignore_eos: true (a server that does not know the field)


def load_model(folder: Path):
    """The fixture target and its tokenizer, loaded with plain transformers (fp32, CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return model, tokenizer


class _Reject(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class OpenAIServer:
    def __init__(self, model, tokenizer, faults: Faults | None = None, model_name: str = MODEL_NAME,
                 port: int = 0, api_key: str | None = None,
                 on_request: Callable[[dict], None] | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.faults = faults or Faults()
        self.model_name = model_name
        self.bind_port, self.api_key, self.on_request = port, api_key, on_request
        self.requests: list[dict] = []  # every request: {"method", "path", "authorization"}
        self.generated = 0  # tokens generated so far (the /metrics counter)
        self.completion_requests = 0  # every POST /v1/completions, answered or not
        self.answered: list[list[int]] = []  # prompt ids of the requests answered with a completion
        self.bodies: list[dict] = []  # the JSON bodies of those requests, as received
        self._lock = threading.Lock()  # one generation at a time (torch on 2 CPUs; deterministic counts)
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        gen = model.generation_config.eos_token_id
        self.model_stops = set(gen if isinstance(gen, list) else [gen] if gen is not None else [])

    # ---- lifecycle
    def start(self) -> "OpenAIServer":
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = _Httpd(("127.0.0.1", self.bind_port), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="openai-test-server", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    def _die(self) -> None:
        # Stop accepting and close the listening socket: later connects are refused, like a crashed server.
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---- generation
    def complete(self, req: dict, number: int) -> dict:
        import torch

        if req.get("model") != self.model_name:
            raise _Reject(404, f"The model `{req.get('model')}` does not exist.")
        if float(req.get("temperature", 1.0)) != 0.0:
            raise _Reject(400, "this test server only does greedy decoding (temperature 0)")
        if int(req.get("n", 1)) != 1 or req.get("stream"):
            raise _Reject(400, "this test server supports n=1 without streaming only")
        if req.get("stop"):
            raise _Reject(400, "this test server does not implement stop strings")
        prompt = req.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            prompt_ids = list(prompt)
        else:
            raise _Reject(400, "prompt must be a string or a list of token ids")
        max_tokens = int(req.get("max_tokens", 16))
        if req.get("ignore_eos") and self.faults.reject_ignore_eos:
            raise _Reject(400, "1 validation error: ignore_eos: Extra inputs are not permitted")
        # ignore_eos: the model's end tokens are generated through, not stopped on (stop_token_ids still stop)
        stops = sorted(set(req.get("stop_token_ids") or []) | (set() if req.get("ignore_eos") else self.model_stops))
        with self._lock, torch.inference_mode():
            out = self.model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids),
                                      dtype=torch.long), max_new_tokens=max_tokens, min_new_tokens=0,
                                      do_sample=False, eos_token_id=stops,  # [] = none (None: the model's)
                                      pad_token_id=min(self.model_stops, default=0))
        ids = out[0, len(prompt_ids):].tolist()
        if number in self.faults.noncanonical_requests:
            # As if the model had emitted a non-canonical split of its text: the text is decoded from these
            # ids, and re-tokenising it gives the canonical (different) ids.
            ids = self._split_first_multichar(ids)[:max_tokens]
        stopped = bool(ids) and ids[-1] in stops
        text_ids = ids[:-1] if stopped and not req.get("no_stop_trim") else ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=bool(req.get("skip_special_tokens", True)),
                                     clean_up_tokenization_spaces=False)
        token_ids = list(ids)
        if stopped and self.faults.ids_without_stop:
            token_ids = token_ids[:-1]
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "stop" if stopped else "length",
                  "matched_stop": ids[-1] if stopped else None}
        if req.get("return_token_ids") and self.faults.token_ids:
            choice["token_ids"] = token_ids
            choice["prompt_token_ids"] = prompt_ids
        self.answered.append(prompt_ids)
        self.bodies.append(req)
        self.generated += len(ids)
        return {"id": f"cmpl-{number}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                          "total_tokens": len(prompt_ids) + len(ids)}}

    def _split_first_multichar(self, ids: list[int]) -> list[int]:
        """The same text as a non-canonical token sequence: the first multi-character token, one char each."""
        tok = self.tokenizer
        specials = set(tok.all_special_ids)
        for k, tid in enumerate(ids):
            piece = tok.convert_ids_to_tokens(tid)
            if tid in specials or len(piece) < 2:
                continue
            chars = tok.convert_tokens_to_ids(list(piece))
            if all(c is not None and c != tok.unk_token_id for c in chars):
                return ids[:k] + list(chars) + ids[k + 1:]
        raise AssertionError("no multi-character token to split in this continuation")


class _Httpd(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address):  # clients that gave up (timeouts) are expected here
        pass


class _Handler(BaseHTTPRequestHandler):
    owner: OpenAIServer
    protocol_version = "HTTP/1.0"

    def log_message(self, format, *args):  # keep test output clean
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        self._send(status, json.dumps({"object": "error", "message": message, "type": kind, "param": None,
                                       "code": status}).encode())

    def _admitted(self, method: str) -> bool:
        """Record the request; False (answered 401) when /v1 is guarded and the key is not the server's."""
        owner = self.owner
        record = {"method": method, "path": self.path, "authorization": self.headers.get("Authorization")}
        owner.requests.append(record)  # not under _lock: that one is held for a whole generation
        if owner.on_request:
            owner.on_request(record)
        if owner.api_key and self.path.startswith("/v1") and record["authorization"] != f"Bearer {owner.api_key}":
            self._send(401, json.dumps({"error": "Unauthorized"}).encode())  # vLLM's answer
            return False
        return True

    def do_GET(self):
        if not self._admitted("GET"):
            return
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/metrics":
            page = f'vllm:generation_tokens_total{{model_name="{self.owner.model_name}"}} {self.owner.generated}\n'
            self._send(200, page.encode())
        elif self.path.rstrip("/") == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [
                {"id": self.owner.model_name, "object": "model", "owned_by": "dfo-tests"}]}).encode())
        else:
            self._error(404, f"no route {self.path}")

    def do_POST(self):
        owner, faults = self.owner, self.owner.faults
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)  # read it all, so closing early is a clean FIN, not a reset
        if not self._admitted("POST"):
            return
        if self.path.rstrip("/") != "/v1/completions":
            return self._error(404, f"no route {self.path}")
        with owner._lock:
            owner.completion_requests += 1
            number = owner.completion_requests
        if faults.die_after is not None and number > faults.die_after:
            owner._die()
            self.close_connection = True
            return
        if number in faults.close_requests:
            self.close_connection = True
            return
        if (faults.fail_after is not None and number > faults.fail_after) or number in faults.fail_requests:
            return self._error(500, f"simulated failure of request {number}: CUDA error: an illegal memory access")
        if faults.delay_s and owner._stopping.wait(faults.delay_s):
            return
        try:
            req = json.loads(raw)
            answer = owner.complete(req, number)
        except _Reject as exc:
            return self._error(exc.status, str(exc))
        except (ValueError, TypeError) as exc:
            return self._error(400, f"bad request: {exc}")
        if faults.malformed == "json":
            return self._send(200, json.dumps(answer).encode()[:40])
        if faults.malformed == "fields":
            answer.pop("choices")
        self._send(200, json.dumps(answer).encode())


def serve_as_engine(argv: list[str]) -> None:
    """Serve as vLLM would with this argv and environment, until killed (the caller stops it by PID)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--served-model-name", required=True)
    ap.add_argument("--port", type=int, required=True)
    args, _ = ap.parse_known_args(argv)
    log_path = os.environ.get("FAKE_ENGINE_REQUESTS")

    def log(record: dict) -> None:
        if log_path:
            with open(log_path, "a") as fh:
                fh.write(json.dumps(record) + "\n")

    log({"argv": sys.argv, "api_key": os.environ.get("VLLM_API_KEY")})
    model, tokenizer = load_model(Path(args.model))
    OpenAIServer(model, tokenizer, model_name=args.served_model_name, port=args.port,
                 api_key=None if os.environ.get("FAKE_ENGINE_IGNORES_KEY") else os.environ.get("VLLM_API_KEY"),
                 on_request=log).start()
    print(f"serving {args.served_model_name} on 127.0.0.1:{args.port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    serve_as_engine(sys.argv[1:])
