"""Run prompts through an engine's server with N requests in flight: outputs, per-request acceptance, speed.

The request is the engine's own (``Engine.completion_request``: for vLLM the one the ``--reference`` client
sends: token-id prompt, greedy, the target's end tokens as ``stop_token_ids``, ``return_token_ids``), so
engine outputs compare token for token with references. Acceptance is the reply's own figures
(``Engine.parse_completion``: vLLM's ``metrics.speculative_decoding``, SGLang's ``meta_info``), so it is
per request at any concurrency.

A level of the sweep (after one untimed warm-up request) sends every prompt with ``concurrency`` requests in
flight and records, in prompt order, each request's output, seconds and acceptance, and for the level:
output tokens/s (the level's tokens over its wall time), time per output token (each request's seconds /
its tokens, averaged: TTFT included), the acceptance totals (τ micro = mean acceptance length, 1 + accepted
/ rounds) and the samples whose output is not the reference. ``counter_check`` is the once-per-run proof
that the per-request figures add up: the difference of the server-wide counters (``spec_metrics``) around
one whole level must equal their sum exactly (rounds, drafted, accepted, per position).

Every request carries the server's per-run API key (``EngineServer.api_key``), and before each one the server
is checked to be alive and the only process on its port (``EngineServer.check_serving``).

Command line (what a person runs on an eval host, in the payload venv; stdlib only):
  python -m remote_payload.engines.run --engine vllm --python ENGINE_PY --target DIR [--drafter DIR]
         --prompts FILE.jsonl --max-tokens N --stop-ids 2,0 [--concurrency 1,4,16] --out DIR
FILE.jsonl: one {"id", "prompt_ids", ["reference"]} per line; writes DIR/engine.json and DIR/*.log.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import PayloadError
from . import registry
from .base import speculative_tokens
from .server import EngineError, EngineServer, ServerConfig, log_tail
from .spec_metrics import SpecCounters, read_counters

SCHEMA = "dfo.engine-run/2"
COUNTER_SETTLE_S = 10.0  # how long to wait for the last engine step of a finished request to be counted


@dataclass(frozen=True)
class EnginePrompt:
    id: str
    prompt_ids: list[int]
    reference: list[int] | None = None  # the target's greedy continuation, when known
    sampled: dict | None = None  # T > 0: the request's sampling fields and seed (None: greedy)


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


def counters(server: EngineServer) -> SpecCounters:
    assert server.engine.counters_prefix is not None
    return read_counters(_http("GET", server.root + "/metrics", None, 30, server.api_key).decode(),
                         server.engine.counters_prefix, server.cfg.served_name)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (the shorter length when one is a prefix of the other)."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def positions_of(cfg: ServerConfig) -> int:
    """Drafts per round of a server (0: no drafter)."""
    return speculative_tokens(cfg) if cfg.drafter is not None else 0


def run_one(server: EngineServer, prompt: EnginePrompt, max_tokens: int, stop_ids: Sequence[int],
            positions: int = 0, timeout_s: float = 900.0) -> dict:
    server.check_serving()
    path, body = server.engine.completion_request(server.cfg, prompt.prompt_ids, max_tokens, stop_ids,
                                                  prompt.sampled)
    started = time.perf_counter()
    raw = _http("POST", server.root + path, body, timeout_s, server.api_key)
    seconds = time.perf_counter() - started
    try:
        completion = server.engine.parse_completion(json.loads(raw), stop_ids)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EngineError(f"{server.engine.title} answer for prompt {prompt.id!r} is not JSON: {exc}") from None
    except EngineError as exc:
        raise EngineError(f"prompt {prompt.id!r}: {exc}") from None
    ids = completion.token_ids
    rec: dict[str, Any] = {"id": prompt.id, "continuation": ids, "finish_reason": completion.finish_reason,
                           "seconds": round(seconds, 4), "tokens": len(ids),
                           "tokens_per_s": round(len(ids) / seconds, 2) if seconds > 0 else None,
                           "tpot_ms": round(1000 * seconds / len(ids), 3) if ids else None}
    if completion.acceptance is not None:
        rec["spec"] = completion.acceptance.as_dict(positions)
    elif server.cfg.drafter is not None:
        raise EngineError(f"{server.engine.title} reported no per-request acceptance for prompt {prompt.id!r} "
                          "(vLLM needs >= 0.32 for --per-request-spec-decode-metrics)")
    if prompt.reference is not None:
        rec["matches_reference"] = ids == list(prompt.reference)
        rec["first_difference"] = first_difference(ids, prompt.reference)
    return rec


def _spec_totals(samples: Sequence[dict], positions: int) -> dict | None:
    specs = [s["spec"] for s in samples if "spec" in s]
    if not specs:
        return None
    rounds, accepted = sum(s["rounds"] for s in specs), sum(s["drafts_accepted"] for s in specs)
    return {"rounds": rounds, "drafts_proposed": sum(s["drafts_proposed"] for s in specs), "drafts_accepted": accepted,
            "per_position_counts": [sum(s["per_position_counts"][k] for s in specs) for k in range(positions)],
            "tau_micro": 1 + accepted / rounds if rounds else None}


def level_summary(concurrency: int, samples: list[dict], wall_s: float, positions: int) -> dict:
    tokens = sum(r["tokens"] for r in samples)
    tpots = [r["tpot_ms"] for r in samples if r["tpot_ms"] is not None]
    out = {"concurrency": concurrency, "samples": samples, "tokens": tokens, "seconds": round(wall_s, 3),
           "tokens_per_s": round(tokens / wall_s, 2) if wall_s > 0 else None,
           "tpot_ms": round(sum(tpots) / len(tpots), 3) if tpots else None,
           "reference_mismatches": [r["id"] for r in samples if r.get("matches_reference") is False]}
    spec = _spec_totals(samples, positions)
    if spec is not None:
        out["spec"] = spec
    return out


def run_prompts(server: EngineServer, prompts: Sequence[EnginePrompt], max_tokens: int, stop_ids: Sequence[int],
                on_sample: Callable[[int, int, dict], None] | None = None, concurrency: int = 1) -> dict:
    """Every prompt with ``concurrency`` requests in flight; the records in prompt order and the level's figures."""
    positions = positions_of(server.cfg)
    started = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="dfo-engine")
    try:
        futures = [pool.submit(run_one, server, p, max_tokens, stop_ids, positions) for p in prompts]
        for done, fut in enumerate(as_completed(futures), 1):
            rec = fut.result()  # the first failure ends the level: the queued requests are cancelled below
            if on_sample:
                on_sample(done, len(prompts), rec)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return level_summary(concurrency, [f.result() for f in futures], time.perf_counter() - started, positions)


