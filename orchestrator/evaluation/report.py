"""What a person reads after a run: the summary table, report.md and the plots.

Everything here is computed from results.json (and samples.jsonl) alone, so `dfo runs show` renders the
same thing long after the hosts are gone. Those files hold what the eval host wrote: every name and
reason in them is host text (``Text`` on the terminal, ``md_*`` in report.md) and every figure may be of
the wrong type ("?" where a number was expected, never an exception).
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from orchestrator.core.atomic_file import write_text_atomic
from orchestrator.core.host_text import fmt_number, md_fence, md_text
from orchestrator.evaluation.card_report import card_lines
from orchestrator.evaluation.k_schedule import k_plan_markdown, k_plans
from orchestrator.evaluation.report_values import (
    _by_position,
    _count,
    _fmt,
    _obj,
    _objs,
    _real,
    _small_int,
    fmt_with_ci,
)
from orchestrator.lint.rules import confirmed_by_diagnose
from remote_payload.metrics.conventions import resolve

FIRST_POSITIONS = 4
HEADLINE = "committed"  # the convention of the headline τ (metrics.tau_macro / tau_micro)
# The figure shown per other convention: z-lab reports a mean over samples, vLLM's counters give 1 + accepted/drafts.
SHOWN = {"zlab-2604": "tau_macro", "vllm": "tau_micro"}
DATASETS_NOTE = ("NAME τ [CI]: τ macro in the committed convention over that dataset's samples (each turn of a "
                 "multi-turn row one sample), 95% bootstrap CI; report.md's Benchmarks has zlab-2604 τ and categories.")
SAMPLED_NOTE = ("{law}: every figure is an expectation over continuations drawn from the target ({k} per prompt, "
                "seeded): the teacher-forced replay on a drawn output is exactly the loop's acceptance on it; "
                "[CI] = 95% cluster bootstrap over prompts (a prompt's draws resampled together).")
CONVENTIONS_NOTE = ("τ conventions: committed = dfo's (the last round counts only the kept tokens); zlab = committed, "
                    "z-lab's loop since August 2026; zlab-2604 = z-lab's April 2026 loop, the one its published τ of "
                    "that time uses (drafts accepted past the end counted; named zlab in results before schema "
                    "dfo.results/2); vllm = vLLM's spec-decode counters (1 + accepted/drafts). Read a card beside the "
                    "convention of the code that measured it.")


def digest_value(digest) -> str | None:
    """A digest recorded either as a plain hex string or as {"algorithm", "value", ...}."""
    return digest.get("value") if isinstance(digest, dict) else digest


TREE_NOT_DEFINED_NOTE = ("DDTree: not defined for DFlash2 drafters (their selector makes a slot's candidates depend on "
                         "the previous draft; no tree over them is defined), so no figure is given")


def _tree_cell(row: dict, key: str) -> str:
    return "not defined" if row["ddtree_not_defined"] else _fmt(row[key])


def convention_figure(metrics: dict, name: str, key: str | None = None) -> dict:
    """One convention's figure: {"value", "exact", "reason"} (value None with a reason when unavailable,
    or with neither in results from before the conventions)."""
    block = resolve(_obj(_obj(metrics).get("conventions")), name)  # an alias (zlab) reads as what it names
    if not isinstance(block, dict):
        return {"value": None, "exact": None, "reason": None}
    if block.get("available") is False:
        return {"value": None, "exact": None, "reason": str(block.get("reason") or "unavailable")}
    return {"value": block.get(key or SHOWN.get(name, "tau_macro")), "exact": block.get("exact", True), "reason": None}


def fmt_convention(fig: dict) -> str:
    """A convention's figure for a table: '–' when absent, 'n/a' when unavailable, '≥x' when a lower bound."""
    if fig["value"] is None:
        return "n/a" if fig["reason"] else "–"
    return ("" if fig["exact"] is not False else "≥") + _fmt(fig["value"])


def has_conventions(results: dict) -> bool:
    return any(_obj(_obj(d).get("metrics")).get("conventions") for d in _obj(results.get("drafters")).values())


