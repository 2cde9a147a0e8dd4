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


# A worker that runs as a Slurm job (`dfo watch --resident-job`) lives on a compute node: the client on the login
# node judges it by Slurm's state of the job its record names and by the heartbeat, never by its pid.


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_a_slurm_worker_is_judged_by_its_job_and_beat_not_by_a_pid_of_another_node(tmp_path):
    folder = _worker_dir(tmp_path, pid=_dead_pid(), pid_start="1", state="ready", beat=time.time(),
                         slurm_job="41_0", node="gpu17")
    assert resident.worker_live(folder) is None  # judged by pid here: that pid is nobody on this node
    answers = {"41_0": "RUNNING"}
    look = resident.SlurmLook("41_0", ask=answers.get)
    assert resident.worker_live(folder, look) is not None
    assert resident.worker_live(folder, resident.SlurmLook("42_0", ask=answers.get)) is None  # another job's record
    ended = resident.SlurmLook("41_0", ask=lambda job: "")  # Slurm no longer lists it: gone, whatever the beat says
    assert resident.worker_live(folder, ended) is None
    unknown = resident.SlurmLook("41_0", ask=lambda job: None)  # squeue cannot answer: the heartbeat decides
    assert resident.worker_live(folder, unknown) is not None
    write_json(folder / "worker.json", {"pid": 1, "state": "ready", "beat": time.time() - 60, "slurm_job": "41_0"})
    assert resident.worker_live(folder, look) is None  # a stale beat: stalled or killed, whatever Slurm says


def test_slurm_is_asked_at_most_every_few_seconds_however_often_the_client_looks(monkeypatch):
    asked: list[str] = []
    look = resident.SlurmLook("7_0", ask=lambda job: asked.append(job) or "RUNNING")
    for _ in range(50):
        assert look() == "RUNNING"
    assert asked == ["7_0"]
    monkeypatch.setattr(resident, "SLURM_LOOK_S", 0.0)
    look()
    assert asked == ["7_0", "7_0"]


def test_a_handover_waits_for_a_queued_slurm_worker_and_gives_up_when_its_job_ends(tmp_path, monkeypatch):
    folder = tmp_path / "worker"
    (folder / "inbox").mkdir(parents=True)
    monkeypatch.setattr(resident, "SLURM_LOOK_S", 0.0)
    states = iter(["PENDING", "PENDING", "RUNNING"] + ["RUNNING"] * 1000)

    def worker() -> None:  # comes up once Slurm runs it, takes the request and replies
        while not (folder / "inbox" / "r1.json").exists():
            if not (folder / "worker.json").exists() and next_state[0] == "RUNNING":
                write_json(folder / "worker.json", {"pid": 1, "state": "ready", "beat": time.time(),
                                                    "slurm_job": "9_0"})
            time.sleep(0.05)
        (folder / "inbox" / "r1.json").unlink()
        write_json(tmp_path / "reply.json", {"ok": True})

    next_state = ["PENDING"]

    def ask(job: str) -> str:
        next_state[0] = next(states)
        return next_state[0]

    threading.Thread(target=worker, daemon=True).start()
    outcome = hand_over(folder, folder / "inbox" / "r1.json", {"name": "d"}, tmp_path / "reply.json",
                        slurm=resident.SlurmLook("9_0", ask=ask))
    assert outcome == {"ok": True}

    # A job that ends while queued: no worker will come, the client returns at once and leaves nothing behind.
    empty = tmp_path / "worker2"
    (empty / "inbox").mkdir(parents=True)
    quick = hand_over(empty, empty / "inbox" / "r2.json", {"name": "d"}, tmp_path / "reply2.json",
                      slurm=resident.SlurmLook("10_0", ask=lambda job: "CANCELLED"))
    assert quick is None and list((empty / "inbox").iterdir()) == []


def test_a_worker_inside_a_slurm_array_task_names_its_task(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1230")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert resident.slurm_job_here() == "1230_0"
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    assert resident.slurm_job_here() == "1234"
    monkeypatch.setenv("SLURM_JOB_ID", "12; rm -rf /")  # a value from the environment is checked, not trusted
    assert resident.slurm_job_here() is None
    assert resident.slurm_job_state("12; rm -rf /") == ""


def test_a_fresh_beat_is_live_while_slurms_last_answer_still_says_pending(tmp_path, monkeypatch):
    # Slurm is asked every few seconds: the worker may have started and beaten since it last said PENDING.
    folder = tmp_path / "worker"
    (folder / "inbox").mkdir(parents=True)
    monkeypatch.setattr(resident, "SLURM_LOOK_S", 3600.0)
    look = resident.SlurmLook("5_0", ask=lambda job: "PENDING")
    assert resident.worker_live(folder, look) is None and look() == "PENDING"  # no record yet: asked once
    write_json(folder / "worker.json", {"pid": 1, "state": "loading", "beat": time.time(), "slurm_job": "5_0"})
    assert resident.worker_live(folder, look) is not None
