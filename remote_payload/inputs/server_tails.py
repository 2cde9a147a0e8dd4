"""The target's greedy tokens past each server reference's stop ("tails"), from the same server.

The ``zlab-2604``/``vllm`` τ conventions need the target's greedy tokens a block past each reference's stop. A
second request per sample sends prompt + continuation as token ids with ``max_tokens`` = B-1, no stop ids and
``ignore_eos: true`` (vLLM and SGLang both accept it). A server that cannot answer it (refuses the field or id
prompts, returns no token ids, dies) does not fail the run: the tails are then unavailable, with the reason,
and those two conventions are reported as such. Cached like the references (``server_reference.py``), in
their own files (``tail-*.json``), keyed by model and tokens. Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from remote_payload.inputs.cache import atomic_write_json, safe_name, tokens_digest
from remote_payload.inputs.openai_client import (
    REQUEST_FIELDS,
    Endpoint,
    RequestFailed,
    base_url,
    http_json,
    parse_completion,
    request_body,
    with_retries,
)
from remote_payload.inputs.server_reference import CACHE_SUBDIR, ReferenceBatch

TAIL_SCHEMA = "dfo.server-tail/1"


@dataclass
class Tails:
    """The tokens past each sample's stop, in sample order; ``tails`` None with ``reason`` when not to be had."""
    tails: list[list[int]] | None
    reason: str | None = None
    requested: int = 0
    cache_hits: int = 0
    notes: list[str] = field(default_factory=list)


def tail_body(model: str, tokens: Sequence[int], n: int) -> dict:
    """The tail request: greedy like the reference request, but no stop ids and the end token not stopped on."""
    return {**request_body(model, list(tokens), n, []), "ignore_eos": True}


def _tail_file(cache_root: Path, model: str, tokens: Sequence[int]) -> Path:
    key = hashlib.sha256(json.dumps([TAIL_SCHEMA, model, tokens_digest(tokens),
                                     REQUEST_FIELDS]).encode()).hexdigest()[:32]
    return cache_root / CACHE_SUBDIR / f"tail-{safe_name(model)[-40:]}-{key}.json"


def _cached_tail(path: Path | None, tokens: list[int], n: int) -> list[int] | None:
    if path is None or not path.exists():
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    tail = found.get("tail") if isinstance(found, dict) else None
    if not isinstance(tail, list) or found.get("schema") != TAIL_SCHEMA or found.get("tokens") != tokens:
        return None
    complete = found.get("max_tokens", 0) >= n or found.get("finish_reason") == "stop"
    if not complete or not all(isinstance(t, int) and not isinstance(t, bool) for t in tail):
        return None
    return list(tail[:n])


def parse_tail(obj: Any, tokens: Sequence[int], n: int) -> tuple[list[int], str | None]:
    """The tail ids from a tail response, and a note when the server stopped early; ValueError when unusable."""
    raw = parse_completion(obj)
    if raw["token_ids"] is None:
        raise ValueError("the server returned no token ids (return_token_ids), so the tokens past the stop are "
                         "not known exactly")
    if raw["prompt_token_ids"] is not None and raw["prompt_token_ids"] != list(tokens):
        raise ValueError("the server continued other prompt ids than prompt + continuation")
    ids = list(raw["token_ids"])
    if len(ids) > n:
        raise ValueError(f"the server returned {len(ids)} tokens for max_tokens {n}")
    note = None
    if len(ids) < n:
        note = (f"the server gave {len(ids)} of {n} tokens past the stop (finish_reason {raw['finish_reason']}; "
                "does it honour ignore_eos?): the last round's zlab-2604/vllm counts are a lower bound")
    return ids, note


def fetch_tails(endpoint: Endpoint, batch: ReferenceBatch, n: int, cache_dir: str | Path | None = None) -> Tails:
    """``n`` greedy tokens past each reference of ``batch`` (prompt + continuation), from the same server.

    Never raises for what the server does: the first failure stops further requests and is the reason the
    tails are unavailable. Finished tails are cached as they arrive.
    """
    if n <= 0:
        return Tails(tails=[[] for _ in batch.samples])
    cache_root = Path(cache_dir) if cache_dir is not None else None
    seqs = [list(s.prompt_ids) + list(s.continuation) for s in batch.samples]
    paths = [_tail_file(cache_root, batch.model, t) if cache_root is not None else None for t in seqs]
    out: list[list[int] | None] = [_cached_tail(p, t, n) for p, t in zip(paths, seqs, strict=True)]
    result = Tails(tails=None, cache_hits=sum(1 for t in out if t is not None))
    pending = [i for i, t in enumerate(out) if t is None]
    failed: list[str] = []
    base = base_url(endpoint.url)

    def one(i: int) -> tuple[list[int], str | None] | None:
        if failed:  # after the first failure, the rest are not asked for
            return None
        try:
            body = tail_body(batch.model, seqs[i], n)
            obj = with_retries(endpoint, lambda: http_json("POST", base + "/completions", body, endpoint.timeout_s,
                                                            endpoint.api_key))
            ids, note = parse_tail(obj, seqs[i], n)
        except (RequestFailed, ValueError) as exc:
            failed.append(f"sample {batch.samples[i].sample_id!r}: {exc}")
            return None
        path = paths[i]
        if path is not None:
            atomic_write_json(path, {"schema": TAIL_SCHEMA, "model": batch.model, "tokens": seqs[i], "max_tokens": n,
                                     "tail": ids, "finish_reason": parse_completion(obj)["finish_reason"]})
        return ids, note

    if pending:
        with ThreadPoolExecutor(max_workers=min(endpoint.concurrency, len(pending)),
                                thread_name_prefix="dfo-tail") as pool:
            for i, got in zip(pending, list(pool.map(one, pending)), strict=True):
                if got is not None:
                    out[i], note = got
                    result.requested += 1
                    if note:
                        result.notes.append(f"{batch.samples[i].sample_id}: {note}")
    if failed:
        result.reason = (f"the reference server {base} did not continue past the stop (POST /completions with "
                         f"prompt + continuation as ids, max_tokens {n}, ignore_eos): {failed[0]}")
    else:
        result.tails = [t if t is not None else [] for t in out]
    return result
