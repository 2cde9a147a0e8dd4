"""``--card``: the verdict of the run's first drafter against the card and, with ``--explain`` or when the verdict
is not reproduced, the knobs behind the gap (the ``card`` stage). The free knobs come from the run's own lines
(cards/explain.py); the subset knobs rerun the first ``--explain-prompts`` rows under another setting with the
target, tokenizer and drafter already loaded, and compare them with the same rows of the run."""

from __future__ import annotations

import re
import time
from dataclasses import replace

from remote_payload.cards.explain import alternatives, card_block
from remote_payload.cards.schema import UNKNOWN, Card, load_card
from remote_payload.cards.verdict import aggregation_of, count_of, figure
from remote_payload.eval import stages
from remote_payload.eval.context import EvalContext
from remote_payload.eval.drafters import evaluate_drafter
from remote_payload.eval.report import sample_lines, sampling_block

REPEATED_NEWLINES = re.compile(r"\n{3,}")  # prompt_normalization: three or more newlines become two
SERVER_NOTE = "the references came from a server: the subset reruns decode with this host's target, so they are skipped"


def measure(ctx: EvalContext) -> dict:
    """results.json ``card`` (with its own ``seconds``)."""
    s, progress = ctx.settings, ctx.progress
    started = time.perf_counter()
    progress.stage_start("card")
    card = load_card(str(s.card))
    name = next(iter(ctx.results))
    lines = sample_lines(ctx)
    settings = settings_record(s)
    block = card_block(card, lines, name, settings, seed=s.seed)
    if s.explain or block.get("verdict") not in (None, "reproduced"):
        subset, skipped = subset_knobs(ctx, card, name, lines)
        block = card_block(card, lines, name, settings, seed=s.seed, explain=True, subset=subset)
        if skipped:
            block["explain_skipped"] = skipped
    block["seconds"] = round(time.perf_counter() - started, 3)
    verdict = block.get("verdict")
    progress.stage_done("card", message=f"card {card.card}: {verdict}" + (f"; {block['explanation']}"
                                                                          if block.get("explanation") else ""))
    return block


def settings_record(s) -> dict:
    """The settings the card block reads, as results.json's ``settings`` holds them (the controller reads those)."""
    return {"enable_thinking": s.enable_thinking, "max_new_tokens": s.max_new_tokens, "draft_rule": s.rule,
            "selection": s.selection, **({"sampling": sampling_block(s)} if s.sampled else {})}


def subset_knobs(ctx: EvalContext, card: Card, name: str, lines: list[dict]) -> tuple[list[dict], list[str]]:
    s = ctx.settings
    if ctx.references.from_server:
        return [], [SERVER_NOTE]
    out, skipped = [], []
    ended_by: int | None = None  # a length under which every rerun response ended by itself
    count, aggregation = count_of(card), aggregation_of(card)
    rule = "sampled" if s.sampled and s.draft_rule == "sampled" else "greedy"
    first_rows = subset_ids(ctx)
    reruns = alternatives(card, s.enable_thinking, s.max_new_tokens, s.selection if s.dataset_specs else None,
                          layer_offsets(ctx, name))
    for done, (knob, setting, changed) in enumerate(reruns):
        ctx.progress.progress("card", done, len(reruns), unit="reruns", message=f"{knob} {setting}")
        if knob == "max_new_tokens" and ended_by is not None:
            skipped.append(f"max_new_tokens {setting}: not rerun, every response ended before {ended_by} tokens, so "
                           "it measures the same as max_new_tokens " + str(ended_by))
            continue
        t0 = time.perf_counter()
        alt_lines = rerun(ctx, name, changed)
        if alt_lines is None:
            skipped.append(f"{knob}: no prompt of the first {s.explain_prompts} row(s) has repeated newlines")
            continue
        if knob == "max_new_tokens" and all(line.get("stop_reason") == "eos" for line in alt_lines):
            ended_by = int(setting)
        ids = {line["id"] for line in alt_lines} if knob != "selection" else first_rows  # other rows: the run's first
        base_lines = [line for line in lines if line["id"] in ids]
        alt = figure(alt_lines, name, count, aggregation, rule, seed=s.seed)
        base = figure(base_lines, name, count, aggregation, rule, seed=s.seed)
        if alt is None or base is None:
            continue
        out.append({"knob": knob, "setting": setting, "tau": alt["value"], "ci": alt["ci"], "tau_base": base["value"],
                    "rows": alt["prompts"], "from": "a rerun of the first rows",
                    "card": _card_value(card, knob), "seconds": round(time.perf_counter() - t0, 3)})
        ctx.progress.emit("stage", stage="card", status="metrics",
                          message=f"{knob} {setting}: τ {alt['value']:.3f} vs {base['value']:.3f} on "
                                  f"{alt['prompts']} prompt(s)")
    return out, skipped


def subset_ids(ctx: EvalContext) -> set[str]:
    """The sample ids of the run's first --explain-prompts rows."""
    probe = EvalContext(settings=ctx.settings, tokenizer=ctx.tokenizer)  # longctx rows are built in its tokens
    stages.select_prompts(probe, rows=ctx.settings.explain_prompts)
    return {p.id for p in probe.prompts}


def layer_offsets(ctx: EvalContext, name: str) -> list[int]:
    """The shifts of the drafter's target layer ids that stay among the target's layers (pitfall 1)."""
    ids = ctx.drafters[name].spec.fc_layer_ids
    layers = ctx.target_config.num_layers
    return [d for d in (-1, 1) if all(0 <= i + d < layers for i in ids)]


def rerun(ctx: EvalContext, name: str, changed: dict) -> list[dict] | None:
    """The sample lines of the first --explain-prompts rows evaluated again with ``changed`` (settings fields, or
    ``layer_offset`` / ``prompt_normalization``), drafter NAME only, reusing the loaded target and drafter (and the
    caches: a row whose setting did not change is read back, not decoded again). None: the change changes none of
    the rows."""
    changed = dict(changed)
    offset = changed.pop("layer_offset", 0)
    normalize = changed.pop("prompt_normalization", False)
    s = replace(ctx.settings, **changed, online_check=False, diagnose=False, card=None, explain=False)
    drafter = ctx.drafters[name]
    if offset:
        spec = replace(drafter.spec, fc_layer_ids=[i + offset for i in drafter.spec.fc_layer_ids])
        drafter = replace(drafter, spec=spec)
    alt = EvalContext(settings=s, fault=ctx.fault, device=ctx.device, cache_dir=ctx.cache_dir,
                      target_config=ctx.target_config, tokenizer=ctx.tokenizer, stop_ids=ctx.stop_ids,
                      drafters={name: drafter}, target=ctx.target)
    stages.select_prompts(alt, rows=ctx.settings.explain_prompts)
    if normalize:
        collapsed = [replace(p, messages=tuple((r, REPEATED_NEWLINES.sub("\n\n", c)) for r, c in p.messages))
                     for p in alt.prompts]
        if collapsed == alt.prompts:
            return None
        alt.prompts = collapsed
    stages.local_references(alt)
    stages.run_checks(alt)
    stages.extract_features(alt)
    evaluate_drafter(alt, name)
    return sample_lines(alt)


def _card_value(card: Card, knob: str):
    p = card.protocol
    value = {"thinking": p.thinking, "max_new_tokens": p.max_new_tokens, "selection": p.selection}.get(knob, UNKNOWN)
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
