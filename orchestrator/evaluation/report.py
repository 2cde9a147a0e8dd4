"""What a person reads after a run: the summary table, report.md and the plots.

Everything here is computed from results.json (and samples.jsonl) alone, so `dfo runs show` renders the
same thing long after the hosts are gone.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.table import Table

FIRST_POSITIONS = 4
HEADLINE = "committed"  # the convention of the headline τ (metrics.tau_macro / tau_micro)
# The figure shown per other convention: z-lab reports a mean over samples, vLLM's counters give 1 + accepted/drafts.
SHOWN = {"zlab": "tau_macro", "vllm": "tau_micro"}
CONVENTIONS_NOTE = ("τ conventions: committed = dfo's (the last round counts only the kept tokens); zlab = z-lab's "
                    "benchmark loop, the one its published τ uses (drafts accepted past the end counted); vllm = "
                    "vLLM's spec-decode counters (1 + accepted/drafts). A committed τ and a model card's τ are "
                    "different figures.")


def digest_value(digest) -> str | None:
    """A digest recorded either as a plain hex string or as {"algorithm", "value", ...}."""
    return digest.get("value") if isinstance(digest, dict) else digest


def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def convention_figure(metrics: dict, name: str, key: str | None = None) -> dict:
    """One convention's figure: {"value", "exact", "reason"} (value None with a reason when unavailable,
    or with neither in results from before the conventions)."""
    block = (metrics.get("conventions") or {}).get(name)
    if not isinstance(block, dict):
        return {"value": None, "exact": None, "reason": None}
    if block.get("available") is False:
        return {"value": None, "exact": None, "reason": block.get("reason") or "unavailable"}
    return {"value": block.get(key or SHOWN.get(name, "tau_macro")), "exact": block.get("exact", True), "reason": None}


def fmt_convention(fig: dict) -> str:
    """A convention's figure for a table: '–' when absent, 'n/a' when unavailable, '≥x' when a lower bound."""
    if fig["value"] is None:
        return "n/a" if fig["reason"] else "–"
    return ("" if fig["exact"] is not False else "≥") + _fmt(fig["value"])


def has_conventions(results: dict) -> bool:
    return any((d.get("metrics") or {}).get("conventions") for d in (results.get("drafters") or {}).values())


def drafter_rows(results: dict) -> list[dict]:
    """One flat row per drafter with the headline numbers (missing ones are None); τ macro/micro are the
    committed convention's, ``zlab``/``vllm`` the other conventions' figures (``convention_figure``)."""
    rows = []
    for name, d in (results.get("drafters") or {}).items():
        m = d.get("metrics") or {}
        tree = m.get("tree") or {}
        topk = tree.get("topk") or {}
        budgeted = tree.get("budgeted") or {}
        positions = {p["k"]: p.get("p") for p in m.get("per_position", [])}
        rows.append({
            "drafter": name,
            "format": (d.get("spec") or {}).get("format"),
            "convention": HEADLINE,
            "tau_macro": m.get("tau_macro"),
            "tau_micro": m.get("tau_micro"),
            "zlab": convention_figure(m, "zlab"),
            "vllm": convention_figure(m, "vllm"),
            "ddtree_k": topk.get("k"),
            "ddtree": topk.get("tau_macro"),
            "budgeted": budgeted.get("tau_macro"),
            "budget": budgeted.get("budget"),
            "positions": [positions.get(k) for k in range(1, FIRST_POSITIONS + 1)],
            "samples": m.get("samples"),
            "rounds": m.get("rounds"),
            "block_size": m.get("block_size"),
            "eval_s": (d.get("timings") or {}).get("eval_s"),
        })
    return rows


def comparison_lines(results: dict) -> list[str]:
    comp = results.get("comparison") or {}
    level = comp.get("confidence", 0.95)
    lines = []
    for pair in comp.get("pairs", []):
        parts = []
        for key, label in (("tau_macro", "τ macro"), ("ddtree", "DDTree-8"), ("tau_micro", "τ micro")):
            stat = pair.get(key)
            if stat and stat.get("delta") is not None:
                ci = stat.get("ci") or [None, None]
                parts.append(f"{label} {stat['delta']:+.2f} [{_fmt(ci[0])}, {_fmt(ci[1])}]")
        if parts:
            verdict = pair.get("verdict")
            lines.append(f"{pair['b']} − {pair['a']} ({level:.0%} bootstrap CI over {pair.get('samples', '?')} "
                         "samples): " + "; ".join(parts) + (f"\n    → {verdict}" if verdict else ""))
    return lines


def convention_notes(results: dict) -> list[str]:
    """Why a drafter's zlab/vllm figures are missing or a lower bound (one line each)."""
    out = []
    for r in drafter_rows(results):
        reasons = {name: r[name]["reason"] for name in SHOWN if r[name]["reason"]}
        for reason in dict.fromkeys(reasons.values()):
            names = " and ".join(n for n, why in reasons.items() if why == reason)
            out.append(f"{r['drafter']}: {names} τ unavailable: {reason}")
        bounds = [name for name in SHOWN if r[name]["exact"] is False]
        if bounds:
            out.append(f"{r['drafter']}: {' and '.join(bounds)} τ a lower bound (≥; fewer than B-1 target tokens "
                       "known past the stop for some samples)")
    return out


