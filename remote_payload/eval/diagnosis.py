"""``--diagnose`` inside the eval: per drafter while its runtime is bound (facts, embeddings, probes, decoded
rounds), then the run's ``diagnostics`` block. The checks themselves live in ``remote_payload.diagnose``."""

from __future__ import annotations

from remote_payload.diagnose import probes, report, tensors
from remote_payload.diagnose.findings import (
    AGREE_OK,
    BETTER_ABS,
    BETTER_REL,
    FINDING_CODES,
    MIN_POSITIONS,
    P1_FAR_BELOW,
    PROBE_ANCHORS_PER_SAMPLE,
    Finding,
    layer_id_heuristic,
    mask_facts,
)
from remote_payload.eval.context import EvalContext


def diagnose_drafter(ctx: EvalContext, name: str, runtime, as_run: dict) -> None:
    """Fills ``ctx.results[name].diagnostics``; ``as_run``: diagnosed sample -> the eval's top-1 drafts."""
    run, ld, target, tok = ctx.results[name], ctx.drafters[name], ctx.target, ctx.tokenizer
    refs, dd, n_diag = ctx.references.refs, ctx.results[name].diagnostics, ctx.diagnosed_samples
    new = []
    if not dd.metadata:
        new.append(Finding("info", "no-training-metadata", "no 'training' block in the drafter's config/spec: "
                                 "add feature_kernel_path, enable_thinking, chat_template_sha256, expected_p1 so "
                                 "each run is checked against the training setup", name))
    embed_rows = int(runtime.embed.weight.shape[0])
    dd.mask, more = mask_facts(name, ld.spec, tok, embed_rows, [r.tokens for r in refs])
    new += more
    dd.embeddings, more = tensors.embedding_comparison(name, ld, target)
    new += more
    h = layer_id_heuristic(name, ld.spec, target.config.num_layers)
    if h is not None:
        new.append(h)
    if dd.fc_output.nonfinite or dd.fc_pre_norm.nonfinite:
        new.append(Finding("warning", "nonfinite-fc", f"the fc projection holds {dd.fc_pre_norm.nan} NaN and "
                                 f"{dd.fc_pre_norm.inf} inf (after hidden_norm: {dd.fc_output.nan} NaN, "
                                 f"{dd.fc_output.inf} inf): overflow in {ctx.settings.dtype} or broken weights", name))
    samples = [probes.ProbeSample(ctx.prompts[i].id, refs[i].tokens, len(refs[i].prompt_ids),
                                  ctx.extraction.probe_features[i], as_run[i]) for i in range(n_diag)]
    final_norm = getattr(target.model.get_decoder(), "norm", None)
    dd.probes, more = probes.run_probes(name, runtime, samples, num_target_layers=target.config.num_layers,
                                        final_norm=final_norm, tokenizer=tok)
    new += more
    dd.drafts = [report.decoded_rounds(tok, smp, run.rounds[i], ctx.settings.diagnose_rounds)
                 for i, smp in enumerate(samples)]
    expected, expected_from = run.expected_p1
    pos = run.summary["metrics"].get("per_position") or []
    dd.p1 = {"measured": pos[0].get("p") if pos else None, "expected": expected, "expected_source": expected_from,
             "far_below_ratio": P1_FAR_BELOW}
    ctx.add_findings(new)


def diagnostics_block(ctx: EvalContext) -> dict:
    """``results.diagnostics``: settings, every finding (warnings first), hidden-state statistics, per drafter."""
    s, refs, n_diag = ctx.settings, ctx.references.refs, ctx.diagnosed_samples
    ctx.add_findings(tensors.stats_findings(ctx.extraction.hidden_stats, s.dtype))
    order = {"warning": 0, "info": 1}
    diag = {
        "samples": [ctx.prompts[i].id for i in range(n_diag)],
        "settings": {"samples": n_diag, "rounds": s.diagnose_rounds,
                     "probe_anchors_per_sample": PROBE_ANCHORS_PER_SAMPLE,
                     "rules": {"better_abs": BETTER_ABS, "better_rel": BETTER_REL,
                               "min_positions": MIN_POSITIONS, "agree_ok": AGREE_OK,
                               "p1_far_below": P1_FAR_BELOW}},
        "findings": [f.to_json() for f in sorted(ctx.findings, key=lambda f: order.get(f.severity, 2))],
        "codes": FINDING_CODES,
        "hidden_states": {"samples": len(refs), "positions": sum(len(r.tokens) for r in refs),
                          "dtype": s.dtype, "kernel_path": ctx.target.kernel_path,
                          "layers": {str(lid): st.to_json() for lid, st in ctx.extraction.hidden_stats.items()}},
        "drafters": {name: run.diagnostics.to_json() for name, run in ctx.results.items()
                     if run.diagnostics is not None},
    }
    diag["text"] = report.render_text(diag)
    return diag
