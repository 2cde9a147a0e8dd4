"""--detach: the supervisor runs the watcher in the background, restarts it when it crashes, and stops
for good on bad input (exit 2) — here a series started with other settings. No host is contacted."""

from __future__ import annotations

import time
from pathlib import Path

from cli_runner import dfo

from orchestrator.watch import series as series_state
from orchestrator.watch import supervisor

INVENTORY = """hosts:
  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k, roles: [train], paths: {checkpoints: /tmp/ck}}
  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}
"""


def test_detach_starts_a_supervisor_that_stops_on_bad_input(tmp_path):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    runs = tmp_path / "runs"
    folder = runs / "series" / "run7"
    series_state.save(folder, series_state.new_series("run7", source="kpro6:/tmp/ck/run7", eval_host="ct129",
                                                      settings={"target": "/other/target"}))
    proc = dfo("watch", "kpro6:run7/", "--host", "ct129", "--target", "/m/t", "--detach", inventory=inv, runs=runs)
    assert proc.returncode == 0, proc.stderr
    assert "detached" in proc.stderr and "supervisor pid" in proc.stderr
    pid = int((folder / "supervisor.pid").read_text())
    log = folder / "watch.log"
    deadline = time.monotonic() + 60
    while supervisor.running_pid(folder) == pid and time.monotonic() < deadline:
        time.sleep(0.2)
    text = log.read_text()
    assert supervisor.running_pid(folder) is None, text
    assert "series 'run7' was started with other settings" in text and "target '/other/target' → '/m/t'" in text
    assert "watcher exited with 2; stopping" in text
    assert "restarting" not in text
    again = dfo("series", "list", "--json", runs=runs)
    assert again.returncode == 0 and '"watcher": null' in again.stdout


def test_running_pid_ignores_a_stale_or_foreign_pid(tmp_path):
    (tmp_path / "supervisor.pid").write_text("1\n")  # init: alive, but not a dfo supervisor
    assert supervisor.running_pid(tmp_path) is None
    (tmp_path / "supervisor.pid").write_text("garbage")
    assert supervisor.running_pid(tmp_path) is None
    assert supervisor.running_pid(Path(tmp_path / "missing")) is None