def summary_table(results: dict, title: str | None = None) -> Table:
    rows = drafter_rows(results)
    k = next((r["ddtree_k"] for r in rows if r["ddtree_k"]), 8)
    conv = has_conventions(results)
    caption = "\n".join([CONVENTIONS_NOTE, *convention_notes(results)]) if conv else None
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    columns = ["drafter", f"{HEADLINE} τ macro", "τ micro", *(["zlab τ macro", "vllm τ micro"] if conv else []),
               f"DDTree-{k}", *[f"p{i}" for i in range(1, FIRST_POSITIONS + 1)], "samples", "rounds", "eval s"]
    for col in columns:  # the headline's convention must stay readable in its header
        table.add_column(col, justify="left" if col == "drafter" else "right",
                         min_width=len(HEADLINE) if col.startswith(HEADLINE) else None)
    for r in rows:
        table.add_row(r["drafter"], _fmt(r["tau_macro"]), _fmt(r["tau_micro"]),
                      *([fmt_convention(r["zlab"]), fmt_convention(r["vllm"])] if conv else []), _fmt(r["ddtree"]),
                      *[_fmt(p) for p in r["positions"]], str(r["samples"] or "–"), str(r["rounds"] or "–"),
                      _fmt(r["eval_s"], 1))
    return table


def engine_lines(results: dict, markdown: bool = False) -> list[str]:
    """The engine block (``--engine vllm``), rendered by ``engine_report`` (owned by the engine eval)."""
    try:
        from orchestrator.evaluation import engine_report
    except ImportError:
        return []
    render = getattr(engine_report, "engine_markdown" if markdown else "engine_text", None)
    return list(render(results)) if render else []


def settings_lines(results: dict) -> list[str]:
    s = results.get("settings") or {}
    t = results.get("target") or {}
    e = results.get("extraction") or {}
    v = results.get("versions") or {}
    prompts = s.get("prompts")
    if isinstance(prompts, dict):
        prompts = prompts.get("source") or prompts.get("name") or prompts
    return [
        f"target: {t.get('path') or t.get('name')} ({t.get('architecture') or t.get('model_type') or '?'}, "
        f"{t.get('num_layers') or '?'} layers, weights sha256 {str(digest_value(t.get('weights_digest')))[:16]})",
        f"prompts: {prompts}; samples: {s.get('samples')}; max new tokens: {s.get('max_new_tokens')}; "
        f"enable_thinking: {s.get('enable_thinking')}",
        f"device: {s.get('device')}; dtype: {s.get('dtype')}; linear-attention kernels: {e.get('kernel_path')}",
        f"versions: torch {v.get('torch')}, transformers {v.get('transformers')}, payload {v.get('payload')}",
    ]


# ------------------------------------------------------------------------------ report.md


