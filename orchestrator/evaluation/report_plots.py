"""The run's plots: per-position acceptance curves and the τ histogram, one series per drafter (PNG, matplotlib),
beside report.md. Like the report they read results.json alone; every name is host text and every figure may be
of the wrong type (left out, never an exception)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core import plotting
from orchestrator.core.atomic_file import atomic_target
from orchestrator.core.host_text import clean
from orchestrator.evaluation.report_depth import depth_figure
from orchestrator.evaluation.report_values import _by_position, _fmt, _obj, _real


def write_plots(run_dir: Path, results: dict) -> list[Path]:
    """Per-position acceptance curves and the τ histogram, one series per drafter (PNG, matplotlib); none
    without matplotlib (report.md then links none, and the run summary says why)."""
    plt = plotting.pyplot()
    drafters = {name: _obj(_obj(d).get("metrics")) for name, d in _obj(results.get("drafters")).items()}
    if plt is None or not drafters:
        return []
    import matplotlib

    # Drafter names are the host's: as mathtext a '$' in one would be parsed, and a malformed one raises.
    with matplotlib.rc_context({"text.parse_math": False}):
        plots = [_save(plt, acceptance_figure(plt, drafters), run_dir / "acceptance.png"),
                 _save(plt, histogram_figure(plt, drafters), run_dir / "tau_histogram.png")]
        depth = depth_figure(plt, results)
        if depth is not None:
            plots.append(_save(plt, depth, run_dir / "tau_by_depth.png"))
    from orchestrator.evaluation import engine_report  # the engine sweep's speedup plot (owned by the engine eval)

    return plots + engine_report.engine_plot(run_dir, results)


def _save(plt, fig, path: Path) -> Path:
    """The PNG under a temporary name, then renamed: a reader never sees half a file."""
    try:
        with atomic_target(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)
    return path


def acceptance_figure(plt, drafters: dict[str, dict]):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    # Distinct markers and dash styles: two drafters with identical curves must both stay visible.
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", "-"), ("P", "--")]
    positions: list[int] = []
    for i, (name, m) in enumerate(drafters.items()):
        pts = [(k, v) for k, p in sorted(_by_position(m.get("per_position")).items()) if (v := _real(p)) is not None]
        marker, dash = styles[i % len(styles)]
        if pts:
            positions += [k for k, _ in pts]
            ax.plot([k for k, _ in pts], [p for _, p in pts], marker=marker, linestyle=dash, linewidth=2,
                    markersize=7 - i, label=f"{clean(name)} (τ {_fmt(m.get('tau_macro'))})")
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(round accepts ≥ k drafts)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Per-position acceptance")
    plotting.integer_ticks(ax.xaxis, positions)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", frameon=False)
    fig.tight_layout()
    return fig


def histogram_figure(plt, drafters: dict[str, dict]):
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    n = len(drafters)
    width = 0.8 / n
    taus: list[int] = []
    for i, (name, m) in enumerate(drafters.items()):
        # {"τ": rounds}; entries whose τ is not a small integer or whose count is not a number are left out
        hist = {int(k): count for k, v in _obj(m.get("tau_histogram")).items()
                if k.isascii() and k.isdigit() and len(k) < 7 and (count := _real(v)) is not None}
        total = sum(hist.values()) or 1
        xs = sorted(hist)
        taus += xs
        ax.bar([x + (i - (n - 1) / 2) * width for x in xs], [hist[x] / total for x in xs], width=width,
               label=clean(name))
    ax.set_xlabel("τ per round (accepted drafts + 1)")
    ax.set_ylabel("fraction of rounds")
    ax.set_title("τ histogram")
    plotting.integer_ticks(ax.xaxis, taus)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig
