"""The eval pipeline: inputs checked -> target -> references -> features -> offline eval -> (online) -> results.

Inputs that can be checked without loading the target's weights (drafter checkpoints against the target
config and tokenizer, prompt files) are checked first, so bad inputs fail in seconds. With ``--reference URL``
the references come from an OpenAI-compatible server *before* the target's weights load (the server may
share the GPU). Per drafter, one batched draft pass per sample feeds the chain τ, the tree metrics
(tree.py) and, with ``--diagnose``, the probes (diagnose.py); with several drafters a comparison block
(compare.py) is added.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.models import kernels
from remote_payload.errors import PayloadError
from remote_payload.progress import SILENT, Progress

DEFAULT_MAX_NEW_TOKENS = 512
DEFAULT_TOPK = 8
DEFAULT_TREE_K = 8  # headline "DDTree-8" = top-8 depth acceptance
DEFAULT_TREE_BUDGET = 16
DEFAULT_DIAGNOSE_SAMPLES = 2
DEFAULT_DIAGNOSE_ROUNDS = 4
KEEP_IN_MEMORY_BYTES = 2 * 2**30
REFERENCE_API_KEY_ENV = "DFO_REFERENCE_API_KEY"
# Test-only planted faults (never set in production): the eval misbehaves on purpose so tests can check
# that --diagnose flags it. The results record it in settings.test_fault and in a warning.
TEST_FAULT_ENV = "DFO_PAYLOAD_TEST_FAULT"
TEST_FAULTS = {"slot0-mask": "blocks built with the mask token in slot 0 instead of the committed token (pitfall 2)"}


@dataclass
class EvalSettings:
    target: str
    drafters: list  # [(name, path)]
    drafter_specs: dict = field(default_factory=dict)  # name -> spec file
    prompts: str = "builtin"
    samples: int | None = None
    shard: tuple = (0, 1)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    enable_thinking: bool = False
    device: str = "auto"
    dtype: str = "bfloat16"
    allow_fp16: bool = False
    cache_dir: str | None = None
    out: str = "dfo-eval"
    online_check: bool = False
    seed: int = 0
    topk: int = DEFAULT_TOPK
    kernel: str = "auto"
    tree_k: int = DEFAULT_TREE_K
    tree_budget: int = DEFAULT_TREE_BUDGET
    reference_url: str | None = None  # OpenAI-compatible endpoint; None: the target's own greedy decoding
    reference_model: str | None = None
    reference_timeout: float = 900.0
    reference_concurrency: int = 4
    reference_retries: int = 2  # extra attempts after a connection failure or HTTP 5xx
    reference_prompt_format: str = "ids"
    reference_strict_roundtrip: bool = False
    diagnose: bool = False
    diagnose_samples: int = DEFAULT_DIAGNOSE_SAMPLES
    diagnose_rounds: int = DEFAULT_DIAGNOSE_ROUNDS
    expect_p1: dict = field(default_factory=dict)  # drafter name (or "*" for all) -> expected position-1 acceptance


def default_cache_dir() -> Path:
    return Path(os.environ.get("DFO_PAYLOAD_CACHE", Path.home() / ".cache" / "dfo-payload"))


def parse_named(values: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values or []:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise PayloadError(f"{flag} expects NAME=PATH, got {v!r}")
        if not all(c.isalnum() or c in "-_." for c in name):
            raise PayloadError(f"{flag} {v!r}: NAME may hold letters, digits, '-', '_' and '.' only")
        out.append((name, path))
    names = [n for n, _ in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PayloadError(f"{flag}: name(s) given twice: {', '.join(dupes)}")
    return out


def parse_expect_p1(values: list[str] | None) -> dict:
    """``--expect-p1 X`` (every drafter) or ``--expect-p1 NAME=X`` (repeatable) -> {name or "*": X}."""
    out: dict = {}
    for v in values or []:
        name, sep, num = v.rpartition("=")
        key = name if sep else "*"
        if sep and not name:
            raise PayloadError(f"--expect-p1 {v!r}: expected X or NAME=X")
        try:
            x = float(num)
        except ValueError:
            raise PayloadError(f"--expect-p1 {v!r}: {num!r} is not a number (expected X or NAME=X, X in (0, 1])") \
                from None
        if not 0 < x <= 1:
            raise PayloadError(f"--expect-p1 {v!r}: the expected position-1 acceptance must be in (0, 1]")
        if key in out:
            raise PayloadError(f"--expect-p1: {'every drafter' if key == '*' else repr(key)} given twice")
        out[key] = x
    return out


def _check_settings(s: EvalSettings) -> None:
    if s.max_new_tokens < 1:
        raise PayloadError("--max-new-tokens must be >= 1")
    if s.samples is not None and s.samples < 1:
        raise PayloadError("--samples must be >= 1")
    if s.topk < 1:
        raise PayloadError("--topk must be >= 1")
    if s.tree_k < 1:
        raise PayloadError("--tree-k must be >= 1")
    if s.tree_budget < 1:
        raise PayloadError("--tree-budget must be >= 1")
    if s.diagnose_samples < 1 or s.diagnose_rounds < 1:
        raise PayloadError("--diagnose-samples and --diagnose-rounds must be >= 1")
    if not s.drafters:
        raise PayloadError("give at least one --drafter NAME=PATH")
    names = {n for n, _ in s.drafters}
    unknown_specs = sorted(set(s.drafter_specs) - names)
    if unknown_specs:
        raise PayloadError(f"--drafter-spec for unknown drafter name(s): {', '.join(unknown_specs)}")
    unknown_p1 = sorted(set(s.expect_p1) - names - {"*"})
    if unknown_p1:
        raise PayloadError(f"--expect-p1 for unknown drafter name(s): {', '.join(unknown_p1)}")
    if s.reference_url is not None:
        if s.reference_concurrency < 1:
            raise PayloadError("--reference-concurrency must be >= 1")
        if s.reference_retries < 0:
            raise PayloadError("--reference-retries must be >= 0")
        if s.reference_timeout <= 0:
            raise PayloadError("--reference-timeout must be > 0 seconds")
        if s.reference_prompt_format not in ("ids", "text"):
            raise PayloadError(f"--reference-prompt-format must be ids or text, not {s.reference_prompt_format!r}")


def _test_fault() -> str | None:
    fault = os.environ.get(TEST_FAULT_ENV) or None
    if fault is not None and fault not in TEST_FAULTS:
        raise PayloadError(f"${TEST_FAULT_ENV}={fault!r}: unknown test fault (known: {', '.join(TEST_FAULTS)}); "
                           "unset it — it exists only for the payload's tests")
    return fault


class _MaskFilledSlot0:
    """Test-only planted fault (``$DFO_PAYLOAD_TEST_FAULT=slot0-mask``): drafts like a harness that fills block
    slot 0 with the mask token, so tests can check that ``--diagnose`` flags pitfall 2."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def draft(self, ctx, tokens, anchors, topk: int = 1):
        return self._runtime.draft(ctx, tokens, anchors, topk=topk, slot0="mask")


