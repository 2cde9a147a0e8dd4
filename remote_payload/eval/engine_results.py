"""The blocks the engine stages record from a drafter's timed run: ``drafters[NAME].engine`` (per sample and in
total at the lowest concurrency level, outputs at every level, the speedup table, the agreement with the offline
figures in the ``vllm`` convention, at T > 0 the agreement of expectations and the engine's draft rule), the
warnings they call for, and each sample line's engine entry (samples.jsonl).
"""

from __future__ import annotations

from remote_payload.engines.run import speedup_table
from remote_payload.eval.context import EvalContext
from remote_payload.eval.engine_setup import EngineRun, _engine
from remote_payload.metrics import engine_agreement
from remote_payload.metrics.sampled import sampled_engine_agreement

CONVENTION = "vllm"


# ------------------------------------------------------------------------------------------- figures


def offline_rounds(ctx: EvalContext, name: str) -> tuple[list[list[int]], str]:
    """Offline accepted drafts per round in the ``vllm`` convention, and where they come from.

    The conventions stage records them per sample (``DrafterRun.conventions[i]["vllm"]``); without it, the
    committed rounds are the same rounds with the last one capped at the kept tokens (a lower bound there).
    """
    run = ctx.results[name]
    conv = getattr(run, "conventions", None)
    if conv and all(isinstance(c, dict) and isinstance(c.get(CONVENTION), dict) for c in conv):
        return [list(c[CONVENTION]["accepted"]) for c in conv], CONVENTION
    return [[r.accepted for r in rs] for rs in run.rounds], \
        "committed (the vllm convention's rounds; the last round capped at the kept tokens, a lower bound there)"


def _sample(rec: dict, positions: int) -> dict:
    """One request's figures as the agreement rule and samples.jsonl take them (per_step where the engine
    reports it)."""
    spec = rec.get("spec") or {}
    counts = (list(spec.get("per_position_counts") or []) + [0] * positions)[:positions]
    rounds, acc = spec.get("rounds", 0), spec.get("drafts_accepted", 0)
    out = {"id": rec["id"], "rounds": rounds, "drafts_accepted": acc, "drafts_proposed": spec.get("drafts_proposed"),
           "per_position_counts": counts, "tau": 1 + acc / rounds if rounds else None, "tokens": rec["tokens"],
           "seconds": rec["seconds"], "tokens_per_s": rec["tokens_per_s"], "tpot_ms": rec.get("tpot_ms"),
           "finish_reason": rec["finish_reason"], "matches_reference": rec.get("matches_reference"),
           "first_difference": rec.get("first_difference")}
    if "per_step" in spec:
        out["per_step"] = list(spec["per_step"])
    return out


def drafter_block(ctx: EvalContext, eng: EngineRun, name: str, run: dict) -> dict:
    """``drafters[NAME].engine``: per sample and total figures (the lowest level), outputs at every level, the
    speedup table, the counter cross-check, the agreement with offline and the per-step comparison."""
    positions = ctx.drafters[name].spec.block_size - 1
    lowest = run["levels"][0]
    samples = [_sample(rec, positions) for rec in lowest["samples"]]
    offline, source = offline_rounds(ctx, name)
    kept = [i for i, smp in enumerate(samples) if smp["matches_reference"]]
    agreement = engine_agreement.compare([samples[i]["id"] for i in kept], [samples[i] for i in kept],
                                         [offline[i] for i in kept], positions)
    agreement.update(convention=CONVENTION, offline_source=source,
                     left_out=[smp["id"] for smp in samples if not smp["matches_reference"]],
                     per_step=engine_agreement.per_step_differences(
                         [samples[i]["id"] for i in kept], [samples[i].get("per_step") for i in kept],
                         [offline[i] for i in kept]))
    plain_levels = (eng.plain or {}).get("levels", [])
    table = speedup_table(plain_levels, run["levels"])
    low = table[0]
    return {"engine": _engine(ctx).name, "num_speculative_tokens": positions,
            "concurrency_measured": lowest["concurrency"], "samples": samples,
            "total": engine_agreement.engine_figures(samples, positions),
            "outputs": {"samples": len(samples), "match_reference": sum(1 for x in samples if x["matches_reference"]),
                        "mismatches": lowest["reference_mismatches"], "equal_plain": low["equal_plain"],
                        "mismatches_by_concurrency": {str(r["concurrency"]): r["reference_mismatches"]["dflash"]
                                                      for r in table}},
            "tokens_per_s": {"plain": low["plain_tokens_per_s"], "dflash": low["dflash_tokens_per_s"],
                             "speedup": low["speedup"]},
            "concurrency": table, "counter_check": run.get("counter_check"), "agreement": agreement}


