"""series.md: the series as a person reads it (pure: the series dict in, Markdown out)."""

from __future__ import annotations

from orchestrator.watch.measures import verdict_text


def fmt_ci(stat: dict | None, digits: int = 2) -> str:
    if not stat or stat.get("value") is None:
        return "–"
    text = f"{stat['value']:.{digits}f}"
    ci = stat.get("ci")
    return text + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def _p(stat_list: list[dict], k: int) -> str:
    for s in stat_list:
        if s["k"] == k and s.get("value") is not None:
            return f"{s['value']:.2f}"
    return "–"


def series_markdown(series: dict) -> str:
    s = series["settings"]
    lines = [f"# Series {series['name']}", "",
             f"Checkpoints from `{series['source']}`, evaluated on {series['eval_host']} against "
             f"`{s.get('target')}` ({s.get('samples') or 'all'} samples of {s.get('prompts')}, "
             f"{s.get('max_new_tokens')} new tokens, {s.get('dtype')}). Updated {series['updated_utc']}.", "",
             "τ macro and DDTree-8 with 95% bootstrap CIs over samples; the verdict pairs each checkpoint with the "
             "best one before it by prompt (Δτ macro CI above 0: up, below 0: down, else flat).", ""]
    base = (series.get("baselines") or {}).get("drafters") or {}
    if base:
        lines += ["## Baselines", "", f"Evaluated once in run `{series['baselines']['run']}` and reused.", "",
                  "| baseline | τ macro | τ micro | DDTree-8 |", "|---|---|---|---|"]
        for name, m in base.items():
            lines.append(f"| {name} | {fmt_ci(m['tau_macro'])} | {fmt_ci(m['tau_micro'])} | {fmt_ci(m['ddtree'])} |")
        lines.append("")
    lines += ["## Checkpoints", "",
              "| step | checkpoint | τ macro | τ micro | DDTree-8 | p1 | p2 | p3 | p4 | verdict | run |",
              "|---:|---|---|---|---|---:|---:|---:|---:|---|---|"]
    for e in sorted(series["checkpoints"].values(), key=lambda e: e["step"]):
        if e["status"] == "done":
            m = e["measures"]
            lines.append(f"| {e['step']} | {e['name']} | {fmt_ci(m['tau_macro'])} | {fmt_ci(m['tau_micro'])} | "
                         f"{fmt_ci(m['ddtree'])} | " + " | ".join(_p(m["p"], k) for k in range(1, 5))
                         + f" | {verdict_text(e['verdict'])} | `{e['run']}` |")
        elif e["status"] == "failed":
            lines.append(f"| {e['step']} | {e['name']} | failed | | | | | | | {_one_line(e.get('error'))} | "
                         f"{'`' + e['run'] + '`' if e.get('run') else ''} |")
        else:
            lines.append(f"| {e['step']} | {e['name']} | {e['status']} … | | | | | | | | |")
    lines.append("")
    drops = [e for e in sorted(series["checkpoints"].values(), key=lambda e: e["step"])
             if e["status"] == "done" and (e.get("verdict") or {}).get("regression")]
    if drops:
        lines += ["## Regressions", ""] + [f"- step {e['step']} ({e['name']}): {verdict_text(e['verdict'])}"
                                           for e in drops] + [""]
    lines += ["![τ over training steps](tau_vs_step.png)", ""]
    return "\n".join(lines)


def _one_line(text: str | None, limit: int = 160) -> str:
    flat = " ".join((text or "?").split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
