"""`dfo demo --watch`, twice in one checkout (each demo makes its own sandbox, so its series starts afresh and
the earlier one is kept under another name), with its TensorBoard events read back by TensorBoard's reader.
Small settings keep it short: 2 of the built-in prompts, 32 new tokens."""

from __future__ import annotations

import pytest
from cli_runner import dfo_process
from test_series_scale import _read_scalars

from orchestrator.watch.series import load_series

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


def test_the_watch_demo_runs_twice_and_writes_tensorboard_events(tmp_path):
    runs = tmp_path / "runs"
    args = ["demo", "--watch", "--samples", "2", "--max-new-tokens", "32"]
    first = dfo_process(*args, runs=runs, timeout=1500)
    assert first.returncode == 0, first.stderr[-4000:]
    second = dfo_process(*args, runs=runs, timeout=1500)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "started with other settings" not in second.stderr
    kept = [p for p in (runs / "series").iterdir() if p.name.startswith("demo-run7-")]
    assert len(kept) == 1 and f"kept as {kept[0].name}" in " ".join(second.stderr.split())
    for folder in (runs / "series" / "demo-run7", kept[0]):
        s = load_series(folder)
        assert [p["step"] for p in s["steps"]] == [100, 200, 300, 400], folder
        assert all(e.get("resident") for e in s["checkpoints"].values()), folder  # the worker evaluated each
        got = _read_scalars(folder / "tensorboard")
        assert got["dflash/tau_macro"] == [(p["step"], round(p["tau_macro"]["value"], 4)) for p in s["steps"]]
        assert {"dflash/ddtree_8", "dflash/p1", "dflash/p4", "dflash_baseline/zlab", "dflash_baseline/random"} \
            <= set(got)
    assert "demo finished" in second.stderr and "demo-run7" in second.stdout
