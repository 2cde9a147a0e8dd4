"""The outputs of one `eval` run: ``samples.jsonl`` lines and the ``results.json`` document (schema
``dfo.results/1``, described in the payload README)."""

from __future__ import annotations

import time
from collections import Counter

from remote_payload.eval import protocols
from remote_payload.eval.context import EvalContext
from remote_payload.metrics.aggregate import BY_DATASET_NOTE, dataset_breakdown, thinking_breakdown
from remote_payload.metrics.chain import sample_tau
from remote_payload.metrics.compare import compare_drafters
from remote_payload.metrics.depth import by_context_depth
from remote_payload.metrics.sampled import ESTIMATOR, sampled_figures
from remote_payload.metrics.sampled_rule import DESCRIPTIONS
from remote_payload.results import now_utc, versions

ANCHORS = "every continuation position (offline drafts for all anchors, chain and tree replays)"
SAMPLES_LAYOUT = "one line per sample, all drafters under 'drafters'"
SAMPLED_NOTE = ("at T > 0 every sample is one draw (samples_per_prompt per prompt) and each figure above is the mean "
                "over the draws; metrics.sampled holds them with CIs over prompts and draws. " + ESTIMATOR)


def sampling_block(s) -> dict:
    """``settings.sampling`` (T > 0): the law, the draws per prompt and how their seeds are made."""
    return {**s.sampling.as_json(), "samples_per_prompt": s.samples_per_prompt, "seed": s.seed,
            "draft_rule": s.rule, "draft_rule_meaning": DESCRIPTIONS[s.rule],
            "draw_seed": "sha256 of (--seed, draw number, purpose, sha256 of the prompt tokens), 31 bits",
            "sampler": "softmax(logits / T), top-k then top-p, one multinomial draw per token (CPU float32)"}


def sample_lines(ctx: EvalContext) -> list[dict]:
    """One line per sample: its reference and, per drafter, its rounds (enough to recompute every metric)."""
    refs = ctx.references
    ex = ctx.extraction
    lines = []
    for i, (p, ref) in enumerate(zip(ctx.prompts, refs.refs, strict=True)):
        line = {"index": p.index, "id": p.id, "category": p.category,
                **({"dataset": p.dataset, "row_id": p.row_id, "turn": p.turn} if p.dataset is not None else {}),
                **(ctx.draws[i].entry() if ctx.draws else {}),  # T > 0: which draw of which prompt, its seed
                **({"thinking": p.thinking, "thinking_pair": p.paired} if p.thinking is not None else {}),
                **({"depth_target": p.depth} if p.depth is not None else {}),
                "prompt_tokens": len(ref.prompt_ids),
                "continuation_tokens": len(ref.continuation), "stop_reason": ref.stop_reason,
                "tail_tokens": len(ref.tail) if ref.tail is not None else None,
                "reference_cached": ref.cached, "teacher_forced_mismatches": ex.teacher_forced_mismatches[i],
                "continuation_text": ctx.tokenizer.decode(ref.continuation),
                "reference": refs.batch.samples[i].to_json() if refs.from_server else
                {"source": "local", "cached": ref.cached, "seconds": round(ref.seconds, 3)},
                "drafters": {}}
        for name, run in ctx.results.items():
            rounds = run.rounds[i]
            entry = {"tau": sample_tau(rounds), "rounds": len(rounds),
                     "anchors": [r.anchor for r in rounds], "accepted": [r.accepted for r in rounds],
                     "produced": [r.produced for r in rounds],
                     "tree": run.trees[i].entry() if run.trees is not None else None}
            if run.sampled_rule is not None:  # expectations given the continuation; "tau" is the sampled rule's
                entry["greedy_rule_tau"] = entry["tau"]
                entry["sampled_rule"] = run.sampled_rule[i]
                entry["tau"] = run.sampled_rule[i]["tau"]
            if run.conventions is not None:
                entry["conventions"] = run.conventions[i]
            if run.online is not None:
                entry["online"] = run.online[i]
            if run.by_k is not None:
                entry["by_k"] = run.by_k[i]
            line["drafters"][name] = entry
        lines.append(line)
    return lines


def comparison(ctx: EvalContext, lines: list[dict]) -> dict | None:
    """With two or more drafters: each against the first, with bootstrap CIs over samples."""
    if len(ctx.results) < 2:
        return None
    return compare_drafters(lines, list(ctx.results), seed=ctx.settings.seed,
                            block_sizes={n: r.summary["metrics"]["block_size"] for n, r in ctx.results.items()},
                            tree_not_defined=[n for n, r in ctx.results.items()
                                              if "not_defined" in (r.summary["metrics"].get("tree") or {})])


