"""series.md: the series as a person reads it (pure: the series dict in, Markdown out).

Checkpoint names come from the training host's listing and errors from the eval host: every string goes
in through ``md_text``/``md_code`` (no HTML, link or extra table cell), every figure through ``fmt_number``.
"""

from __future__ import annotations

from orchestrator.core.host_text import fmt_number, md_code, md_text
from orchestrator.watch.measures import verdict_text


def fmt_ci(stat: dict | None, digits: int = 2) -> str:
    if not isinstance(stat, dict) or stat.get("value") is None:
        return "–"
    spec = f".{digits}f"
    ci = stat.get("ci")
    bounds = f" [{fmt_number(ci[0], spec)}, {fmt_number(ci[1], spec)}]" if isinstance(ci, list) and len(ci) == 2 \
        else ""
    return fmt_number(stat["value"], spec) + bounds


def verdict_cell(entry: dict) -> str:
    """A done checkpoint's verdict as words; '–' when series.json has none for it."""
    return verdict_text(entry["verdict"]) if entry.get("verdict") else "–"


def _p(stat_list: list[dict], k: int) -> str:
    for s in stat_list:
        if s["k"] == k and s.get("value") is not None:
            return fmt_number(s["value"])
    return "–"


def series_markdown(series: dict, *, plotted: bool) -> str:
    """series.md; ``plotted``: tau_vs_step.png was just drawn beside it (else it is not linked)."""
    s = series["settings"]
    lines = [f"# Series {md_text(series['name'])}", "",
             f"Checkpoints from {md_code(series['source'])}, evaluated on {md_text(series['eval_host'])} against "
             f"{md_code(s.get('target'))} ({md_text(s.get('samples') or 'all')} samples of "
             f"{md_text(s.get('prompts'))}, {md_text(s.get('max_new_tokens'))} new tokens, {md_text(s.get('dtype'))})."
             f" Updated {md_text(series['updated_utc'])}.", "",
             "τ macro and DDTree-8 with 95% bootstrap CIs over samples; the verdict pairs each checkpoint with the "
             "best one before it by prompt (Δτ macro CI above 0: up, below 0: down, else flat).", ""]
    base = (series.get("baselines") or {}).get("drafters") or {}
    if base:
        lines += ["## Baselines", "", f"Evaluated once in run {md_code(series['baselines']['run'])} and reused.", "",
                  "| baseline | τ macro | τ micro | DDTree-8 |", "|---|---|---|---|"]
        for name, m in base.items():
            lines.append(f"| {md_text(name)} | {fmt_ci(m['tau_macro'])} | {fmt_ci(m['tau_micro'])} | "
                         f"{fmt_ci(m['ddtree'])} |")
        lines.append("")
    lines += ["## Checkpoints", "",
              "| step | checkpoint | τ macro | τ micro | DDTree-8 | p1 | p2 | p3 | p4 | verdict | run |",
              "|---:|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for e in sorted(series["checkpoints"].values(), key=lambda e: e["step"]):
        if e["status"] == "done":
            m = e["measures"]
            lines.append(f"| {md_text(e['step'])} | {md_text(e['name'])} | {fmt_ci(m['tau_macro'])} | "
                         f"{fmt_ci(m['tau_micro'])} | {fmt_ci(m['ddtree'])} | "
                         + " | ".join(_p(m["p"], k) for k in range(1, 5))
                         + f" | {md_text(verdict_cell(e))} | {md_code(e['run'], in_table=True)} |")
        elif e["status"] == "failed":
            lines.append(f"| {md_text(e['step'])} | {md_text(e['name'])} | failed | | | | | | | "
                         f"{_one_line(e.get('error'))} | "
                         f"{md_code(e['run'], in_table=True) if e.get('run') else ''} |")
        else:
            lines.append(f"| {md_text(e['step'])} | {md_text(e['name'])} | {md_text(e['status'])} … | | | | | | | | |")
    lines.append("")
    drops = [e for e in sorted(series["checkpoints"].values(), key=lambda e: e["step"])
             if e["status"] == "done" and (e.get("verdict") or {}).get("regression")]
    if drops:
        lines += ["## Regressions", ""]
        lines += ["- " + md_text(f"step {e['step']} ({e['name']}): {verdict_cell(e)}") for e in drops]
        lines += [""]
    if plotted:
        lines += ["![τ over training steps](tau_vs_step.png)", ""]
    return "\n".join(lines)


def _one_line(text: str | None, limit: int = 160) -> str:
    """An error as one short table cell (cut before escaping: an escape is never cut in half)."""
    flat = " ".join(str(text or "?").split())
    return md_text(flat if len(flat) <= limit else flat[: limit - 1] + "…")
