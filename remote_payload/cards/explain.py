"""``--explain``: the knobs that explain a gap between a measurement and a card, ranked by how much of it each
closes, and the card block of results.json. Pure stdlib: the free knobs come from the run's own sample lines;
the subset knobs (eval/card_stage.py reruns the first rows under another setting) arrive as entries.

gap = published − measured. A knob's setting moves τ by shift = τ(setting) − τ(the run's setting) on the same
rows; gap_closed = shift / gap (1: the whole gap, 0: none, < 0: the wrong way). A knob explains the gap when it
closes between half and one and a half of it and the published figure lies inside its setting's CI carried to
the whole run (τ measured + shift, the CI shifted with it). Knob names are fixed words (KNOBS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from remote_payload.cards import protocol as card_protocol
from remote_payload.cards.facts import QUANTIZED_SEEN
from remote_payload.cards.schema import AGGREGATIONS, COUNTS, UNKNOWN, Card, parse_card
from remote_payload.cards.verdict import (
    aggregation_of,
    by_k_figure,
    count_of,
    figure,
    judge,
)

FREE = ("count", "aggregation", "draft_rule", "k", "end_rule")  # from the run itself
SUBSET = ("thinking", "max_new_tokens", "selection", "chat_template", "temperature", "top_p", "top_k", "dtype",
          "layer_offset", "prompt_normalization")  # subset reruns
FACTS = ("quantization",)  # reported, not rerun: nothing to switch off offline
KNOBS = (*FREE, *SUBSET, *FACTS)  # fixed words
CARD_MAX_NEW = (2048, 4096)  # what cards measure when they give no length: z-lab's benchmark default, its cards'
# The sampling values cards publish at, each rerun only where the card leaves it unknown and it differs from the
# run's (at most two reruns for T, one each for top-p and top-k at the defaults): greedy (z-lab's paper tables,
# EAGLE's) and T = 1 (z-lab's t1 cards, the DFlash2 card); no nucleus (z-lab's benchmark default) and 0.95; top-k
# off and 20 (0.95 and 20 are Qwen3's generation_config, which the DFlash2 card and engines' defaults follow).
CARD_TEMPERATURES = (0.0, 1.0)
CARD_TOP_P = (1.0, 0.95)
CARD_TOP_K = (0, 20)
EXPLAINS = (0.5, 1.5)  # the share of the gap a knob must close to explain it
OTHER_SELECTION = {"zlab-transformers": "zlab-server", "zlab-server": "zlab-transformers"}
SUSPECT = ("no knob explains the gap: the drafter itself is the suspect (its weights, its training, or an export "
           "that changed it), not the way it was measured")


def merged_card(results: dict, samples: Sequence[dict]) -> dict | None:
    """The card block over the merged samples of several hosts, recomputed from the card document each part
    recorded (None when the parts measured no card); the subset knobs of one host are not carried over."""
    shards = results.get("shards")
    parts: list = shards if isinstance(shards, list) else []
    blocks = [p.get("card") for p in parts if isinstance(p, dict)] + [results.get("card")]
    block = next((b for b in blocks if isinstance(b, dict) and isinstance(b.get("document"), dict)), None)
    if block is None:
        return None
    card = parse_card(block["document"], "results.json card.document")
    given = results.get("settings")
    settings: dict = given if isinstance(given, dict) else {}
    seed = settings.get("seed")
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else 0
    return card_block(card, samples, str(block.get("drafter")), settings, seed=seed)


def card_block(card: Card, lines: Sequence[dict], name: str, settings: dict, *, seed: int = 0,
               explain: bool = False, subset: Sequence[dict] = ()) -> dict:
    """results.json ``card``: the card, how it was applied, the verdict of drafter NAME and (with ``explain``,
    or when the verdict is not reproduced) the knobs ranked."""
    rule = _rule(settings)
    count, aggregation = count_of(card), aggregation_of(card)
    measured = figure(lines, name, count, aggregation, rule, seed=seed)
    out: dict[str, Any] = {
        "name": card.card, "source": card.source, "target": card.target.name, "drafter_on_card": card.drafter.name,
        "figure": {"tau": card.figure.tau, "ci": list(card.figure.ci) if card.figure.ci else None,
                   "n": card.figure.n},
        "card_count": card.count, "card_aggregation": card.aggregation, "protocol": card.as_json()["protocol"],
        "applied": card_protocol.fixed_values(card), "not_applied": card_protocol.not_applied(card),
        "run_values": _run_values(card, settings), "drafter": name, "count": count, "aggregation": aggregation,
        "draft_rule": rule, "document": card.as_json()}
    if measured is None:
        return {**out, "verdict": None, "reason": f"drafter '{name}' has no rounds in the {count} count (a count "
                "past the end token needs the target's tokens past it: see results.json warnings)"}
    out.update(judge(measured, card), card=card.card)
    out.pop("card")
    if explain or out["verdict"] != "reproduced":
        free = free_knobs(card, lines, name, settings, seed=seed)
        out["explain"] = rank([*free, *subset], measured["value"], card.figure.tau)
        out["explanation"] = explanation(out["explain"])
    return out


def free_knobs(card: Card, lines: Sequence[dict], name: str, settings: dict, *, seed: int = 0) -> list[dict]:
    """Every free knob's alternative settings, each measured from the run's own lines."""
    rule = _rule(settings)
    count, aggregation = count_of(card), aggregation_of(card)
    base = figure(lines, name, count, aggregation, rule, seed=seed)
    out = []

    def add(knob: str, setting: str, fig: dict | None, **more: Any) -> None:
        if fig is not None and fig.get("value") is not None:
            out.append({"knob": knob, "setting": setting, "tau": fig["value"], "ci": fig["ci"],
                        "tau_base": base["value"] if base else None, "rows": fig["prompts"], "from": "the run", **more})

    for other in (c for c in COUNTS if c not in ("zlab", count)):
        add("count", other, figure(lines, name, other, aggregation, rule, seed=seed), card=card.count)
    for other in (a for a in AGGREGATIONS if a != aggregation):
        add("aggregation", other, figure(lines, name, count, other, rule, seed=seed), card=card.aggregation)
    if rule == "sampled":  # the greedy rule's replay of the same draws
        add("draft_rule", "greedy", figure(lines, name, count, aggregation, "greedy", seed=seed),
            card=card.protocol.draft_rule)
    block = _block_size(lines, name)
    k = card.protocol.k  # unknown: block size − 1, what the run measures (no K is fitted to the figure)
    if k != UNKNOWN and block is not None and k < block - 1:
        add("k", str(k), by_k_figure(lines, name, int(k), aggregation, seed=seed), card=k)
    add("end_rule", "full rounds only", figure(lines, name, count, aggregation, rule, seed=seed,
                                               drop_last_round=True))
    return out


@dataclass(frozen=True)
class RunSide:
    """The run's own value of each subset knob: what a rerun changes, and what it compares with."""

    thinking: bool | str
    max_new_tokens: int
    selection: str | None = None        # a benchmark-dataset run's selection (None: a prompt set)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    samples_per_prompt: int = 1
    dtype: str = "bfloat16"
    layer_offsets: Sequence[int] = ()   # those in range (read from the drafter's spec on the host)
    drafter_template: str | None = None  # the template text the drafter was trained with, where it ships one
    template_unknown: bool = False      # the plan: the drafter's files are on the host, a rerun is possible