def drafter_rows(results: dict) -> list[dict]:
    """One flat row per drafter with the headline numbers (missing ones are None); τ macro/micro are the
    committed convention's (= zlab), ``zlab-2604``/``vllm`` the other conventions' figures
    (``convention_figure``)."""
    rows = []
    for name, d in _obj(results.get("drafters")).items():
        d = _obj(d)
        m = _obj(d.get("metrics"))
        tree = _obj(m.get("tree"))
        topk = _obj(tree.get("topk"))
        budgeted = _obj(tree.get("budgeted"))
        positions = _by_position(m.get("per_position"))
        rows.append({
            "drafter": name,
            "format": _obj(d.get("spec")).get("format"),
            "convention": HEADLINE,
            "tau_macro": m.get("tau_macro"),
            "tau_micro": m.get("tau_micro"),
            "zlab-2604": convention_figure(m, "zlab-2604"),
            "vllm": convention_figure(m, "vllm"),
            "ddtree_k": _small_int(topk.get("k")),
            "ddtree": topk.get("tau_macro"),
            "ddtree_not_defined": isinstance(tree.get("not_defined"), str),  # a DFlash2 drafter
            "budgeted": budgeted.get("tau_macro"),
            "budget": _small_int(budgeted.get("budget")),
            "positions": [positions.get(k) for k in range(1, FIRST_POSITIONS + 1)],
            "samples": m.get("samples"),
            "rounds": m.get("rounds"),
            "block_size": m.get("block_size"),
            "eval_s": _obj(d.get("timings")).get("eval_s"),
        })
    return rows


def sampling_of(results: dict) -> dict | None:
    """The run's sampling settings (``settings.sampling``, T > 0), None for a greedy run."""
    s = _obj(_obj(results.get("settings")).get("sampling"))
    return s if _real(s.get("temperature")) else None


def law_label(sampling: dict | None) -> str:
    """'T=1, sampled rule', 'T=0.6, top-p 0.95, greedy rule' …; 'T=0' for a greedy run. The draft rule is part
    of the law's label: at T > 0 the two rules give different τ (a run from before the option followed the greedy
    rule)."""
    if sampling is None:
        return "T=0"
    top_p, top_k = _real(sampling.get("top_p")), _small_int(sampling.get("top_k"))
    rule = sampling.get("draft_rule") if sampling.get("draft_rule") in ("greedy", "sampled") else "greedy"
    return (f"T={fmt_number(sampling.get('temperature'), 'g')}" + (f", top-p {top_p:g}" if top_p and top_p < 1 else "")
            + (f", top-k {top_k}" if top_k else "") + f", {rule} rule")


def sampled_figure(results: dict, drafter: str, key: str = "tau_macro") -> dict:
    """One figure of ``metrics.sampled`` (T > 0): {"value", "ci"} (None when absent)."""
    block = _obj(_obj(_obj(_obj(results.get("drafters")).get(drafter)).get("metrics")).get("sampled"))
    fig = _obj(block.get(key))
    ci = fig.get("ci")
    return {"value": fig.get("value"), "ci": ci if isinstance(ci, list) and len(ci) == 2 else None}


def sampled_lines(results: dict) -> list[str]:
    """Per drafter at T > 0: the expected τ with its CI, the variance parts and the online check's verdict."""
    sampling = sampling_of(results)
    if sampling is None:
        return []
    out = []
    for name, d in _obj(results.get("drafters")).items():
        block = _obj(_obj(_obj(d).get("metrics")).get("sampled"))
        if not block:
            continue
        var = _obj(block.get("variance"))
        parts = [f"τ macro {fmt_with_ci(sampled_figure(results, name))}",
                 f"τ micro {fmt_with_ci(sampled_figure(results, name, 'tau_micro'))}",
                 f"zlab-2604 {fmt_with_ci(sampled_figure(results, name, 'zlab_2604_tau_macro'))}",
                 f"DDTree {fmt_with_ci(sampled_figure(results, name, 'ddtree'))}"]
        line = (f"{name} at {law_label(sampling)} over {_count(block.get('prompts'))} prompts × "
                f"{fmt_number(block.get('draws_per_prompt'), 'g')} draws: " + "; ".join(parts))
        if _real(var.get("between")) is not None and _real(var.get("within")) is not None:
            line += (f"; per-draw τ variance between prompts {_fmt(var['between'])}, within a prompt "
                     f"{_fmt(var['within'])}")
        out.append(line)
        check = _obj(_obj(d).get("online_check"))
        for conv, verdict in _obj(check.get("agreement")).items() if check.get("sampled") else ():
            verdict = _obj(verdict)
            if verdict.get("agree") is None:
                continue
            out.append(f"{name} online check ({conv}): offline {_fmt(verdict.get('offline_tau'))} vs online loop "
                       f"{_fmt(verdict.get('online_tau'))}, Δ {fmt_number(verdict.get('difference'), '+.3f')} "
                       f"{'within' if verdict.get('agree') else 'OUTSIDE'} ±{_fmt(verdict.get('bound'), 3)} "
                       f"({_count(verdict.get('prompts'))} prompts, 1% false alarm)")
    return out


