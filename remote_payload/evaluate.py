"""The eval pipeline: inputs checked -> target -> references -> features -> offline eval -> (online) -> results.

Inputs that can be checked without loading the target's weights (drafter checkpoints against the target
config and tokenizer, prompt files) are checked first, so bad inputs fail in seconds.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import kernels
from .errors import PayloadError
from .progress import SILENT, Progress

DEFAULT_MAX_NEW_TOKENS = 512
DEFAULT_TOPK = 8
KEEP_IN_MEMORY_BYTES = 2 * 2**30


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
        from .features import load_cached

        feats, reasons = load_cached(self.paths[i], self.meta[i], self.layer_ids)
        if feats is None:
            raise PayloadError(f"feature cache {self.paths[i]} changed during the run ({'; '.join(reasons)})")
        return feats.layers


def run_eval(s: EvalSettings, progress: Progress = SILENT) -> dict:
    t_start = time.perf_counter()
    if s.max_new_tokens < 1:
        raise PayloadError("--max-new-tokens must be >= 1")
    if s.samples is not None and s.samples < 1:
        raise PayloadError("--samples must be >= 1")
    if s.topk < 1:
        raise PayloadError("--topk must be >= 1")
    if not s.drafters:
        raise PayloadError("give at least one --drafter NAME=PATH")
    unknown_specs = sorted(set(s.drafter_specs) - {n for n, _ in s.drafters})
    if unknown_specs:
        raise PayloadError(f"--drafter-spec for unknown drafter name(s): {', '.join(unknown_specs)}")

    # Device and kernel policy first: nothing from transformers' model code may be imported before it.
    from .target import load_target, load_tokenizer, read_target_config, render_prompt, resolve_device, \
        resolve_dtype, stop_token_ids
    device = resolve_device(s.device)
    kernels.apply_policy(device, s.kernel)
    resolve_dtype(s.dtype, s.allow_fp16)

    import torch

    torch.manual_seed(s.seed)
    from . import checkpoint, prompts as prompts_mod
    from .drafter import DrafterRuntime
    from .features import cache_path, cached_features
    from .metrics import sample_tau, summarize
    from .offline import draft_sample, replay
    from .online import online_generate
    from .reference import cached_reference
    from .results import now_utc, versions, write_outputs

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
    target = load_target(tcfg.path, device=device, dtype=s.dtype, allow_fp16=s.allow_fp16, kernel=s.kernel,
                         progress=progress)
    load_s = progress.stage_done("load")
    cache_dir = Path(s.cache_dir) if s.cache_dir else default_cache_dir()

    def warn(msg):
        progress.warning(msg)

    # ---- references
    progress.stage_start("reference")
    refs, ref_tokens, ref_time, ref_hits = [], 0, 0.0, 0
    for i, p in enumerate(chosen):
        ids = render_prompt(tokenizer, p.message_dicts(), s.enable_thinking)
        ref = cached_reference(target, ids, s.max_new_tokens, cache_dir, warn=warn)
        refs.append(ref)
        if ref.cached:
            ref_hits += 1
        else:
            ref_tokens += len(ref.continuation)
            ref_time += ref.seconds
        progress.progress("reference", i + 1, len(chosen), unit="samples",
                          tokens_per_s=ref_tokens / ref_time if ref_time else None, message=p.id)
    reference_s = progress.stage_done("reference")

    # ---- features
    layer_ids = sorted({lid for ld in loaded.values() for lid in ld.spec.fc_layer_ids})
    progress.stage_start("extract")
    store = _FeatureStore(layer_ids, cache_dir)
    ext_tokens, ext_time, ext_hits, tf_mismatch = 0, 0.0, 0, []
    for i, ref in enumerate(refs):
        feats = cached_features(target, ref.tokens, len(ref.prompt_ids), layer_ids, cache_dir, warn=warn)
        store.add(i, feats, cache_path(cache_dir, target, ref.tokens))
        tf_mismatch.append(feats.teacher_forced_mismatches())
        if feats.cached:
            ext_hits += 1
        else:
            ext_tokens += len(ref.tokens)
            ext_time += feats.seconds
        progress.progress("extract", i + 1, len(refs), unit="samples",
                          tokens_per_s=ext_tokens / ext_time if ext_time else None, message=chosen[i].id)
    extract_s = progress.stage_done("extract")
    if any(m for m in tf_mismatch if m):
        warn(f"{sum(1 for m in tf_mismatch if m)} sample(s) where the target's one-pass argmax differs from its "
             "greedy continuation (near-tied logits); offline and online rounds may differ there")

    # ---- offline evaluation per drafter
    embed, head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    drafter_device = target.input_device
    per_drafter: dict = {}
    per_sample_rounds: dict = {}
    online_per_sample: dict = {}
    for name, ld in loaded.items():
        stage = f"eval:{name}"
        progress.stage_start(stage)
        try:
            runtime = DrafterRuntime(ld, embed, head, device=drafter_device, dtype=target.dtype)
        except PayloadError as exc:
            raise PayloadError(f"drafter '{name}': {exc}") from None
        rounds_all, draft_s, anchors = [], 0.0, 0
        for i, ref in enumerate(refs):
            drafts = draft_sample(runtime, store.get(i), ref.tokens, len(ref.prompt_ids), topk=s.topk)
            rounds_all.append(replay(drafts))
            draft_s += drafts.seconds
            anchors += len(drafts.anchors)
            progress.progress(stage, i + 1, len(refs), unit="samples", message=chosen[i].id,
                              tokens_per_s=anchors * (runtime.block_size) / draft_s if draft_s else None)
        metrics = summarize(rounds_all, runtime.block_size)
        per_sample_rounds[name] = rounds_all
        per_drafter[name] = {"spec": ld.spec.to_json(), "source": ld.source, "metrics": metrics,
                             "online_check": None,
                             "timings": {"eval_s": round(progress.stage_done(stage), 3),
                                         "draft_s": round(draft_s, 3), "anchors": anchors}}
        progress.emit("stage", stage=stage, status="metrics", message=f"{name}: tau_macro "
                      f"{metrics['tau_macro']:.3f}" if metrics["tau_macro"] is not None else f"{name}: no rounds")
        online_by_sample = None
        if s.online_check:
            online_by_sample = []
            ostage = f"online:{name}"
            progress.stage_start(ostage)
            for i, ref in enumerate(refs):
                res = online_generate(target, runtime, ref.prompt_ids, s.max_new_tokens)
                same_out = res.continuation == ref.continuation
                same_rounds = [r.as_dict() for r in res.rounds] == [r.as_dict() for r in rounds_all[i]]
                online_by_sample.append({"output_equals_reference": same_out, "rounds_identical": same_rounds,
                                         "tau": sample_tau(res.rounds), "seconds": round(res.seconds, 3),
                                         "target_forwards": res.target_forwards})
                progress.progress(ostage, i + 1, len(refs), unit="samples", message=chosen[i].id)
            online_s = progress.stage_done(ostage)
            bad = [chosen[i].id for i, o in enumerate(online_by_sample)
                   if not (o["output_equals_reference"] and o["rounds_identical"])]
            per_drafter[name]["online_check"] = {
                "samples": len(online_by_sample),
                "all_outputs_equal_reference": all(o["output_equals_reference"] for o in online_by_sample),
                "all_rounds_identical": all(o["rounds_identical"] for o in online_by_sample),
                "mismatched_samples": bad,
                "tau_macro_online": _mean(o["tau"] for o in online_by_sample if o["tau"] is not None),
                "seconds": round(online_s, 3)}
            per_drafter[name]["timings"]["online_s"] = round(online_s, 3)
            if bad:
                warn(f"online check for '{name}': {len(bad)} sample(s) differ from the offline path: "
                     f"{', '.join(bad[:5])}")
        online_per_sample[name] = online_by_sample
        del runtime

    # ---- outputs
    sample_lines = []
    for i, (p, ref) in enumerate(zip(chosen, refs)):
        line = {"index": p.index, "id": p.id, "category": p.category, "prompt_tokens": len(ref.prompt_ids),
                "continuation_tokens": len(ref.continuation), "stop_reason": ref.stop_reason,
                "reference_cached": ref.cached, "teacher_forced_mismatches": tf_mismatch[i],
                "continuation_text": tokenizer.decode(ref.continuation), "drafters": {}}
        for name in loaded:
            rounds = per_sample_rounds[name][i]
            entry = {"tau": sample_tau(rounds), "rounds": len(rounds),
                     "anchors": [r.anchor for r in rounds], "accepted": [r.accepted for r in rounds],
                     "produced": [r.produced for r in rounds]}
            if online_per_sample[name] is not None:
                entry["online"] = online_per_sample[name][i]
            line["drafters"][name] = entry
        sample_lines.append(line)
    total_s = time.perf_counter() - t_start
    results = {
        "status": "ok",
        "created_utc": now_utc(),
        "settings": {"enable_thinking": s.enable_thinking, "max_new_tokens": s.max_new_tokens,
                     "prompts": prompt_info, "samples_requested": s.samples,
                     "samples": len(chosen), "sample_ids": [p.id for p in chosen],
                     "shard": {"index": s.shard[0], "count": s.shard[1]}, "dtype": s.dtype, "device": device,
                     "kernel_requested": s.kernel, "seed": s.seed, "draft_topk": s.topk,
                     "online_check": s.online_check, "cache_dir": str(cache_dir),
                     "anchors": "every continuation position (offline drafts for all anchors, chain replay)"},
        "target": target.info(),
        "versions": versions(),
        "reference": {"tokens_generated": ref_tokens, "tokens_per_s": _rate(ref_tokens, ref_time),
                      "cache_hits": ref_hits, "stop_reasons": _count(r.stop_reason for r in refs)},
        "extraction": {"layers": layer_ids, "tokens": ext_tokens, "tokens_per_s": _rate(ext_tokens, ext_time),
                       "cache_hits": ext_hits, "kernel_path": target.kernel_path,
                       "teacher_forced_mismatches": sum(m or 0 for m in tf_mismatch)},
        "drafters": per_drafter,
        "timings": {"load_s": round(load_s, 3), "reference_s": round(reference_s, 3),
                    "extract_s": round(extract_s, 3), "total_s": round(total_s, 3)},
        "samples": {"count": len(sample_lines), "file": "samples.jsonl", "layout": "one line per sample, "
                    "all drafters under 'drafters'"},
    }
    paths = write_outputs(Path(s.out), results, sample_lines)
    progress.result(**paths, drafters={n: d["metrics"]["tau_macro"] for n, d in per_drafter.items()})
    return results


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
