"""Per drafter: one batched draft pass per sample feeding the chain τ and the tree metrics, the p1 check,
``--diagnose`` (``diagnosis.py``) and the optional online check (the ``eval:NAME`` / ``online:NAME`` stages)."""

from __future__ import annotations

import time

from remote_payload.diagnose.findings import p1_check
from remote_payload.diagnose.report import DrafterDiagnostics
from remote_payload.errors import PayloadError
from remote_payload.eval.context import DrafterRun, EvalContext
from remote_payload.eval.diagnosis import diagnose_drafter
from remote_payload.eval.offline import draft_sample, replay
from remote_payload.eval.online import online_generate
from remote_payload.eval.sampled_rule import sample_entry
from remote_payload.metrics import conventions as conv
from remote_payload.metrics.by_k import sample_record, summarize_by_k
from remote_payload.metrics.chain import sample_tau, summarize
from remote_payload.metrics.sampled_rule import DESCRIPTIONS, GREEDY_WALKS, rule_summary
from remote_payload.metrics.tree import sample_tree_rounds, tree_summary
from remote_payload.models.drafter import DrafterRuntime

# What results say in place of the tree figures of a DFlash2 drafter. z-lab defines no tree over the selector's
# candidates (its loop drafts one walked chain per block); DDTree's tree over independent per-slot top-k does not
# describe a drafter whose slot law depends on the previous draft, so dfo reports no figure rather than a wrong one.
TREE_NOT_DEFINED = ("DDTree is not defined for DFlash2: its candidate selector makes each slot's candidates depend "
                    "on the previous draft, and no tree over the selector's candidates is defined (z-lab drafts one "
                    "walked chain per block); dfo reports no tree figures for this drafter")

SERVER_ONLINE_NOTE = ("references came from a serving endpoint: the online loop decodes with this host's target, so "
                      "output_equals_reference says whether local and server greedy decoding agree (a numerics "
                      "question, not a lossless-decoding one), and rounds_identical can hold only where they do")


class MaskFilledSlot0:
    """Test-only planted fault (``$DFO_PAYLOAD_TEST_FAULT=slot0-mask``): drafts like a harness that fills block
    slot 0 with the mask token, so tests can check that ``--diagnose`` flags pitfall 2."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    def draft(self, ctx, tokens, anchors, topk: int = 1, block: int | None = None):
        return self._runtime.draft(ctx, tokens, anchors, topk=topk, slot0="mask", block=block)


def evaluate_drafter(ctx: EvalContext, name: str) -> DrafterRun:
    """The ``eval:NAME`` stage (and ``online:NAME``): fills ``ctx.results[name]``."""
    ld, progress = ctx.drafters[name], ctx.progress
    stage = f"eval:{name}"
    progress.stage_start(stage)
    model = ctx.target.model
    try:
        runtime = DrafterRuntime(ld, model.get_input_embeddings(), model.get_output_embeddings(),
                                 device=ctx.target.input_device, dtype=ctx.target.dtype)
    except PayloadError as exc:
        raise PayloadError(f"drafter '{name}': {exc}") from None
    source = MaskFilledSlot0(runtime) if ctx.fault == "slot0-mask" else runtime
    run, as_run = _draft_all(ctx, name, runtime, source)
    ctx.results[name] = run
    run.expected_p1 = expected_p1(ctx, name)
    finding = p1_check(name, run.summary["metrics"], *run.expected_p1)
    if finding is not None:
        ctx.add_findings([finding], warn_all=True)
    if run.diagnostics is not None:
        t0 = time.perf_counter()
        diagnose_drafter(ctx, name, runtime, as_run)
        run.summary["timings"]["diagnose_s"] = round(time.perf_counter() - t0, 3)
    run.summary["timings"]["eval_s"] = round(progress.stage_done(stage), 3)
    metrics = run.summary["metrics"]
    april = metrics["conventions"]["zlab-2604"].get("tau_macro")
    rule = f", {metrics['draft_rule']} rule" if ctx.settings.sampled else ""
    april_rule = " (greedy rule)" if rule == ", sampled rule" else ""  # the zlab-2604 count walks the greedy drafts
    headline = (f"{name}: tau_macro (committed = zlab{rule}) {metrics['tau_macro']:.3f}"
                + (f", zlab-2604{april_rule} {april:.3f}" if april is not None else "")
                + (f", DDTree-{ctx.settings.tree_k} {metrics['tree']['topk']['tau_macro']:.3f}"
                   if "topk" in metrics["tree"] else ", DDTree not defined for DFlash2")
                ) if metrics["tau_macro"] is not None else f"{name}: no rounds"
    progress.emit("stage", stage=stage, status="metrics", message=headline)
    if ctx.settings.online_check:
        if ctx.settings.sampled:  # T > 0: the expectations must agree, not the draws (eval/sampled_check.py)
            from remote_payload.eval.sampled_check import sampled_online_check

            sampled_online_check(ctx, name, source)
        else:
            online_check(ctx, name, source)
    return run


def topk_above_selector(spec, name: str, topk: int) -> str | None:
    """The warning for ``--topk`` above a DFlash2 drafter's selector K (None: nothing to say)."""
    if spec.dflash2 is None or topk <= spec.dflash2.selector_top_k:
        return None
    k = spec.dflash2.selector_top_k
    return (f"--topk {topk}: drafter '{name}' is DFlash2, its selector walks the top {k} candidates of each slot, so "
            f"ranks {k + 1}..{topk} do not exist for it (kept as id -1, never a match); its figures use rank 1 only "
            "and are unaffected")


