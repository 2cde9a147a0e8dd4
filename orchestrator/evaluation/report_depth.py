"""The report's τ by context depth and thinking-mode parts: report.md sections, the terminal table's columns and the
depth plot, read from ``metrics.by_context_depth`` and ``metrics.by_thinking`` (remote_payload/metrics/depth.py,
remote_payload/metrics/aggregate.py). As in report.py every name is host text and every figure may be of the wrong
type ("–" where a number was expected, never an exception)."""

from __future__ import annotations

from orchestrator.core.host_text import fmt_number, md_text
from orchestrator.evaluation.report_values import _count, _fmt, _obj, _objs, _real, fmt_with_ci

THINKING_COLUMNS = ("thinking off τ [CI]", "thinking on τ [CI]", "on − off [CI]")


def _figure(block) -> dict:
    block = _obj(block)
    ci = block.get("ci")
    return {"value": _real(block.get("value")),
            "ci": ci if isinstance(ci, list) and len(ci) == 2 and all(_real(c) is not None for c in ci) else None}


def depth_of(metrics) -> dict:
    return _obj(_obj(metrics).get("by_context_depth"))


def bucket_labels(results: dict) -> list[str]:
    """Every depth bucket with rounds in any drafter, in order."""
    out: list[str] = []
    for d in _obj(results.get("drafters")).values():
        for b in _objs(depth_of(_obj(d).get("metrics")).get("buckets")):
            if isinstance(b.get("label"), str) and _real(b.get("rounds")) and b["label"] not in out:
                out.append(b["label"])
    return out


def depth_markdown(results: dict) -> list[str]:
    """``## τ by context depth``: per drafter and bucket τ macro [CI] and p1 [CI], its rounds and samples."""
    labels = bucket_labels(results)
    if not labels:
        return []
    first = next(b for d in _obj(results.get("drafters")).values() if (b := depth_of(_obj(d).get("metrics"))))
    out = ["", "## τ by context depth", "",
           f"Buckets of the anchor's absolute position ({md_text(first.get('layout') or '?')} layout): τ macro "
           "[95% CI]; p1 [CI]; rounds / samples.", "",
           "| drafter | " + " | ".join(md_text(label) for label in labels) + " |", "|---|" + "---|" * len(labels)]
    for name, d in _obj(results.get("drafters")).items():
        buckets = {b.get("label"): b for b in _objs(depth_of(_obj(d).get("metrics")).get("buckets"))}
        cells = []
        for label in labels:
            b = _obj(buckets.get(label))
            cells.append("–" if not _real(b.get("rounds")) else
                         f"{fmt_with_ci(_figure(b.get('tau_macro')))}; p1 {fmt_with_ci(_figure(b.get('p1')))}; "
                         f"{_count(b.get('rounds'))} / {_count(b.get('samples'))}")
        out.append(f"| {md_text(name)} | " + " | ".join(cells) + " |")
    out.append("")
    for key in ("definition", "layout_rule", "rounds_binned", "ci"):
        if isinstance(first.get(key), str):
            out.append(f"- **{key.replace('_', ' ')}**: {md_text(first[key])}")
    return out


def thinking_of(results: dict, name: str) -> dict:
    return _obj(_obj(_obj(_obj(results.get("drafters")).get(name)).get("metrics")).get("by_thinking"))


def has_thinking(results: dict) -> bool:
    return any(thinking_of(results, name) for name in _obj(results.get("drafters")))


def thinking_cells(results: dict, name: str) -> list[str]:
    """The three THINKING_COLUMNS of drafter NAME: τ macro per mode and the paired difference, each with its CI."""
    block = thinking_of(results, name)
    paired = _obj(block.get("paired"))
    diff = _figure({"value": paired.get("difference"), "ci": paired.get("ci")})
    diff_text = "–" if diff["value"] is None else fmt_number(diff["value"], "+.2f") + (
        f" [{_fmt(diff['ci'][0])}, {_fmt(diff['ci'][1])}]" if diff["ci"] else "")
    return [fmt_with_ci(_figure(_obj(block.get("off")).get("tau_macro"))),
            fmt_with_ci(_figure(_obj(block.get("on")).get("tau_macro"))), diff_text]


def thinking_markdown(results: dict) -> list[str]:
    """``## Thinking modes`` (``--enable-thinking both``): τ per mode, the paired difference and its verdict."""
    if not has_thinking(results):
        return []
    out = ["", "## Thinking modes", "", "| drafter | " + " | ".join(THINKING_COLUMNS) + " | prompts | verdict |",
           "|---|---|---|---|---|---|"]
    definition = None
    for name in _obj(results.get("drafters")):
        block = thinking_of(results, name)
        if not block:
            continue
        paired = _obj(block.get("paired"))
        definition = definition or block.get("definition")
        out.append(f"| {md_text(name)} | " + " | ".join(thinking_cells(results, name))
                   + f" | {_count(paired.get('prompts'))} | {md_text(paired.get('verdict') or '')} |")
    if isinstance(definition, str):
        out += ["", f"- **definition**: {md_text(definition)}"]
    return out


def depth_figure(plt, results: dict):
    """τ macro per depth bucket with its CI, one series per drafter; None when no drafter has depth figures."""
    from orchestrator.core.host_text import clean

    labels = bucket_labels(results)
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    markers = ["o", "s", "^", "D", "v", "P"]
    for i, (name, d) in enumerate(_obj(results.get("drafters")).items()):
        buckets = {b.get("label"): b for b in _objs(depth_of(_obj(d).get("metrics")).get("buckets"))}
        xs, ys, lo, hi = [], [], [], []
        for x, label in enumerate(labels):
            fig_ = _figure(_obj(buckets.get(label)).get("tau_macro"))
            if fig_["value"] is None:
                continue
            xs.append(x + (i - 0.5) * 0.06)  # a small offset: two drafters' bars stay apart
            ys.append(fig_["value"])
            ci = fig_["ci"] or [fig_["value"], fig_["value"]]
            lo.append(max(0.0, fig_["value"] - ci[0]))
            hi.append(max(0.0, ci[1] - fig_["value"]))
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker=markers[i % len(markers)], capsize=3, linewidth=1.5,
                        label=clean(name))
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("context depth of the round's anchor (tokens)")
    ax.set_ylabel("τ macro (95% CI)")
    ax.set_title("τ by context depth")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