class _FeatureStore:
    """Features of every sample: in memory when small, else re-read from the cache per drafter."""

    def __init__(self, layer_ids, cache_dir):
        self.layer_ids, self.cache_dir = layer_ids, cache_dir
        self.mem: dict = {}
        self.paths: dict = {}
        self.meta: dict = {}
        self.bytes = 0

    def add(self, i, feats, path):
        self.paths[i] = path
        self.meta[i] = feats.meta
        size = sum(t.numel() * t.element_size() for t in feats.layers.values())
        if self.bytes + size <= KEEP_IN_MEMORY_BYTES:
            self.mem[i] = feats.layers
            self.bytes += size

    def get(self, i):
        if i in self.mem:
            return self.mem[i]
        from remote_payload.inputs.features import load_cached

        feats, reasons = load_cached(self.paths[i], self.meta[i], self.layer_ids)
        if feats is None:
            raise PayloadError(f"feature cache {self.paths[i]} changed during the run ({'; '.join(reasons)})")
        return feats.layers


def run_eval(s: EvalSettings, progress: Progress = SILENT) -> dict:
    t_start = time.perf_counter()
    _check_settings(s)
    fault = _test_fault()

    # Device and kernel policy first: nothing from transformers' model code may be imported before it.
    from remote_payload.models.target import load_target, load_tokenizer, read_target_config, render_prompt, resolve_device, \
        resolve_dtype, stop_token_ids
    device = resolve_device(s.device)
    kernels.apply_policy(device, s.kernel)
    resolve_dtype(s.dtype, s.allow_fp16)

    import torch

    torch.manual_seed(s.seed)
    from remote_payload.models import checkpoint
    from remote_payload.diagnose import checks as dg
    from remote_payload.inputs import prompts as prompts_mod
    from remote_payload.metrics.compare import compare_drafters
    from remote_payload.models.drafter import DrafterRuntime
    from remote_payload.inputs.features import cache_path, cached_features, extract
    from remote_payload.metrics.chain import sample_tau, summarize
    from remote_payload.eval.offline import draft_sample, replay
    from remote_payload.eval.online import online_generate
    from remote_payload.inputs.reference import cached_reference
    from remote_payload.results import now_utc, versions, write_outputs
    from remote_payload.metrics.tree import sample_tree_rounds, tree_summary

    cache_dir = Path(s.cache_dir) if s.cache_dir else default_cache_dir()
    warnings: list[str] = []

    def warn(msg):
        if msg not in warnings:
            warnings.append(msg)
        progress.warning(msg)

    # K >= budget makes the budgeted tree exact DDTree (ranks >= budget never enter a tree of budget nodes).
    tree_K = s.tree_budget
    draft_topk = max(s.topk, s.tree_k, tree_K)

    # ---- cheap checks before the target's weights load
    progress.stage_start("load")
    tcfg = read_target_config(s.target)
    tokenizer = load_tokenizer(tcfg.path)
    stops = stop_token_ids(tcfg.path, tokenizer)
    loaded = {}
    for name, path in s.drafters:
        try:
            ld = checkpoint.load_drafter(path, s.drafter_specs.get(name), allow_fp16=s.allow_fp16)
            checkpoint.validate_against_target(ld.spec, tcfg, tokenizer, stops, str(path), ld.extras)
        except PayloadError as exc:
            raise PayloadError(f"drafter '{name}': {exc}") from None
        loaded[name] = ld
        progress.emit("stage", stage="load", status="drafter", message=f"{name}: {ld.spec.format} format, "
                      f"fc layers {ld.spec.fc_layer_ids}" + (f", reserved {ld.spec.reserved_layer_ids}"
                                                             if ld.spec.reserved_layer_ids else ""))
    all_prompts, prompt_info = prompts_mod.load_prompts(s.prompts)
    chosen = prompts_mod.select(all_prompts, s.samples, s.shard)
    if not chosen:
        raise PayloadError(f"no prompts selected: shard {s.shard[0]}/{s.shard[1]} of "
                           f"{min(len(all_prompts), s.samples or len(all_prompts))} prompt(s)")
    if fault:
        warn(f"TEST FAULT {fault} planted (${TEST_FAULT_ENV}): {TEST_FAULTS[fault]}; these results are not a "
             "measurement")

    # ---- references: from a serving endpoint (before the target's weights load) or the target's own greedy
    batch = None
    if s.reference_url:
        load_s = progress.stage_done("load", message="inputs checked; the target loads after the references")
        progress.stage_start("reference")
        batch, refs, ref_time = _server_references(s, chosen, tokenizer, stops, cache_dir, progress, warn)
        reference_s = progress.stage_done("reference")
        progress.stage_start("target")
        target = load_target(tcfg.path, device=device, dtype=s.dtype, allow_fp16=s.allow_fp16, kernel=s.kernel,
                             progress=progress)
        load_s += progress.stage_done("target")
        ref_tokens = sum(len(r.continuation) for r in refs if not r.cached)
    else:
        target = load_target(tcfg.path, device=device, dtype=s.dtype, allow_fp16=s.allow_fp16, kernel=s.kernel,
                             progress=progress)
        load_s = progress.stage_done("load")
        progress.stage_start("reference")
        refs, ref_tokens, ref_time = [], 0, 0.0
        for i, p in enumerate(chosen):
            ids = render_prompt(tokenizer, p.message_dicts(), s.enable_thinking)
            ref = cached_reference(target, ids, s.max_new_tokens, cache_dir, warn=warn)
            refs.append(ref)
            if not ref.cached:
                ref_tokens += len(ref.continuation)
                ref_time += ref.seconds
            progress.progress("reference", i + 1, len(chosen), unit="samples",
                              tokens_per_s=ref_tokens / ref_time if ref_time else None, message=p.id)
        reference_s = progress.stage_done("reference")
    ref_hits = sum(1 for r in refs if r.cached)

    # ---- run checks (always on): the run against the drafters' training metadata, fp16, expected p1
    facts = dg.RunFacts(kernel_path=target.kernel_path, enable_thinking=s.enable_thinking, dtype=s.dtype,
                        chat_template_sha256=dg.template_sha256(tokenizer))
    findings: list = dg.run_level_checks(facts)
    for name, ld in loaded.items():
        findings += dg.drafter_checks(name, ld.spec, ld.source.get("training_metadata"), facts)
    for f in findings:
        warn(f.line())

    # ---- features
    layer_ids = sorted({lid for ld in loaded.values() for lid in ld.spec.fc_layer_ids})
    progress.stage_start("extract")
    store = _FeatureStore(layer_ids, cache_dir)
    hidden_stats = {lid: dg.TensorStats() for lid in layer_ids} if s.diagnose else None
    ext_tokens, ext_time, ext_hits, tf_mismatch = 0, 0.0, 0, []
    for i, ref in enumerate(refs):
        feats = cached_features(target, ref.tokens, len(ref.prompt_ids), layer_ids, cache_dir, warn=warn)
        store.add(i, feats, cache_path(cache_dir, target, ref.tokens))
        tf_mismatch.append(feats.teacher_forced_mismatches())
        if hidden_stats is not None:
            for lid in layer_ids:
                hidden_stats[lid].add(feats.layers[lid])
        if feats.cached:
            ext_hits += 1
        else:
            ext_tokens += len(ref.tokens)
            ext_time += feats.seconds
        progress.progress("extract", i + 1, len(refs), unit="samples",
                          tokens_per_s=ext_tokens / ext_time if ext_time else None, message=chosen[i].id)
    # Diagnosed samples: extra layers for the layer-shift / post-norm probes (one more target forward each).
    n_diag = min(s.diagnose_samples, len(refs)) if s.diagnose else 0
    probe_feats = {}
    if n_diag:
        extra = set()
        for ld in loaded.values():
            for ids in dg.probe_layer_ids(ld.spec, tcfg.num_layers).values():
                extra |= set(ids)
        extra -= set(layer_ids)
        for i in range(n_diag):
            more = extract(target, refs[i].tokens, sorted(extra), len(refs[i].prompt_ids),
                           with_argmax=False).layers if extra else {}
            probe_feats[i] = {**more, **store.get(i)}
    extract_s = progress.stage_done("extract")
    mismatched = [m for m in tf_mismatch if m]
    if mismatched:
        if batch is not None:
            warn(f"{len(mismatched)} sample(s) where this host's one-pass target argmax differs from the server's "
                 f"continuation ({sum(mismatched)} position(s)): the server's numerics (kernels, batching, dtype) "
                 "differ from this host's extraction; the rounds are measured against the server's tokens, as that "
                 "server would verify them")
        else:
            warn(f"{len(mismatched)} sample(s) where the target's one-pass argmax differs from its greedy "
                 "continuation (near-tied logits); offline and online rounds may differ there")

    # ---- offline evaluation per drafter
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    final_norm = getattr(target.model.get_decoder(), "norm", None)
    drafter_device = target.input_device
    per_drafter: dict = {}
    per_sample_rounds: dict = {}
    per_sample_tree: dict = {}
    online_per_sample: dict = {}
    diag_drafters: dict = {}
    for name, ld in loaded.items():
        stage = f"eval:{name}"
        progress.stage_start(stage)
        try:
            runtime = DrafterRuntime(ld, embed, head, device=drafter_device, dtype=target.dtype)
        except PayloadError as exc:
            raise PayloadError(f"drafter '{name}': {exc}") from None
        source = _MaskFilledSlot0(runtime) if fault == "slot0-mask" else runtime
        dd = dg.DrafterDiagnostics(name, ld.spec, metadata=ld.source.get("training_metadata")) if s.diagnose \
            else None
        rounds_all, trees, as_run, draft_s, tree_s, anchors = [], [], {}, 0.0, 0.0, 0
        for i, ref in enumerate(refs):
            feats = store.get(i)
            drafts = draft_sample(source, feats, ref.tokens, len(ref.prompt_ids), topk=draft_topk)
            rounds_all.append(replay(drafts))
            t0 = time.perf_counter()
            trees.append(sample_tree_rounds(drafts, k=s.tree_k, budget=s.tree_budget, K=tree_K))
            tree_s += time.perf_counter() - t0
            draft_s += drafts.seconds
            anchors += len(drafts.anchors)
            if dd is not None:
                dd.add_fc(runtime, feats)
                if i < n_diag:
                    as_run[i] = drafts.topk_ids[:, :, 0].clone()
            progress.progress(stage, i + 1, len(refs), unit="samples", message=chosen[i].id,
                              tokens_per_s=anchors * (runtime.block_size) / draft_s if draft_s else None)
        metrics = summarize(rounds_all, runtime.block_size)
        metrics["tree"] = tree_summary([t.topk for t in trees], [t.budgeted for t in trees],
                                       block_size=runtime.block_size, k=s.tree_k, budget=s.tree_budget, K=tree_K)
        per_sample_rounds[name] = rounds_all
        per_sample_tree[name] = trees
        per_drafter[name] = {"spec": ld.spec.to_json(), "source": ld.source, "metrics": metrics,
                             "online_check": None,
                             "timings": {"eval_s": None, "draft_s": round(draft_s, 3), "tree_s": round(tree_s, 3),
                                         "anchors": anchors}}
        expected, expected_from = _expected_p1(s, name, ld)
        f = dg.p1_check(name, metrics, expected, expected_from)
        if f is not None:
            findings.append(f)
            warn(f.line())
        if dd is not None:
            t0 = time.perf_counter()
            _diagnose_drafter(dd, dg, name, ld, runtime, target, tokenizer, refs, chosen, n_diag, probe_feats,
                              as_run, rounds_all, metrics, expected, expected_from, final_norm, s, findings, warn)
            per_drafter[name]["timings"]["diagnose_s"] = round(time.perf_counter() - t0, 3)
            diag_drafters[name] = dd
        per_drafter[name]["timings"]["eval_s"] = round(progress.stage_done(stage), 3)
        headline = (f"{name}: tau_macro {metrics['tau_macro']:.3f}, DDTree-{s.tree_k} "
                    f"{metrics['tree']['topk']['tau_macro']:.3f}") if metrics["tau_macro"] is not None else \
            f"{name}: no rounds"
        progress.emit("stage", stage=stage, status="metrics", message=headline)
        online_by_sample = None
        if s.online_check:
            online_by_sample, online_s = _online_check(s, name, target, source, refs, chosen, rounds_all, progress,
                                                       online_generate, sample_tau)
            bad = [chosen[i].id for i, o in enumerate(online_by_sample)
                   if not (o["output_equals_reference"] and o["rounds_identical"])]
            per_drafter[name]["online_check"] = {
                "samples": len(online_by_sample),
                "all_outputs_equal_reference": all(o["output_equals_reference"] for o in online_by_sample),
                "all_rounds_identical": all(o["rounds_identical"] for o in online_by_sample),
                "mismatched_samples": bad,
                "tau_macro_online": _mean(o["tau"] for o in online_by_sample if o["tau"] is not None),
                "seconds": round(online_s, 3),
                "reference_source": "server" if batch is not None else "local"}
            if batch is not None:
                per_drafter[name]["online_check"]["note"] = SERVER_ONLINE_NOTE
            per_drafter[name]["timings"]["online_s"] = round(online_s, 3)
            if bad:
                if batch is not None:
                    warn(f"online check for '{name}': {len(bad)} sample(s) where the local online loop's output or "
                         f"rounds differ from the server's reference ({', '.join(bad[:5])}): local and server greedy "
                         "decoding disagree there (numerics), which is not by itself a lossless-decoding failure")
                else:
                    warn(f"online check for '{name}': {len(bad)} sample(s) differ from the offline path: "
                         f"{', '.join(bad[:5])}")
        online_per_sample[name] = online_by_sample
        del runtime, source

    # ---- outputs
    sample_lines = []
    for i, (p, ref) in enumerate(zip(chosen, refs)):
        line = {"index": p.index, "id": p.id, "category": p.category, "prompt_tokens": len(ref.prompt_ids),
                "continuation_tokens": len(ref.continuation), "stop_reason": ref.stop_reason,
                "reference_cached": ref.cached, "teacher_forced_mismatches": tf_mismatch[i],
                "continuation_text": tokenizer.decode(ref.continuation),
                "reference": batch.samples[i].to_json() if batch is not None else
                {"source": "local", "cached": ref.cached, "seconds": round(ref.seconds, 3)},
                "drafters": {}}
        for name in loaded:
            rounds = per_sample_rounds[name][i]
            entry = {"tau": sample_tau(rounds), "rounds": len(rounds),
                     "anchors": [r.anchor for r in rounds], "accepted": [r.accepted for r in rounds],
                     "produced": [r.produced for r in rounds], "tree": per_sample_tree[name][i].entry()}
            if online_per_sample[name] is not None:
                entry["online"] = online_per_sample[name][i]
            line["drafters"][name] = entry
        sample_lines.append(line)
    comparison = None
    if len(loaded) > 1:
        comparison = compare_drafters(sample_lines, list(loaded), seed=s.seed,
                                      block_sizes={n: per_drafter[n]["metrics"]["block_size"] for n in loaded})
    diagnostics = None
    if s.diagnose:
        diagnostics = _diagnostics_block(dg, s, chosen, refs, n_diag, hidden_stats, target, diag_drafters, findings,
                                         warn)
    reference = {"source": "server" if batch is not None else "local", "tokens_generated": ref_tokens,
                 "tokens_per_s": _rate(ref_tokens, ref_time), "cache_hits": ref_hits,
                 "stop_reasons": _count(r.stop_reason for r in refs)}
    if batch is not None:
        reference["server"] = batch.summary()
    total_s = time.perf_counter() - t_start
    results = {
        "status": "ok",
        "created_utc": now_utc(),
        "settings": {"enable_thinking": s.enable_thinking, "max_new_tokens": s.max_new_tokens,
                     "prompts": prompt_info, "samples_requested": s.samples,
                     "samples": len(chosen), "sample_ids": [p.id for p in chosen],
                     "shard": {"index": s.shard[0], "count": s.shard[1]}, "dtype": s.dtype, "device": device,
                     "kernel_requested": s.kernel, "seed": s.seed, "draft_topk": draft_topk,
                     "tree": {"k": s.tree_k, "budget": s.tree_budget, "K": tree_K},
                     "reference": {"source": reference["source"],
                                   "prompt_format": s.reference_prompt_format if batch is not None else None,
                                   "strict_roundtrip": s.reference_strict_roundtrip if batch is not None else None},
                     "chat_template_sha256": facts.chat_template_sha256,
                     "online_check": s.online_check, "cache_dir": str(cache_dir),
                     "diagnose": ({"samples": n_diag, "rounds": s.diagnose_rounds} if s.diagnose else False),
                     "expect_p1": dict(s.expect_p1) or None,
                     "anchors": "every continuation position (offline drafts for all anchors, chain and tree replays)",
                     **({"test_fault": fault} if fault else {})},
        "target": target.info(),
        "versions": versions(),
        "reference": reference,
        "extraction": {"layers": layer_ids, "tokens": ext_tokens, "tokens_per_s": _rate(ext_tokens, ext_time),
                       "cache_hits": ext_hits, "kernel_path": target.kernel_path,
                       "teacher_forced_mismatches": sum(m or 0 for m in tf_mismatch)},
        "drafters": per_drafter,
        "timings": {"load_s": round(load_s, 3), "reference_s": round(reference_s, 3),
                    "extract_s": round(extract_s, 3), "total_s": round(total_s, 3)},
        "samples": {"count": len(sample_lines), "file": "samples.jsonl", "layout": "one line per sample, "
                    "all drafters under 'drafters'"},
    }
    if comparison is not None:
        results["comparison"] = comparison
    if diagnostics is not None:
        results["diagnostics"] = diagnostics
        progress.text(diagnostics["text"])
    if warnings:
        results["warnings"] = list(warnings)
    paths = write_outputs(Path(s.out), results, sample_lines)
    progress.result(**paths, drafters={n: d["metrics"]["tau_macro"] for n, d in per_drafter.items()})
    return results