def _settled(server: EngineServer, before: SpecCounters, tokens: int) -> SpecCounters:
    deadline = time.monotonic() + COUNTER_SETTLE_S
    while True:
        after = counters(server)
        if after.generated - before.generated >= tokens or time.monotonic() > deadline:
            return after
        time.sleep(0.05)


def counter_check(level: dict, delta: SpecCounters, positions: int) -> dict:
    """The server-wide counters' difference around one level against the sum of its per-request figures."""
    mine = level.get("spec") or {}
    counted = {"rounds": delta.drafts, "drafts_proposed": delta.draft_tokens, "drafts_accepted": delta.accepted,
               "per_position_counts": (list(delta.per_position) + [0] * positions)[:positions]}
    extra = list(delta.per_position[positions:])
    per_request = {k: mine.get(k, 0 if k != "per_position_counts" else [0] * positions) for k in counted}
    differ = [k for k in counted if counted[k] != per_request[k]] + (["per_position_counts"] if any(extra) else [])
    return {"concurrency": level["concurrency"], "requests": len(level["samples"]), "counters": counted,
            "per_request": per_request, "differ": differ, "ok": not differ}


def sweep(server: EngineServer, prompts: Sequence[EnginePrompt], max_tokens: int, stop_ids: Sequence[int],
          levels: Sequence[int], on_sample: Callable[[int, int, int, dict], None] | None = None) -> dict:
    """One level per concurrency (lowest first), after one untimed warm-up request (a fresh server's first
    request pays one-off costs that would count against whichever level came first); with a drafter and an
    engine whose counters dfo reads, the first level is bracketed by two counter readings (``counter_check``)."""
    positions = positions_of(server.cfg)
    checked = server.cfg.drafter is not None and server.engine.counters_prefix is not None
    if prompts:
        run_one(server, prompts[0], max_tokens, stop_ids, positions)
    out: list[dict] = []
    check = None
    for c in sorted(levels):
        before = counters(server) if checked and not out else None
        level = run_prompts(server, prompts, max_tokens, stop_ids, concurrency=c,
                            on_sample=functools.partial(on_sample, c) if on_sample else None)
        if before is not None:
            check = counter_check(level, _settled(server, before, level["tokens"]) - before, positions)
        out.append(level)
    return {"levels": out, "counter_check": check}


