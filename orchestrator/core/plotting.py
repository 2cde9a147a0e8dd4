"""matplotlib for the PNGs dfo writes (a run's acceptance.png, tau_histogram.png and tau_by_depth.png, a series'
tau_vs_step.png).

matplotlib is the `plots` extra (about 140 MB with numpy, pillow and fonttools, where dfo itself takes 80 MB):
without it dfo works and writes no PNG, links none, and says so once per command with the line that fixes it.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

MISSING = "no plots: matplotlib is not installed for this Python"
FEW_TICKS = 12  # up to this many values get a tick each; more get about ten round ones


def install_line() -> str:
    """The command that installs matplotlib where dfo runs."""
    return f"{shlex.quote(sys.executable)} -m pip install 'matplotlib>=3.8'"


def available() -> bool:
    return pyplot() is not None


def pyplot() -> Any | None:
    """matplotlib.pyplot drawing off-screen (Agg: no display needed), or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def integer_ticks(axis: Any, values: list[int]) -> None:
    """Ticks on AXIS (ax.xaxis) that stay readable at any count: one at each of a few VALUES (the steps
    evaluated), else at most FEW_TICKS round integers (240 or 1,000 checkpoints would be a black smear)."""
    from matplotlib.ticker import MaxNLocator

    distinct = sorted(set(values))
    if len(distinct) <= FEW_TICKS:
        axis.set_ticks(distinct)
    else:
        axis.set_major_locator(MaxNLocator(nbins=FEW_TICKS - 2, steps=[1, 2, 2.5, 5, 10], integer=True, min_n_ticks=3))