def results_document(ctx: EvalContext, lines: list[dict], comparison: dict | None, diagnostics: dict | None) -> dict:
    refs, ex, t = ctx.references, ctx.extraction, ctx.timings
    reference = {"source": "server" if refs.from_server else "local", "tokens_generated": refs.tokens,
                 "tokens_per_s": _rate(refs.tokens, refs.seconds), "cache_hits": refs.cache_hits,
                 "stop_reasons": dict(Counter(r.stop_reason for r in refs.refs))}
    if refs.decode:
        reference["decode"] = refs.decode
    if refs.from_server:
        reference["server"] = refs.batch.summary()
    total_s = time.perf_counter() - ctx.started
    results = {
        "status": "ok",
        "created_utc": now_utc(),
        "settings": _settings_block(ctx, reference["source"]),
        "target": ctx.target.info(),
        "versions": versions(),
        "reference": reference,
        "extraction": {"layers": ex.layer_ids, "tokens": ex.tokens, "tokens_per_s": _rate(ex.tokens, ex.seconds),
                       "cache_hits": ex.cache_hits, "kernel_path": ctx.target.kernel_path,
                       "teacher_forced_mismatches": sum(m or 0 for m in ex.teacher_forced_mismatches),
                       "feature_bytes_per_token": ex.bytes_per_token,
                       "feature_bytes": ex.bytes_per_token * sum(len(r.tokens) for r in refs.refs),
                       **ex.memory, "cache": ex.cache or None},
        "drafters": {name: run.summary for name, run in ctx.results.items()},
        "timings": {"load_s": round(t["load_s"], 3), "reference_s": round(t["reference_s"], 3),
                    "extract_s": round(t["extract_s"], 3), "total_s": round(total_s, 3)},
        "samples": {"count": len(lines), "file": "samples.jsonl", "layout": SAMPLES_LAYOUT},
    }
    s = ctx.settings
    for name in ctx.results:
        metrics = results["drafters"][name]["metrics"]
        by_dataset = dataset_breakdown(lines, name, seed=s.seed)
        if by_dataset is not None:
            metrics["by_dataset"] = by_dataset
            metrics["definitions"] = {**(metrics.get("definitions") or {}), "by_dataset": BY_DATASET_NOTE}
        by_thinking = thinking_breakdown(lines, name, seed=s.seed)
        if by_thinking is not None:
            metrics["by_thinking"] = by_thinking
        metrics["by_context_depth"] = by_context_depth(lines, name, seed=s.seed,
                                                       rule=s.rule if s.sampled else "greedy")
        if s.sampled:
            metrics["sampled"] = sampled_figures(lines, name, metrics["block_size"], sampling=sampling_block(s),
                                                 seed=s.seed)
            metrics["definitions"] = {**(metrics.get("definitions") or {}), "sampled": SAMPLED_NOTE}
    if comparison is not None:
        results["comparison"] = comparison
    if diagnostics is not None:
        results["diagnostics"] = diagnostics
    if ctx.warnings:
        results["warnings"] = list(ctx.warnings)
    return results


def _settings_block(ctx: EvalContext, reference_source: str) -> dict:
    s, server = ctx.settings, ctx.references.from_server
    return {"enable_thinking": s.enable_thinking, "max_new_tokens": s.max_new_tokens,
            "prompts": ctx.prompt_info, "samples_requested": s.samples,
            **({"datasets": ctx.datasets, "suite": s.suite} if ctx.datasets else {}),
            "samples": len(ctx.prompts), "sample_ids": [p.id for p in ctx.prompts],
            "shard": {"index": s.shard[0], "count": s.shard[1]}, "dtype": s.dtype, "device": ctx.device,
            "kernel_requested": s.kernel, "seed": s.seed, "draft_topk": s.draft_topk,
            "tree": {"k": s.tree_k, "budget": s.tree_budget, "K": s.tree_K},
            "reference": {"source": reference_source,
                          "prompt_format": s.reference_prompt_format if server else None,
                          "strict_roundtrip": s.reference_strict_roundtrip if server else None},
            "chat_template_sha256": ctx.run_facts.chat_template_sha256,
            "online_check": s.online_check, "cache_dir": str(ctx.cache_dir), "draft_rule": s.rule,
            "decode_batch": s.decode_batch if not server else None,
            "selection": s.selection if ctx.datasets else None,
            **({"protocol": protocols.record(s.protocol)} if s.protocol else {}),
            "diagnose": ({"samples": ctx.diagnosed_samples, "rounds": s.diagnose_rounds} if s.diagnose else False),
            "expect_p1": dict(s.expect_p1) or None,
            **({"sampling": sampling_block(s)} if s.sampled else {}),
            "anchors": ANCHORS,
            **({"test_fault": ctx.fault} if ctx.fault else {})}


def _rate(tokens: int, seconds: float):
    return round(tokens / seconds, 2) if seconds > 0 else None
