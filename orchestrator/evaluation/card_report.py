"""The card's verdict as the run's summary and report.md show it, read from results.json ``card`` (written on a
host: every value is checked for its type here, a wrong one shows as '?')."""

from __future__ import annotations

from orchestrator.core.host_text import fmt_number
from orchestrator.evaluation.report_values import json_object

VERDICTS = ("reproduced", "below", "above")
SHOWN_KNOBS = 6  # the best measured settings listed (and every fact); results.json card.explain holds them all


def card_lines(results: dict) -> list[str]:
    """The verdict line, what the measurement assumed, the knobs best first, and the one sentence."""
    card = json_object(results.get("card"))
    if not card:
        return []
    name = _text(card.get("name"))
    if card.get("verdict") is None:
        return [f"card {name}: no verdict ({_text(card.get('reason'))})"]
    m, pub, diff = (json_object(card.get(k)) for k in ("measured", "published", "difference"))
    verdict = card.get("verdict") if card.get("verdict") in VERDICTS else "?"
    lines = [f"card {name}: τ {fmt_number(m.get('value'))}{_ci(m.get('ci'))} ({_text(card.get('count'))}, "
             f"{_text(card.get('aggregation'))}; drafter {_text(card.get('drafter'))}) vs published "
             f"{fmt_number(pub.get('tau'), 'g')}{_ci(pub.get('ci'))} ({_text(card.get('source'))}): {verdict}, "
             f"Δ {fmt_number(diff.get('value'), '+.2f')}{_ci(diff.get('ci'), '+.2f')}"]
    assumed = json_object(card.get("run_values"))
    if assumed:
        lines.append("  the card leaves unknown, measured as the run set it: "
                     + ", ".join(f"{_text(k)} {_text(v)}" for k, v in assumed.items()))
    for note in card.get("not_applied") or [] if isinstance(card.get("not_applied"), list) else []:
        lines.append(f"  not applied: {_text(note)}")
    explain = [e for e in card.get("explain") or [] if isinstance(e, dict)] \
        if isinstance(card.get("explain"), list) else []
    facts = [e for e in explain if e.get("fact")]  # quantization: always shown, nothing to rerun
    for e in [e for e in explain if not e.get("fact")][:SHOWN_KNOBS]:
        closed = e.get("gap_closed")
        share = fmt_number(closed * 100, ".0f") + " %" if isinstance(closed, (int, float)) \
            and not isinstance(closed, bool) else "–"
        lines.append(f"  {_text(e.get('knob'))} {_text(e.get('setting'))}: τ {fmt_number(e.get('tau'))}"
                     f"{_ci(e.get('ci'))} vs {fmt_number(e.get('tau_base'))} on {fmt_number(e.get('rows'), 'd')} "
                     f"prompt(s) ({_text(e.get('from'))}), gap closed {share}")
    for e in facts:
        lines.append(f"  {_text(e.get('knob'))}: the {_text(e.get('setting'))}, not rerun (nothing to switch off "
                     "offline)")
    if card.get("explanation") is not None:
        lines.append(f"  {_text(card.get('explanation'))}")
    return lines


def _ci(value, spec: str = ".2f") -> str:
    if isinstance(value, list) and len(value) == 2:
        return f" [{fmt_number(value[0], spec)}, {fmt_number(value[1], spec)}]"
    return ""


def _text(value) -> str:
    return value if isinstance(value, str) else fmt_number(value, "g") if isinstance(value, (int, float)) else "?"
