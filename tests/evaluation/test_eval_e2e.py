"""`dfo eval` end to end on the sandbox hosts: the demo path, dry runs, pre-flight failures, detach and
reattach, and a job that fails on the host.

The hosts get the payload's CPU venv (built once per session, offline), tiny fixtures built *on the hosts*
through dfo's own job runner (a training-format checkpoint on kpro6, the target and z-lab-format drafters
on ct129), and the eval relays the checkpoint from kpro6 to ct129 through the controller.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.core.inventory import load_inventory
from orchestrator.jobs.operation import launch_job
from orchestrator.transport import Connector

pytestmark = [pytest.mark.sshd, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def eval_args(hosts, *extra) -> list[str]:
    return ["eval", "--host", "ct129", "--target", hosts["target"], "--drafter", hosts["ours"],
            "--drafter", hosts["random"], "--samples", "4", "--max-new-tokens", "48", "--dtype", "float32",
            "--threads", "1", *extra]


def snapshot(box) -> dict[str, tuple[int, int]]:
    seen = {}
    for host in box.hosts.values():
        for top in (host.workdir, host.checkpoints, host.models):
            for p in Path(top).rglob("*"):
                st = p.lstat()
                seen[str(p)] = (st.st_size, st.st_mtime_ns)
    return seen


def test_eval_relays_evaluates_and_writes_a_readable_run_folder(sandbox, eval_hosts, tmp_path):
    runs = tmp_path / "runs"
    proc = dfo(sandbox, *eval_args(eval_hosts), "--diagnose", "--json", runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    run_dir = Path(summary["path"])
    results = json.loads((run_dir / "results.json").read_text())
    assert results["schema"] == "dfo.results/2" and results["status"] == "ok"
    assert set(results["drafters"]) == {"ours", "random"}
    ours, rnd = (results["drafters"][n]["metrics"] for n in ("ours", "random"))
    assert ours["tau_macro"] > rnd["tau_macro"], (ours["tau_macro"], rnd["tau_macro"])
    assert ours["tau_macro"] >= 1.5  # the trained fixture drafter really accepts
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4 and all(s["host"] == "ct129" for s in samples)
    assert set(samples[0]["drafters"]) == {"ours", "random"}
    # The training checkpoint was stripped on kpro6 and relayed: weights only, next to a digest manifest.
    relayed = sandbox.hosts["ct129"].checkpoints / "dfo-relayed" / "kpro6" / "checkpoint-weights"
    assert (relayed / "model.safetensors").is_file()
    assert results["drafters"]["ours"]["source"]
    for name in ("report.md", "acceptance.png", "tau_histogram.png", "logs/ct129.log", "run.json"):
        assert (run_dir / name).is_file(), name
    report = (run_dir / "report.md").read_text()
    assert "| ours |" in report and "| random |" in report and "τ macro" in report
    # Side by side on the same samples: the comparison block and the tree metrics are there.
    (pair,) = results["comparison"]["pairs"]
    assert (pair["a"], pair["b"]) == ("ours", "random") and pair["tau_macro"]["delta"] < 0
    assert ours["tree"]["topk"]["k"] == 8 and ours["tree"]["topk"]["tau_macro"] >= ours["tau_macro"]
    assert results["diagnostics"]["text"] and "## Diagnostics" in report and "## Comparison" in report
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "succeeded" and run["jobs"]["ct129"]["state"] == "succeeded"
    assert summary["drafters"]["ours"]["tau_macro"] == ours["tau_macro"]

    # One speculation profile per drafter; the schema's validation passes and K = B-1 is the full replay.
    for name in ("ours", "random"):
        profile = json.loads((run_dir / "profiles" / f"{name}.speculation_profile.json").read_text())
        assert profile["schema_version"] == "1.0" and profile["validation"]["passed"], profile["validation"]
        B = results["drafters"][name]["metrics"]["block_size"]
        by_k = profile["accept_length_by_k"]
        assert list(by_k) == [str(k) for k in range(1, B)]
        assert by_k[str(B - 1)] == pytest.approx(profile["mean_accept_length"], abs=1e-5)
        assert by_k == {k: v["mean_accept_length"] for k, v in
                        results["drafters"][name]["metrics"]["accept_length_by_k"]["by_k"].items()}
    exported = dfo(sandbox, "runs", "profile", run_dir.name, "--drafter", "ours", "--out",
                   str(tmp_path / "ours.json"), runs=runs)
    assert exported.returncode == 0 and "validation passed" in exported.stdout, exported.stderr[-2000:]
    ours_profile = json.loads((run_dir / "profiles" / "ours.speculation_profile.json").read_text())
    assert json.loads((tmp_path / "ours.json").read_text()) == ours_profile

    listed = dfo(sandbox, "runs", "list", "--json", runs=runs)
    assert json.loads(listed.stdout)["runs"][0]["run"] == run_dir.name
    shown = dfo(sandbox, "runs", "show", run_dir.name[:15], runs=runs)
    assert shown.returncode == 0 and "ours" in shown.stdout and "random" in shown.stdout


def test_dry_run_prints_the_plan_and_leaves_every_host_untouched(sandbox, eval_hosts, tmp_path):
    before = snapshot(sandbox)
    proc = dfo(sandbox, *eval_args(eval_hosts), "--dry-run", runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    assert "relay drafters" in proc.stdout and "checkpoint.pt" in proc.stdout and "strip optimizer" in proc.stdout
    assert "python -m remote_payload eval" in proc.stdout
    assert snapshot(sandbox) == before
    assert not (tmp_path / "runs").exists()


def test_missing_target_fails_before_any_upload_or_relay(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    ckpt = box.hosts["kpro6"].checkpoints / "step_1.pt"
    ckpt.write_bytes(b"not really a checkpoint")
    proc = dfo(box, "eval", "--host", "ct129", "--target", "/nonexistent/Qwen3.6-27B",
               "--drafter", f"ours=kpro6:{ckpt}", runs=tmp_path / "runs")
    assert proc.returncode == 2, proc.stderr
    assert "ct129: target /nonexistent/Qwen3.6-27B does not exist" in proc.stderr
    assert "nothing was uploaded or relayed" in proc.stderr and "Traceback" not in proc.stderr
    assert not (box.hosts["ct129"].workdir / "payload").exists()
    assert not list(box.hosts["ct129"].checkpoints.rglob("*"))


def test_detach_then_reattach_with_runs_pull(sandbox, eval_hosts, tmp_path):
    runs = tmp_path / "runs"
    proc = dfo(sandbox, *eval_args(eval_hosts), "--detach", "--json", runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    started = json.loads(proc.stdout)
    assert started["status"] == "detached" and "dfo runs pull" in proc.stderr
    assert not (Path(started["path"]) / "results.json").exists()
    pulled = dfo(sandbox, "runs", "pull", started["run"], "--json", runs=runs)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    done = json.loads(pulled.stdout)
    assert done["status"] == "succeeded" and set(done["drafters"]) == {"ours", "random"}
    assert (Path(started["path"]) / "results.json").is_file()


def test_remote_failure_surfaces_the_payload_error_and_marks_the_run_failed(sandbox, eval_hosts, tmp_path):
    # A z-lab drafter whose fc width does not match its layer list (one layer too many).
    bad = sandbox.hosts["ct129"].models / "bad-drafter"
    subprocess.run(["cp", "-r", eval_hosts["zlab"], str(bad)], check=True)
    config = json.loads((bad / "config.json").read_text())
    ids = config["dflash_config"]["target_layer_ids"]
    config["dflash_config"]["target_layer_ids"] = ids + [ids[-1] - 1]
    (bad / "config.json").write_text(json.dumps(config))
    runs = tmp_path / "runs"
    # --no-lint: the payload's own check is what this test is about (the lint would stop it first: tests/lint).
    proc = dfo(sandbox, "eval", "--host", "ct129", "--target", eval_hosts["target"], "--drafter", f"bad={bad}",
               "--samples", "2", "--max-new-tokens", "16", "--no-lint", runs=runs)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "drafter 'bad'" in proc.stderr and "fc expects" in proc.stderr and "Traceback" not in proc.stderr
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "failed" and "fc expects" in record["error"]
    assert "dfo-payload error:" in (run_dir / "logs" / "ct129.log").read_text()
    assert not (run_dir / "results.json").exists()
    assert "lint skipped (--no-lint)" in proc.stderr


def test_two_eval_hosts_shard_the_prompts_and_merge_with_provenance(sandbox, eval_hosts, tmp_path):
    # The sandbox hosts share one filesystem, so ct129's fixture paths exist on kpro6 too.
    runs = tmp_path / "runs"
    proc = dfo(sandbox, "eval", "--host", "ct129", "--host", "kpro6", "--target", eval_hosts["target"],
               "--drafter", f"zlab={eval_hosts['zlab']}", "--drafter", eval_hosts["random"],
               "--samples", "4", "--max-new-tokens", "32", "--dtype", "float32", "--threads", "1", "--json",
               runs=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(json.loads(proc.stdout)["path"])
    results = json.loads((run_dir / "results.json").read_text())
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 4
    assert sorted(s["host"] for s in samples) == ["ct129", "ct129", "kpro6", "kpro6"]
    assert sorted(s["index"] for s in samples) == [0, 1, 2, 3]
    assert set(results["hosts"]) == {"ct129", "kpro6"}
    assert {h["shard"][0] for h in results["hosts"].values()} == {0, 1}
    assert results["drafters"]["zlab"]["metrics"]["samples"] == 4
    for host in ("ct129", "kpro6"):
        assert (run_dir / "logs" / f"{host}.log").is_file()


def _all_cmdlines(stop, seen: set) -> None:
    """Every process command line on this machine (the sandbox hosts share its /proc) until ``stop``."""
    while not stop.is_set():
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    seen.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" "))
                except OSError:
                    pass
        stop.wait(0.02)


def test_no_secret_in_any_argv_log_results_file_or_message(sandbox, eval_hosts, tmp_path):
    """Inventory `env` (on both hosts: the relay's strip runs on kpro6) and $DFO_REFERENCE_API_KEY reach
    the processes, and nothing else: not a command line, the output, the run folder or the job folders."""
    import threading

    token, key = "inv-secret-5c1f9e", "api-key-93b2d0"
    text = sandbox.inventory_path.read_text()
    text = text.replace("    gpu: false\n", f"    gpu: false\n    env: {{DFO_T_TOKEN: {token}}}\n")
    assert text.count(token) == 2
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(text)
    runs = tmp_path / "runs"
    seen: set = set()
    stop = threading.Event()
    sampler = threading.Thread(target=_all_cmdlines, args=(stop, seen), daemon=True)
    sampler.start()
    try:
        proc = dfo(*eval_args(eval_hosts),
                   inventory=inventory, runs=runs, env={"DFO_REFERENCE_API_KEY": key})
    finally:
        stop.set()
        sampler.join()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(seen) > 10
    for secret in (token.encode(), key.encode()):
        assert not [c for c in seen if secret in c], "a secret appeared in a command line"
        assert secret.decode() not in proc.stdout + proc.stderr
    places = [runs] + [h.workdir / "jobs" for h in sandbox.hosts.values()]
    env_files = []
    for place in places:
        for path in Path(place).rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                if path.name == "env.json":  # the one place they live: the job's private environment file
                    assert path.stat().st_mode & 0o077 == 0
                    env_files.append(data)
                    continue
                assert token.encode() not in data and key.encode() not in data, f"a secret is in {path}"
    assert any(key.encode() in d and token.encode() in d for d in env_files)


def test_an_eval_is_refused_before_it_changes_a_host_whose_gpu_a_running_job_holds(sandbox, eval_hosts, tmp_path):
    """The second eval must not deploy or sync the venv under a running job: it checks the GPU lock
    first (under the host lock) and leaves the payload, the releases and the venv as they were."""
    from orchestrator.jobs.operation import cancel_job

    workdir = sandbox.hosts["ct129"].workdir
    with Connector(load_inventory(sandbox.inventory_path)) as connector:
        running = launch_job(connector, "ct129", ["sleep", "120"], lock="gpu")
        try:
            before = os.readlink(workdir / "payload"), sorted(p.name for p in (workdir / "releases").iterdir())
            changed_payload = tmp_path / "payload"
            shutil.copytree(REPO / "remote_payload", changed_payload / "remote_payload",
                            ignore=shutil.ignore_patterns("__pycache__"))
            (changed_payload / "remote_payload" / "dfo_marker.py").write_text("X = 1\n")
            proc = dfo(sandbox, *eval_args(eval_hosts), runs=tmp_path / "runs", payload=changed_payload)
            assert proc.returncode == 1, proc.stdout + proc.stderr
            assert f"ct129:{running.job_id}" in proc.stderr and "refusing to start a second job" in proc.stderr
            after = os.readlink(workdir / "payload"), sorted(p.name for p in (workdir / "releases").iterdir())
            assert after == before  # nothing was deployed under the running job
        finally:
            cancel_job(connector, "ct129", running.job_id, grace=1)