def alternatives(card: Card, run: RunSide) -> list[tuple[str, str, dict]]:
    """(knob, setting, what changes) of each subset rerun: thinking the other way; for a card that gives no
    length, the lengths cards use (a longer one is skipped when every response ended before a shorter one); for a
    dataset card that gives no selection, z-lab's other path; the prompts rendered with the chat template the
    drafter ships; for a card that gives no T / top-p / top-k, the values cards use other than the run's (top-p
    and top-k only where the run samples: at T = 0 they do not enter the figure); the other dtype; the drafter's
    target layer ids shifted by each of ``layer_offsets``; the prompts with repeated newlines collapsed. A change
    is a settings field, or ``layer_offset`` / ``prompt_normalization`` / ``chat_template`` (the rerun applies
    those itself)."""
    p = card.protocol
    out: list[tuple[str, str, dict]] = []
    if isinstance(run.thinking, bool):  # "both" (--enable-thinking both) measured each mode already
        out.append(("thinking", "off" if run.thinking else "on", {"enable_thinking": not run.thinking}))
    if p.max_new_tokens == UNKNOWN:
        out += [("max_new_tokens", str(n), {"max_new_tokens": n}) for n in CARD_MAX_NEW if n != run.max_new_tokens]
    if p.selection == UNKNOWN and run.selection in OTHER_SELECTION:
        other = OTHER_SELECTION[run.selection]
        out.append(("selection", other, {"selection": other}))
    if run.drafter_template is not None or run.template_unknown:
        out.append(("chat_template", "drafter", {"chat_template": run.drafter_template}))
    if p.temperature == UNKNOWN:
        out += [("temperature", f"{t:g}", {"temperature": t}) for t in CARD_TEMPERATURES if t != run.temperature]
    if run.temperature > 0:
        if p.top_p == UNKNOWN:
            out += [("top_p", f"{v:g}", {"top_p": v}) for v in CARD_TOP_P if v != run.top_p]
        if p.top_k == UNKNOWN:
            out += [("top_k", str(v), {"top_k": v}) for v in CARD_TOP_K if v != run.top_k]
    other = other_dtype(run.dtype)
    out.append(("dtype", other, {"dtype": other}))
    out += [("layer_offset", f"{d:+d}", {"layer_offset": d}) for d in run.layer_offsets]
    out.append(("prompt_normalization", "repeated newlines collapsed", {"prompt_normalization": True}))
    return out


