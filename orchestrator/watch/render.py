"""series.md: the series as a person reads it (pure: the series dict in, Markdown out).

Checkpoint names come from the training host's listing and errors from the eval host: every string goes
in through ``md_text``/``md_code`` (no HTML, link or extra table cell), every figure through ``fmt_number``.
"""

from __future__ import annotations

from orchestrator.core.host_text import fmt_number, md_code, md_text
from orchestrator.watch.measures import verdict_text
from orchestrator.watch.proxy_step import source_text

MD_ROWS = 50         # checkpoints in series.md's table: the latest ones (series.json and `series show --all` hold all)
MD_REGRESSIONS = 20  # regressions listed, the latest first


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
    entries = sorted(series["checkpoints"].values(), key=lambda e: e["step"])
    lines += summary_lines(series)
    proxied = any(e.get("proxy") for e in entries)
    lines += proxy_lines(entries) if proxied else []
    shown = entries[-MD_ROWS:]
    lines += ["## Checkpoints" + (f" (the latest {len(shown)} of {len(entries)})" if len(shown) < len(entries)
                                  else ""), ""]
    if len(shown) < len(entries):
        lines += [f"Earlier ones: `dfo series show {md_text(series['name'])} --all`, or series.json.", ""]
    lines += ["| step | checkpoint | τ macro | τ micro | DDTree-8 | p1 | p2 | p3 | p4 | verdict | run |"
              + (" proxy |" if proxied else ""),
              "|---:|---|---|---|---|---:|---:|---:|---:|---|---|" + ("---:|" if proxied else "")]
    tail = " |" if proxied else ""
    for e in shown:
        if e["status"] == "done":
            m = e["measures"]
            lines.append(f"| {md_text(e['step'])} | {md_text(e['name'])} | {fmt_ci(m['tau_macro'])} | "
                         f"{fmt_ci(m['tau_micro'])} | {fmt_ci(m['ddtree'])} | "
                         + " | ".join(_p(m["p"], k) for k in range(1, 5))
                         + f" | {md_text(verdict_cell(e))} | {md_code(e['run'], in_table=True)} |"
                         + (f" {proxy_cell(e)} |" if proxied else ""))
        elif e["status"] == "failed":
            lines.append(f"| {md_text(e['step'])} | {md_text(e['name'])} | failed | | | | | | | "
                         f"{_one_line(e.get('error'))} | "
                         f"{md_code(e['run'], in_table=True) if e.get('run') else ''} |" + tail)
        else:
            lines.append(f"| {md_text(e['step'])} | {md_text(e['name'])} | {md_text(e['status'])} … | | | | | | | | |"
                         + tail)
    lines.append("")
    drops = [e for e in entries if e["status"] == "done" and (e.get("verdict") or {}).get("regression")]
    if drops:
        lines += ["## Regressions" + (f" (the latest {MD_REGRESSIONS} of {len(drops)})" if len(drops) > MD_REGRESSIONS
                                      else ""), ""]
        lines += ["- " + md_text(f"step {e['step']} ({e['name']}): {verdict_cell(e)}")
                  for e in reversed(drops[-MD_REGRESSIONS:])]
        lines += [""]
    if plotted:
        lines += ["![τ over training steps](tau_vs_step.png)", ""]
    return "\n".join(lines)


def proxy_value(e: dict) -> str:
    """The proxy's value at a checkpoint, '!' marking one whose τ disagrees with it."""
    proxy, checked = e.get("proxy"), e.get("proxy_check")
    if not proxy:
        return "–"
    return fmt_number(proxy["value"], ".4g") + (" !" if isinstance(checked, dict) and checked.get("disagrees") else "")


def proxy_cell(e: dict) -> str:
    return md_text(proxy_value(e))


def alert_texts(entries: list[dict]) -> list[str]:
    """Each proxy alert as one line: where it fired, what it says, which checkpoint was diagnosed."""
    out = []
    for e in entries:
        alert = e.get("proxy_alert")
        if isinstance(alert, dict):
            diagnosed = alert.get("diagnosed_in")
            out.append(f"step {e['step']} ({e['name']}): {alert['text']}"
                       + (f"; {diagnosed} evaluated with --diagnose" if diagnosed else ""))
    return out


def proxy_lines(entries: list[dict]) -> list[str]:
    """series.md's section on the trainer's proxy: what it is, and its alerts."""
    latest = next(e["proxy"] for e in reversed(entries) if e.get("proxy"))
    lines = ["## The trainer's proxy", "",
             md_text(f"Proxy: {source_text(latest)}, the value logged at each checkpoint's step (else the last one "
                     "logged since the previous checkpoint). Each checkpoint's τ is checked against the τ a line "
                     "fitted on the earlier agreeing checkpoints predicts from the proxy; '!' marks one more than "
                     "2.5 standard errors below it, two in a row raise an alert."), ""]
    alerts = alert_texts(entries)
    lines += [*(f"- **alert** {md_text(a)}" for a in alerts), ""] if alerts else ["No alert.", ""]
    return lines


def summary(series: dict) -> dict:
    """Counts, the best and the latest evaluated checkpoint (what a long series is read by first)."""
    done = [e for e in series["checkpoints"].values() if e["status"] == "done"]
    done.sort(key=lambda e: e["step"])
    rated = [e for e in done if e["measures"]["tau_macro"].get("value") is not None]
    best = max(rated, key=lambda e: e["measures"]["tau_macro"]["value"], default=None)
    counts = {status: sum(1 for e in series["checkpoints"].values() if e["status"] == status)
              for status in ("done", "failed", "relaying", "evaluating")}
    return {"counts": counts, "best": best, "latest": done[-1] if done else None,
            "regressions": sum(1 for e in done if (e.get("verdict") or {}).get("regression"))}


def summary_text(series: dict) -> list[str]:
    """The summary as plain lines (names and figures from other hosts: the callers escape or wrap them)."""
    s = summary(series)
    c = s["counts"]
    out = [f"{len(series['checkpoints'])} checkpoints: {c['done']} evaluated, {c['failed']} failed"
           + (f", {c['relaying'] + c['evaluating']} in progress" if c["relaying"] + c["evaluating"] else "")
           + f", {s['regressions']} regression(s)"]
    for label, e in (("best", s["best"]), ("latest", s["latest"])):
        if e is not None:
            out.append(f"{label}: step {e['step']} ({e['name']}), τ macro {fmt_ci(e['measures']['tau_macro'])}, "
                       f"DDTree-8 {fmt_ci(e['measures']['ddtree'])}")
    return out


def summary_lines(series: dict) -> list[str]:
    return ["## Summary", "", *("- " + md_text(line) for line in summary_text(series)), ""]


def _one_line(text: str | None, limit: int = 160) -> str:
    """An error as one short table cell (cut before escaping: an escape is never cut in half)."""
    flat = " ".join(str(text or "?").split())
    return md_text(flat if len(flat) <= limit else flat[: limit - 1] + "…")