def write_report(run_dir: Path, results: dict, samples: list[dict]) -> Path:
    plots = write_plots(run_dir, results)
    rows = drafter_rows(results)
    k = next((r["ddtree_k"] for r in rows if r["ddtree_k"]), 8)
    out = [f"# dfo eval — {run_dir.name}", ""]
    out += [f"- {line}" for line in settings_lines(results)]
    hosts = results.get("hosts") or {}
    if hosts:
        out += ["- hosts: " + ", ".join(f"{h} (job {p.get('job_id')}, {p.get('samples')} samples, "
                                         f"kernels {p.get('kernel_path')})" for h, p in hosts.items())]
    conv = has_conventions(results)
    out += ["", "## Acceptance", "",
            f"| drafter | format | τ macro ({HEADLINE}) | τ micro ({HEADLINE}) | "
            + ("zlab τ macro | vllm τ micro | " if conv else "") + f"DDTree-{k} | budgeted DDTree | "
            + " | ".join(f"p{i}" for i in range(1, FIRST_POSITIONS + 1)) + " | samples | rounds | eval s |",
            "|---|---|---|---|" + ("---|---|" if conv else "") + "---|---|" + "---|" * FIRST_POSITIONS + "---|---|---|"]
    for r in rows:
        out.append(f"| {r['drafter']} | {r['format'] or ''} | {_fmt(r['tau_macro'])} | {_fmt(r['tau_micro'])} | "
                   + (f"{fmt_convention(r['zlab'])} | {fmt_convention(r['vllm'])} | " if conv else "")
                   + f"{_fmt(r['ddtree'])} | {_fmt(r['budgeted'])}"
                   + (f" (budget {r['budget']})" if r["budget"] else "") + " | "
                   + " | ".join(_fmt(p) for p in r["positions"])
                   + f" | {r['samples']} | {r['rounds']} | {_fmt(r['eval_s'], 1)} |")
    if conv:
        out += ["", f"p_k and the τ histogram below are the {HEADLINE} convention's.", ""]
        out += conventions_markdown(results)
    engine = engine_lines(results, markdown=True)
    out += ["", *engine] if engine else []
    comparison = comparison_lines(results)
    if comparison:
        out += ["", "## Comparison", ""] + [f"- {line}" for line in comparison]
    if plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    definitions = _definitions(results)
    if definitions:
        out += ["", "## Definitions", ""] + [f"- **{k}**: {v}" for k, v in definitions.items()]
    diag = results.get("diagnostics")
    if diag:
        out += ["", "## Diagnostics", "", "```", _diagnostics_text(diag), "```"]
    warnings = results.get("warnings") or []
    if warnings:
        out += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    out += ["", "## Samples", "", "| id | host | tokens | " + " | ".join(f"τ {r['drafter']} ({HEADLINE})" for r in rows)
            + " |",
            "|---|---|---|" + "---|" * len(rows)]
    for s in samples:
        taus = [(s.get("drafters") or {}).get(r["drafter"], {}).get("tau") for r in rows]
        out.append(f"| {s.get('id')} | {s.get('host', '')} | {s.get('continuation_tokens')} | "
                   + " | ".join(_fmt(t) for t in taus) + " |")
    path = run_dir / "report.md"
    tmp = run_dir / ".report.md.tmp"
    tmp.write_text("\n".join(out) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def conventions_markdown(results: dict) -> list[str]:
    """``## τ conventions``: every convention of every drafter, macro and micro, rounds and p1..p4."""
    out = ["## τ conventions", "", CONVENTIONS_NOTE, "",
           "| drafter | convention | τ macro | τ micro | rounds | "
           + " | ".join(f"p{i}" for i in range(1, FIRST_POSITIONS + 1)) + " | exact |",
           "|---|---|---|---|---|" + "---|" * FIRST_POSITIONS + "---|"]
    for name, d in (results.get("drafters") or {}).items():
        for conv, block in ((d.get("metrics") or {}).get("conventions") or {}).items():
            if block.get("available") is False:
                out.append(f"| {name} | {conv} | n/a | n/a | | " + " | " * FIRST_POSITIONS + "|")
                continue
            ps = {p["k"]: p.get("p") for p in block.get("per_position") or []}
            out.append(f"| {name} | {conv} | {_fmt(block.get('tau_macro'))} | {_fmt(block.get('tau_micro'))} | "
                       f"{block.get('rounds')} | " + " | ".join(_fmt(ps.get(i)) for i in range(1, FIRST_POSITIONS + 1))
                       + f" | {'yes' if block.get('exact', True) else 'lower bound'} |")
    notes = convention_notes(results)
    definitions: dict = next((c for d in (results.get("drafters") or {}).values()
                              if (c := (d.get("metrics") or {}).get("conventions"))), {})
    out += [""] + [f"- {line}" for line in notes] + ([""] if notes else [])
    out += [f"- **{conv}**: {block.get('definition')}" for conv, block in definitions.items()
            if block.get("definition")]
    return out


def _definitions(results: dict) -> dict:
    for d in (results.get("drafters") or {}).values():
        defs = dict((d.get("metrics") or {}).get("definitions") or {})
        tree = (d.get("metrics") or {}).get("tree") or {}
        for key in ("topk", "budgeted"):
            if (tree.get(key) or {}).get("definition"):
                defs[f"tree.{key}"] = tree[key]["definition"]
        if defs:
            return defs
    return {}


def _diagnostics_text(diag) -> str:
    if isinstance(diag, dict) and diag.get("text"):
        return diag["text"]
    import json

    return json.dumps(diag, indent=2)[:20000]


# ------------------------------------------------------------------------------ plots


def write_plots(run_dir: Path, results: dict) -> list[Path]:
    """Per-position acceptance curves and the τ histogram, one series per drafter (PNG, matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.environ.setdefault("MPLBACKEND", "Agg")
    drafters = results.get("drafters") or {}
    if not drafters:
        return []
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    # Distinct markers and dash styles: two drafters with identical curves must both stay visible.
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", "-"), ("P", "--")]
    for i, (name, d) in enumerate(drafters.items()):
        m = d.get("metrics") or {}
        pts = [(p["k"], p["p"]) for p in m.get("per_position", []) if p.get("p") is not None]
        marker, dash = styles[i % len(styles)]
        if pts:
            ax.plot([k for k, _ in pts], [p for _, p in pts], marker=marker, linestyle=dash, linewidth=2,
                    markersize=7 - i, label=f"{name} (τ {_fmt(m.get('tau_macro'))})")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(round accepts ≥ k drafts)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Per-position acceptance")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", frameon=False)
    fig.tight_layout()
    path = run_dir / "acceptance.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    n = len(drafters)
    width = 0.8 / n
    for i, (name, d) in enumerate(drafters.items()):
        hist = (d.get("metrics") or {}).get("tau_histogram") or {}
        total = sum(hist.values()) or 1
        xs = sorted(int(k) for k in hist)
        ax.bar([x + (i - (n - 1) / 2) * width for x in xs], [hist[str(x)] / total for x in xs], width=width,
               label=name)
    ax.set_xlabel("τ per round (accepted drafts + 1)")
    ax.set_ylabel("fraction of rounds")
    ax.set_title("τ histogram")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    path = run_dir / "tau_histogram.png"
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    return written