def _draft_all(ctx: EvalContext, name: str, runtime, source) -> tuple[DrafterRun, dict]:
    """Draft every anchor of every sample, replay chain and tree rounds; returns the run and, for the diagnosed
    samples, the top-1 drafts as the eval used them."""
    s, refs, stage = ctx.settings, ctx.references.refs, f"eval:{name}"
    ld = ctx.drafters[name]
    note = topk_above_selector(ld.spec, name, s.topk)
    if note is not None:
        ctx.warn(note)
    dd = DrafterDiagnostics(name, ld.spec, metadata=ld.source.get("training_metadata")) if s.diagnose else None
    rounds_all: list = []
    by_k: list = []
    trees: list = []
    as_run: dict = {}
    draft_s, tree_s, anchors = 0.0, 0.0, 0
    unavailable = ctx.references.tail_unavailable or (
        None if all(r.tail is not None for r in refs) else "the references carry no tokens past the stop")
    ends: list | None = [] if unavailable is None else None
    by_rule: list | None = [] if s.rule == "sampled" else None
    rule_s, replan_s = 0.0, 0.0
    for i, ref in enumerate(refs):
        feats = ctx.extraction.store.get(i)
        drafts = draft_sample(source, feats, ref.tokens, len(ref.prompt_ids), topk=s.draft_topk,
                              end=ends is not None and conv.anchors_at_last_token(
                                  len(ref.tokens) - len(ref.prompt_ids), ref.stop_reason), replan=True)
        rounds_all.append(replay(drafts))
        by_k.append(sample_record(_sample_end(ctx, ref, drafts), drafts.drafts_at_k, runtime.block_size))
        replan_s += drafts.replan_seconds
        if by_rule is not None:  # τ under the sampled rule, exact given this continuation (eval/sampled_rule.py)
            t0 = time.perf_counter()
            by_rule.append(sample_entry(ctx.target, source, feats, ref.tokens, len(ref.prompt_ids), s.sampling,
                                        f"sample {ctx.prompts[i].id}, drafter '{name}'"))
            rule_s += time.perf_counter() - t0
        if ends is not None:
            ends.append(_convention_rounds(ctx, ref, drafts, runtime.block_size))
        if runtime.spec.dflash2 is None:  # DDTree is not defined over a selector's walk (TREE_NOT_DEFINED)
            t0 = time.perf_counter()
            trees.append(sample_tree_rounds(drafts, k=s.tree_k, budget=s.tree_budget, K=s.tree_K))
            tree_s += time.perf_counter() - t0
        draft_s += drafts.seconds
        anchors += len(drafts.anchors)
        if dd is not None:
            dd.add_fc(runtime, feats)
            if i < ctx.diagnosed_samples:
                as_run[i] = drafts.topk_ids[:, :, 0].clone()
        ctx.progress.progress(stage, i + 1, len(refs), unit="samples", message=ctx.prompts[i].id,
                              tokens_per_s=anchors * runtime.block_size / draft_s if draft_s else None)
    metrics = summarize(rounds_all, runtime.block_size)
    if by_rule is not None:  # the headline follows the sampled rule; the replay's figures stay beside it
        greedy = {k: metrics[k] for k in ("tau_macro", "tau_micro", "mean_accepted", "per_position", "tau_histogram")}
        metrics.update(rule_summary(by_rule, runtime.block_size), greedy_rule=greedy)
        metrics["definitions"] = {**metrics["definitions"], "draft_rule": DESCRIPTIONS["sampled"] + "; " + GREEDY_WALKS}
    metrics["draft_rule"] = s.rule
    metrics["conventions"] = conv.summaries(
        rounds_all, [z for z, _ in ends] if ends is not None else None,
        [v for _, v in ends] if ends is not None else None, runtime.block_size,
        exact=all(len(ref.tail or []) >= runtime.block_size - 1 for ref in refs),
        unavailable=unavailable)
    metrics["accept_length_by_k"] = summarize_by_k(
        by_k, runtime.block_size, exact=all(len(ref.tail or []) >= runtime.block_size - 1 for ref in refs))
    if runtime.spec.dflash2 is None:
        metrics["tree"] = tree_summary([t.topk for t in trees], [t.budgeted for t in trees],
                                       block_size=runtime.block_size, k=s.tree_k, budget=s.tree_budget, K=s.tree_K)
    else:
        metrics["tree"] = {"not_defined": TREE_NOT_DEFINED}
    summary = {"spec": ld.spec.to_json(), "source": ld.source, "metrics": metrics, "online_check": None,
               "timings": {"eval_s": None, "draft_s": round(draft_s, 3), "tree_s": round(tree_s, 3),
                           "by_k_draft_s": round(replan_s, 3),
                           "anchors": anchors, **({"sampled_rule_s": round(rule_s, 3)} if by_rule is not None else {})}}
    records = [{"zlab-2604": conv.record(z), "vllm": conv.record(v)} for z, v in ends] if ends is not None else None
    return DrafterRun(summary=summary, rounds=rounds_all, trees=trees or None, diagnostics=dd, conventions=records,
                      sampled_rule=by_rule, by_k=by_k), as_run


