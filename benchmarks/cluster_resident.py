"""What `dfo watch --resident-job` saves per checkpoint on a Slurm cluster: the same checkpoints evaluated as one
one-task array each (each task pays Python, torch and the target's load) and handed to one resident worker job
(the payload's `eval-worker` as a Slurm job, each checkpoint handed over by `eval-handover`, which judges the
worker by Slurm's state of its job), on the sandbox Slurm with the fixture target and z-lab drafter.

Only the cluster part: no SSH, relay or pull (those are the same either way). Needs root and slurm-wlm/munge.
    .venv/bin/python benchmarks/cluster_resident.py [--checkpoints 4] [--samples 4] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.cluster.operation import cancel, follow, submit
from orchestrator.cluster.plan import BatchRequest, task_dir
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm, missing_reason

REPO = Path(__file__).resolve().parents[1]


def _eval_options(fixtures: Path, samples: int, tokens: int) -> list[str]:
    return ["--target", str(fixtures / "target"), "--prompts", "builtin", "--samples", str(samples),
            "--max-new-tokens", str(tokens), "--no-enable-thinking", "--device", "auto", "--dtype", "float32",
            "--seed", "0", "--threads", "1"]


def _digests(folder: Path) -> list[str]:
    return [f"{p.relative_to(folder)}={hashlib.sha256(p.read_bytes()).hexdigest()}"
            for p in sorted(folder.rglob("*")) if p.is_file()]


def one_off(login, section: SlurmSection, options: list[str], drafter: Path, n: int) -> list[float]:
    """Seconds from submission to the end of a one-task array per checkpoint."""
    seconds = []
    for i in range(n):
        name = f"oneoff{i}"
        request = BatchRequest(name, f"{section.shared}/jobs/{name}", (0,),
                               (sys.executable, "-m", "remote_payload", "eval", *options, "--drafter",
                                f"ckpt{i}={drafter}", "--out", "{task_dir}/results"), cwd=str(REPO))
        started = time.perf_counter()
        final = follow(login, submit(login, section, request), poll=0.1, max_poll=0.2, timeout=600)
        seconds.append(time.perf_counter() - started)
        assert final[0].exit_code == 0, f"one-off task {i}: {final[0]}"
    return seconds


def resident(login, slurm: SandboxSlurm, section: SlurmSection, options: list[str], drafter: Path, n: int,
             root: Path) -> tuple[float, list[float]]:
    """Seconds from the worker job's submission to its first checkpoint's results, and per later checkpoint."""
    jobs = root / "handover-jobs"
    jobs.mkdir()
    job_dir = f"{section.shared}/jobs/resident"
    request = BatchRequest("resident", job_dir, (0,),
                           (sys.executable, "-m", "remote_payload", "eval-worker", *options, "--worker-dir",
                            "{task_dir}/worker", "--drafter-root", str(drafter.parent), "--jobs-root", str(jobs),
                            "--idle-exit", "120"), cwd=str(REPO))
    started = time.perf_counter()
    submitted = submit(login, section, request)
    worker = Path(task_dir(job_dir, 0), "worker")
    seconds = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            folder = jobs / f"handover{i}"
            folder.mkdir()
            argv = [sys.executable, "-m", "remote_payload", "eval-handover", "--worker-dir", str(worker),
                    "--drafter", f"ckpt{i}={drafter}", "--slurm-job", f"{submitted.array_job_id}_0"]
            for digest in _digests(drafter):
                argv += ["--sha256", digest]
            done = subprocess.run(argv, cwd=REPO, env={**slurm.env, "DFO_JOB_DIR": str(folder)},
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0 or not (folder / "results" / "results.json").is_file():
                log = Path(task_dir(job_dir, 0), "slurm.log")
                sys.exit(f"handover {i} failed: {done.stderr[-1500:]}\nworker log:\n"
                         + (log.read_text()[-3000:] if log.is_file() else "(none)"))
            seconds.append(time.perf_counter() - (started if i == 0 else t0))
    finally:
        cancel(login, submitted.array_job_id)
    return seconds[0], seconds[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    if reason := missing_reason():
        sys.exit(f"cluster_resident: {reason}")
    from remote_payload.fixtures import build

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fixtures = root / "fixtures"
        build.build(fixtures, ["target", "zlab-drafter"])
        drafter = fixtures / "relayed" / "zlab-drafter"
        drafter.parent.mkdir()
        os.replace(fixtures / "zlab-drafter", drafter)
        slurm = SandboxSlurm(root / "slurm").start()
        try:
            login = LocalLoginSession(slurm)
            section = SlurmSection(shared=str(slurm.root / "shared"), partition="debug", time_limit="10")
            options = _eval_options(fixtures, args.samples, args.max_new_tokens)
            arrays = one_off(login, section, options, drafter, args.checkpoints)
            first, later = resident(login, slurm, section, options, drafter, args.checkpoints, root)
        finally:
            slurm.stop()
    print(f"sandbox Slurm, {args.checkpoints} checkpoints ({args.samples} prompts, {args.max_new_tokens} new tokens, "
          "fixture target and z-lab drafter, 1 thread):")
    print(f"  one-task array per checkpoint:   median {statistics.median(arrays):.1f} s per checkpoint "
          f"(min {min(arrays):.1f}, max {max(arrays):.1f})")
    print(f"  resident job, first checkpoint:  {first:.1f} s (its submission, start and the target's load included)")
    print(f"  resident job, later checkpoints: median {statistics.median(later):.1f} s per checkpoint "
          f"(min {min(later):.1f}, max {max(later):.1f})")
    print(f"  later checkpoints: resident / array = {statistics.median(later) / statistics.median(arrays):.2f}")


if __name__ == "__main__":
    main()