def speedup_table(plain: Sequence[dict], dflash: Sequence[dict]) -> list[dict]:
    """Per concurrency: tokens/s without and with the drafter, speedup, mean acceptance length (τ micro),
    time per output token, and the outputs against the reference and against the plain server's."""
    by_c = {lv["concurrency"]: lv for lv in plain}
    rows = []
    for lv in dflash:
        base = by_c.get(lv["concurrency"]) or {}
        p_tps, d_tps = base.get("tokens_per_s"), lv.get("tokens_per_s")
        rows.append({"concurrency": lv["concurrency"], "plain_tokens_per_s": p_tps, "dflash_tokens_per_s": d_tps,
                     "plain_tokens": base.get("tokens"), "plain_seconds": base.get("seconds"),
                     "dflash_tokens": lv["tokens"], "dflash_seconds": lv["seconds"],
                     "speedup": round(d_tps / p_tps, 3) if p_tps and d_tps else None,
                     "mean_acceptance_length": (lv.get("spec") or {}).get("tau_micro"),
                     "tpot_ms": {"plain": base.get("tpot_ms"), "dflash": lv.get("tpot_ms")},
                     "samples": len(lv["samples"]),
                     "reference_mismatches": {"plain": base.get("reference_mismatches"),
                                              "dflash": lv["reference_mismatches"]},
                     "equal_plain": [s["continuation"] for s in lv["samples"]]
                     == [s["continuation"] for s in base.get("samples", [])] if base else None})
    return rows


def _served(cfg: ServerConfig, log: Path, prompts, max_tokens, stop_ids, levels, start_timeout_s: float) -> dict:
    server = EngineServer(cfg, log)
    server.start(timeout_s=start_timeout_s)
    try:
        result = sweep(server, prompts, max_tokens, stop_ids, levels)
    except EngineError as exc:
        # An engine can pass its health check and die at the first request (e.g. an unsupported CPU
        # attention head size): the log says why, the HTTP 500 does not.
        server.stop()
        raise EngineError(f"{exc}\n{server.engine.title} log {log}, last lines:\n{log_tail(log)}") from None
    finally:
        status = server.stop()
    return {**result, "start_seconds": round(server.start_seconds or 0.0, 1), "exit_status": status,
            "log": str(log), "port": server.port, "command": server.command}


def evaluate_engine(plain: ServerConfig, with_drafter: ServerConfig, prompts: Sequence[EnginePrompt],
                    max_tokens: int, stop_ids: Sequence[int], out_dir: str | Path, levels: Sequence[int] = (1,),
                    start_timeout_s: float = 900.0) -> dict:
    """Plain server (baseline outputs and tokens/s), then the speculative one, each over every level."""
    if with_drafter.drafter is None:
        raise PayloadError("evaluate_engine: the speculative configuration has no drafter")
    out, name = Path(out_dir), plain.engine
    base = _served(plain, out / f"{name}-plain.log", prompts, max_tokens, stop_ids, levels, start_timeout_s)
    spec = _served(with_drafter, out / f"{name}-dflash.log", prompts, max_tokens, stop_ids, levels, start_timeout_s)
    table = speedup_table(base["levels"], spec["levels"])
    return {"schema": SCHEMA, "engine": name, "target": plain.target, "drafter": with_drafter.drafter,
            "dtype": with_drafter.dtype, "max_tokens": max_tokens, "plain": base, "dflash": spec,
            "concurrency": table, "outputs_equal_plain": all(r["equal_plain"] for r in table)}


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
    from ..eval.options import parse_concurrency

    ap = argparse.ArgumentParser(prog="python -m remote_payload.engines.run", description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default="vllm", choices=registry.NAMES)
    ap.add_argument("--python", required=True, help="the engine venv's python")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", help="z-lab DFlash drafter folder (omit: plain decoding only)")
    ap.add_argument("--prompts", required=True, type=Path)
    ap.add_argument("--max-tokens", required=True, type=int)
    ap.add_argument("--stop-ids", required=True, help="comma-separated end token ids")
    ap.add_argument("--concurrency", default="1", help="comma-separated requests in flight, e.g. 1,4,16")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--start-timeout", type=float, default=900.0)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        stops = [int(s) for s in args.stop_ids.split(",") if s.strip()]
        levels = parse_concurrency(args.concurrency)
        prompts = read_prompts(args.prompts)
        plain = ServerConfig(python=args.python, target=args.target, engine=args.engine, dtype=args.dtype,
                             threads=args.threads)
        args.out.mkdir(parents=True, exist_ok=True)
        if args.drafter:
            spec = ServerConfig(python=args.python, target=args.target, engine=args.engine, drafter=args.drafter,
                                dtype=args.dtype, threads=args.threads)
            result = evaluate_engine(plain, spec, prompts, args.max_tokens, stops, args.out, levels,
                                     args.start_timeout)
        else:
            result = {"schema": SCHEMA, "engine": args.engine, "target": args.target, "plain": _served(
                plain, args.out / f"{args.engine}-plain.log", prompts, args.max_tokens, stops, levels,
                args.start_timeout)}
    except (PayloadError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (args.out / "engine.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"outputs_equal_plain": result.get("outputs_equal_plain"),
                      "concurrency": [{k: r[k] for k in ("concurrency", "speedup")} for r in result.get("concurrency",
                                                                                                        [])]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