def datasets_of(results: dict) -> list[str]:
    """The benchmark datasets of a run, in its order (from the drafters' ``metrics.by_dataset``)."""
    names: list[str] = []
    for d in _obj(results.get("drafters")).values():
        for name in _obj(_obj(_obj(d).get("metrics")).get("by_dataset")):
            if name not in names:
                names.append(str(name))
    return names


def dataset_figure(results: dict, drafter: str, dataset: str, key: str = "tau_macro",
                   category: str | None = None) -> dict:
    """One cell of the per-dataset table: {"value", "ci", "samples"} (values None when absent)."""
    block = _obj(_obj(_obj(_obj(_obj(results.get("drafters")).get(drafter)).get("metrics")).get("by_dataset"))
                 .get(dataset))
    if category is not None:
        block = _obj(_obj(block.get("by_category")).get(category))
    fig = block.get(key)
    if not isinstance(fig, dict):  # engine_tau / tau_micro are plain numbers
        return {"value": fig, "ci": None, "samples": block.get("samples")}
    ci = fig.get("ci")
    return {"value": fig.get("value"), "ci": ci if isinstance(ci, list) and len(ci) == 2 else None,
            "samples": fig.get("samples", block.get("samples"))}


def dataset_categories(results: dict, dataset: str) -> list[str]:
    out: list[str] = []
    for d in _obj(results.get("drafters")).values():
        block = _obj(_obj(_obj(_obj(d).get("metrics")).get("by_dataset")).get(dataset))
        out += [str(c) for c in _obj(block.get("by_category")) if c not in out]
    return out


def comparison_lines(results: dict) -> list[str]:
    comp = _obj(results.get("comparison"))
    level = comp.get("confidence", 0.95)
    lines = []
    for pair in _objs(comp.get("pairs")):
        parts = []
        for key, label in (("tau_macro", "τ macro"), ("ddtree", "DDTree-8"), ("tau_micro", "τ micro")):
            stat = _obj(pair.get(key))
            if stat.get("delta") is not None:
                ci = stat.get("ci")
                ci = ci if isinstance(ci, list) and len(ci) == 2 else [None, None]
                parts.append(f"{label} {fmt_number(stat['delta'], '+.2f')} [{_fmt(ci[0])}, {_fmt(ci[1])}]")
            elif key == "ddtree" and "DFlash2" in str(stat.get("note") or ""):
                parts.append(str(stat["note"]))  # named, not silently missing
        if parts:
            verdict = pair.get("verdict")
            lines.append(f"{pair.get('b', '?')} − {pair.get('a', '?')} ({fmt_number(level, '.0%')} bootstrap CI "
                         f"over {_count(pair.get('samples'))} samples): " + "; ".join(parts)
                         + (f"\n    → {verdict}" if verdict else ""))
    return lines


