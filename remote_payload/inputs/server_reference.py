"""Reference completions from an OpenAI-compatible serving endpoint (SGLang, vLLM) instead of local decoding.

The eval host often already serves the target with SGLang; its greedy continuations are then far cheaper
than decoding token by token with transformers. The target's hidden states are still extracted locally,
over exactly the tokens the server produced.

The request (token-id prompts on ``/completions``, greedy, the target's stop ids, ids back) and why it is so:
``openai_client.py``. At T > 0 (``SeededDraws``) each request samples at T with its draw's seed; before the
first one, a cheap probe (``check_seeded``: four short requests on a prompt, more only where the target is
near-certain) refuses a server whose draws do not follow the seed: two requests with one seed must give the
same tokens, and other seeds other tokens (a server that ignores the seed, or samples greedily, fails one or
the other). A run whose draws all come from the cache sends no probe.

Round trip: the server's text re-tokenised with our tokenizer vs the server's token ids. A mismatch (e.g.
the model emitted a non-canonical split of its text, or the server's tokenizer differs from ours) is
reported per sample, not fatal unless ``strict_roundtrip``: the server's ids are what the target
generated, so those are the reference tokens either way.

Resumable: each finished sample is written to its own cache file (atomic rename) keyed by (endpoint model,
prompt digest, settings); the endpoint URL is not in the key, so a server restarted on another port still
hits the cache. Stdlib only; the tokenizer is passed in.

The tokens past each reference's stop (for the ``zlab-2604``/``vllm`` τ conventions): ``server_tails.py``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from remote_payload.errors import PayloadError
from remote_payload.inputs.cache import atomic_write_json, mismatches, safe_name, tokens_digest
from remote_payload.inputs.openai_client import (
    REQUEST_FIELDS,
    Endpoint,
    RequestFailed,
    base_url,
    http_json,
    parse_completion,
    request_body,
    resolve_model,
    with_retries,
)

SCHEMA = "dfo.server-reference/1"
PROMPT_FORMATS = ("ids", "text")
CACHE_SUBDIR = "server-references"
# Fields of a cache entry that must equal the current request for reuse (the key hashes them too).
CACHE_FIELDS = ("schema", "model", "prompt_sha256", "settings")


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
    seed: int | None = None  # the draw's seed at T > 0 (None: greedy)

    @property
    def roundtrip_ok(self) -> bool | None:
        return self.roundtrip.get("ok")

    def to_reference(self):
        """The same ``Reference`` object the local greedy path returns, so the eval uses it unchanged."""
        from remote_payload.inputs.reference import Reference

        if self.seed is not None:
            from remote_payload.inputs.sampled_reference import SampledReference

            return SampledReference(list(self.prompt_ids), list(self.continuation), self.stop_reason, self.seconds,
                                    self.cached, seed=self.seed)
        return Reference(list(self.prompt_ids), list(self.continuation), self.stop_reason, self.seconds, self.cached)

    def to_json(self) -> dict:
        """Per-sample facts for samples.jsonl (no token arrays: the eval records those itself)."""
        return {"source": "server", "ids_source": self.ids_source, "finish_reason": self.finish_reason,
                "roundtrip": self.roundtrip, "notes": self.notes, "cached": self.cached,
                "seconds": round(self.seconds, 3), **({"seed": self.seed} if self.seed is not None else {})}


@dataclass
class ReferenceBatch:
    url: str
    model: str
    prompt_format: str
    settings: dict
    samples: list[ServerReference]
    requests: int  # completions requested in this run (the rest came from the cache)
    cache_dir: str | None
    seed_check: dict | None = None  # at T > 0: what the seed probe found (None: no probe was needed)

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
                "ids_source": dict(Counter(s.ids_source for s in self.samples)), "cache_dir": self.cache_dir,
                **({"seed_check": self.seed_check} if self.seed_check is not None else {})}


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
    result: dict[str, Any] = {"checked": True, "ok": True, "first_difference": None, "server_tokens": len(server),
              "retokenized_tokens": len(ours), "detail": None}
    if server == ours:
        return result
    if server and server[-1] in stops and server[:-1] == ours:
        result["detail"] = "equal apart from the stop token, which the text leaves out"
        return result
    if ours and ours[-1] in stops and ours[:-1] == server:
        result["detail"] = "equal apart from the stop token, which the ids leave out"
        return result
    i = next((k for k, (a, b) in enumerate(zip(server, ours, strict=False)) if a != b), min(len(server), len(ours)))

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
        j = next((k for k, (a, b) in enumerate(zip(server_prompt, used_prompt, strict=False)) if a != b),
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


def settings_for(max_tokens: int, stop_ids: Sequence[int], prompt_format: str, enable_thinking: bool,
                 sampling=None) -> dict:
    """Everything besides model and prompt that changes the server's answer (part of the cache key); at T > 0 the
    law (``sampling.Sampling``) too, and each request's seed is added per sample (greedy keys are unchanged)."""
    out = {"max_tokens": int(max_tokens), "stop_token_ids": sorted(int(i) for i in stop_ids),
           "prompt_format": prompt_format,
           "enable_thinking": bool(enable_thinking), "request_fields": dict(REQUEST_FIELDS)}
    if sampling is not None:
        out["sampling"] = sampling.request_fields()
    return out


