"""--detach: the first checks run before anything detaches (a failing one exits non-zero and starts no
supervisor); the supervisor runs the watcher in the background and stops for good on bad input (exit 2) or
a clean exit."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.watch import series as series_state
from orchestrator.watch import supervisor

INVENTORY = """hosts:
  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k, roles: [train], paths: {checkpoints: /tmp/ck}}
  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}
"""


def wait_until_stopped(folder: Path, timeout: float = 120) -> str:
    """The supervisor's log once it said it stops (its last line), and no supervisor runs for the folder."""
    log = folder / "watch.log"
    deadline = time.monotonic() + timeout
    while "; stopping" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.2)
    text = " ".join(log.read_text().split())  # the log is as wide as the supervisor's terminal: unwrap it
    while supervisor.running_pid(folder) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert supervisor.running_pid(folder) is None, text
    return text


@pytest.fixture
def unreachable(tmp_path) -> Path:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    return inv


def test_detach_with_a_series_of_other_settings_exits_2_and_starts_nothing(tmp_path, unreachable):
    runs = tmp_path / "runs"
    folder = runs / "series" / "run7"
    series_state.save(folder, series_state.new_series("run7", source="kpro6:/tmp/ck/run7", eval_host="ct129",
                                                      settings={"target": "/other/target"}))
    proc = dfo("watch", "kpro6:run7/", "--host", "ct129", "--target", "/m/t", "--detach", inventory=unreachable,
               runs=runs)
    assert proc.returncode == 2, proc.stderr
    assert "series 'run7' was started with other settings" in proc.stderr and "Traceback" not in proc.stderr
    assert "detached" not in proc.stderr and not (folder / "supervisor.pid").exists()


def test_detach_with_an_unreachable_host_exits_1_and_starts_nothing(tmp_path, unreachable):
    runs = tmp_path / "runs"
    proc = dfo("watch", "kpro6:run7/", "--target", "/m/t", "--detach", inventory=unreachable, runs=runs)
    assert proc.returncode == 1, proc.stderr
    assert "ct129: connection refused" in proc.stderr and "Traceback" not in proc.stderr  # --host: the eval role
    assert "detached" not in proc.stderr
    assert not list(runs.rglob("supervisor.pid"))


def test_the_supervisor_stops_for_good_when_the_watcher_exits_2(tmp_path, unreachable):
    runs = tmp_path / "runs"
    folder = runs / "series" / "run7"
    series_state.save(folder, series_state.new_series("run7", source="kpro6:/tmp/ck/run7", eval_host="ct129",
                                                      settings={"target": "/other/target"}))
    supervisor.start(folder, ["--inventory", str(unreachable), "watch", "kpro6:run7/", "--host", "ct129",
                                    "--target", "/m/t", "--runs-dir", str(runs)])
    text = wait_until_stopped(folder)
    assert "series 'run7' was started with other settings" in text and "target '/other/target' → '/m/t'" in text
    assert "watcher exited with 2; stopping" in text
    assert "restarting" not in text
    again = dfo("series", "list", "--json", runs=runs)
    assert again.returncode == 0 and '"watcher": null' in again.stdout


@pytest.mark.sshd
def test_detach_leaves_once_the_first_checks_pass(sandbox, tmp_path):
    """Reachable hosts, a target that exists, an empty training folder: detached; the watcher (--once) finds
    nothing, exits 0 and the supervisor stops."""
    run_folder = sandbox.hosts["kpro6"].checkpoints / f"empty-{tmp_path.name[-16:]}"
    run_folder.mkdir(parents=True)
    runs = tmp_path / "runs"
    proc = dfo(sandbox, "watch", f"kpro6:{run_folder}/", "--target", str(sandbox.hosts["ct129"].models),
               "--series", "empty", "--once", "--detach", runs=runs)
    assert proc.returncode == 0, proc.stderr
    assert "detached" in proc.stderr and "supervisor pid" in proc.stderr
    folder = runs / "series" / "empty"
    text = wait_until_stopped(folder)
    assert "watcher exited with 0; stopping" in text and "restarting" not in text
    assert series_state.load_series(folder)["checkpoints"] == {}


def test_running_pid_ignores_a_stale_or_foreign_pid(tmp_path):
    (tmp_path / "supervisor.pid").write_text("1\n")  # init: alive, but not a dfo supervisor
    assert supervisor.running_pid(tmp_path) is None
    (tmp_path / "supervisor.pid").write_text("garbage")
    assert supervisor.running_pid(tmp_path) is None
    assert supervisor.running_pid(Path(tmp_path / "missing")) is None


def test_the_supervisor_backs_off_10s_doubling_to_5_min_and_starts_over_after_a_long_run(tmp_path, capsys):
    """Real child processes (exit 1 on each of the first 11 starts, then 0); the waits and the clock are recorded
    and simulated (no test waits half an hour): start 8 ran 'long' (over 5 min), so the wait after it is 10 s."""
    count = tmp_path / "starts"
    child = [sys.executable, "-c", f"import pathlib, sys; p = pathlib.Path({str(count)!r}); "
             "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); sys.exit(0 if n >= 12 else 1)"]
    waits: list[float] = []
    now = [0.0]

    def clock() -> float:  # each start and each exit: one second later; start 8 exits 400 s after it started
        now[0] += 400.0 if count.exists() and count.read_text() == "8" and len(waits) == 7 else 1.0
        return now[0]

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = supervisor.supervise(tmp_path, [], argv=child, sleep=waits.append, clock=clock)
    finally:  # supervise installs its own (it is a process of its own in production)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code == 0 and count.read_text() == "12"
    assert waits == [10, 20, 40, 80, 160, 300, 300, 10, 20, 40, 80]
    out = capsys.readouterr().out
    assert out.count("watcher exited with 1; restarting in") == 11 and "restarting in 300s" in out
    assert "watcher exited with 0; stopping" in out
