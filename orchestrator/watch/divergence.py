"""Does measured τ still follow the trainer's own proxy? Pure statistics, no I/O.

A trainer's proxy (simulated acceptance length, per-position accuracy, minus the loss) is useful only as
long as it moves with the τ that decoding measures. Each checkpoint is tested against a calibration fitted
on the agreeing checkpoints before it: an ordinary least-squares line τ ≈ a + b·proxy, whose prediction
carries its own uncertainty (the fit's residual spread and the line's standard error at this proxy value)
plus the checkpoint's measured τ uncertainty (from its bootstrap CI). A checkpoint *disagrees* when its τ
lies more than ``z`` combined standard errors below the prediction: the proxy promises more than decoding
delivers. ``run`` disagreeing checkpoints in a row raise an alert, stated against the last agreeing
checkpoint (the anchor): the proxy's change and τ's change there with τ's 95 % CI. The alert's kind is
``diverge`` when τ fell significantly since the anchor and ``stall`` when τ did not move beyond noise while
the proxy climbed. Disagreeing checkpoints are left out of later calibrations, so a long bad stretch cannot
teach the fit that it is normal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_FIT = 3      # checkpoints of calibration before any checkpoint is tested
Z = 2.5          # disagreement threshold in combined standard errors (one-sided)
RUN = 2          # this many disagreeing checkpoints in a row make an alert
CI_Z = 1.96      # the measured τ CIs are 95 % intervals


@dataclass(frozen=True)
class Point:
    step: int
    tau: float
    tau_ci: tuple[float, float] | None   # 95 % CI of τ; None: no CI (too few samples)
    proxy: float                          # oriented so that higher is better (a loss enters negated)


@dataclass(frozen=True)
class Check:
    step: int
    predicted: float | None    # τ the calibration predicts from the proxy (None: not enough calibration yet)
    z: float | None            # (τ − predicted) / combined standard error
    disagrees: bool


@dataclass(frozen=True)
class Alert:
    step: int                  # the checkpoint whose check completed the run
    kind: str                  # "diverge" or "stall"
    since: int                 # the anchor: the last agreeing checkpoint
    proxy_change: float        # relative change of the proxy since the anchor
    tau_change: float          # relative change of τ since the anchor
    tau_change_ci: tuple[float, float]

    def text(self, proxy_name: str = "proxy") -> str:
        lo, hi = self.tau_change_ci
        tau_word = "down" if self.tau_change < 0 else "up"
        head = "τ stalls while the proxy climbs" if self.kind == "stall" else "τ and the proxy part"
        return (f"{head}: {proxy_name} {_pct_word(self.proxy_change)}, τ {tau_word} "
                f"{abs(self.tau_change) * 100:.0f} % [{lo * 100:+.0f}, {hi * 100:+.0f}] since step {self.since}")


def _pct_word(change: float) -> str:
    return f"{'up' if change >= 0 else 'down'} {abs(change) * 100:.0f} %"


def tau_se(point: Point) -> float:
    """Standard error of a measured τ from its 95 % CI (0 without one)."""
    if point.tau_ci is None:
        return 0.0
    return max(0.0, (point.tau_ci[1] - point.tau_ci[0]) / (2 * CI_Z))


def _scale(values: list[float]) -> float:
    """The largest magnitude among VALUES (1 when none is finite and non-zero): the fit divides by it first,
    so no square or sum of any finite input overflows."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    return top if top > 0 else 1.0


def _fit(points: list[Point]) -> tuple[float, float, float, float, float, int]:
    """OLS τ = a + b·proxy: (a, b, residual variance, mean proxy, Sxx, n), in the units of the values given."""
    n = len(points)
    xs = [p.proxy for p in points]
    ys = [p.tau for p in points]
    xbar, ybar = sum(xs) / n, sum(ys) / n
    sxx = sum((x - xbar) * (x - xbar) for x in xs)
    b = sum((x - xbar) * (y - ybar) for x, y in zip(xs, ys, strict=True)) / sxx if sxx > 0 else 0.0
    a = ybar - b * xbar
    dof = n - 2 if sxx > 0 else n - 1
    s2 = sum((y - a - b * x) * (y - a - b * x) for x, y in zip(xs, ys, strict=True)) / max(dof, 1)
    return a, b, s2, xbar, sxx, n