@dataclass(frozen=True)
class SeededDraws:
    """At T > 0: the law the server draws with, ``--seed``, and each prompt's draw number; a request's seed is
    ``sampling.draw_seed(seed, its prompt ids, its number)``, as the local draws' are."""
    sampling: Any  # inputs.sampling.Sampling
    seed: int
    numbers: Sequence[int]


def prompt_digest(prompt_ids: Sequence[int], prompt_text: str | None) -> str:
    h = hashlib.sha256(tokens_digest(prompt_ids).encode())
    if prompt_text is not None:
        h.update(b"\0" + prompt_text.encode())
    return h.hexdigest()


def cache_file(cache_dir: Path, model: str, prompt_sha: str, settings: dict) -> Path:
    key = hashlib.sha256(json.dumps([model, prompt_sha, settings], sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / CACHE_SUBDIR / f"{safe_name(model)[-40:]}-{key}.json"


# ----------------------------------------------------------------------------------------------- the run


@dataclass
class _Job:
    index: int
    sample_id: str
    prompt_ids: list[int]
    prompt: list[int] | str
    prompt_sha: str
    path: Path | None
    settings: dict  # the cache key's settings: the run's, with this draw's seed at T > 0
    seed: int | None = None


def _render(tokenizer, prompt, enable_thinking: bool, prompt_format: str) -> tuple[list[int], str | None]:
    from remote_payload.models.target import (
        render_prompt,  # the eval's own rendering, so local and server references agree
    )

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


def _load_cached(job: _Job, model: str) -> dict | None:
    if job.path is None or not job.path.exists():
        return None
    try:
        found = json.loads(job.path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    expected = {"schema": SCHEMA, "model": model, "prompt_sha256": job.prompt_sha, "settings": job.settings}
    if mismatches(expected, found, CACHE_FIELDS) or found.get("prompt_ids") != job.prompt_ids:
        return None
    try:
        return {"raw": parse_completion(found.get("response")), "seconds": float(found.get("seconds", 0.0))}
    except (ValueError, TypeError):
        return None


def fetch_references(endpoint: Endpoint, prompts: Sequence[Any], tokenizer, *, enable_thinking: bool,
                     max_tokens: int, stop_ids: Sequence[int], cache_dir: str | Path | None = None,
                     strict_roundtrip: bool = False,
                     on_sample: Callable[[int, int, ServerReference], None] | None = None,
                     warn: Callable[[str], None] | None = None, sampled: SeededDraws | None = None) -> ReferenceBatch:
    """Greedy references for ``prompts`` (objects with ``.id`` and ``.message_dicts()``, e.g. prompts.Prompt).

    Returns them in prompt order. Samples found in ``cache_dir`` are not requested again; each finished
    sample is cached as soon as it arrives, so a failure part-way (server died, timeout) loses nothing:
    the PayloadError says how many samples are done, and a re-run requests only the rest. (Ten parameters:
    the keyword-only ones are the eval's ``--reference-*`` settings and its callbacks, passed as they are.)
    """
    _check_request(endpoint, max_tokens, stop_ids)
    run = _Fetch(endpoint, tokenizer, max_tokens, stop_ids, Path(cache_dir) if cache_dir is not None else None,
                 on_sample, sampled)
    run.plan(prompts, enable_thinking)
    pending = run.reuse_cached()
    seed_check = check_seeded(run, pending) if sampled is not None and pending else None
    run.request(pending)
    batch = ReferenceBatch(url=run.base, model=run.model, prompt_format=endpoint.prompt_format,
                           settings=run.settings, samples=[r for r in run.results if r is not None],
                           requests=run.requested, cache_dir=str(run.cache_root / CACHE_SUBDIR)
                           if run.cache_root is not None else None, seed_check=seed_check)
    _report(batch, strict_roundtrip, warn or (lambda _msg: None))
    return batch


def _check_request(endpoint: Endpoint, max_tokens: int, stop_ids: Sequence[int]) -> None:
    if max_tokens < 1:
        raise PayloadError("reference max_tokens must be >= 1")
    if endpoint.prompt_format not in PROMPT_FORMATS:
        raise PayloadError(f"reference prompt format must be one of {', '.join(PROMPT_FORMATS)}, "
                           f"not {endpoint.prompt_format!r}")
    if endpoint.concurrency < 1 or endpoint.retries < 0 or endpoint.timeout_s <= 0:
        raise PayloadError("reference endpoint: concurrency >= 1, retries >= 0 and timeout > 0 required")
    if not stop_ids:
        raise PayloadError("reference endpoint: the target has no end tokens to stop on")


class _Fetch:
    """One fetch: the jobs, the results in prompt order, and the requests in flight."""

    def __init__(self, endpoint: Endpoint, tokenizer, max_tokens: int, stop_ids: Sequence[int],
                 cache_root: Path | None, on_sample, sampled: SeededDraws | None = None):
        self.endpoint, self.tokenizer, self.max_tokens, self.stop_ids = endpoint, tokenizer, max_tokens, stop_ids
        self.cache_root, self.on_sample, self.sampled = cache_root, on_sample, sampled
        self.base = base_url(endpoint.url)
        self.model = resolve_model(endpoint)
        self.settings: dict = {}
        self.jobs: list[_Job] = []
        self.results: list[ServerReference | None] = []
        self.done = self.requested = 0

    def plan(self, prompts: Sequence[Any], enable_thinking: bool) -> None:
        from remote_payload.inputs.sampling import draw_seed

        fmt, sampled = self.endpoint.prompt_format, self.sampled
        self.settings = settings_for(self.max_tokens, self.stop_ids, fmt, enable_thinking,
                                     sampled.sampling if sampled is not None else None)
        for i, p in enumerate(prompts):
            ids, text = _render(self.tokenizer, p, enable_thinking, fmt)
            sha = prompt_digest(ids, text)
            seed = draw_seed(sampled.seed, ids, sampled.numbers[i]) if sampled is not None else None
            settings = self.settings if seed is None else {**self.settings, "seed": seed}
            path = cache_file(self.cache_root, self.model, sha, settings) if self.cache_root is not None else None
            self.jobs.append(_Job(i, str(p.id), ids, ids if text is None else text, sha, path, settings, seed))
        self.results = [None] * len(self.jobs)

    def record(self, job: _Job, ref: ServerReference, seconds: float, cached: bool) -> None:
        ref.cached, ref.seconds = cached, seconds
        self.results[job.index] = ref
        self.done += 1
        if self.on_sample:
            self.on_sample(self.done, len(self.jobs), ref)

    def derive(self, job: _Job, raw: dict) -> ServerReference:
        ref = derive(job.sample_id, job.prompt_ids, raw, self.tokenizer, self.stop_ids, self.max_tokens)
        ref.seed = job.seed
        return ref

    def sampled_fields(self, seed: int | None) -> dict | None:
        """The request's sampling fields at T > 0 (None: greedy)."""
        if self.sampled is None or seed is None:
            return None
        return {**self.sampled.sampling.request_fields(), "seed": int(seed)}

    def reuse_cached(self) -> list[_Job]:
        """Record the samples the cache holds; returns the jobs still to request."""
        pending = []
        for job in self.jobs:
            hit = _load_cached(job, self.model)
            try:
                ref = self.derive(job, hit["raw"]) if hit else None
            except ValueError:
                ref = None
            if ref is None or hit is None:
                pending.append(job)
            else:
                self.record(job, ref, hit["seconds"], True)
        return pending

    def fail(self, job: _Job, what: str) -> PayloadError:
        n = len(self.jobs)
        kept = (f"{self.done} of {n} sample(s) done and cached under {self.cache_root / CACHE_SUBDIR}; re-run to "
                "resume from there" if self.cache_root is not None else
                f"{self.done} of {n} sample(s) were done (no cache dir: they are not kept)")
        return PayloadError(f"reference server {self.base} (model {self.model!r}): sample {job.sample_id!r}: {what}; "
                            f"{kept}")

    def post(self, job: _Job) -> tuple[Any, float]:
        body = request_body(self.model, job.prompt, self.max_tokens, self.stop_ids, self.sampled_fields(job.seed))
        ep = self.endpoint
        start = time.perf_counter()
        obj = with_retries(ep, lambda: http_json("POST", self.base + "/completions", body, ep.timeout_s, ep.api_key))
        return obj, time.perf_counter() - start

    def request(self, pending: list[_Job]) -> None:
        """Up to ``concurrency`` requests in flight; after the first failure no new ones, then it is raised."""
        if not pending:
            return
        first_error: PayloadError | None = None
        limit = self.endpoint.concurrency
        with ThreadPoolExecutor(max_workers=min(limit, len(pending)), thread_name_prefix="dfo-reference") as pool:
            queue = list(pending)
            running: dict[Future, _Job] = {}
            while queue or running:
                while queue and first_error is None and len(running) < limit:
                    job = queue.pop(0)
                    running[pool.submit(self.post, job)] = job
                    self.requested += 1
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    error = self.finish(running.pop(fut), fut)
                    first_error = first_error or error
        if first_error is not None:
            raise first_error

    def finish(self, job: _Job, fut: Future) -> PayloadError | None:
        """A finished request: checked, cached and recorded, or the error it ends the run with."""
        try:
            obj, seconds = fut.result()
            # Checked before caching: a response that cannot become a reference is not kept.
            ref = self.derive(job, parse_completion(obj))
        except RequestFailed as exc:
            return self.fail(job, str(exc))
        except ValueError as exc:
            return self.fail(job, f"malformed response from POST /completions: {exc}")
        if job.path is not None:
            atomic_write_json(job.path, {
                "schema": SCHEMA, "model": self.model, "prompt_sha256": job.prompt_sha, "settings": job.settings,
                "sample_id": job.sample_id, "url": self.base, "prompt_ids": job.prompt_ids,
                "response": obj,  # as received; parsed again (and re-checked) on reuse
                "seconds": round(seconds, 3), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        self.record(job, ref, seconds, False)
        return None


def _report(batch: ReferenceBatch, strict_roundtrip: bool, say: Callable[[str], None]) -> None:
    """Warnings about ids the server did not return and round trips that failed (fatal when strict)."""
    base = batch.url
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


# ----------------------------------------------------------------------------------------------- the seed probe

SEED_PROBE_TOKENS = 32  # tokens per probe request (at most max_tokens)
SEED_PROBE_SEEDS = 4  # distinct seeds tried on one prompt before the next prompt is tried
SEED_PROBE_PROMPTS = 3  # prompts tried before concluding that the draws do not depend on the seed


def check_seeded(run: _Fetch, pending: list[_Job]) -> dict:
    """Refuse a server whose draws at T > 0 do not follow the request's seed (its references would be neither
    reproducible nor cached correctly): one prompt twice with one seed must give the same tokens, and with other
    seeds, other tokens. A prompt the target answers almost surely the same way (a memorised answer) shows neither,
    so the probe moves on to the next prompt until one draws differently under another seed, and that seed must draw
    its tokens again: four short requests on a prompt with entropy, at most ``SEED_PROBE_PROMPTS`` ×
    (``SEED_PROBE_SEEDS`` + 2). One request at a time,
    so batching cannot change a seeded draw."""
    assert run.sampled is not None
    n = min(SEED_PROBE_TOKENS, run.max_tokens)
    ep = run.endpoint
    where = f"reference server {run.base} (model {run.model!r})"
    law = run.sampled.sampling.label()
    requests = 0

    def draw(job: _Job, seed: int) -> list[int]:
        nonlocal requests
        requests += 1
        body = request_body(run.model, job.prompt, n, run.stop_ids, run.sampled_fields(seed))
        try:
            obj = with_retries(ep, lambda: http_json("POST", run.base + "/completions", body, ep.timeout_s,
                                                       ep.api_key))
            raw = parse_completion(obj)
        except RequestFailed as exc:
            raise run.fail(job, f"the seed probe's request failed: {exc}") from None
        except ValueError as exc:
            raise run.fail(job, f"malformed response to the seed probe: {exc}") from None
        return list(raw["token_ids"]) if raw["token_ids"] is not None else retokenize(run.tokenizer, raw["text"])

    probes = list({job.prompt_sha: job for job in pending}.values())[:SEED_PROBE_PROMPTS]
    tried: list[int] = []
    for job in probes:
        base = int(job.seed or 0)
        first, again = draw(job, base), draw(job, base)
        if first != again:
            at = next((i for i, (a, b) in enumerate(zip(first, again, strict=False)) if a != b),
                      min(len(first), len(again)))
            raise PayloadError(f"{where} ignores the request's seed: two requests for {job.sample_id!r} with seed "
                               f"{base} at {law} drew different tokens (from token {at} on), so its references can "
                               "be neither reproduced nor cached per seed; use a server that honours `seed` (vLLM, "
                               "SGLang), or --reference target")
        tried = [base]
        for k in range(1, SEED_PROBE_SEEDS):
            other = (base + k * 7919) % (1 << 31)
            tried.append(other)
            drawn = draw(job, other)
            if drawn == first:
                continue
            # two different draws: each seed must give its own again (chance alone rarely repeats a rarer draw)
            if draw(job, other) != drawn:
                raise PayloadError(f"{where} ignores the request's seed: two requests for {job.sample_id!r} with "
                                   f"seed {other} at {law} drew different tokens, so its references can be neither "
                                   "reproduced nor cached per seed; use a server that honours `seed` (vLLM, "
                                   "SGLang), or --reference target")
            return {"ok": True, "tokens": n, "requests": requests, "prompt": job.sample_id, "seeds": tried,
                    "rule": "same seed -> same tokens, another seed -> other tokens (on the first prompt whose "
                            "draws differ), and that seed's tokens again"}
    raise PayloadError(f"{where} drew the same {n} tokens for {len(tried)} different seeds at {law} on each of "
                       f"{len(probes)} prompt(s): its draws do not depend on the seed (it ignores the seed and samples "
                       "greedily, or ignores the temperature); if the target really is that certain at this "
                       "temperature, sampling changes nothing: use --temperature 0")
