"""`dfo watch`'s failure paths on the sandbox hosts (real sshd), each at a named kill point
(``DFO_WATCH_TEST_KILL_AT``, orchestrator/watch/loop.py) or a named event:

- ``launched``: the eval job runs, the series does not know it (an orphan): the next watcher reattaches to it,
  no second relay or job;
- ``recorded``: the result is in the series, --on-result has not run: the next watcher delivers it once;
- the resident worker outlives the watchers and is reused; ``worker-take``: it dies under a handover, and the
  watcher evaluates that checkpoint in a job of its own (the handover's run never counts);
- the resident strip worker on kpro6 strips the checkpoints, refuses handovers that leave the watched folder or
  the strip folder, and ``strip-take``: it dies under a strip, and the one-shot strip-checkpoint does it;
- the GPU lock held by another job: nothing is recorded against the checkpoint, the next look evaluates it;
- a checkpoint that vanishes while it is relayed, and a corrupt one: recorded as failed, the watcher goes on,
  the stripped copy a killed relay would leave on the training host is removed (kept with --keep);
- TensorBoard events here and in the trainer's logdir on kpro6, read back with TensorBoard's reader.

Checkpoints are copies of the fixtures' training-format checkpoint, settled (an hour old) from the start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runner import dfo_argv, dfo_env
from test_series_scale import _read_scalars

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import load_inventory
from orchestrator.evaluation.runs import list_runs
from orchestrator.jobs.operation import cancel_job, launch_job
from orchestrator.transport import Connector
from orchestrator.watch.probe import strip_key
from orchestrator.watch.series import load_series

pytestmark = [pytest.mark.sshd, pytest.mark.slow]
EVAL = ["--samples", "3", "--max-new-tokens", "32", "--dtype", "float32", "--threads", "1", "--settle", "1",
        "--pattern", "step_*.pt", "--worker-idle", "120"]


def watch(sandbox, runs: Path, folder: Path, series: str, *extra: str, kill_at: str | None = None,
          wait: bool = True):
    """`dfo watch --once` as a process of its own (a kill point SIGKILLs it)."""
    env = {**dfo_env(sandbox.inventory_path), "DFO_RUNS_DIR": str(runs)}
    if kill_at:
        env["DFO_WATCH_TEST_KILL_AT"] = kill_at
    args = dfo_argv("watch", f"kpro6:{folder}/", "--host", "ct129", "--series", series, "--once", *EVAL, *extra)
    if not wait:
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)


def series(runs: Path, name: str) -> dict:
    try:
        return load_series(runs / "series" / name) or {}
    except InputError:
        return {}


def settled_checkpoint(eval_hosts, folder: Path, step: int) -> Path:
    src = Path(eval_hosts["ours"].split(":", 1)[1])
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src.with_name("spec.json"), folder / "spec.json")  # the drafter spec the strip reads beside it
    path = folder / f"step_{step}.pt"
    shutil.copyfile(src, path)
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    return path


def strip_folder(sandbox, path: Path) -> Path:
    st = path.stat()
    return sandbox.hosts["kpro6"].workdir / "relay-strip" / strip_key(str(path), st.st_size, st.st_mtime_ns)


def test_an_orphan_is_reattached_a_result_is_delivered_once_and_the_worker_is_reused(sandbox, eval_hosts, tmp_path):
    folder = sandbox.hosts["kpro6"].checkpoints / f"orphan-{tmp_path.name[-12:]}"
    ckpt = settled_checkpoint(eval_hosts, folder, 10)
    runs, name = tmp_path / "runs", "orphan"
    hook_log = tmp_path / "hook.jsonl"
    hook = tmp_path / "hook.py"
    hook.write_text(f"import sys\nopen({str(hook_log)!r}, 'a').write(sys.stdin.read().replace('\\n', ' ') + '\\n')\n")
    tb_local, tb_remote = tmp_path / "tb", sandbox.hosts["kpro6"].checkpoints / f"tb-{tmp_path.name[-12:]}"
    extra = ["--target", eval_hosts["target"], "--on-result", f"{sys.executable} {hook}",
             "--tensorboard", str(tb_local), "--tensorboard-logdir", str(tb_remote)]

    first = watch(sandbox, runs, folder, name, *extra, kill_at="launched")
    assert first.returncode == -signal.SIGKILL, first.stdout + first.stderr
    e = series(runs, name)["checkpoints"]["step_10.pt"]
    assert e["status"] == "relaying" and e["run"] is None  # the job runs; the series never heard of it
    launched = [r for r in list_runs(runs) if r.record.get("jobs")]
    assert len(launched) == 1 and launched[0].record.get("resident_worker")
    worker = json.loads((runs / "series" / name / "worker.json").read_text())

    second = watch(sandbox, runs, folder, name, *extra, kill_at="recorded")
    assert second.returncode == -signal.SIGKILL, second.stdout + second.stderr
    e = series(runs, name)["checkpoints"]["step_10.pt"]
    assert e["status"] == "done" and e["run"] == launched[0].name and e["attempts"] == 1
    assert e["notify_pending"] and not hook_log.exists()
    assert "reattaching to step_10.pt" in second.stderr
    assert len([r for r in list_runs(runs) if r.record.get("jobs")]) == 1  # no second relay, no second job

    settled_checkpoint(eval_hosts, folder, 11)
    third = watch(sandbox, runs, folder, name, *extra)
    assert third.returncode == 0, third.stderr[-3000:]
    deliveries = [json.loads(line) for line in hook_log.read_text().splitlines()]
    assert [(d["checkpoint"], d["status"]) for d in deliveries] == [("step_10.pt", "done"), ("step_11.pt", "done")]
    entries = series(runs, name)["checkpoints"]
    assert entries["step_10.pt"]["on_result"]["ok"] and not entries["step_10.pt"]["notify_pending"]
    assert entries["step_11.pt"]["resident"]  # handed to the worker the first watcher started
    assert json.loads((runs / "series" / name / "worker.json").read_text())["job_id"] == worker["job_id"]
    assert "resident eval worker" not in third.stderr  # reused, not started again

    taus = [(s, round(entries[f"step_{s}.pt"]["measures"]["tau_macro"]["value"], 4)) for s in (10, 11)]
    for where in (tb_local, tb_remote / f"dfo-{name}"):
        got = _read_scalars(where)
        assert got["dflash/tau_macro"] == taus, where  # once each, though step_10's watcher was killed after it
        assert {"dflash/tau_micro", "dflash/ddtree_8", "dflash/p1", "dflash/p4"} <= set(got), where
    assert not list(tb_remote.rglob(".*dfo-tmp"))
    assert not strip_folder(sandbox, ckpt).exists()


def test_gpu_lock_retry_vanished_and_corrupt_checkpoints_and_a_worker_that_dies(sandbox, eval_hosts, tmp_path):
    folder = sandbox.hosts["kpro6"].checkpoints / f"fail-{tmp_path.name[-12:]}"
    runs, name = tmp_path / "runs", "fail"
    target = ["--target", eval_hosts["target"]]
    ckpt = settled_checkpoint(eval_hosts, folder, 20)

    # 1. Another job holds ct129's GPU lock: no worker, no job, nothing recorded; the next look evaluates.
    with Connector(load_inventory(sandbox.inventory_path)) as connector:
        holder = launch_job(connector, "ct129", ["sleep", "600"], job_name="someone else's eval")
        try:
            busy = watch(sandbox, runs, folder, name, *target)
        finally:
            cancel_job(connector, "ct129", holder.job_id)
    assert busy.returncode == 0, busy.stderr[-3000:]
    text = " ".join(busy.stderr.split())
    assert f"lock 'gpu' is held by running job ct129:{holder.job_id}" in text
    assert "no resident worker" in text and "will try step_20.pt again" in text
    assert series(runs, name)["checkpoints"] == {}

    # 2. A corrupt checkpoint beside it, with the stripped copy a killed relay of it left on kpro6.
    corrupt = folder / "step_30.pt"
    corrupt.write_bytes(b"not a checkpoint" * 1000)
    os.utime(corrupt, (time.time() - 3600, time.time() - 3600))
    left = strip_folder(sandbox, corrupt)
    (left / "partial").mkdir(parents=True)
    (left / "partial" / "model.safetensors.part").write_bytes(b"x" * 100)
    # 3. The worker dies when it takes step_20's handover: step_20 is evaluated by a job of its own.
    # --no-lint: lint would refuse step_30 before its strip (tests/watch/test_watch_e2e.py shows that); here
    # the strip itself must fail and clear what the killed relay left.
    run = watch(sandbox, runs, folder, name, *target, "--no-lint", kill_at="worker-take")
    assert run.returncode == 0, run.stderr[-3000:]
    entries = series(runs, name)["checkpoints"]
    assert entries["step_20.pt"]["status"] == "done" and not entries["step_20.pt"]["resident"], entries["step_20.pt"]
    assert entries["step_20.pt"]["attempts"] == 2 and len(entries["step_20.pt"]["superseded_runs"]) >= 1
    gone = entries["step_20.pt"]["superseded_runs"][0]
    assert gone != entries["step_20.pt"]["run"]
    assert "the resident worker stopped" in " ".join(run.stderr.split())
    assert entries["step_30.pt"]["status"] == "failed" and "strip-checkpoint" in entries["step_30.pt"]["error"]
    assert not left.exists() and entries["step_30.pt"]["strip_removed"]
    assert not strip_folder(sandbox, ckpt).exists()

    # 4. A checkpoint removed while the watcher is relaying it: failed, with the reason; the watcher goes on.
    vanishing = settled_checkpoint(eval_hosts, folder, 40)
    proc = watch(sandbox, runs, folder, name, *target, "--no-resident", wait=False)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if (series(runs, name).get("checkpoints", {}).get("step_40.pt") or {}).get("status") == "relaying":
            vanishing.unlink()
            break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    e = series(runs, name)["checkpoints"]["step_40.pt"]
    assert e["status"] == "failed" and "relay/launch" in e["error"] and "step_40.pt" in e["error"], e
    shown = subprocess.run(dfo_argv("series", "show", name), env={**dfo_env(), "DFO_RUNS_DIR": str(runs)},
                           capture_output=True, text=True, timeout=120)
    assert "2 failed" in shown.stdout and "step_40.pt" in shown.stdout


def test_the_strip_worker_strips_refuses_hostile_handovers_and_one_that_dies_falls_back(sandbox, eval_hosts, tmp_path):
    folder = sandbox.hosts["kpro6"].checkpoints / f"strip-{tmp_path.name[-12:]}"
    ckpt = settled_checkpoint(eval_hosts, folder, 50)
    runs, name = tmp_path / "runs", "strip"
    target = ["--target", eval_hosts["target"]]

    first = watch(sandbox, runs, folder, name, *target)
    assert first.returncode == 0, first.stderr[-3000:]
    assert series(runs, name)["checkpoints"]["step_50.pt"]["status"] == "done"
    assert "resident strip worker kpro6:" in " ".join(first.stderr.split())
    record = json.loads((runs / "series" / name / "strip-worker.json").read_text())
    worker_dir = Path(record["job_dir"]) / "worker"  # the sandbox hosts' folders are on this machine
    state = json.loads((worker_dir / "worker.json").read_text())
    assert state["state"] == "ready" and state["served"] == 1 and state["last"]["ok"], state
    assert not strip_folder(sandbox, ckpt).exists()  # relayed, then removed

    # Handovers the watcher would never make, through kpro6's shell as the relay sends its own.
    workdir = sandbox.hosts["kpro6"].workdir
    outside = Path(eval_hosts["ours"].split(":", 1)[1])  # a checkpoint outside the watched folder
    with Connector(load_inventory(sandbox.inventory_path)) as connector:
        def handover(src: Path, out: Path):
            return connector.session("kpro6").run(
                f"cd {workdir / 'payload'} && exec {record['python']} -m remote_payload strip-handover "
                f"--worker-dir {worker_dir} {src} {out}", check=False)

        evil = workdir / "evil"
        refused = [handover(outside, strip_folder(sandbox, outside)), handover(ckpt, evil),
                   handover(ckpt, strip_folder(sandbox, outside))]
    assert [r.exit_code for r in refused] == [2, 2, 2], [r.err_text for r in refused]
    assert "is not inside" in refused[0].err_text and "strip request: output" in refused[1].err_text
    assert not evil.exists() and not strip_folder(sandbox, outside).exists()
    assert json.loads((worker_dir / "worker.json").read_text())["state"] == "ready"  # it goes on serving

    # The worker dies when it takes step_60's strip: the one-shot strip-checkpoint does it, the watcher goes on.
    with Connector(load_inventory(sandbox.inventory_path)) as connector:
        cancel_job(connector, "kpro6", record["job_id"])
    settled_checkpoint(eval_hosts, folder, 60)
    dying = watch(sandbox, runs, folder, name, *target, kill_at="strip-take")
    assert dying.returncode == 0, dying.stderr[-3000:]
    e = series(runs, name)["checkpoints"]["step_60.pt"]
    assert e["status"] == "done" and e["attempts"] == 1, e
    assert "the resident strip worker stopped" in " ".join(dying.stderr.split())
    assert not (runs / "series" / name / "strip-worker.json").exists()


def test_keep_keeps_the_stripped_copy_a_failed_relay_left(sandbox, eval_hosts, tmp_path):
    folder = sandbox.hosts["kpro6"].checkpoints / f"keep-{tmp_path.name[-12:]}"
    folder.mkdir(parents=True)
    corrupt = folder / "step_5.pt"
    corrupt.write_bytes(b"garbage" * 100)
    os.utime(corrupt, (time.time() - 3600, time.time() - 3600))
    left = strip_folder(sandbox, corrupt)
    left.mkdir(parents=True)
    run = watch(sandbox, tmp_path / "runs", folder, "keep", "--target", eval_hosts["target"], "--no-resident",
                "--keep")
    # --once with nothing evaluated and a failure exits 1 (cron sees it), naming what failed
    assert run.returncode == 1, run.stderr[-3000:]
    assert "no checkpoint was evaluated, 1 failed" in " ".join(run.stderr.split())
    assert "failed: step_5.pt (step 5):" in " ".join(run.stderr.split())
    assert series(tmp_path / "runs", "keep")["checkpoints"]["step_5.pt"]["status"] == "failed"
    assert left.is_dir()


def test_a_checkpoint_without_a_spec_fails_naming_watch_s_option_and_is_retried_with_it(sandbox, eval_hosts, tmp_path):
    """A trainer that saves no spec: the eval's error names `dfo watch --drafter-spec FILE`; without
    --retry-failed the failed, unchanged checkpoint is left alone; with it and the spec the next look evaluates it
    again (the bound on retries: tests/watch/test_discovery_selection.py), through the resident worker, which takes
    the spec with each handover."""
    folder = sandbox.hosts["kpro6"].checkpoints / f"nospec-{tmp_path.name[-12:]}"
    ckpt = settled_checkpoint(eval_hosts, folder, 50)
    spec = tmp_path / "run-spec.json"  # on the eval host (the sandbox hosts share this filesystem)
    (folder / "spec.json").rename(spec)
    runs, name, target = tmp_path / "runs", "nospec", ["--target", eval_hosts["target"]]
    first = watch(sandbox, runs, folder, name, *target)
    assert first.returncode == 1, first.stderr[-3000:]
    e = series(runs, name)["checkpoints"]["step_50.pt"]
    assert e["status"] == "failed" and e["attempts"] == 1 and "`dfo watch --drafter-spec FILE`" in e["error"], e
    watch(sandbox, runs, folder, name, *target)  # no retry asked: skipped, unchanged since
    assert series(runs, name)["checkpoints"]["step_50.pt"]["attempts"] == 1
    retried = watch(sandbox, runs, folder, name, *target, "--drafter-spec", str(spec), "--retry-failed", "1")
    assert retried.returncode == 0, retried.stderr[-3000:]
    e = series(runs, name)["checkpoints"]["step_50.pt"]
    assert e["status"] == "done" and e["attempts"] == 2 and e["measures"]["tau_macro"]["value"] > 0, e
    assert e["resident"], e  # the spec travels with the handover: the resident worker served it
    assert "one eval job per checkpoint" not in retried.stderr
    assert ckpt.exists()
