"""`dfo demo --watch` with its TensorBoard events read back by TensorBoard's reader, and the proxy alert: the
fake trainer's checkpoints get worse from step 500 while the proxy it logs climbs on, so the alert fires there
(measured: τ fell) and not on the honest stretch before, and the checkpoint after it is evaluated with
--diagnose. Small settings keep it short: 2 of the built-in prompts, 32 new tokens.

A later demo in the same checkout makes its own sandbox, so its series starts afresh and the earlier one is kept
under another name. That step comes first in the demo, before its sandbox starts: the test runs a second demo
in-process only up to there (a whole second demo would cost as much as the first) and checks the kept series
is the first one, whole."""

from __future__ import annotations

import pytest
from cli_runner import dfo_process
from fixtures_provision import wheelhouse_cache_dir
from test_series_scale import _read_scalars

from orchestrator.core.events import QuietEvents
from orchestrator.demo.watch import SERIES, STEPS, WORSE_FROM, run_watch_demo
from orchestrator.evaluation.runs import load_run
from orchestrator.watch.series import load_series

pytestmark = [pytest.mark.sshd, pytest.mark.slow]


class _StopBeforeTheSandbox(Exception):
    pass


class _UpToTheSandbox(QuietEvents):
    """Records what the demo says and stops it at its first step (starting the sandbox hosts)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)

    def step(self, text: str, tag: str | None = None) -> None:
        self.lines.append(text)
        raise _StopBeforeTheSandbox(text)


def test_the_watch_demo_writes_tensorboard_events_and_a_later_demo_keeps_its_series(tmp_path, tmp_path_factory):
    runs = tmp_path / "runs"
    args = ["demo", "--watch", "--samples", "2", "--max-new-tokens", "32"]
    # The suite's wheelhouse (DFO_CACHE) and fixture cache (DFO_FIXTURE_CACHE, which the demo hands to its hosts'
    # fixture jobs): on a fresh machine the demo's own defaults are empty, and it downloaded the wheels and trained
    # the fixtures again (51 s of training, measured) where the payload tests had just built the same ones.
    first = dfo_process(*args, runs=runs, timeout=1500, env={"DFO_CACHE": str(wheelhouse_cache_dir(tmp_path_factory))})
    assert first.returncode == 0, first.stderr[-4000:]
    assert "kept as" not in first.stderr  # nothing earlier to keep
    series = runs / "series" / SERIES
    _check_series(series, runs)
    assert "demo finished" in first.stderr and SERIES in first.stdout
    shown = " ".join(first.stdout.split())
    assert "alert step 600" in shown and "train/acc_0 from TensorBoard events" in shown
    before = load_series(series)

    # A second demo, up to the point where it starts its sandbox: the first series is moved aside, whole.
    said = _UpToTheSandbox()
    with pytest.raises(_StopBeforeTheSandbox, match="start sandbox hosts"):
        run_watch_demo(events=said, runs_dir=runs, root=tmp_path / "second-sandbox", samples=2, max_new_tokens=32)
    kept = [p for p in (runs / "series").iterdir() if p.name.startswith(f"{SERIES}-")]
    assert len(kept) == 1 and any(f"kept as {kept[0].name}" in line for line in said.lines), said.lines
    assert not series.exists()  # the second demo's watcher starts a new series (no "started with other settings")
    assert load_series(kept[0]) == before
    _check_series(kept[0], runs)


def _check_series(folder, runs) -> None:
    s = load_series(folder)
    assert [p["step"] for p in s["steps"]] == list(STEPS), folder
    _alert_at_the_broken_stretch(s, runs)
    got = _read_scalars(folder / "tensorboard")
    assert got["dflash/tau_macro"] == [(p["step"], round(p["tau_macro"]["value"], 4)) for p in s["steps"]]
    assert {"dflash/ddtree_8", "dflash/p1", "dflash/p4", "dflash_baseline/zlab", "dflash_baseline/random"} \
        <= set(got)
    assert got["dflash_proxy/train_acc_0"] == [(p["step"], round(p["proxy"]["value"], 4)) for p in s["steps"]]


def _alert_at_the_broken_stretch(s: dict, runs) -> None:
    by_step = {p["step"]: p for p in s["steps"]}
    proxies = [by_step[step]["proxy"]["value"] for step in STEPS]
    assert proxies == sorted(proxies) and len(set(proxies)) == len(STEPS)  # the proxy climbs throughout
    tau = {step: by_step[step]["tau_macro"]["value"] for step in STEPS}
    honest = [step for step in STEPS if step < WORSE_FROM]
    assert max(tau[step] for step in STEPS if step >= WORSE_FROM) < tau[honest[-1]]  # measured: τ really fell
    entries = {e["step"]: e for e in s["checkpoints"].values()}
    assert not any((entries[step].get("proxy_check") or {}).get("disagrees") for step in honest)  # no false alarm
    alerts = [step for step in STEPS if entries[step].get("proxy_alert")]
    assert alerts == [WORSE_FROM + 100], alerts  # the second disagreeing checkpoint in a row
    alert = entries[alerts[0]]["proxy_alert"]
    assert alert["since"] == honest[-1] and alert["kind"] == "diverge" and alert["tau_change_ci"][1] < 0
    diagnosed = entries[alerts[0] + 100]
    assert alert["diagnosed_in"] == diagnosed["name"] and not diagnosed.get("resident")
    assert load_run(runs / diagnosed["run"]).results().get("diagnostics")  # the probes are in its report
    # The resident worker evaluated every other checkpoint.
    assert all(e.get("resident") for e in s["checkpoints"].values() if e is not diagnosed)