def other_dtype(dtype: str) -> str:
    """The dtype the dtype knob reruns in: bfloat16, what cards and engines measure in, unless the run already is;
    then float32 (no bf16 rounding anywhere)."""
    return "float32" if dtype in ("bfloat16", "bf16") else "bfloat16"


def explain_cost(card: Card, run: RunSide, rows: int, run_rows: int | None) -> str:
    """The plan's line: which reruns --explain makes and their size against the run's own decoding and extraction
    (the layer offsets are known once the drafter's spec is read on the host: ±1 counted here; they read the run's
    references back and extract other layers only; the chat template is counted where the drafter may ship one)."""
    reruns = alternatives(card, run)
    names = ", ".join(f"{k} {v}" for k, v, _ in reruns)
    size = ""
    if run_rows:
        used = min(rows, run_rows)
        draws = run.samples_per_prompt if run.temperature > 0 else 1
        decoded = [c for k, _, c in reruns if k != "layer_offset"]
        tokens = sum(int(c.get("max_new_tokens", run.max_new_tokens)) * _draws(c, run) for c in decoded)
        size = (f"; at most ≈ {tokens * used / (run.max_new_tokens * draws * run_rows):.2g}× the run's reference "
                f"decoding ({len(decoded)} rerun(s) of {used} of its {run_rows} row(s), each up to its max new "
                f"tokens) and {len(reruns) * used / run_rows:.2g}× its feature extraction; references already cached "
                "are read back")
    return (f"--explain: the free knobs ({', '.join(FREE)}) from the run's own samples, no extra pass; subset reruns "
            f"of the first {rows} row(s): {names}{size}; dtype {other_dtype(run.dtype)} loads the target once more "
            "in it; chat_template only where the drafter ships the template it was trained with, "
            "prompt_normalization only where a prompt has repeated newlines, a layer offset only where it stays "
            "among the target's layers")