def convention_notes(results: dict) -> list[str]:
    """Why a drafter's zlab-2604/vllm figures are missing or a lower bound (one line each)."""
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
    """The terminal's table. Every cell, the title and the caption are ``Text``: names and reasons in them
    came from the host, and as markup a "[/x]" would raise and a "[link=…]" would render."""
    rows = drafter_rows(results)
    k = next((r["ddtree_k"] for r in rows if r["ddtree_k"]), 8)
    conv = has_conventions(results)
    sampling = sampling_of(results)
    notes = ([SAMPLED_NOTE.format(law=law_label(sampling), k=fmt_number(sampling.get("samples_per_prompt"), "d"))]
             if sampling else []) + ([CONVENTIONS_NOTE, *convention_notes(results)] if conv else []) + (
        [DATASETS_NOTE] if datasets_of(results) else [])
    if any(r["ddtree_not_defined"] for r in rows):
        notes.append(TREE_NOT_DEFINED_NOTE)
    protocol = _obj(_obj(results.get("settings")).get("protocol"))
    if protocol:  # the card this measurement reproduces, first
        notes.insert(0, f"protocol {protocol.get('name')}: {protocol.get('source')}")
    caption = Text("\n".join(notes)) if notes else None
    table = Table(title=Text(title) if title is not None else None, title_justify="left", caption=caption,
                  caption_justify="left")
    datasets = datasets_of(results)
    from orchestrator.evaluation.report_depth import THINKING_COLUMNS, has_thinking, thinking_cells

    thinking = has_thinking(results)
    columns = ["drafter", f"{HEADLINE} τ macro", *([f"{law_label(sampling)} τ [CI]"] if sampling else []), "τ micro",
               *(["zlab-2604 τ macro", "vllm τ micro"] if conv else []),
               f"DDTree-{k}", *[f"p{i}" for i in range(1, FIRST_POSITIONS + 1)], "samples", "rounds", "eval s",
               *[f"{d} τ [CI]" for d in datasets], *(THINKING_COLUMNS if thinking else ())]
    for col in columns:  # the headline's convention must stay readable in its header; a τ with its CI on one line
        table.add_column(col, justify="left" if col == "drafter" else "right", no_wrap=col.endswith("[CI]"),
                         min_width=len(HEADLINE) if col.startswith(HEADLINE) else None)
    for r in rows:
        cells = [r["drafter"], _fmt(r["tau_macro"]),
                 *([fmt_with_ci(sampled_figure(results, r["drafter"]))] if sampling else []), _fmt(r["tau_micro"]),
                 *([fmt_convention(r["zlab-2604"]), fmt_convention(r["vllm"])] if conv else []),
                 _tree_cell(r, "ddtree"),
                 *[_fmt(p) for p in r["positions"]], _count(r["samples"]), _count(r["rounds"]), _fmt(r["eval_s"], 1),
                 *[fmt_with_ci(dataset_figure(results, r["drafter"], d)) for d in datasets],
                 *(thinking_cells(results, r["drafter"]) if thinking else ())]
        table.add_row(*map(Text, cells))
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
    s = _obj(results.get("settings"))
    t = _obj(results.get("target"))
    e = _obj(results.get("extraction"))
    v = _obj(results.get("versions"))
    prompts = s.get("prompts")
    if isinstance(prompts, dict):
        prompts = prompts.get("source") or prompts.get("name") or prompts
    sampling = sampling_of(results)
    drawn = ([f"sampling: {law_label(sampling)}, {sampling.get('samples_per_prompt')} draw(s) per prompt, seed "
              f"{sampling.get('seed')} (each draw's seed in samples.jsonl)"] if sampling else [])
    protocol = _obj(s.get("protocol"))
    if protocol:
        drawn.append(f"protocol: {protocol.get('name')}: {protocol.get('source')}")
    if isinstance(s.get("selection"), str):
        drawn.append(f"dataset rows: {s.get('selection')} selection")
    return [
        f"target: {t.get('path') or t.get('name')} ({t.get('architecture') or t.get('model_type') or '?'}, "
        f"{t.get('num_layers') or '?'} layers, weights sha256 {str(digest_value(t.get('weights_digest')))[:16]})",
        f"prompts: {prompts}; samples: {s.get('samples')}; max new tokens: {s.get('max_new_tokens')}; "
        f"enable_thinking: {s.get('enable_thinking')}",
        f"device: {s.get('device')}; dtype: {s.get('dtype')}; linear-attention kernels: {e.get('kernel_path')}",
        f"versions: torch {v.get('torch')}, transformers {v.get('transformers')}, payload {v.get('payload')}",
        *drawn,
    ]


# ------------------------------------------------------------------------------ report.md


