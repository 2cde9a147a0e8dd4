"""The run-wide stages of `eval`, in order: start, inputs, (references, target | target, references), run
checks, features. Each takes the ``EvalContext`` and fills in its part (see ``pipeline.py`` for the order).

Inputs that can be checked without the target's weights (drafter checkpoints against the target's config
and tokenizer, prompt files) are checked first, so bad inputs fail in seconds. With ``--reference URL`` the
references come from an OpenAI-compatible server *before* the target's weights load (the server may share
the GPU).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from remote_payload.diagnose.findings import RunFacts, drafter_checks, run_level_checks, template_sha256
from remote_payload.diagnose.probes import probe_layer_ids
from remote_payload.diagnose.tensors import TensorStats
from remote_payload.errors import PayloadError
from remote_payload.eval import draws as draws_mod
from remote_payload.eval import thinking_modes
from remote_payload.eval.context import EvalContext, Extraction, References
from remote_payload.eval.settings import (
    REFERENCE_API_KEY_ENV,
    TEST_FAULT_ENV,
    TEST_FAULTS,
    check_settings,
    planted_fault,
)
from remote_payload.inputs import batched_references
from remote_payload.inputs import prompts as prompts_mod
from remote_payload.inputs.batched_references import Request
from remote_payload.inputs.cache import enforce_limit
from remote_payload.inputs.datasets import longctx
from remote_payload.inputs.datasets.load import load_datasets
from remote_payload.inputs.features import FeatureStore, bytes_per_token, cache_path, cached_features, extract
from remote_payload.inputs.prompts import Prompt, with_history
from remote_payload.inputs.reference import Reference
from remote_payload.inputs.sampling import draw_seed
from remote_payload.models import checkpoint, kernels
from remote_payload.models import target as targetmod
from remote_payload.models.validation import validate_against_target

SAMPLED_SERVER_TAILS = ("at T > 0 the tokens past each stop must be drawn at T as well, and a server's tail requests "
                        "are greedy; --reference target samples them on this host")


def start(ctx: EvalContext) -> None:
    """Settings checked, then device and kernel policy: no transformers model code may be imported before."""
    s = ctx.settings
    check_settings(s)
    ctx.fault = planted_fault()
    ctx.device = targetmod.resolve_device(s.device)
    kernels.apply_policy(ctx.device, s.kernel)
    targetmod.resolve_dtype(s.dtype, s.allow_fp16)
    import torch

    torch.manual_seed(s.seed)
    ctx.cache_dir = s.resolved_cache_dir()


def check_inputs(ctx: EvalContext) -> None:
    """Opens the ``load`` stage: target config and tokenizer, every drafter validated against them, prompts."""
    s, progress = ctx.settings, ctx.progress
    progress.stage_start("load")
    ctx.target_config = targetmod.read_target_config(s.target)
    ctx.tokenizer = targetmod.load_tokenizer(ctx.target_config.path)
    ctx.stop_ids = targetmod.stop_token_ids(ctx.target_config.path, ctx.tokenizer)
    for name, path in s.drafters:
        try:
            ld = checkpoint.load_drafter(path, s.drafter_specs.get(name), allow_fp16=s.allow_fp16)
            validate_against_target(ld.spec, ctx.target_config, ctx.tokenizer, ctx.stop_ids, str(path),
                                               ld.extras)
        except PayloadError as exc:
            raise PayloadError(f"drafter '{name}': {exc}") from None
        ctx.drafters[name] = ld
        reserved = f", reserved {ld.spec.reserved_layer_ids}" if ld.spec.reserved_layer_ids else ""
        progress.emit("stage", stage="load", status="drafter",
                      message=f"{name}: {ld.spec.format} format, fc layers {ld.spec.fc_layer_ids}{reserved}")
    select_prompts(ctx)
    if ctx.fault:
        ctx.warn(f"TEST FAULT {ctx.fault} planted (${TEST_FAULT_ENV}): {TEST_FAULTS[ctx.fault]}; these results are "
                 "not a measurement")


def select_prompts(ctx: EvalContext, rows: int | None = None) -> None:
    """The run's prompts (its datasets' rows or its prompt set, its shard; at T > 0 every draw); ``rows``: only
    the first N conversations of them, every turn of each (--explain's subset reruns)."""
    s = ctx.settings
    specs = s.dataset_specs
    if specs:  # the benchmark datasets replace the prompt set
        all_prompts, ctx.datasets = load_datasets(specs, s.dataset_files, s.selection, s.selection_concurrency)
        ctx.prompt_info = {"source": "datasets", "datasets": [d["name"] for d in ctx.datasets],
                           "suite": s.suite, "count": len(all_prompts)}
    else:
        all_prompts, ctx.prompt_info = prompts_mod.load_prompts(s.prompts)
    ctx.prompts = prompts_mod.select(all_prompts, s.samples, s.shard)
    if not ctx.prompts:
        chosen = all_prompts if s.samples is None else all_prompts[:s.samples]
        raise PayloadError(f"no prompts selected: shard {s.shard[0]}/{s.shard[1]} of "
                           f"{prompts_mod.conversations(chosen)} prompt(s)")
    if rows is not None:
        kept: set[int] = set()
        first_turns = 0
        for p in ctx.prompts:
            if p.follows is None and first_turns < rows:
                first_turns += 1
                kept.add(p.index)
            elif p.follows in kept:
                kept.add(p.index)
        ctx.prompts = [p for p in ctx.prompts if p.index in kept]
    if s.thinking_both:  # each prompt under both thinking modes, paired (eval/thinking_modes.py)
        ctx.prompts = thinking_modes.expand(ctx.prompts)
    build_longctx(ctx)
    if s.sampled:  # K draws per prompt, each one sample of the run (eval/draws.py)
        ctx.prompts, ctx.draws = draws_mod.expand(ctx.prompts, s.samples_per_prompt)


def build_longctx(ctx: EvalContext) -> None:
    """longctx prompts built to their depth in the target's tokens, under each one's thinking mode."""
    s, deep = ctx.settings, [i for i, p in enumerate(ctx.prompts) if p.depth is not None]
    for done, i in enumerate(deep, start=1):
        p = ctx.prompts[i]
        mode = thinking_modes.mode_of(p, s.enable_thinking)

        def render(messages: list[dict], mode: bool = mode) -> list[int]:
            return targetmod.render_prompt(ctx.tokenizer, messages, mode)

        ctx.prompts[i] = longctx.fit(p, render)
        ctx.progress.progress("load", done, len(deep), unit="prompts", message=f"{p.id}: {p.depth} tokens")


def load_target(ctx: EvalContext) -> None:
    s = ctx.settings
    ctx.target = targetmod.load_target(ctx.target_config.path, device=ctx.device, dtype=s.dtype,
                                       allow_fp16=s.allow_fp16, kernel=s.kernel, progress=ctx.progress)


def local_references(ctx: EvalContext) -> None:
    """The ``reference`` stage from the target's own decoding: greedy (cached per prompt), or at T > 0 each draw
    sampled with its seed (cached per seed); ``--decode-batch`` rows per forward (``inputs/batched_references.py``),
    a later turn once the turn before it has its reference."""
    s, progress = ctx.settings, ctx.progress
    progress.stage_start("reference")
    batch, tail_batch = decode_batch(ctx), decode_batch(ctx, tails=True)
    found: dict[int, Reference] = {}
    refs = References(decode={"batch_asked": s.decode_batch, "batch": batch, "tail_batch": tail_batch})
    stats = []
    for wave in turn_waves(ctx.prompts):
        requests = []
        for i in wave:
            p = ask(ctx, i, [found.get(j) for j in range(len(ctx.prompts))])
            mode = thinking_modes.mode_of(p, s.enable_thinking)  # --enable-thinking both: the prompt's own
            ids = targetmod.render_prompt(ctx.tokenizer, p.message_dicts(), mode)
            if s.sampled:
                ctx.draws[i].seed = draw_seed(s.seed, ids, ctx.draws[i].number)
            requests.append(Request(ids, ctx.draws[i].seed if s.sampled else None))
        part, wave_stats = batched_references.references(
            ctx.target, requests, s.max_new_tokens, ctx.cache_dir, batch=batch, tail_batch=tail_batch,
            sampling=s.sampling if s.sampled else None, tail=tail_length(ctx), warn=ctx.warn,
            on_progress=lambda at: _reference_progress(ctx, at))
        found.update(zip(wave, part, strict=True))
        stats.append(wave_stats)
        if wave_stats.halvings:  # what ran out of memory once would again: the next waves start below it
            below = min(wave_stats.halvings) // 2
            batch, tail_batch = min(batch, below), min(tail_batch, below)
    refs.refs = [found[i] for i in range(len(ctx.prompts))]
    refs.tokens = sum(st.tokens for st in stats)
    refs.seconds = sum(st.seconds for st in stats)
    refs.decode.update(_decode_figures(stats))
    oom = refs.decode["out_of_memory_at"]
    if oom:
        ctx.warn(f"out of memory decoding at batch {', '.join(map(str, oom))}: halved and went on (no finished row "
                 f"lost); give --decode-batch {min(oom) // 2} or less next time")
    ctx.references = refs
    ctx.timings["reference_s"] = progress.stage_done("reference")


def decode_batch(ctx: EvalContext, tails: bool = False) -> int:
    """The rows per forward: --decode-batch N, or for auto what the device's free memory holds for the longest row
    (1 on the CPU); ``tails``: for the tail rows, whose prefill is the whole row."""
    from remote_payload.inputs.decode_memory import auto_batch

    value = ctx.settings.decode_batch
    if value != "auto":
        return int(value)
    prompt, total = longest_row(ctx)
    return auto_batch(ctx.target, total, len(ctx.prompts), prefill_tokens=None if tails else prompt)


def longest_row(ctx: EvalContext) -> tuple[int, int]:
    """Tokens of the longest prompt a reference stage prefills and of its whole row: a later turn's history (at
    most each turn's prompt and max new tokens), the continuation and its tail."""
    s = ctx.settings
    turns = len(turn_waves(ctx.prompts)) or 1
    longest = max((len(targetmod.render_prompt(ctx.tokenizer, p.message_dicts(),
                                               thinking_modes.mode_of(p, s.enable_thinking))) for p in ctx.prompts),
                  default=0)
    prompt = turns * longest + (turns - 1) * s.max_new_tokens
    return prompt, prompt + s.max_new_tokens + tail_length(ctx)


def _reference_progress(ctx: EvalContext, at) -> None:
    ctx.progress.progress("reference", at.done, at.total, unit="rows", tokens_per_s=at.tokens_per_s,
                          eta_s=at.eta_s, message=f"batch {at.stats.batch}" if at.total else "every row cached")


def _decode_figures(stats: list) -> dict:
    """The reference stage's decode figures over its waves (``DecodeStats.as_dict`` summed)."""
    tokens, seconds = sum(st.tokens for st in stats), sum(st.seconds for st in stats)
    slots = sum(st.slot_steps for st in stats)
    return {"rows": sum(st.rows for st in stats), "tokens": tokens,
            "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
            "idle_share": round(1 - tokens / slots, 4) if slots else None,
            "out_of_memory_at": [b for st in stats for b in st.halvings]}


def ask(ctx: EvalContext, i: int, refs: list) -> Prompt:
    """Prompt ``i`` as it is asked: a later turn of a multi-turn row gets the previous turn in its history, its
    answer being the target's reference continuation decoded as z-lab decodes its output
    (``skip_special_tokens=True``). ``ctx.prompts[i]`` becomes that prompt, so every later stage (server tails,
    the engine, the sample lines) sees the conversation the reference was made for."""
    p = ctx.prompts[i]
    if p.follows is not None:
        prev = next(j for j, q in enumerate(ctx.prompts[:i]) if q.index == p.follows)
        answer = ctx.tokenizer.decode(refs[prev].continuation, skip_special_tokens=True)
        p = ctx.prompts[i] = with_history(p, ctx.prompts[prev], answer)
    return p


def turn_waves(prompts: list) -> list[list[int]]:
    """Positions of the prompts in waves: every first turn, then every turn that follows one of the wave before."""
    depth: dict[int, int] = {}
    for i, p in enumerate(prompts):
        prev = next((j for j, q in enumerate(prompts[:i]) if q.index == p.follows), None)
        depth[i] = 0 if prev is None else depth[prev] + 1
    return [[i for i in depth if depth[i] == d] for d in range(max(depth.values(), default=-1) + 1)]


def tail_length(ctx: EvalContext) -> int:
    """Tokens past the stop the zlab-2604/vllm conventions need: a block of the largest drafter, less its anchor."""
    return max((ld.spec.block_size for ld in ctx.drafters.values()), default=1) - 1


def server_references(ctx: EvalContext, engine_key: str | None = None) -> None:
    """The ``reference`` stage from an OpenAI-compatible server (``--reference URL``), before the target loads.

    ``engine_key``: the per-run API key of the engine this run started (``--reference vllm``). The user's
    ``$DFO_REFERENCE_API_KEY`` goes only to the server the user named, never to an engine started here.
    """
    from remote_payload.inputs.openai_client import Endpoint  # stdlib only, loaded for --reference runs only
    from remote_payload.inputs.server_reference import SeededDraws, fetch_references
    from remote_payload.inputs.server_tails import fetch_tails

    s, progress = ctx.settings, ctx.progress
    progress.stage_start("reference")
    api_key = engine_key if s.reference_engine else os.environ.get(REFERENCE_API_KEY_ENV) or None
    endpoint = Endpoint(url=str(s.reference_url), model=s.reference_model, timeout_s=s.reference_timeout,
                        prompt_format=s.reference_prompt_format, concurrency=s.reference_concurrency,
                        retries=s.reference_retries, api_key=api_key)
    started = time.perf_counter()
    found: dict = {}
    batch = None
    for wave in turn_waves(ctx.prompts):  # a later turn is asked once the turn before it has its reference
        done = len(found)
        asked = [ask(ctx, i, [found.get(j) for j in range(len(ctx.prompts))]) for i in wave]
        sampled = SeededDraws(s.sampling, s.seed, [ctx.draws[i].number for i in wave]) if s.sampled else None
        part = fetch_references(  # one mode: --enable-thinking both is refused with a server (check_thinking_values)
            endpoint, asked, ctx.tokenizer, enable_thinking=bool(s.enable_thinking), max_tokens=s.max_new_tokens,
            stop_ids=ctx.stop_ids, cache_dir=ctx.cache_dir, strict_roundtrip=s.reference_strict_roundtrip,
            # mypy cannot infer a lambda with a default argument (done, bound per wave)
            on_sample=lambda d, t, r, done=done: progress.progress(  # type: ignore[misc]
                "reference", done + d, len(ctx.prompts), unit="samples", message=r.sample_id),
            warn=ctx.warn, sampled=sampled)
        for i, ref in zip(wave, part.samples, strict=True):
            found[i] = ref
            if s.sampled:
                ctx.draws[i].seed = ref.seed
        batch = part if batch is None else replace(batch, samples=batch.samples + part.samples,
                                                   requests=batch.requests + part.requests)
    assert batch is not None  # a run has prompts, so at least one wave
    batch = replace(batch, samples=[found[i] for i in range(len(ctx.prompts))])
    refs = [r.to_reference() for r in batch.samples]
    ctx.references = References(refs=refs, batch=batch, tokens=sum(len(r.continuation) for r in refs if not r.cached),
                                seconds=time.perf_counter() - started)
    if s.sampled:  # the tokens past the stop would have to be drawn at T too: the tail requests are greedy
        ctx.references.tail_unavailable = SAMPLED_SERVER_TAILS
        ctx.warn(f"zlab-2604 and vllm τ conventions unavailable: {SAMPLED_SERVER_TAILS}")
        ctx.timings["reference_s"] = progress.stage_done("reference")
        return
    tails = fetch_tails(endpoint, batch, tail_length(ctx), ctx.cache_dir)
    if tails.tails is None:
        ctx.references.tail_unavailable = tails.reason
        ctx.warn(f"zlab-2604 and vllm τ conventions unavailable: {tails.reason}")
    else:
        for ref, tail in zip(refs, tails.tails, strict=True):
            ref.tail = tail
    if tails.notes:
        ctx.warn(f"{len(tails.notes)} sample(s) with a short tail past the stop: {tails.notes[0]}")
    ctx.timings["reference_s"] = progress.stage_done("reference")


def run_checks(ctx: EvalContext) -> None:
    """Always on: the run against the drafters' training metadata, fp16 (each finding is a warning)."""
    ctx.run_facts = RunFacts(kernel_path=ctx.target.kernel_path, enable_thinking=ctx.settings.enable_thinking,
                             dtype=ctx.settings.dtype, chat_template_sha256=template_sha256(ctx.tokenizer))
    found = run_level_checks(ctx.run_facts)
    for name, ld in ctx.drafters.items():
        found += drafter_checks(name, ld.spec, ld.source.get("training_metadata"), ctx.run_facts)
    ctx.add_findings(found, warn_all=True)


def extract_features(ctx: EvalContext) -> None:
    """The ``extract`` stage: hidden states at every drafter's fc layers, for every sample (cached)."""
    s, progress, refs = ctx.settings, ctx.progress, ctx.references.refs
    layer_ids = sorted({lid for ld in ctx.drafters.values() for lid in ld.spec.fc_layer_ids})
    progress.stage_start("extract")
    ex = Extraction(layer_ids=layer_ids, store=FeatureStore(layer_ids, ctx.cache_dir),
                    hidden_stats={lid: TensorStats() for lid in layer_ids} if s.diagnose else {},
                    bytes_per_token=bytes_per_token(ctx.target, layer_ids))
    memory = PeakMemory(ctx.device)
    for i, ref in enumerate(refs):
        feats = cached_features(ctx.target, ref.tokens, len(ref.prompt_ids), layer_ids, ctx.cache_dir, warn=ctx.warn)
        ex.store.add(i, feats, cache_path(ctx.cache_dir, ctx.target, ref.tokens))
        # at T > 0 the continuation is drawn, not the argmax: a one-pass argmax check says nothing there
        ex.teacher_forced_mismatches.append(None if s.sampled else feats.teacher_forced_mismatches())
        if ex.hidden_stats:
            for lid in layer_ids:
                ex.hidden_stats[lid].add(feats.layers[lid])
        if feats.cached:
            ex.cache_hits += 1
        else:
            ex.tokens += len(ref.tokens)
            ex.seconds += feats.seconds
        progress.progress("extract", i + 1, len(refs), unit="samples",
                          tokens_per_s=ex.tokens / ex.seconds if ex.seconds else None, message=ctx.prompts[i].id)
    ex.memory = memory.read()
    ctx.extraction = ex
    ctx.diagnosed_samples = min(s.diagnose_samples, len(refs)) if s.diagnose else 0
    _probe_features(ctx)
    ctx.timings["extract_s"] = progress.stage_done("extract")
    _warn_teacher_forced(ctx)
    _limit_cache(ctx)


def _limit_cache(ctx: EvalContext) -> None:
    """The cache folder back under --cache-limit-gib, least recently used entries first; this run's features stay
    (the drafters' stage may read them back)."""
    limit = int(ctx.settings.cache_limit_gib * 2**30)
    ex = ctx.extraction
    ex.cache = enforce_limit(ctx.cache_dir, limit, keep=ex.store.paths.values())
    if ex.cache["over_limit"]:
        ctx.warn(f"the cache {ctx.cache_dir} holds {ex.cache['bytes'] / 2**30:.1f} GiB after this run, over "
                 f"--cache-limit-gib {ctx.settings.cache_limit_gib:g}: this run's own features are larger than the "
                 "limit (raise it, or evaluate fewer samples per run)")
    elif ex.cache["evicted"]:
        ctx.warn(f"cache over --cache-limit-gib {ctx.settings.cache_limit_gib:g}: removed {ex.cache['evicted']} "
                 f"least recently used file(s), {ex.cache['evicted_bytes'] / 2**30:.2f} GiB")


class PeakMemory:
    """The extraction's peak memory: the process's peak resident size, and torch's CUDA peak on a GPU."""

    def __init__(self, device: str):
        import torch

        self.cuda = device == "cuda" and torch.cuda.is_available()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def read(self) -> dict:
        import resource

        import torch

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        return {"peak_rss_bytes": rss, "cuda_peak_bytes": torch.cuda.max_memory_allocated() if self.cuda else None}


def _probe_features(ctx: EvalContext) -> None:
    """Diagnosed samples: extra layers for the layer-shift / post-norm probes (one more target forward each)."""
    ex = ctx.extraction
    extra: set[int] = set()
    if ctx.diagnosed_samples:
        for ld in ctx.drafters.values():
            for ids in probe_layer_ids(ld.spec, ctx.target_config.num_layers).values():
                extra |= set(ids)
    extra -= set(ex.layer_ids)
    for i in range(ctx.diagnosed_samples):
        ref = ctx.references.refs[i]
        more = extract(ctx.target, ref.tokens, sorted(extra), len(ref.prompt_ids),
                       with_argmax=False).layers if extra else {}
        ex.probe_features[i] = {**more, **ex.store.get(i)}


def _warn_teacher_forced(ctx: EvalContext) -> None:
    mismatched = [m for m in ctx.extraction.teacher_forced_mismatches if m]
    if not mismatched:
        return
    if ctx.references.from_server:
        ctx.warn(f"{len(mismatched)} sample(s) where this host's one-pass target argmax differs from the server's "
                 f"continuation ({sum(mismatched)} position(s)): the server's numerics (kernels, batching, dtype) "
                 "differ from this host's extraction; the rounds are measured against the server's tokens, as that "
                 "server would verify them")
    else:
        ctx.warn(f"{len(mismatched)} sample(s) where the target's one-pass argmax differs from its greedy "
                 "continuation (near-tied logits); offline and online rounds may differ there")
