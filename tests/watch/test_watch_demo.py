"""`dfo demo --watch`, twice in one checkout (each demo makes its own sandbox, so its series starts afresh and
the earlier one is kept under another name), with its TensorBoard events read back by TensorBoard's reader,
and the proxy alert: the fake trainer's checkpoints get worse from step 500 while the proxy it logs climbs on,
so the alert fires there (measured: τ fell) and not on the honest stretch before, and the checkpoint after it
is evaluated with --diagnose. Small settings keep it short: 2 of the built-in prompts, 32 new tokens."""

from __future__ import annotations

import pytest
from cli_runner import dfo_process
from test_series_scale import _read_scalars

from orchestrator.demo.watch import STEPS, WORSE_FROM
from orchestrator.evaluation.runs import load_run
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
        assert [p["step"] for p in s["steps"]] == list(STEPS), folder
        _alert_at_the_broken_stretch(s, runs)
        got = _read_scalars(folder / "tensorboard")
        assert got["dflash/tau_macro"] == [(p["step"], round(p["tau_macro"]["value"], 4)) for p in s["steps"]]
        assert {"dflash/ddtree_8", "dflash/p1", "dflash/p4", "dflash_baseline/zlab", "dflash_baseline/random"} \
            <= set(got)
        assert got["dflash_proxy/train_acc_0"] == [(p["step"], round(p["proxy"]["value"], 4)) for p in s["steps"]]
    assert "demo finished" in second.stderr and "demo-run7" in second.stdout
    shown = " ".join(second.stdout.split())
    assert "alert step 600" in shown and "train/acc_0 from TensorBoard events" in shown


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
