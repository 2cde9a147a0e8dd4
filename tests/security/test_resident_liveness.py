"""Issue 30, finding 8: a resident worker is alive by its heartbeat, and a handover has a timeout.

Before, a worker was alive while its pid answered ``kill 0``: once it died without writing ``stopped``
(killed, out of memory), any process that got the pid later (another user's) kept it "alive", the heartbeat
was never read, and the handover client (and the watcher following its job) waited forever.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from remote_payload import resident
from remote_payload.resident import WORKER_GONE, hand_over, write_json

REPO = Path(__file__).resolve().parents[2]


def _worker_dir(tmp_path: Path, **state) -> Path:
    folder = tmp_path / "worker"
    (folder / "inbox").mkdir(parents=True)
    write_json(folder / "worker.json", state)
    return folder


def test_a_dead_workers_recycled_pid_is_not_a_live_worker(tmp_path):
    # The worker died an hour ago without a word; its pid now names another process (here: a sleep of ours).
    other = subprocess.Popen(["sleep", "60"])
    try:
        folder = _worker_dir(tmp_path, pid=other.pid, pid_start="1", state="ready", started=time.time() - 4000,
                             beat=time.time() - 3600)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-m", "remote_payload", "strip-handover", "--worker-dir", str(folder),
                               str(tmp_path / "ckpt"), str(tmp_path / "out")], capture_output=True, text=True,
                              timeout=60, env=env, cwd=str(tmp_path))
    finally:
        other.kill()
        other.wait()
    assert proc.returncode == WORKER_GONE, proc.stdout + proc.stderr
    assert "no resident strip worker took" in proc.stderr and "Traceback" not in proc.stderr
    assert list((folder / "inbox").iterdir()) == []  # nothing left for a later worker to act on


def test_a_fresh_beat_under_another_process_start_is_not_the_worker(tmp_path):
    other = subprocess.Popen(["sleep", "60"])
    try:
        folder = _worker_dir(tmp_path, pid=other.pid, pid_start="no such start", state="ready", beat=time.time())
        assert resident.worker_live(folder) is None
        write_json(folder / "worker.json", {"pid": other.pid, "pid_start": resident.process_start(other.pid),
                                            "state": "ready", "beat": time.time()})
        assert resident.worker_live(folder) is not None  # the same process, beating: alive
    finally:
        other.kill()
        other.wait()


def test_a_handover_a_live_worker_never_takes_times_out_and_is_withdrawn(tmp_path, monkeypatch):
    # A worker that beats but never takes a request (stuck): the handover ends, the request is withdrawn.
    folder = _worker_dir(tmp_path, pid=os.getpid(), pid_start=resident.process_start(os.getpid()), state="ready",
                         beat=time.time())
    stop = threading.Event()

    def beat():
        while not stop.wait(0.2):
            write_json(folder / "worker.json", {"pid": os.getpid(), "state": "ready", "beat": time.time(),
                                                "pid_start": resident.process_start(os.getpid())})

    threading.Thread(target=beat, daemon=True).start()
    monkeypatch.setattr(resident, "TAKE_TIMEOUT_S", 0.5, raising=False)  # 60 s in use
    outcome: list[object] = []
    waiting = threading.Thread(target=lambda: outcome.append(
        hand_over(folder, folder / "inbox" / "r1.json", {"src": "x"}, folder / "outbox" / "r1.json")), daemon=True)
    waiting.start()
    waiting.join(timeout=20)
    stop.set()
    assert not waiting.is_alive(), "the handover waits forever on a worker that never takes its request"
    assert outcome == [None]
    assert list((folder / "inbox").iterdir()) == []
    assert json.loads((folder / "worker.json").read_text())["state"] == "ready"