def _draws(change: dict, run: RunSide) -> int:
    """The continuations a rerun decodes per row: one at T = 0, the run's draws per prompt at T > 0."""
    return run.samples_per_prompt if float(change.get("temperature", run.temperature)) > 0 else 1


def rank(entries: Sequence[dict], measured: float, published: float) -> list[dict]:
    """Each entry with gap_closed and explains, best first (closest to closing the whole gap); one entry per
    knob (its best setting), then the others. A fact (``quantization``: no τ) closes nothing measurable: after
    every measured knob."""
    gap = published - measured
    scored = []
    for e in entries:
        if e.get("tau") is None:
            scored.append({**e, "gap_closed": None, "explains": False})
            continue
        base = e["tau_base"] if e.get("tau_base") is not None else measured
        closed = (e["tau"] - base) / gap if gap else None
        ci = e.get("ci")
        carried = [c + measured - base for c in ci] if ci else None
        explains = closed is not None and EXPLAINS[0] <= closed <= EXPLAINS[1] and \
            (carried is None or carried[0] <= published <= carried[1])
        scored.append({**e, "gap_closed": closed, "explains": explains})
    scored.sort(key=lambda e: (not e["explains"], abs(1 - e["gap_closed"]) if e["gap_closed"] is not None else 9e9))
    best: dict[str, dict] = {}
    for e in scored:
        best.setdefault(e["knob"], e)
    firsts = list(best.values())
    return firsts + [e for e in scored if e not in firsts]


def explanation(ranked: Sequence[dict]) -> str:
    """The report's one sentence (a quantization fact is added to it when no knob explains the gap)."""
    measured = [e for e in ranked if e.get("tau") is not None]
    facts = [e for e in ranked if e.get("fact")]
    quantized = "; " + "; ".join(f"the {e['setting']}" for e in facts) + f": {QUANTIZED_SEEN}" if facts else ""
    if not measured:
        return SUSPECT + " (no knob could be measured)" + quantized
    top = measured[0]
    closed = top["gap_closed"]
    share = f"{closed:.0%}" if closed is not None else "none"
    if top["explains"]:
        ci = f" [{top['ci'][0]:.2f}, {top['ci'][1]:.2f}]" if top.get("ci") else ""
        return (f"{top['knob']} explains the gap: with {top['knob']} {top['setting']} τ is {top['tau']:.2f}{ci} "
                f"({top['from']}, {top['rows']} prompt(s)), closing {share} of it")
    return f"{SUSPECT}; the closest, {top['knob']} {top['setting']}, closes {share} of it{quantized}"


def _run_values(card: Card, settings: dict) -> dict:
    """The run's own value of each protocol field the card leaves unknown (what the measurement assumed)."""
    sampling = settings.get("sampling") or {}
    mode = settings.get("enable_thinking")
    known = {"thinking": mode if isinstance(mode, str) else "on" if mode else "off",
             "max_new_tokens": settings.get("max_new_tokens"),
             "temperature": sampling.get("temperature", 0.0), "top_p": sampling.get("top_p"),
             "top_k": sampling.get("top_k"), "draft_rule": settings.get("draft_rule"),
             "selection": settings.get("selection"), "chat_template": "target", "engine": "offline"}
    if not sampling:  # T = 0: the sampling law and the draft rule do not enter the figure
        for key in ("top_p", "top_k", "draft_rule"):
            known.pop(key)
    return {f: known[f] for f in card.protocol.unknown() if known.get(f) is not None}


def _rule(settings: dict) -> str:
    return "sampled" if settings.get("draft_rule") == "sampled" else "greedy"


def _block_size(lines: Sequence[dict], name: str) -> int | None:
    for line in lines:
        rec = (((line.get("drafters") or {}).get(name) or {}).get("by_k"))
        if isinstance(rec, dict) and rec:
            return max(int(k) for k in rec) + 1
    return None