def _sample_end(ctx: EvalContext, ref, drafts) -> conv.SampleEnd:
    """The sample with the target's tokens past the stop (none where they are unknown: counts there are lower
    bounds) and the full block's drafts."""
    return conv.SampleEnd(tokens=ref.tokens + list(ref.tail or []), prompt_len=len(ref.prompt_ids),
                          kept=len(ref.tokens), max_new=ctx.settings.max_new_tokens,
                          stop_ids=frozenset(ctx.target.stop_ids), drafts_at=drafts.top1)


def _convention_rounds(ctx: EvalContext, ref, drafts, block_size: int) -> tuple[list, list]:
    """This sample's rounds in the zlab-2604 and vllm conventions (the committed ones are the chain replay's)."""
    end = _sample_end(ctx, ref, drafts)
    return conv.zlab_2604_rounds(end, block_size), conv.vllm_rounds(end, block_size)


def expected_p1(ctx: EvalContext, name: str) -> tuple[float | None, str | None]:
    """The position-1 acceptance this drafter should reach, and where that figure comes from."""
    expect = ctx.settings.expect_p1
    if name in expect:
        return expect[name], f"--expect-p1 {name}={expect[name]:g}"
    if "*" in expect:
        return expect["*"], f"--expect-p1 {expect['*']:g}"
    meta = ctx.drafters[name].source.get("training_metadata") or {}
    if meta.get("expected_p1") is not None:
        return float(meta["expected_p1"]), "training.expected_p1 in the drafter's metadata"
    return None, None


def online_check(ctx: EvalContext, name: str, source) -> None:
    """The ``online:NAME`` stage: the real draft-verify loop must give the offline rounds and the reference."""
    run, refs, progress = ctx.results[name], ctx.references.refs, ctx.progress
    ostage = f"online:{name}"
    progress.stage_start(ostage)
    out = []
    for i, ref in enumerate(refs):
        res = online_generate(ctx.target, source, ref.prompt_ids, ctx.settings.max_new_tokens)
        same_rounds = [r.as_dict() for r in res.rounds] == [r.as_dict() for r in run.rounds[i]]
        out.append({"output_equals_reference": res.continuation == ref.continuation, "rounds_identical": same_rounds,
                    "tau": sample_tau(res.rounds), "seconds": round(res.seconds, 3),
                    "target_forwards": res.target_forwards})
        progress.progress(ostage, i + 1, len(refs), unit="samples", message=ctx.prompts[i].id)
    online_s = progress.stage_done(ostage)
    run.online = out
    server = ctx.references.from_server
    bad = [ctx.prompts[i].id for i, o in enumerate(out) if not (o["output_equals_reference"] and o["rounds_identical"])]
    taus = [o["tau"] for o in out if o["tau"] is not None]
    run.summary["online_check"] = {
        "samples": len(out),
        "all_outputs_equal_reference": all(o["output_equals_reference"] for o in out),
        "all_rounds_identical": all(o["rounds_identical"] for o in out),
        "mismatched_samples": bad,
        "tau_macro_online": sum(taus) / len(taus) if taus else None,
        "seconds": round(online_s, 3),
        "reference_source": "server" if server else "local"}
    if server:
        run.summary["online_check"]["note"] = SERVER_ONLINE_NOTE
    run.summary["timings"]["online_s"] = round(online_s, 3)
    if bad and server:
        ctx.warn(f"online check for '{name}': {len(bad)} sample(s) where the local online loop's output or rounds "
                 f"differ from the server's reference ({', '.join(bad[:5])}): local and server greedy decoding "
                 "disagree there (numerics), which is not by itself a lossless-decoding failure")
    elif bad:
        ctx.warn(f"online check for '{name}': {len(bad)} sample(s) differ from the offline path: {', '.join(bad[:5])}")