SERVER_ONLINE_NOTE = ("references came from a serving endpoint: the online loop decodes with this host's target, so "
                      "output_equals_reference says whether local and server greedy decoding agree (a numerics "
                      "question, not a lossless-decoding one), and rounds_identical can hold only where they do")


def _server_references(s: EvalSettings, chosen, tokenizer, stops, cache_dir: Path, progress: Progress, warn):
    from remote_payload.inputs.server_reference import Endpoint, fetch_references

    endpoint = Endpoint(url=s.reference_url, model=s.reference_model, timeout_s=s.reference_timeout,
                        prompt_format=s.reference_prompt_format, concurrency=s.reference_concurrency,
                        retries=s.reference_retries,
                        api_key=os.environ.get(REFERENCE_API_KEY_ENV) or None)
    started = time.perf_counter()
    batch = fetch_references(
        endpoint, chosen, tokenizer, enable_thinking=s.enable_thinking, max_tokens=s.max_new_tokens, stop_ids=stops,
        cache_dir=cache_dir, strict_roundtrip=s.reference_strict_roundtrip,
        on_sample=lambda d, t, r: progress.progress("reference", d, t, unit="samples", message=r.sample_id),
        warn=warn)
    return batch, [r.to_reference() for r in batch.samples], time.perf_counter() - started


