"""The proxy-versus-τ statistics (orchestrator/watch/divergence.py) on hand-made and simulated series.

The simulated series are the figures the watch docs quote: the false-alarm rate on series whose τ follows
its proxy, and the detection rate on series that part from it."""

from __future__ import annotations

import random

from orchestrator.watch.divergence import Point, check

SE = 0.05          # standard error of a measured τ (a 95 % CI of ±0.1)
CHECKPOINTS = 12
PART_AT = 7        # the simulated diverging series part from their proxy from this checkpoint on


def _series(rng: random.Random, *, diverge: bool) -> list[Point]:
    points = []
    for i in range(CHECKPOINTS):
        proxy_true = 0.3 + 0.5 * (1 - 0.85 ** (i + 1))      # a saturating training curve
        proxy = proxy_true + rng.gauss(0, 0.004)           # the trainer's own logging noise
        tau_true = 1.2 + 3.0 * proxy_true + rng.gauss(0, 0.02)   # the proxy explains τ but not exactly
        if diverge and i >= PART_AT:
            tau_true -= 0.12 * (i - PART_AT + 1)          # checkpoints get worse, the proxy does not notice
        tau = tau_true + rng.gauss(0, SE)
        points.append(Point(step=1000 * (i + 1), tau=tau, tau_ci=(tau - 1.96 * SE, tau + 1.96 * SE), proxy=proxy))
    return points


def _rates(trials: int = 2000) -> tuple[float, float, float]:
    rng = random.Random(36)
    false_alarms = sum(1 for _ in range(trials) if check(_series(rng, diverge=False))[1])
    detected, early = 0, 0
    for _ in range(trials):
        alerts = check(_series(rng, diverge=True))[1]
        early += any(a.step < 1000 * (PART_AT + 1) for a in alerts)
        detected += any(a.step >= 1000 * (PART_AT + 1) for a in alerts)
    return false_alarms / trials, detected / trials, early / trials


def test_false_alarm_rate_is_bounded_and_divergence_is_detected():
    false_alarm, detection, early = _rates()
    print(f"false-alarm rate {false_alarm:.3f}, detection rate {detection:.3f}, alerts before the split {early:.3f}")
    assert false_alarm <= 0.02
    assert early <= 0.02
    assert detection >= 0.85


def _pt(step: int, tau: float, proxy: float, half: float = 0.1) -> Point:
    return Point(step, tau, (tau - half, tau + half), proxy)


def test_alert_names_the_anchor_and_the_changes():
    points = [_pt(1000, 2.0, 0.40), _pt(2000, 2.3, 0.50), _pt(3000, 2.6, 0.60),
              _pt(4000, 2.2, 0.62), _pt(5000, 2.0, 0.64)]
    checks, alerts = check(points)
    assert [c.disagrees for c in checks] == [False, False, False, True, True]
    assert len(alerts) == 1
    alert = alerts[0]
    assert (alert.step, alert.since, alert.kind) == (5000, 3000, "diverge")
    assert round(alert.proxy_change, 3) == round(0.04 / 0.60, 3)
    assert alert.tau_change_ci[1] < 0
    assert alert.text("acc_pos1") .startswith("τ and the proxy part: acc_pos1 up 7 %, τ down 23 % [")
    assert alert.text().endswith("since step 3000")


def test_stall_while_the_proxy_climbs():
    points = [_pt(1000, 2.0, 0.40, 0.05), _pt(2000, 2.3, 0.50, 0.05), _pt(3000, 2.6, 0.60, 0.05),
              _pt(4000, 2.6, 0.70, 0.05), _pt(5000, 2.62, 0.80, 0.05)]
    alerts = check(points)[1]
    assert [(a.step, a.kind) for a in alerts] == [(5000, "stall")]
    assert "τ stalls while the proxy climbs" in alerts[0].text()


def test_no_alert_before_calibration_and_one_per_run():
    # Three points only calibrate; a single disagreeing checkpoint is no alert; a second run alerts again.
    assert check([_pt(1000, 2.0, 0.4), _pt(2000, 1.0, 0.9), _pt(3000, 0.5, 1.0)])[1] == []
    points = [_pt(1000, 2.0, 0.40), _pt(2000, 2.3, 0.50), _pt(3000, 2.6, 0.60), _pt(4000, 2.0, 0.62),
              _pt(5000, 2.66, 0.62), _pt(6000, 2.0, 0.66), _pt(7000, 1.8, 0.70)]
    checks, alerts = check(points)
    assert [c.disagrees for c in checks] == [False, False, False, True, False, True, True]
    assert [(a.step, a.since) for a in alerts] == [(7000, 5000)]


def test_points_come_from_done_series_entries_with_a_matched_proxy():
    from orchestrator.watch.divergence import points_from_entries

    entries = [{"step": 100, "measures": {"tau_macro": {"value": 2.0, "ci": [1.9, 2.1]}}},
               {"step": 200, "measures": {"tau_macro": {"value": None, "ci": None}}},
               {"step": 300, "measures": {"tau_macro": {"value": 2.5, "ci": None}}},
               {"step": 400, "measures": {"tau_macro": {"value": 2.6, "ci": [2.5, 2.7]}}}]
    points = points_from_entries(entries, {100: (100, 0.4), 200: (190, 0.5), 300: (300, 0.6)})
    assert points == [Point(100, 2.0, (1.9, 2.1), 0.4), Point(300, 2.5, None, 0.6)]
