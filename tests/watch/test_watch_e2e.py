"""`dfo watch` on the sandbox hosts against a fake trainer on kpro6 that writes checkpoints slowly.

The trainer (orchestrator/testing/fake_trainer.py, a detached job on kpro6) writes step_100.pt,
step_200.pt, a corrupt step_250.pt and step_300.pt, each noisier-to-cleaner copy of the fixtures' trained
drafter (so τ rises with the step), chunk by chunk (step_200 over a minute, or until the test has looked), each
file held back until the test lets it start.
The watcher must evaluate each good checkpoint exactly once and never a half-written one, survive a
SIGKILL while it relays and while the eval job runs, record the corrupt one as failed and go on, call
--on-result once per checkpoint, evaluate the baseline once, and leave no relayed weights on ct129.
"""

from __future__ import annotations

import json
import os
import posixpath
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import dfo, dfo_argv, dfo_env

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import load_inventory
from orchestrator.evaluation.runs import list_runs
from orchestrator.jobs.operation import cancel_job, launch_job
from orchestrator.provision.operation import provision
from orchestrator.transport import Connector
from orchestrator.watch.series import load_series

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

TRAINER = Path(__file__).resolve().parents[2] / "orchestrator" / "testing" / "fake_trainer.py"
STEPS = (100, 200, 250, 300)
CORRUPT = 250
# A file is written in CHUNKS pieces, CHUNK_DELAY apart (3 s), the slow step_200 one piece a second: --settle 3 s
# is three of its gaps, so a file still being written never looks settled, and the test waits little on the
# trainer (it waited 20 s more at 30 pieces 0.2 s apart and --settle 5).
CHUNKS, CHUNK_DELAY, SETTLE = 60, 0.05, 3


