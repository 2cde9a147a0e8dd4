"""Issue 42, findings 2 and 4: the trainer's proxy logs are another machine's (or another user's) files.

One value of 1e155 in a shared logdir made the divergence fit raise OverflowError outside every handler, and
`dfo watch` crash-looped; the reader walked the whole logdir before pruning, read files at any depth and took
the newest trainer_state.json anywhere. Pure and local: the host script runs here as a module.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator.watch import proxy_host_script, proxy_step
from orchestrator.watch.divergence import Point, check, predict
from orchestrator.watch.proxies import MAX_VALUE, parse_origins, parse_proxies
from orchestrator.watch.proxy_step import ProxyOptions, ProxyWatch


def test_proxy_values_beyond_the_bound_are_dropped_where_parsed():
    doc = {"series": {"acc": [[100, 0.5], [200, 1e155], [300, -1e300], [400, MAX_VALUE], [500, 0.6]]}}
    assert parse_proxies(doc, ["acc"], "kpro6") == {"acc": [(100, 0.5), (400, MAX_VALUE), (500, 0.6)]}


def test_the_divergence_fit_takes_any_finite_input_without_overflow():
    huge = [Point(100 * i, 2.0 + 0.01 * i, (1.9, 2.1 + i), 10.0 ** (150 + i)) for i in range(6)]
    extreme = [Point(1, 1e308, (-1e308, 1e308), -1e308), Point(2, -1e308, None, 1e308), Point(3, 3.0, None, 1e-308),
               Point(4, 1e308, (1e307, 1e308), 1e308), Point(5, 2.0, None, 0.0)]
    for points in (huge, extreme):
        checks, alerts = check(points)  # no OverflowError, no ValueError
        assert len(checks) == len(points)
        for c in checks:
            assert c.predicted is None or math.isfinite(c.predicted)
    # Scaled, the fit is the same line whatever the proxy's units: x·1e150 predicts what x predicts.
    plain = [Point(i, 2.0 + 0.1 * i, (1.9, 2.1), float(i)) for i in range(5)]
    scaled = [Point(p.step, p.tau, p.tau_ci, p.proxy * 1e150) for p in plain]
    assert predict(plain[:4], plain[4]) == pytest.approx(predict(scaled[:4], scaled[4]), rel=1e-9)


class _Said:
    def __init__(self):
        self.warnings: list[str] = []

    def warn(self, text: str) -> None:
        self.warnings.append(text)


def test_any_failure_in_the_proxy_path_is_a_warning_that_never_stops_the_watcher(monkeypatch):
    def broken(*args, **kwargs):
        raise OverflowError("(34, 'Numerical result out of range')")

    monkeypatch.setattr(proxy_step, "fetch", broken)
    said = _Said()
    watch = ProxyWatch(None, "kpro6", ProxyOptions("/data/run"), said, lambda e: None)  # type: ignore[arg-type]
    entry = {"name": "step_100.pt", "step": 100, "path": "/data/run/step_100.pt"}
    assert watch.after({"checkpoints": {}}, entry) is None
    assert said.warnings and "OverflowError" in said.warnings[0] and "τ is recorded without it" in said.warnings[0]


def _state(path: Path, loss: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"log_history": [{"step": 100, "loss": loss}]}))


def test_the_walk_is_bounded_in_depth_and_the_checkpoints_own_trainer_state_wins(tmp_path):
    run = tmp_path / "run"
    _state(run / "checkpoint-100" / "trainer_state.json", 2.0)  # the checkpoint evaluated
    (run / "deep" / "er" / "still").mkdir(parents=True)
    (run / "deep" / "er" / "still" / "m.jsonl").write_text('{"step": 100, "acc": 0.99}\n')  # three folders down
    _state(run / "planted" / "trainer_state.json", 0.01)  # newer, elsewhere in the logdir
    future = time.time() + 100
    os.utime(run / "planted" / "trainer_state.json", (future, future))

    doc = proxy_host_script.read_proxies(str(run), ["loss", "acc"], 1 << 20, 1000,
                                         prefer=[str(run / "checkpoint-100")])
    assert "acc" not in doc["series"] and not any("still" in f for f in doc["files"])
    assert [row[:2] for row in doc["series"]["loss"]] == [[100, 2.0]]
    series = parse_proxies(doc, ["-loss"], "kpro6")
    assert parse_origins(doc, series) == {"-loss": {100: "checkpoint-100/trainer_state.json"}}
    # Without a checkpoint folder to prefer, the logdir's own trainer_state.json comes before any deeper one.
    _state(run / "trainer_state.json", 1.0)
    doc = proxy_host_script.read_proxies(str(run), ["loss"], 1 << 20, 1000)
    assert [row[:2] for row in doc["series"]["loss"]] == [[100, 1.0]]


def test_the_walk_stops_after_max_dirs_folders(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for i in range(20):
        (run / f"d{i:02d}").mkdir(parents=True)
        (run / f"d{i:02d}" / "m.jsonl").write_text(json.dumps({"step": i, "acc": 0.5}) + "\n")
    monkeypatch.setattr(proxy_host_script, "MAX_DIRS", 5)
    listed = list(proxy_host_script._walk(str(run), proxy_host_script.MAX_DIRS))
    assert len(listed) == 5


def test_a_fifo_in_the_logdir_does_not_hang_the_reader(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "metrics.jsonl")
    (run / "ok.jsonl").write_text('{"step": 1, "acc": 0.5}\n')
    answer: list = []
    reader = threading.Thread(target=lambda: answer.append(
        proxy_host_script.read_proxies(str(run), ["acc"], 1 << 20, 1000)), daemon=True)
    reader.start()
    reader.join(10)
    hung = reader.is_alive()
    if hung:
        os.close(os.open(run / "metrics.jsonl", os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "read_proxies blocked on a FIFO"
    assert [row[:2] for row in answer[0]["series"]["acc"]] == [[1, 0.5]]
