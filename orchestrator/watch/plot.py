"""tau_vs_step.png: τ macro and DDTree-8 over training steps, CI bands, baselines as labelled lines.

``last``: only the last N evaluated checkpoints (and the failures among their steps), for a long run whose
early steps would squeeze the part that moves now; the ticks stay round numbers at any count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.core import plotting
from orchestrator.core.atomic_file import atomic_target
from orchestrator.core.host_text import clean
from orchestrator.watch.series import done_entries, failures

MARKERS_UP_TO = 60  # checkpoints drawn with a marker each; beyond, the line alone (markers would merge)


def write_plot(folder: Path, series: dict, *, last: int | None = None) -> Path | None:
    """tau_vs_step.png in FOLDER (temp name, then renamed); None when nothing is evaluated yet or matplotlib
    is missing (``plotting.available()`` tells which)."""
    plt = plotting.pyplot()
    if plt is None or not done_entries(series):
        return None
    fig = tau_figure(plt, series, last=last)
    path = folder / "tau_vs_step.png"
    try:
        with atomic_target(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path


def tau_figure(plt: Any, series: dict, *, last: int | None = None) -> Any:
    """The figure of a series with at least one evaluated checkpoint."""
    import matplotlib

    done = done_entries(series)
    shown = done[-last:] if last else done
    # Baseline and series names are text, not mathtext: a '$' in one would be parsed (and a bad one raises).
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw(plt, series, shown, of=len(done))


def _draw(plt: Any, series: dict, done: list[dict], *, of: int) -> Any:
    fig, ax = plt.subplots(figsize=(8, 5.0), dpi=120)
    steps = [e["step"] for e in done]
    k = next((e["measures"]["ddtree"].get("k") for e in done if e["measures"]["ddtree"].get("k")), 8)
    for key, label, color, marker in (("tau_macro", "τ macro", "tab:blue", "o"),
                                      ("ddtree", f"DDTree-{k}", "tab:orange", "s")):
        stats = [e["measures"][key] for e in done]
        pts = [(s, st) for s, st in zip(steps, stats, strict=True) if st.get("value") is not None]
        if not pts:
            continue
        xs = [s for s, _ in pts]
        ax.plot(xs, [st["value"] for _, st in pts], marker=marker if len(pts) <= MARKERS_UP_TO else None,
                color=color, linewidth=2 if len(pts) <= MARKERS_UP_TO else 1.2, label=label)
        banded = [(s, st["ci"]) for s, st in pts if st.get("ci")]
        if banded:
            ax.fill_between([s for s, _ in banded], [c[0] for _, c in banded], [c[1] for _, c in banded],
                            color=color, alpha=0.18, linewidth=0, label=f"{label} 95% CI")
    _dataset_curves(ax, steps, done)
    proxied = any(isinstance(e.get("proxy"), dict) for e in done)
    _baselines(ax, (series.get("baselines") or {}).get("drafters") or {}, k, inside=proxied)
    extra = _proxy_axis(ax, done)
    failed = [e for e in failures(series) if e["step"] >= steps[0]]
    if failed:  # at the foot of the plot: a failed checkpoint has no τ
        ax.plot([e["step"] for e in failed], [0.04] * len(failed), "x", color="tab:red", markersize=9,
                transform=ax.get_xaxis_transform(), label="failed checkpoint")
    ax.set_xlabel("training step")
    ax.set_ylabel("tokens per verify round (τ)")
    window = f" (the last {len(done)} of {of} checkpoints)" if len(done) < of else ""
    ax.set_title(f"Series {series['name']}: acceptance over training{window}")
    plotting.integer_ticks(ax.xaxis, steps + [e["step"] for e in failed])
    ax.ticklabel_format(axis="x", style="plain", useOffset=False)
    ax.grid(alpha=0.3)
    # Below the axes: inside, it would hide the bands it explains.
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles + extra[0], labels + extra[1], loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5,
              frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def _proxy_axis(ax, done: list[dict]) -> tuple[list, list]:
    """The trainer's proxy on a second y axis (as logged), its alerts as red marks on τ; returns the legend's
    extra handles and labels."""
    pts = [(e["step"], e["proxy"]) for e in done if isinstance(e.get("proxy"), dict)]
    if not pts:
        return [], []
    name = str(pts[-1][1].get("name", "proxy"))
    tag = name.lstrip("-")
    ax2 = ax.twinx()
    ax2.plot([s for s, _ in pts], [p["value"] for _, p in pts], marker="^" if len(pts) <= MARKERS_UP_TO else None,
             color="tab:green", linewidth=1.4, linestyle="-.", label=f"{clean(tag)} (trainer, right axis)")
    ax2.set_ylabel(f"trainer's proxy: {clean(tag)}" + (" (lower is better)" if name.startswith("-") else ""))
    alerts = [e for e in done if isinstance(e.get("proxy_alert"), dict) and e["measures"]["tau_macro"].get("value")
              is not None]
    if alerts:
        ax.plot([e["step"] for e in alerts], [e["measures"]["tau_macro"]["value"] for e in alerts], "o",
                markersize=13, markerfacecolor="none", markeredgecolor="tab:red", markeredgewidth=2,
                label="proxy alert")
    handles, labels = ax2.get_legend_handles_labels()
    return handles, labels


def _dataset_curves(ax, steps: list[int], done: list[dict]) -> None:
    """Runs on benchmark datasets: τ macro of each dataset as its own thin curve (measures' ``by_dataset``)."""
    names = list(dict.fromkeys(d for e in done for d in (e["measures"].get("by_dataset") or {})))
    for i, name in enumerate(names):
        pts = [(s, v) for s, e in zip(steps, done, strict=True)
               if (v := (((e["measures"].get("by_dataset") or {}).get(name) or {}).get("tau_macro") or {})
                   .get("value")) is not None]
        if pts:
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker=".", linestyle="--", linewidth=1.2,
                    color=f"C{(i + 2) % 10}", label=f"{clean(name)} τ macro")


def _baselines(ax, base: dict, k: int, *, inside: bool = False) -> None:
    """Horizontal lines, labelled at the right edge (``inside`` it when a second axis has its ticks there); labels
    closer than ~4% of the axis are spread apart."""
    dashes = ["--", ":", "-.", (0, (5, 1, 1, 1))]
    labels = []
    for i, (name, m) in enumerate(base.items()):
        for key, color, what in (("tau_macro", "tab:blue", "τ"), ("ddtree", "tab:orange", f"DDTree-{k}")):
            v = (m.get(key) or {}).get("value")
            if v is not None:
                ax.axhline(v, color=color, linestyle=dashes[i % len(dashes)], linewidth=1.2, alpha=0.8)
                labels.append((v, f"{clean(name)} {what} {v:.2f}", color))
    if not labels:
        return
    lo, hi = ax.get_ylim()
    gap = 0.045 * (hi - lo)
    placed: list[float] = []
    for v, text, color in sorted(labels):
        y = max(v, placed[-1] + gap) if placed else v
        placed.append(y)
        ax.annotate(text, xy=(1.0, v), xycoords=("axes fraction", "data"), xytext=(0.99 if inside else 1.01, y),
                    textcoords=("axes fraction", "data"), va="bottom" if inside else "center",
                    ha="right" if inside else "left", fontsize=8,
                    color=color)