def wait_for(predicate, what: str, timeout: float = 300, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def trainer_events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def series_state(path: Path) -> dict:
    """The series whose series.json is PATH, its journal replayed ({} while there is none)."""
    try:
        return load_series(path.parent) or {}
    except InputError:
        return {}


def status_of(path: Path, name: str) -> str | None:
    return ((series_state(path).get("checkpoints") or {}).get(name) or {}).get("status")


class Background:
    """A watcher in its own process group, so a SIGKILL takes its ssh children with it."""

    def __init__(self, box, args, runs: Path, log: Path):
        self.log = log.open("ab")
        self.proc = subprocess.Popen(dfo_argv(*args), env={**dfo_env(box.inventory_path), "DFO_RUNS_DIR": str(runs)},
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(30)
        self.log.close()


@pytest.fixture
def trainer(sandbox, eval_hosts, provision_cache, tmp_path):
    """Starts the fake trainer on kpro6; yields (folder, log, gate(i) to let file i start, the gate that lets the
    slow step_200 finish at once)."""
    kpro6 = sandbox.hosts["kpro6"]
    folder = posixpath.join(str(kpro6.checkpoints), f"run-{tmp_path.name[-12:]}")
    log, gates = tmp_path / "trainer.jsonl", [tmp_path / f"gate{i}" for i in range(len(STEPS) - 1)]
    hurry = tmp_path / "hurry"
    source = eval_hosts["ours"].split(":", 1)[1]
    with Connector(load_inventory(sandbox.inventory_path)) as connector:
        python = provision(connector, "kpro6", offline=True, wheelhouse_cache=provision_cache).python
        script = posixpath.join(str(kpro6.workdir), "fake_trainer.py")
        connector.session("kpro6").put(TRAINER, script)
        argv = [python, script, "--source", source, "--out", folder, "--steps", ",".join(map(str, STEPS)),
                "--corrupt", str(CORRUPT), "--slow", "200", "--slow-seconds", "60", "--chunks", str(CHUNKS),
                "--chunk-delay", str(CHUNK_DELAY), "--hurry", str(hurry), "--log", str(log)]
        for g in gates:
            argv += ["--wait-for", str(g)]
        handle = launch_job(connector, "kpro6", argv, lock=None, job_name="fake trainer")
        try:
            yield folder, log, gates, hurry
        finally:
            for g in [*gates, hurry]:
                g.touch()
            cancel_job(connector, "kpro6", handle.job_id)


def test_watch_evaluates_each_checkpoint_once_through_kills_and_a_corrupt_file(sandbox, eval_hosts, trainer, tmp_path):
    folder, log, gates, hurry = trainer
    runs = tmp_path / "runs"
    hook_log = tmp_path / "hook.jsonl"
    hook_script = tmp_path / "hook.py"
    hook_script.write_text("import json, sys\n"
                           f"open({str(hook_log)!r}, 'a').write(json.dumps(json.load(sys.stdin)) + '\\n')\n")
    hook = f"{sys.executable} {hook_script}"
    args = ["watch", f"kpro6:{folder}/", "--host", "ct129", "--target", eval_hosts["target"],
            "--drafter", eval_hosts["random"], "--series", "run7", "--pattern", "step_*.pt", "--settle", str(SETTLE),
            "--samples", "3", "--max-new-tokens", "32", "--dtype", "float32", "--threads", "1", "--on-result", hook]
    state = runs / "series" / "run7" / "series.json"

    # 1. step_100 is complete and step_200 half-written when the watcher looks (--once).
    wait_for(lambda: any(e["event"] == "done" for e in trainer_events(log)), "step_100.pt", timeout=120)
    gates[0].touch()
    wait_for(lambda: any(e["event"] == "start" and e["step"] == 200 for e in trainer_events(log)), "step_200 start")
    # step_100 must have been quiet for --settle on a fast machine too; step_200 keeps growing (over 60 s, or
    # until the test has looked and lets it finish).
    time.sleep(SETTLE + 1)
    dry = dfo(sandbox, *args, "--dry-run", "--json", runs=runs)
    assert dry.returncode == 0, dry.stderr[-2000:]
    planned = json.loads(dry.stdout)
    assert [c["name"] for c in planned["evaluate"]] == ["step_100.pt"]
    assert [c["name"] for c in planned["waiting"]] == ["step_200.pt"] and not runs.exists()
    once = dfo(sandbox, *args, "--once", runs=runs)
    assert once.returncode == 0, once.stderr[-3000:]
    assert "waiting for step_200.pt" in once.stderr
    first = series_state(state)
    assert set(first["checkpoints"]) == {"step_100.pt"} and first["checkpoints"]["step_100.pt"]["status"] == "done"
    assert set(first["baselines"]["drafters"]) == {"random"}
    assert not any(e["event"] == "done" and e["step"] == 200 for e in trainer_events(log))  # it was still growing
    hurry.touch()

    # 2. The rest, with the watcher SIGKILLed once while it relays and once while the eval job runs.
    wait_for(lambda: any(e["event"] == "done" and e["step"] == 200 for e in trainer_events(log)), "step_200 done")
    for g in gates[1:]:
        g.touch()
    loop_args = [*args, "--interval", "1"]
    watcher = Background(sandbox, loop_args, runs, tmp_path / "watch1.log")
    wait_for(lambda: status_of(state, "step_200.pt") == "relaying", "step_200.pt relaying", every=0.05)
    watcher.kill()
    watcher = Background(sandbox, loop_args, runs, tmp_path / "watch2.log")
    killed_in_eval = wait_for(lambda: next((n for n, e in series_state(state)["checkpoints"].items()
                                            if e["status"] == "evaluating"), None), "an eval job", every=0.05)
    watcher.kill()
    watcher = Background(sandbox, loop_args, runs, tmp_path / "watch3.log")
    try:
        wait_for(lambda: all(((series_state(state).get("checkpoints") or {}).get(f"step_{s}.pt") or {}).get("on_result")
                             for s in STEPS), "every step evaluated (or failed) and reported", timeout=600, every=0.5)
    finally:
        watcher.kill(signal.SIGTERM)
    third_log = (tmp_path / "watch3.log").read_text()
    assert f"reattaching to {killed_in_eval}" in third_log

    final = series_state(state)
    entries = final["checkpoints"]
    assert {n: e["status"] for n, e in entries.items()} == {
        "step_100.pt": "done", "step_200.pt": "done", "step_250.pt": "failed", "step_300.pt": "done"}
    # The lint refuses the corrupt file where it lies, before any strip or relay.
    refused = entries["step_250.pt"]["error"]
    assert "[torch-not-zip]" in refused and "nothing was relayed" in refused
    assert entries["step_200.pt"]["attempts"] == 2  # the attempt killed while relaying was redone
    # Exactly once: one complete run per checkpoint, and the series points at it.
    complete = {}
    for run in list_runs(runs):
        paths = [d["path"] for d in run.record["request"]["drafters"]]
        if run.has_results():
            complete.setdefault(tuple(paths), []).append(run.name)
    for s in (100, 200, 300):
        path = posixpath.join(folder, f"step_{s}.pt")
        assert complete[(path,)] == [entries[f"step_{s}.pt"]["run"]], s
    assert len([k for k in complete if len(k) == 1 and "random-drafter" in k[0]]) == 1  # the baseline, once
    # Never half-written: the digest of what was evaluated is the digest of the finished file.
    written = {e["name"]: e["sha256"] for e in trainer_events(log) if e["event"] == "done"}
    for s in (100, 200, 300):
        e = entries[f"step_{s}.pt"]
        assert e["digests"]["source"]["sha256"] == written[f"step_{s}.pt"], s
        assert e["metadata_step"] == s and e["removed_from_eval_host"]
    points = final["steps"]
    assert [p["step"] for p in points] == [100, 200, 300]
    assert points[-1]["tau_macro"]["value"] > points[0]["tau_macro"]["value"]  # the trainer's quality rises
    assert entries["step_300.pt"]["verdict"]["verdict"] in ("up", "flat")
    assert entries["step_300.pt"]["reuse"]["features_cache_hits"]  # target features extracted once, reused
    relayed = sandbox.hosts["ct129"].checkpoints / "dfo-relayed" / "kpro6"
    assert not [p.name for p in relayed.glob("step_*")]
    hooks = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert sorted((h["checkpoint"], h["status"]) for h in hooks) == [
        ("step_100.pt", "done"), ("step_200.pt", "done"), ("step_250.pt", "failed"), ("step_300.pt", "done")]
    folder_files = {p.name for p in state.parent.iterdir()}
    assert {"series.json", "series.md", "tau_vs_step.png"} <= folder_files
    shown = dfo(sandbox, "series", "show", "run7", runs=runs)
    assert shown.returncode == 0 and "step_250.pt" in shown.stdout and "failed" in shown.stdout
