"""``--card``: the verdict of the run's first drafter against the card and, with ``--explain`` or when the verdict
is not reproduced, the knobs behind the gap (the ``card`` stage). The free knobs come from the run's own lines
(cards/explain.py); the subset knobs rerun the first ``--explain-prompts`` rows under another setting with the
target, tokenizer and drafter already loaded, and compare them with the same rows of the run; what the
checkpoints say of themselves (the drafter's training template, quantization) is read from their files here
and judged in cards/facts.py."""

from __future__ import annotations

import copy
import gc
import re
import time
from dataclasses import replace
from pathlib import Path

from remote_payload.cards.explain import RunSide, alternatives, card_block
from remote_payload.cards.facts import drafter_template, quantization, quantization_entry
from remote_payload.cards.schema import UNKNOWN, Card, load_card
from remote_payload.cards.verdict import aggregation_of, count_of, figure
from remote_payload.diagnose.findings import template_sha256
from remote_payload.errors import PayloadError
from remote_payload.eval import stages
from remote_payload.eval.context import EvalContext
from remote_payload.eval.drafters import evaluate_drafter
from remote_payload.eval.report import sample_lines, sampling_block
from remote_payload.models import target as targetmod
from remote_payload.models.target import read_json

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
    """The subset knobs measured (each against the same rows of the run) and the quantization facts, and a note
    for each knob not measured."""
    s = ctx.settings
    facts = quantization_facts(ctx, name)
    if ctx.references.from_server:
        return facts, [SERVER_NOTE]
    out, skipped = [], []
    ended_by: int | None = None  # a length under which every rerun response ended by itself
    count, aggregation = count_of(card), aggregation_of(card)
    first_rows = subset_ids(ctx)
    template, why = trained_template(ctx, name)
    if template is None:
        skipped.append(f"chat_template: {why}")
    run = RunSide(thinking=s.enable_thinking, max_new_tokens=s.max_new_tokens,
                  selection=s.selection if s.dataset_specs else None, temperature=s.temperature, top_p=s.top_p,
                  top_k=s.top_k, samples_per_prompt=s.samples_per_prompt, dtype=s.dtype,
                  layer_offsets=layer_offsets(ctx, name), drafter_template=template)
    silent = [k for k in ("top_p", "top_k") if getattr(card.protocol, k) == UNKNOWN]
    if s.temperature == 0 and silent:
        skipped.append(f"{', '.join(silent)}: the run decodes greedily (T = 0), where they do not enter the figure")
    reruns = alternatives(card, run)
    for done, (knob, setting, changed) in enumerate(reruns):
        ctx.progress.progress("card", done, len(reruns), unit="reruns", message=f"{knob} {setting}")
        if knob == "max_new_tokens" and ended_by is not None:
            skipped.append(f"max_new_tokens {setting}: not rerun, every response ended before {ended_by} tokens, so "
                           "it measures the same as max_new_tokens " + str(ended_by))
            continue
        if knob == "temperature" and float(changed["temperature"]) > 0 and card.protocol.draft_rule != UNKNOWN:
            changed = {**changed, "draft_rule": card.protocol.draft_rule}  # the card's rule, at the card's T
        t0 = time.perf_counter()
        alt_lines = rerun(ctx, name, changed)
        if isinstance(alt_lines, str):
            skipped.append(f"{knob if knob == 'prompt_normalization' else f'{knob} {setting}'}: {alt_lines}")
            continue
        if knob == "max_new_tokens" and all(line.get("stop_reason") == "eos" for line in alt_lines):
            ended_by = int(setting)
        # another selection or T draws other rows or draws: the run's own first rows are the other side
        ids = first_rows if knob in ("selection", "temperature") else {line["id"] for line in alt_lines}
        base_lines = [line for line in lines if line["id"] in ids]
        alt = figure(alt_lines, name, count, aggregation, _rule(s, changed), seed=s.seed)
        base = figure(base_lines, name, count, aggregation, _rule(s, {}), seed=s.seed)
        if alt is None or base is None:
            continue
        out.append({"knob": knob, "setting": setting, "tau": alt["value"], "ci": alt["ci"], "tau_base": base["value"],
                    "rows": alt["prompts"], "from": "a rerun of the first rows",
                    "card": _card_value(card, knob), "seconds": round(time.perf_counter() - t0, 3)})
        ctx.progress.emit("stage", stage="card", status="metrics",
                          message=f"{knob} {setting}: τ {alt['value']:.3f} vs {base['value']:.3f} on "
                                  f"{alt['prompts']} prompt(s)")
    return out + facts, skipped


def _rule(s, changed: dict) -> str:
    """The draft rule a figure follows under the settings ``changed`` (sampled only at T > 0)."""
    temperature = float(changed.get("temperature", s.temperature))
    return "sampled" if temperature > 0 and changed.get("draft_rule", s.draft_rule) == "sampled" else "greedy"


def trained_template(ctx: EvalContext, name: str) -> tuple[str | None, str]:
    """The chat template drafter NAME was trained with, as text, where it ships one (else None and why)."""
    ld = ctx.drafters[name]
    meta = ld.source.get("training_metadata") or {}
    folder = Path(str(ld.source.get("path", "")))
    shipped, where = None, ""
    if folder.is_dir():  # a folder format; a training checkpoint is one file, with nothing beside it of its own
        jinja, tok_cfg = folder / "chat_template.jinja", folder / "tokenizer_config.json"
        if jinja.is_file():
            shipped, where = _read_text(jinja), str(jinja)
        elif tok_cfg.is_file():
            found = read_json(tok_cfg, f"drafter {folder}").get("chat_template")
            shipped, where = (found, f"{tok_cfg} chat_template") if isinstance(found, str) else (None, "")
    return drafter_template(meta.get("chat_template_sha256"), shipped, where, template_sha256(ctx.tokenizer))