def _scaled(point: Point, sx: float, sy: float) -> Point:
    ci = None if point.tau_ci is None else (point.tau_ci[0] / sy, point.tau_ci[1] / sy)
    return Point(point.step, point.tau / sy, ci, point.proxy / sx)


def predict(calibration: list[Point], point: Point) -> tuple[float, float]:
    """(predicted τ, combined standard error of τ − prediction) for ``point``. Computed on the values divided
    by their largest magnitude (proxy and τ apart) and scaled back: any finite input gives a finite answer
    or, beyond the float range, an infinite one — never an OverflowError."""
    everyone = [*calibration, point]
    sx = _scale([p.proxy for p in everyone])
    sy = _scale([v for p in everyone for v in (p.tau, *(p.tau_ci or ()))])
    calibration, point = [_scaled(p, sx, sy) for p in calibration], _scaled(point, sx, sy)
    a, b, s2, xbar, sxx, n = _fit(calibration)
    # The residual spread already holds the calibration points' own measurement noise; it is floored at
    # their mean squared measurement SE so that a handful of points that happen to lie on a line do not
    # claim a precision the measurements never had.
    measured = sum(tau_se(p) * tau_se(p) for p in calibration) / n
    noise = max(s2, measured)
    line_var = noise * (1 / n + ((point.proxy - xbar) * (point.proxy - xbar) / sxx if sxx > 0 else 0.0))
    model_var = max(0.0, noise - measured)
    se = math.sqrt(line_var + model_var + tau_se(point) * tau_se(point))
    return (a + b * point.proxy) * sy, se * sy


def check(points: list[Point], *, z: float = Z, run: int = RUN, min_fit: int = MIN_FIT
          ) -> tuple[list[Check], list[Alert]]:
    """Per-checkpoint checks and the alerts they raise, for a series in step order.

    One alert per disagreeing run (at the checkpoint that completes it); a run that ends lets a later one
    alert again."""
    checks: list[Check] = []
    alerts: list[Alert] = []
    calibration: list[Point] = []
    anchor: Point | None = None
    streak = 0
    for point in points:
        if len(calibration) < min_fit:
            checks.append(Check(point.step, None, None, False))
            calibration.append(point)
            anchor = point
            continue
        predicted, se = predict(calibration, point)
        if not (math.isfinite(predicted) and math.isfinite(se)):  # beyond the float range: no test
            checks.append(Check(point.step, None, None, False))
            continue
        score = (point.tau - predicted) / se if se > 0 else (0.0 if point.tau >= predicted else -math.inf)
        disagrees = score < -z
        checks.append(Check(point.step, predicted, score, disagrees))
        if not disagrees:
            calibration.append(point)
            anchor, streak = point, 0
            continue
        streak += 1
        if streak == run and anchor is not None:
            alerts.append(_alert(anchor, point))
    return checks, alerts


def _alert(anchor: Point, point: Point) -> Alert:
    base = anchor.tau if anchor.tau else 1.0
    change = (point.tau - anchor.tau) / base
    se = math.hypot(tau_se(anchor), tau_se(point)) / abs(base)
    ci = (change - CI_Z * se, change + CI_Z * se)
    proxy_base = abs(anchor.proxy) if anchor.proxy else 1.0
    proxy_change = (point.proxy - anchor.proxy) / proxy_base
    kind = "diverge" if ci[1] < 0 else "stall"
    return Alert(point.step, kind, anchor.step, proxy_change, change, ci)


def points_from_entries(entries: list[dict], proxy_at: dict[int, tuple[int, float]]) -> list[Point]:
    """The checks' input from the series' done checkpoints (step order) and the proxy matched to their steps
    (proxies.at_checkpoints); a checkpoint without a τ or without a proxy value is left out."""
    points = []
    for e in entries:
        tau = ((e.get("measures") or {}).get("tau_macro") or {})
        if tau.get("value") is None or e["step"] not in proxy_at:
            continue
        ci = tau.get("ci")
        points.append(Point(e["step"], float(tau["value"]), (float(ci[0]), float(ci[1])) if ci else None,
                            proxy_at[e["step"]][1]))
    return points
