"""Plots stay readable at any number of checkpoints, and without matplotlib dfo says so instead of
claiming or linking PNGs it did not make (orchestrator/core/plotting.py and the plots that use it)."""

from __future__ import annotations

import itertools
import sys

import pytest

from orchestrator.core import plotting
from orchestrator.evaluation.report import write_report
from orchestrator.evaluation.report_plots import acceptance_figure, histogram_figure
from orchestrator.watch.plot import tau_figure, write_plot
from orchestrator.watch.render import series_markdown

plt = pytest.importorskip("matplotlib.pyplot")


def stat(value: float) -> dict:
    return {"value": value, "ci": [value - 0.1, value + 0.1]}


def series_of(steps: list[int]) -> dict:
    checkpoints = {f"step_{s}.pt": {"name": f"step_{s}.pt", "step": s, "status": "done", "run": f"r{s}",
                                    "measures": {"tau_macro": stat(3 + s / 1e6), "tau_micro": stat(3.1),
                                                 "ddtree": {"k": 8, **stat(4.0)}, "p": []},
                                    "verdict": {"verdict": "first"}} for s in steps}
    return {"schema": "dfo.series/1", "name": "run7", "source": "kpro6:/ck", "eval_host": "ct129",
            "updated_utc": "2026-12-01T00:00:00Z", "settings": {}, "baselines": None, "checkpoints": checkpoints}


def visible_ticks(fig) -> tuple[list[float], list]:
    ax = fig.axes[0]
    fig.canvas.draw()
    lo, hi = sorted(ax.get_xlim())
    ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
    labels = [label for label in ax.get_xticklabels() if label.get_text() and lo <= label.get_position()[0] <= hi]
    return ticks, labels


def assert_readable(fig, at_most: int = plotting.FEW_TICKS) -> list[float]:
    ticks, labels = visible_ticks(fig)
    assert 3 <= len(ticks) <= at_most, f"{len(ticks)} x ticks"
    assert all(float(t).is_integer() for t in ticks), ticks  # steps, positions and τ are whole numbers
    boxes = [label.get_window_extent() for label in labels]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)), "tick labels overlap"
    plt.close(fig)
    return ticks


@pytest.mark.parametrize("count", [240, 1000])
def test_tau_vs_step_has_a_few_round_ticks_at_hundreds_of_checkpoints(count):
    assert_readable(tau_figure(plt, series_of([100 * i for i in range(1, count + 1)])))


def test_tau_vs_step_has_a_tick_at_each_of_a_few_checkpoints():
    assert assert_readable(tau_figure(plt, series_of([100, 200, 350]))) == [100, 200, 350]


def test_the_run_plots_have_a_few_integer_ticks_at_a_thousand_positions():
    drafters = {"ours": {"tau_macro": 3.0, "per_position": [{"k": k, "p": 1 / k} for k in range(1, 1001)],
                         "tau_histogram": {str(t): 1000 - t for t in range(1, 1001)}}}
    assert_readable(acceptance_figure(plt, drafters))
    assert_readable(histogram_figure(plt, drafters))


@pytest.fixture
def no_matplotlib(monkeypatch):
    """matplotlib as on a controller without the plots extra: importing it fails."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_without_matplotlib_no_png_is_made_or_linked(no_matplotlib, tmp_path):
    assert not plotting.available() and plotting.pyplot() is None
    assert write_plot(tmp_path, series_of([100, 200])) is None
    results = {"drafters": {"ours": {"metrics": {"tau_macro": 3.0, "per_position": [{"k": 1, "p": 0.5}]}}}}
    report = write_report(tmp_path, results, []).read_text(encoding="utf-8")
    assert ".png" not in report and "## Plots" not in report
    assert list(tmp_path.glob("*.png")) == []
    assert "tau_vs_step.png" not in series_markdown(series_of([100]), plotted=False)
    assert "tau_vs_step.png" in series_markdown(series_of([100]), plotted=True)
    assert plotting.install_line().endswith("-m pip install 'matplotlib>=3.8'")