def _expected_p1(s: EvalSettings, name: str, ld) -> tuple[float | None, str | None]:
    if name in s.expect_p1:
        return s.expect_p1[name], f"--expect-p1 {name}={s.expect_p1[name]:g}"
    if "*" in s.expect_p1:
        return s.expect_p1["*"], f"--expect-p1 {s.expect_p1['*']:g}"
    meta = ld.source.get("training_metadata") or {}
    if meta.get("expected_p1") is not None:
        return float(meta["expected_p1"]), "training.expected_p1 in the drafter's metadata"
    return None, None


def _online_check(s, name, target, source, refs, chosen, rounds_all, progress, online_generate, sample_tau):
    out = []
    ostage = f"online:{name}"
    progress.stage_start(ostage)
    for i, ref in enumerate(refs):
        res = online_generate(target, source, ref.prompt_ids, s.max_new_tokens)
        same_out = res.continuation == ref.continuation
        same_rounds = [r.as_dict() for r in res.rounds] == [r.as_dict() for r in rounds_all[i]]
        out.append({"output_equals_reference": same_out, "rounds_identical": same_rounds,
                    "tau": sample_tau(res.rounds), "seconds": round(res.seconds, 3),
                    "target_forwards": res.target_forwards})
        progress.progress(ostage, i + 1, len(refs), unit="samples", message=chosen[i].id)
    return out, progress.stage_done(ostage)


def _diagnose_drafter(dd, dg, name, ld, runtime, target, tokenizer, refs, chosen, n_diag, probe_feats, as_run,
                      rounds_all, metrics, expected, expected_from, final_norm, s, findings, warn) -> None:
    """--diagnose for one drafter, while its runtime is bound: facts, embeddings, probes, decoded rounds."""
    new = []
    if not dd.metadata:
        new.append(dg.Finding("info", "no-training-metadata", "no 'training' block in the drafter's config/spec: "
                              "add feature_kernel_path, enable_thinking, chat_template_sha256, expected_p1 so each "
                              "run is checked against the training setup", name))
    embed_rows = int(runtime.embed.weight.shape[0])
    dd.mask, more = dg.mask_facts(name, ld.spec, tokenizer, embed_rows, [r.tokens for r in refs])
    new += more
    dd.embeddings, more = dg.embedding_comparison(name, ld, target)
    new += more
    h = dg.layer_id_heuristic(name, ld.spec, target.config.num_layers)
    if h is not None:
        new.append(h)
    if dd.fc_output.nonfinite or dd.fc_pre_norm.nonfinite:
        new.append(dg.Finding("warning", "nonfinite-fc", f"the fc projection holds {dd.fc_pre_norm.nan} NaN and "
                              f"{dd.fc_pre_norm.inf} inf (after hidden_norm: {dd.fc_output.nan} NaN, "
                              f"{dd.fc_output.inf} inf): overflow in {s.dtype} or broken weights", name))
    samples = [dg.ProbeSample(chosen[i].id, refs[i].tokens, len(refs[i].prompt_ids), probe_feats[i], as_run[i])
               for i in range(n_diag)]
    dd.probes, more = dg.run_probes(name, runtime, samples, num_target_layers=target.config.num_layers,
                                    final_norm=final_norm, tokenizer=tokenizer)
    new += more
    dd.drafts = [dg.decoded_rounds(tokenizer, chosen[i].id, refs[i].tokens, as_run[i], len(refs[i].prompt_ids),
                                   rounds_all[i], s.diagnose_rounds) for i in range(n_diag)]
    pos = metrics.get("per_position") or []
    dd.p1 = {"measured": pos[0].get("p") if pos else None, "expected": expected, "expected_source": expected_from,
             "far_below_ratio": dg.P1_FAR_BELOW}
    for f in new:
        findings.append(f)
        if f.severity == "warning":
            warn(f.line())


