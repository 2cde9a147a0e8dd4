"""The small readers and formatters the report's modules share (report.py, report_plots.py, report_depth.py,
compare.py): a value a host wrote read as the shape expected or nothing (results.json is data from another
machine), a figure formatted for a cell. Kept apart so that the plots and the tables import them downward.
"""

from __future__ import annotations

import math

from orchestrator.core.host_text import fmt_number


def _fmt(x, digits: int = 2) -> str:
    return fmt_number(x, f".{digits}f")


def json_object(value) -> dict:
    """VALUE when it is a JSON object, else {} (a host may write any shape)."""
    return value if isinstance(value, dict) else {}


_obj = json_object  # the short name the report modules' many reads of host-written JSON use


def _objs(value) -> list[dict]:
    """The JSON objects in VALUE when it is a list, else []."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _small_int(value) -> int | None:
    """VALUE when it is a plain integer that fits a label (a k, a budget), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**6 else None


def _by_position(items) -> dict[int, object]:
    """{k: p} of a per-position list; entries without an integer k are left out."""
    return {k: p.get("p") for p in _objs(items) if (k := _small_int(p.get("k"))) is not None}


def _real(x) -> float | None:
    """X as a finite float, or None when it is not a finite number."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        value = float(x)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _count(x) -> str:
    """A count: '–' when absent, '?' when not an integer."""
    return fmt_number(x, "d") if not isinstance(x, float) else "?"


def fmt_with_ci(fig: dict) -> str:
    """'6.55 [6.31, 6.80]', '6.55' without a CI, '–' when absent."""
    if fig["value"] is None:
        return "–"
    return _fmt(fig["value"]) + (f" [{_fmt(fig['ci'][0])}, {_fmt(fig['ci'][1])}]" if fig["ci"] else "")