def write_report(run_dir: Path, results: dict, samples: list[dict]) -> Path:
    """report.md (temp name, then renamed). Host text goes in through ``md_text``/``md_fence``: no HTML,
    link, extra table cell or early end of a code fence can come from results.json or samples.jsonl."""
    from orchestrator.evaluation.report_plots import write_plots  # matplotlib only when a report is written

    plots = write_plots(run_dir, results)
    rows = drafter_rows(results)
    k = next((r["ddtree_k"] for r in rows if r["ddtree_k"]), 8)
    out = [f"# dfo eval — {md_text(run_dir.name)}", ""]
    out += [f"- {md_text(line)}" for line in settings_lines(results)]
    hosts = {h: _obj(p) for h, p in _obj(results.get("hosts")).items()}
    if hosts:
        out += ["- hosts: " + ", ".join(md_text(f"{h} (job {p.get('job_id')}, {p.get('samples')} samples, "
                                                f"kernels {p.get('kernel_path')})") for h, p in hosts.items())]
    conv = has_conventions(results)
    out += ["", "## Acceptance", "",
            f"| drafter | format | τ macro ({HEADLINE}) | τ micro ({HEADLINE}) | "
            + ("zlab-2604 τ macro | vllm τ micro | " if conv else "") + f"DDTree-{k} | budgeted DDTree | "
            + " | ".join(f"p{i}" for i in range(1, FIRST_POSITIONS + 1)) + " | samples | rounds | eval s |",
            "|---|---|---|---|" + ("---|---|" if conv else "") + "---|---|" + "---|" * FIRST_POSITIONS + "---|---|---|"]
    for r in rows:
        out.append(f"| {md_text(r['drafter'])} | {md_text(r['format'] or '')} | {_fmt(r['tau_macro'])} | "
                   f"{_fmt(r['tau_micro'])} | "
                   + (f"{fmt_convention(r['zlab-2604'])} | {fmt_convention(r['vllm'])} | " if conv else "")
                   + f"{_tree_cell(r, 'ddtree')} | {_tree_cell(r, 'budgeted')}"
                   + (f" (budget {r['budget']})" if r["budget"] else "") + " | "
                   + " | ".join(_fmt(p) for p in r["positions"])
                   + f" | {_count(r['samples'])} | {_count(r['rounds'])} | {_fmt(r['eval_s'], 1)} |")
    if any(r["ddtree_not_defined"] for r in rows):
        out += ["", TREE_NOT_DEFINED_NOTE + "."]
    if conv:
        out += ["", f"p_k and the τ histogram below are the {HEADLINE} convention's.", ""]
        out += conventions_markdown(results)
    card = card_lines(results)
    out += ["", "## Card", ""] + [f"- {md_text(line.strip())}" for line in card] if card else []
    out += sampled_markdown(results)
    out += benchmarks_markdown(results)
    from orchestrator.evaluation.report_depth import depth_markdown, thinking_markdown  # it reads this module

    out += thinking_markdown(results) + depth_markdown(results)
    engine = engine_lines(results, markdown=True)
    out += ["", *engine] if engine else []
    out += k_plan_markdown(k_plans(results, samples), md_text)
    comparison = comparison_lines(results)
    if comparison:
        out += ["", "## Comparison", ""] + [f"- {md_text(line)}" for line in comparison]
    if plots:
        out += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    definitions = _definitions(results)
    if definitions:
        out += ["", "## Definitions", ""] + [f"- **{md_text(k)}**: {md_text(v)}" for k, v in definitions.items()]
    diag = results.get("diagnostics")
    if diag:
        out += ["", "## Diagnostics", "", *md_fence(_diagnostics_text(diag))]
        out += [f"- {md_text(line)}" for line in confirmed_by_diagnose(_obj(diag).get("findings"))]
    warnings = results.get("warnings") or []
    if warnings:
        out += ["", "## Warnings", ""] + [f"- {md_text(w)}" for w in (warnings if isinstance(warnings, list)
                                                                      else [warnings])]
    out += ["", "## Samples", "", "| id | host | tokens | "
            + " | ".join(f"τ {md_text(r['drafter'])} ({HEADLINE})" for r in rows) + " |",
            "|---|---|---|" + "---|" * len(rows)]
    for s in samples:
        per_drafter = _obj(s.get("drafters"))
        taus = [_obj(per_drafter.get(r["drafter"])).get("tau") for r in rows]
        out.append(f"| {md_text(s.get('id'))} | {md_text(s.get('host', ''))} | "
                   f"{_count(s.get('continuation_tokens'))} | " + " | ".join(_fmt(t) for t in taus) + " |")
    path = run_dir / "report.md"
    write_text_atomic(path, "\n".join(out) + "\n")
    return path