def _diagnostics_block(dg, s, chosen, refs, n_diag, hidden_stats, target, diag_drafters, findings, warn) -> dict:
    more = dg.stats_findings(hidden_stats, s.dtype)
    for f in more:
        findings.append(f)
        if f.severity == "warning":
            warn(f.line())
    order = {"warning": 0, "info": 1}
    diag = {
        "samples": [chosen[i].id for i in range(n_diag)],
        "settings": {"samples": n_diag, "rounds": s.diagnose_rounds,
                     "probe_anchors_per_sample": dg.PROBE_ANCHORS_PER_SAMPLE,
                     "rules": {"better_abs": dg.BETTER_ABS, "better_rel": dg.BETTER_REL,
                               "min_positions": dg.MIN_POSITIONS, "agree_ok": dg.AGREE_OK,
                               "p1_far_below": dg.P1_FAR_BELOW}},
        "findings": [f.to_json() for f in sorted(findings, key=lambda f: order.get(f.severity, 2))],
        "codes": dg.FINDING_CODES,
        "hidden_states": {"samples": len(refs), "positions": sum(len(r.tokens) for r in refs),
                          "dtype": s.dtype, "kernel_path": target.kernel_path,
                          "layers": {str(lid): st.to_json() for lid, st in hidden_stats.items()}},
        "drafters": {name: dd.to_json() for name, dd in diag_drafters.items()},
    }
    diag["text"] = dg.render_text(diag)
    return diag

def _rate(tokens: int, seconds: float):
    return round(tokens / seconds, 2) if seconds > 0 else None


def _mean(values):
    values = list(values)
    return sum(values) / len(values) if values else None


def _count(items) -> dict:
    out: dict = {}
    for it in items:
        out[it] = out.get(it, 0) + 1
    return out
