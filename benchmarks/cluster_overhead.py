"""What Slurm adds per task on the sandbox cluster: submission to task start, task start to its first result.

Runs the same tiny task (write one result file) as a two-task array on the sandbox Slurm and directly in a
shell on this machine, and prints both. Needs root and slurm-wlm/munge (scripts/setup.sh installs them).
    .venv/bin/python benchmarks/cluster_overhead.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from orchestrator.cluster.operation import follow, submit
from orchestrator.cluster.plan import BatchRequest
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import LocalLoginSession, SandboxSlurm, missing_reason

TASK = 'date +%s.%N > "$1/result.txt"'


def main(rounds: int = 3) -> None:
    if reason := missing_reason():
        sys.exit(f"cluster_overhead: {reason}")
    with tempfile.TemporaryDirectory() as tmp:
        slurm = SandboxSlurm(Path(tmp)).start()
        try:
            login = LocalLoginSession(slurm)
            section = SlurmSection(shared=str(slurm.root / "shared"), partition="debug", time_limit="1")
            to_start, to_result = [], []
            for n in range(rounds):
                request = BatchRequest(f"bench{n}", f"{section.shared}/jobs/bench{n}", (0, 1),
                                       ("bash", "-c", TASK, "_", "{task_dir}"))
                submitted_at = time.time()
                follow(login, submit(login, section, request), poll=0.1, timeout=60)
                for task in request.tasks:
                    folder = Path(request.job_dir, "tasks", str(task))
                    started = json.loads((folder / "started.json").read_text())["started"]
                    to_start.append(started - submitted_at)
                    to_result.append(float((folder / "result.txt").read_text()) - started)
        finally:
            slurm.stop()
        direct = []
        for _ in range(rounds * 2):
            before = time.time()
            out = subprocess.run(["bash", "-c", "date +%s.%N"], capture_output=True, text=True).stdout
            direct.append(float(out) - before)
    print(f"sandbox Slurm, {len(to_start)} tasks: submission -> task start  median {statistics.median(to_start):.2f} s "
          f"(max {max(to_start):.2f})")
    print(f"                          task start -> first result median {statistics.median(to_result) * 1000:.0f} ms")
    print(f"one host, no scheduler:   start -> first result      median {statistics.median(direct) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