def sampled_markdown(results: dict) -> list[str]:
    """``## Sampling``: at T > 0 each figure with its CI over prompts, the variance parts, the online check, and
    the estimator (why it is exact in expectation)."""
    sampling = sampling_of(results)
    if sampling is None:
        return []
    figures = [("tau_macro", f"τ macro ({HEADLINE})"), ("tau_micro", "τ micro"),
               ("zlab_2604_tau_macro", "zlab-2604 τ macro"),
               ("vllm_tau_micro", "vllm τ micro"), ("ddtree", "DDTree"), ("budgeted", "budgeted DDTree")]
    out = ["", f"## Sampling ({md_text(law_label(sampling))})", "",
           "| drafter | " + " | ".join(label for _, label in figures) + " | "
           + " | ".join(f"p{i}" for i in range(1, FIRST_POSITIONS + 1)) + " | prompts × draws |",
           "|---|" + "---|" * (len(figures) + FIRST_POSITIONS + 1)]
    estimator = ci = None
    for name, d in _obj(results.get("drafters")).items():
        block = _obj(_obj(_obj(d).get("metrics")).get("sampled"))
        if not block:
            continue
        estimator, ci = estimator or block.get("estimator"), ci or block.get("ci")
        positions = {p.get("k"): p for p in _objs(block.get("per_position"))}
        cells = [fmt_with_ci(sampled_figure(results, name, key)) for key, _ in figures]
        cells += [fmt_with_ci({"value": (p := _obj(positions.get(i))).get("value"),
                               "ci": p["ci"] if isinstance(p.get("ci"), list) and len(p["ci"]) == 2 else None})
                  for i in range(1, FIRST_POSITIONS + 1)]
        out.append(f"| {md_text(name)} | " + " | ".join(cells) + f" | {_count(block.get('prompts'))} × "
                   f"{fmt_number(block.get('draws_per_prompt'), 'g')} |")
    out += [""] + [f"- {md_text(line)}" for line in sampled_lines(results)]
    if estimator:
        out.append(f"- **estimator**: {md_text(estimator)}")
    if ci:
        out.append(f"- **CI**: {md_text(ci)}")
    return out


def benchmarks_markdown(results: dict) -> list[str]:
    """``## Benchmarks``: z-lab's table shape (datasets as columns, drafters as rows, τ macro with its CI) in the
    committed (= zlab) and zlab-2604 conventions, the engine's τ per dataset with --engine, each set's categories,
    and where each set's prompts came from (file digest, selection)."""
    datasets = datasets_of(results)
    if not datasets:
        return []
    names = list(_obj(results.get("drafters")))
    head = "| drafter | " + " | ".join(md_text(d) for d in datasets) + " |"
    rule = "|---|" + "---|" * len(datasets)
    out = ["", "## Benchmarks", ""]
    tables = [("tau_macro", f"τ macro, {HEADLINE} convention (95% bootstrap CI over the dataset's samples)"),
              ("zlab_2604_tau_macro", "τ macro, zlab-2604 convention (z-lab's April 2026 loop, that of its paper-era "
                                      "tables)"),
              ("engine_tau", "engine τ (1 + accepted / rounds of the engine's requests, vllm convention)")]
    for key, title in tables:
        rows = [[fmt_with_ci(dataset_figure(results, n, d, key)) for d in datasets] for n in names]
        if all(c == "–" for row in rows for c in row) and key != "tau_macro":
            continue
        out += [f"{title}:", "", head, rule]
        out += [f"| {md_text(n)} | " + " | ".join(row) + " |" for n, row in zip(names, rows, strict=True)]
        out += [""]
    samples_row = [_count(dataset_figure(results, names[0], d)["samples"]) if names else "–" for d in datasets]
    out += ["samples per dataset: " + ", ".join(f"{md_text(d)} {c}" for d, c in zip(datasets, samples_row,
                                                                                   strict=True)), ""]
    for d in datasets:
        cats = dataset_categories(results, d)
        if not cats:
            continue
        out += [f"{md_text(d)} by category ({HEADLINE} τ macro [CI]; zlab-2604 τ macro):", "",
                "| drafter | " + " | ".join(md_text(c) for c in cats) + " |", "|---|" + "---|" * len(cats)]
        for n in names:
            out.append(f"| {md_text(n)} | " + " | ".join(
                f"{fmt_with_ci(dataset_figure(results, n, d, category=c))}; "
                f"{_fmt(dataset_figure(results, n, d, 'zlab_2604_tau_macro', category=c)['value'])}" for c in cats)
                + " |")
        out += [""]
    for rec in _objs(_obj(results.get("settings")).get("datasets")):
        source, selection = _obj(rec.get("source")), _obj(rec.get("selection"))
        package = _obj(source.get("package"))
        licence = f" ({package['licence']})" if package.get("licence") else ""
        origin = (f"package {package.get('distribution')} {package.get('version')}{licence}"
                  if package else "file " + ", ".join(str(f) for f in source.get("files") or []))
        config = f", {rec['config']}" if rec.get("config") else ""
        out.append("- " + md_text(f"{rec.get('name')} ({rec.get('hub_id')}{config}, split {rec.get('split')}): "
                                  f"{_count(rec.get('samples'))} sample(s) of "
                                  f"{_count(rec.get('rows'))} rows, {origin}, sha256 "
                                  f"{str(source.get('sha256'))[:16]}; selection {selection.get('rule')} seed "
                                  f"{selection.get('seed')}, N {selection.get('requested')}"))
    return out