def sampled_drafter_block(ctx: EvalContext, eng: EngineRun, name: str, run: dict, greedy: dict | None) -> dict:
    """``drafters[NAME].engine`` at T > 0: per request figures, the speedup table, and the agreement of the
    engine's expected τ with the offline one (or the engine's limitation, named)."""
    s = ctx.settings
    positions = ctx.drafters[name].spec.block_size - 1
    lowest = run["levels"][0]
    samples = [_sample(rec, positions) for rec in lowest["samples"]]
    offline, source = offline_rounds(ctx, name)
    agreement = sampled_engine_agreement(offline, samples, [d.prompt_index for d in ctx.draws],
                                         title=_engine(ctx).title, law=s.sampling.label(), device=ctx.device,
                                         greedy=greedy)
    agreement["offline_source"] = source
    table = speedup_table((eng.plain or {}).get("levels", []), run["levels"])
    low = table[0]
    return {"engine": _engine(ctx).name, "num_speculative_tokens": positions, "sampled": True,
            "draft_rule": engine_rule(ctx),
            "concurrency_measured": lowest["concurrency"], "samples": samples,
            "total": engine_agreement.engine_figures(samples, positions),
            "outputs": {"samples": len(samples), "match_reference": None, "mismatches": None,
                        "note": "at T > 0 each request is its own draw (its own seed): outputs are not compared"},
            "tokens_per_s": {"plain": low["plain_tokens_per_s"], "dflash": low["dflash_tokens_per_s"],
                             "speedup": low["speedup"]},
            "concurrency": table, "counter_check": run.get("counter_check"), "agreement": agreement}


def engine_rule(ctx: EvalContext) -> dict:
    """Which draft rule the engine's τ follows at T > 0 against the one the run asked for. The agreement test
    always compares like with like (the engine with dfo's greedy-rule rounds of the same draws, vllm
    convention); the engine's τ is never the run's headline when the rules differ."""
    s, engine = ctx.settings, _engine(ctx)
    rule = engine.draft_rule
    out = {"requested": s.rule, "engine": rule if rule is not None else "unknown",
           "same": rule == s.rule if rule is not None else None,
           "compared_with": "dfo's greedy-rule rounds of the same draws (vllm convention)"}
    if rule is None:
        out["note"] = (f"dfo does not know which rule {engine.title}'s DFlash speculation verifies by at T > 0: "
                       "its τ is compared with the greedy rule's figures, and is not the run's figure")
    elif rule != s.rule:
        out["note"] = (f"{engine.title} runs the {rule} rule (it has no choice to pass --draft-rule {s.rule} to): "
                       f"its τ follows the {rule} rule, the run's headline the {s.rule} rule; they are not compared")
    return out


def _warn(ctx: EvalContext, name: str, block: dict) -> None:
    title = _engine(ctx).title
    if block.get("sampled"):
        rule = block.get("draft_rule") or {}
        if rule.get("note"):
            ctx.warn(f"engine {title} with drafter '{name}': {rule['note']}")
        ag = block["agreement"]
        if ag["limitation"] is not None:
            ctx.warn(f"engine {title} with drafter '{name}': {ag['limitation']['text']}")
        elif ag["within_tolerance"] is False:
            ctx.warn(f"engine vs offline expected τ for '{name}' at {ag['law']} outside the tolerance: "
                     + "; ".join(ag["problems"]))
        return
    bad = block["outputs"]["mismatches"]
    if bad:
        ctx.warn(f"engine {title} with drafter '{name}': {len(bad)} sample(s) whose output differs from the reference "
                 f"continuation ({', '.join(bad[:5])}): engine and reference numerics differ there (dtype, kernels); "
                 "they are left out of the engine-vs-offline agreement")
    for row in block["concurrency"][1:]:
        differ = row["reference_mismatches"]["dflash"] or []
        if differ or row["equal_plain"] is False:
            ctx.warn(f"engine {title} with drafter '{name}' at concurrency {row['concurrency']}: "
                     f"{len(differ)} output(s) differ from the reference ({', '.join(differ[:5])})"
                     + ("; outputs differ from the plain server's at the same level" if row["equal_plain"] is False
                        else "") + " (batched numerics differ from single-request ones there)")
    check = block.get("counter_check")
    if check and not check["ok"]:
        ctx.warn(f"engine {title} with drafter '{name}': the per-request acceptance does not add up to the "
                 f"server's counters ({', '.join(check['differ'])}: per request {check['per_request']}, counters "
                 f"{check['counters']})")
    ag = block["agreement"]
    if not ag["within_tolerance"]:
        ctx.warn(f"engine vs offline acceptance for '{name}' ({CONVENTION} convention) outside the tolerance: "
                 + "; ".join(ag["problems"]))


def sample_entries(ctx: EvalContext, lines: list[dict]) -> None:
    """Each sample line's ``drafters[NAME].engine``: that sample's engine figures (samples.jsonl)."""
    for name, run in ctx.results.items():
        block = run.summary.get("engine") or {}
        by_id = {x["id"]: x for x in block.get("samples", [])}
        for line in lines:
            entry = by_id.get(line["id"])
            if entry is not None and name in line["drafters"]:
                line["drafters"][name]["engine"] = {k: v for k, v in entry.items() if k != "id"}