def quantization_facts(ctx: EvalContext, name: str) -> list[dict]:
    """A quantization entry for the drafter and for the target where either is quantized (no rerun: a quantized
    checkpoint has no unquantized twin on the host)."""
    ld = ctx.drafters[name]
    folder = Path(str(ld.source.get("path", "")))
    drafter_cfg = read_json(folder / "config.json", f"drafter {folder}") if (folder / "config.json").is_file() \
        else None
    dtypes = {str(t.dtype).replace("torch.", "") for t in ld.weights.values()}
    target_cfg = read_json(ctx.target_config.path / "config.json", f"target {ctx.target_config.path}")
    out = []
    for who, what in (("drafter", quantization(drafter_cfg, dtypes)), ("target", quantization(target_cfg, set()))):
        if what is not None:
            out.append(quantization_entry(who, what))
    return out


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


def rerun(ctx: EvalContext, name: str, changed: dict) -> list[dict] | str:
    """The sample lines of the first --explain-prompts rows evaluated again with ``changed`` (settings fields, or
    ``layer_offset`` / ``prompt_normalization`` / ``chat_template``), drafter NAME only, reusing the loaded target
    (another ``dtype``: the target loaded once more in it, for this rerun only) and drafter, and the caches: a row
    whose setting did not change is read back, not decoded again. A text: why the change was not rerun."""
    changed = dict(changed)
    offset = changed.pop("layer_offset", 0)
    normalize = changed.pop("prompt_normalization", False)
    template = changed.pop("chat_template", None)
    s = replace(ctx.settings, **changed, online_check=False, diagnose=False, card=None, explain=False)
    drafter = ctx.drafters[name]
    if offset:
        spec = replace(drafter.spec, fc_layer_ids=[i + offset for i in drafter.spec.fc_layer_ids])
        drafter = replace(drafter, spec=spec)
    tokenizer = ctx.tokenizer
    if template is not None:  # a copy: the run's tokenizer keeps the target's template
        tokenizer = copy.copy(ctx.tokenizer)
        tokenizer.chat_template = template
    target, cache_dir = ctx.target, ctx.cache_dir
    if s.dtype != ctx.settings.dtype:
        loaded = target_in(ctx, s.dtype)
        if isinstance(loaded, str):
            return loaded
        target, cache_dir = loaded, dtype_cache(ctx.cache_dir, s.dtype)
    alt = EvalContext(settings=s, fault=ctx.fault, device=ctx.device, cache_dir=cache_dir,
                      target_config=ctx.target_config, tokenizer=tokenizer, stop_ids=ctx.stop_ids,
                      drafters={name: drafter}, target=target)
    try:
        stages.select_prompts(alt, rows=ctx.settings.explain_prompts)
        if normalize:
            collapsed = [replace(p, messages=tuple((r, REPEATED_NEWLINES.sub("\n\n", c)) for r, c in p.messages))
                         for p in alt.prompts]
            if collapsed == alt.prompts:
                return f"no prompt of the first {ctx.settings.explain_prompts} row(s) has repeated newlines"
            alt.prompts = collapsed
        stages.local_references(alt)
        stages.run_checks(alt)
        stages.extract_features(alt)
        evaluate_drafter(alt, name)
        return sample_lines(alt)
    finally:
        if target is not ctx.target:  # the second copy goes before the next rerun
            alt.target = target = None
            _free_memory(ctx.device)


def dtype_cache(cache_dir: Path, dtype: str) -> Path:
    """The caches of a rerun in another dtype: a folder of their own. A reference or feature file is one per prompt,
    its dtype inside it, not in its name: written beside the run's, the rerun's would replace them, and every later
    rerun or eval in the run's dtype would decode those rows again."""
    return cache_dir / f"explain-{dtype}"


def target_in(ctx: EvalContext, dtype: str):
    """The target loaded again in ``dtype`` (a Target), or why not: on a GPU, a copy the free memory beside the
    run's own cannot hold is not attempted (a float32 copy of a large bf16 target)."""
    import torch

    if ctx.device == "cuda":
        size = torch.empty((), dtype=targetmod.resolve_dtype(dtype, True)).element_size()
        need = sum(p.numel() for p in ctx.target.model.parameters()) * size
        free = sum(torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count()))
        if need > 0.9 * free:
            return (f"a {dtype} copy of the target needs ≈ {need / 2**30:.1f} GiB, the GPU(s) have "
                    f"{free / 2**30:.1f} GiB free beside the run's own copy")
    s = ctx.settings
    try:
        return targetmod.load_target(ctx.target_config.path, device=ctx.device, dtype=dtype,
                                     allow_fp16=s.allow_fp16, kernel=s.kernel)
    except torch.OutOfMemoryError:
        _free_memory(ctx.device)
        return f"out of memory loading a {dtype} copy of the target beside the run's own"


def _free_memory(device: str) -> None:
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PayloadError(f"drafter chat template {path}: cannot read it ({exc})") from None


def _card_value(card: Card, knob: str):
    p = card.protocol
    value = {"thinking": p.thinking, "max_new_tokens": p.max_new_tokens, "selection": p.selection,
             "chat_template": p.chat_template, "temperature": p.temperature, "top_p": p.top_p,
             "top_k": p.top_k}.get(knob, UNKNOWN)
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
