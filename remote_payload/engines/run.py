"""Run prompts through a vLLM server one at a time: outputs, per-request acceptance, tokens/s.

Requests are sequential on purpose: the Prometheus counters are server-wide, so the difference of two
readings taken around a request is that request's spec-decode figures only when nothing else runs. The
request is the one the ``--reference`` client sends (token-id prompt, greedy, the target's end tokens as
``stop_token_ids``, ``return_token_ids``), so engine outputs compare token for token with references.

Every request carries the server's per-run API key (``VllmServer.api_key``; vLLM guards ``/v1`` with it,
not ``/metrics``, which gets it all the same), and before each prompt the server is checked to be alive and
the only process on its port (``VllmServer.check_serving``): the prompts reach the process dfo started.

``evaluate_engine`` is the whole per-drafter step: a plain server (no speculation: the reference outputs
and the baseline tokens/s), then one with the drafter, each stopped by PID with its log kept.

Command line (what the controller runs on the eval host, in the payload venv; stdlib only):
  python -m remote_payload.engines.run --python ENGINE_PY --target DIR [--drafter DIR] --prompts FILE.jsonl
         --max-tokens N --stop-ids 2,0 --out DIR
FILE.jsonl: one {"id", "prompt_ids", ["reference"]} per line; writes DIR/engine.json and DIR/*.log.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import PayloadError
from ..inputs.openai_client import parse_completion, request_body  # the --reference client's request
from .spec_metrics import SpecCounters, read_counters
from .vllm_server import EngineError, ServerConfig, VllmServer, log_tail

SCHEMA = "dfo.engine-run/1"
COUNTER_SETTLE_S = 10.0  # how long to wait for the last engine step of a finished request to be counted


@dataclass(frozen=True)
class EnginePrompt:
    id: str
    prompt_ids: list[int]
    reference: list[int] | None = None  # the target's greedy continuation, when known


def _http(method: str, url: str, body: dict | None, timeout: float, api_key: str) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.read()
    except urllib.error.HTTPError as exc:
        detail = " ".join(exc.read().decode("utf-8", "replace").split())[:400]
        raise EngineError(f"HTTP {exc.code} from {method} {url}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EngineError(f"{method} {url} failed: {getattr(exc, 'reason', exc)}") from None


def counters(server: VllmServer) -> SpecCounters:
    return read_counters(_http("GET", server.root + "/metrics", None, 30, server.api_key).decode(),
                         server.cfg.served_name)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _settled(server: VllmServer, before: SpecCounters, tokens: int) -> SpecCounters:
    deadline = time.monotonic() + COUNTER_SETTLE_S
    while True:
        after = counters(server)
        if after.generated - before.generated >= tokens or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def run_one(server: VllmServer, prompt: EnginePrompt, max_tokens: int, stop_ids: Sequence[int],
            timeout_s: float = 900.0) -> dict:
    server.check_serving()
    before = counters(server)
    body = request_body(server.cfg.served_name, list(prompt.prompt_ids), max_tokens, stop_ids)
    started = time.perf_counter()
    raw = _http("POST", server.url + "/completions", body, timeout_s, server.api_key)
    seconds = time.perf_counter() - started
    try:
        parsed = parse_completion(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise EngineError(f"vLLM answer for prompt {prompt.id!r} unusable: {exc}") from None
    ids = parsed["token_ids"]
    if ids is None:
        raise EngineError(f"vLLM returned no token_ids for prompt {prompt.id!r} (return_token_ids ignored?)")
    delta = _settled(server, before, len(ids)) - before
    rec: dict[str, Any] = {"id": prompt.id, "continuation": ids, "finish_reason": parsed["finish_reason"],
                           "seconds": round(seconds, 4), "tokens": len(ids),
                           "tokens_per_s": round(len(ids) / seconds, 2) if seconds > 0 else None,
                           "counted_tokens": delta.generated}
    if delta.spec_enabled:
        rec["spec"] = delta.summary() | {"per_position_counts": delta.per_position}
    if prompt.reference is not None:
        rec["matches_reference"] = ids == list(prompt.reference)
        rec["first_difference"] = first_difference(ids, prompt.reference)
    return rec


def run_prompts(server: VllmServer, prompts: Sequence[EnginePrompt], max_tokens: int, stop_ids: Sequence[int],
                on_sample: Callable[[int, int, dict], None] | None = None) -> dict:
    """Every prompt, in order, one request at a time; per-sample records and totals."""
    samples, total = [], SpecCounters()
    for i, p in enumerate(prompts):
        rec = run_one(server, p, max_tokens, stop_ids)
        samples.append(rec)
        if "spec" in rec:
            s = rec["spec"]
            total = total + SpecCounters(s["rounds"], s["drafts_proposed"], s["drafts_accepted"],
                                         list(rec["spec"]["per_position_counts"]), rec["counted_tokens"], True)
        if on_sample:
            on_sample(i + 1, len(prompts), rec)
    tokens = sum(r["tokens"] for r in samples)
    seconds = sum(r["seconds"] for r in samples)
    out = {"samples": samples, "tokens": tokens, "seconds": round(seconds, 3),
           "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else None,
           "reference_mismatches": [r["id"] for r in samples if r.get("matches_reference") is False]}
    if total.spec_enabled:
        out["spec"] = total.summary()
    return out


def _served(cfg: ServerConfig, log: Path, prompts, max_tokens, stop_ids, start_timeout_s: float) -> dict:
    server = VllmServer(cfg, log)
    server.start(timeout_s=start_timeout_s)
    try:
        result = run_prompts(server, prompts, max_tokens, stop_ids)
    except EngineError as exc:
        # An engine can pass its health check and die at the first request (e.g. an unsupported CPU
        # attention head size): the log says why, the HTTP 500 does not.
        server.stop()
        raise EngineError(f"{exc}\nvLLM log {log}, last lines:\n{log_tail(log)}") from None
    finally:
        status = server.stop()
    return {**result, "start_seconds": round(server.start_seconds or 0.0, 1), "exit_status": status,
            "log": str(log), "port": server.port}


def evaluate_engine(plain: ServerConfig, with_drafter: ServerConfig, prompts: Sequence[EnginePrompt],
                    max_tokens: int, stop_ids: Sequence[int], out_dir: str | Path,
                    start_timeout_s: float = 900.0) -> dict:
    """Plain run (baseline outputs and tokens/s), then the speculative run; outputs must be equal."""
    if with_drafter.drafter is None:
        raise PayloadError("evaluate_engine: the speculative configuration has no drafter")
    out = Path(out_dir)
    base = _served(plain, out / "vllm-plain.log", prompts, max_tokens, stop_ids, start_timeout_s)
    spec = _served(with_drafter, out / "vllm-dflash.log", prompts, max_tokens, stop_ids, start_timeout_s)
    differ = [b["id"] for b, s in zip(base["samples"], spec["samples"], strict=True)
              if b["continuation"] != s["continuation"]]
    speedup = (spec["tokens_per_s"] / base["tokens_per_s"]) if base["tokens_per_s"] and spec["tokens_per_s"] else None
    return {"schema": SCHEMA, "engine": "vllm", "target": plain.target, "drafter": with_drafter.drafter,
            "dtype": with_drafter.dtype, "max_tokens": max_tokens, "plain": base, "dflash": spec,
            "outputs_equal_plain": not differ, "outputs_differ": differ,
            "speedup": round(speedup, 3) if speedup else None}


def read_prompts(path: Path) -> list[EnginePrompt]:
    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            ids = obj["prompt_ids"]
            if not (isinstance(ids, list) and ids and all(isinstance(i, int) and i >= 0 for i in ids)):
                raise ValueError("prompt_ids must be a non-empty list of token ids")
            prompts.append(EnginePrompt(str(obj["id"]), ids, obj.get("reference")))
        except (ValueError, KeyError, TypeError) as exc:
            raise PayloadError(f"{path} line {n}: {exc}") from None
    return prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m remote_payload.engines.run", description=__doc__.split("\n")[0])
    ap.add_argument("--python", required=True, help="the engine venv's python")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", help="z-lab DFlash drafter folder (omit: plain decoding only)")
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--max-tokens", required=True, type=int)
    ap.add_argument("--stop-ids", required=True, help="comma-separated end token ids")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=900.0)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        stops = [int(s) for s in args.stop_ids.split(",") if s.strip()]
        prompts = read_prompts(args.prompts)
        plain = ServerConfig(python=args.python, target=args.target, dtype=args.dtype, threads=args.threads)
        args.out.mkdir(parents=True, exist_ok=True)
        if args.drafter:
            spec = ServerConfig(python=args.python, target=args.target, drafter=args.drafter, dtype=args.dtype,
                                threads=args.threads)
            result = evaluate_engine(plain, spec, prompts, args.max_tokens, stops, args.out, args.start_timeout)
        else:
            result = {"schema": SCHEMA, "engine": "vllm", "target": args.target, "plain": _served(
                plain, args.out / "vllm-plain.log", prompts, args.max_tokens, stops, args.start_timeout)}
    except (PayloadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (args.out / "engine.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("outputs_equal_plain", "speedup") if k in result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