def conventions_markdown(results: dict) -> list[str]:
    """``## τ conventions``: every convention of every drafter, macro and micro, rounds and p1..p4."""
    out = ["## τ conventions", "", CONVENTIONS_NOTE, "",
           "| drafter | convention | τ macro | τ micro | rounds | "
           + " | ".join(f"p{i}" for i in range(1, FIRST_POSITIONS + 1)) + " | exact |",
           "|---|---|---|---|---|" + "---|" * FIRST_POSITIONS + "---|"]
    for name, d in _obj(results.get("drafters")).items():
        for conv, block in _obj(_obj(_obj(d).get("metrics")).get("conventions")).items():
            block = _obj(block)
            if isinstance(block.get("alias_of"), str):  # the same figures as the convention it names
                out.append(f"| {md_text(name)} | {md_text(conv)} | = {md_text(block['alias_of'])} | | | "
                           + " | " * FIRST_POSITIONS + "|")
                continue
            if block.get("available") is False:
                out.append(f"| {md_text(name)} | {md_text(conv)} | n/a | n/a | | " + " | " * FIRST_POSITIONS + "|")
                continue
            ps = _by_position(block.get("per_position"))
            out.append(f"| {md_text(name)} | {md_text(conv)} | {_fmt(block.get('tau_macro'))} | "
                       f"{_fmt(block.get('tau_micro'))} | {_count(block.get('rounds'))} | "
                       + " | ".join(_fmt(ps.get(i)) for i in range(1, FIRST_POSITIONS + 1))
                       + f" | {'yes' if block.get('exact', True) else 'lower bound'} |")
    notes = convention_notes(results)
    definitions: dict = next((c for d in _obj(results.get("drafters")).values()
                              if (c := _obj(_obj(_obj(d).get("metrics")).get("conventions")))), {})
    out += [""] + [f"- {md_text(line)}" for line in notes] + ([""] if notes else [])
    out += [f"- **{md_text(conv)}**: {md_text(block['definition'])}" for conv, block in definitions.items()
            if _obj(block).get("definition")]
    return out


def _definitions(results: dict) -> dict:
    for d in _obj(results.get("drafters")).values():
        metrics = _obj(_obj(d).get("metrics"))
        defs = dict(_obj(metrics.get("definitions")))
        tree = _obj(metrics.get("tree"))
        for key in ("topk", "budgeted"):
            if _obj(tree.get(key)).get("definition"):
                defs[f"tree.{key}"] = tree[key]["definition"]
        if defs:
            return defs
    return {}


def _diagnostics_text(diag) -> str:
    if isinstance(diag, dict) and diag.get("text"):
        return str(diag["text"])
    import json

    return json.dumps(diag, indent=2)[:20000]
