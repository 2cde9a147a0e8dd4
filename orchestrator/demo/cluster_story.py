"""`dfo demo --cluster slurm`: the demo's eval as a two-task Slurm array on a sandbox cluster.

A real Slurm (munged, slurmctld, slurmd; orchestrator/testing/slurm.py) starts beside the sandbox hosts, with
ct129 as its login node: inventory host ``hpc`` is ct129's SSH and workdir with a ``slurm:`` section. The
demo's eval runs there as ``dfo eval --host hpc --shards 2`` (one array job, merged as SSH shards are), then
the same eval on ct129 alone; the demo prints the merged run's τ table, says whether it equals the single
host's, and lists each task's Slurm job id, node, state and timings from the run record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.core.events import Events
from orchestrator.core.host_text import fmt_number
from orchestrator.evaluation.operation import follow_and_collect, start_eval
from orchestrator.evaluation.plan import EvalRequest, plan_eval
from orchestrator.evaluation.report import drafter_rows
from orchestrator.evaluation.runs import Run
from orchestrator.testing.slurm import SandboxSlurm, cluster_inventory, start_in_sandbox

CLUSTERS = ("slurm",)
CLUSTER_HOST = "hpc"
CLUSTER_SHARDS = 2
# drafter_rows' fields that are measured time, not the eval's outcome: they differ between any two runs.
TIMING_FIELDS = frozenset({"eval_s"})


@dataclass
class ClusterRuns:
    merged: Run   # the array's tasks, merged
    single: Run   # the same eval on ct129 alone

    def lines(self) -> list[str]:
        return same_table_lines(self.merged.results(), self.single.results()) + task_lines(self.merged.record)


def start_cluster(box: Any, root: Path, events: Events) -> tuple[SandboxSlurm, Path]:
    """The sandbox Slurm with ct129 as login node, and the inventory that adds cluster host ``hpc``."""
    events.step(tag="demo", text="start a sandbox Slurm (munged, slurmctld, slurmd node1; ct129 is its login node)")
    slurm = start_in_sandbox(box, root / "slurm")
    events.info(f"  SLURM_CONF={slurm.conf}; partition debug up on node1")
    return slurm, cluster_inventory(box, slurm, root / "cluster-inventory.yaml", name=CLUSTER_HOST)


def cluster_evals(connector: Any, request: EvalRequest, inv: Any, runs_dir: Path, events: Events) -> ClusterRuns:
    """REQUEST as a CLUSTER_SHARDS-task array on ``hpc``, then on ct129 alone (the comparison)."""
    on_cluster = replace(request, hosts=[CLUSTER_HOST])
    events.step(tag="demo", text=f"dfo eval --host {CLUSTER_HOST} --shards {CLUSTER_SHARDS} (one sbatch --array, "
                "one task per shard, followed with squeue/scontrol)")
    merged = start_eval(connector, plan_eval(on_cluster, inv), runs_dir=runs_dir, events=events,
                        shards=CLUSTER_SHARDS)
    follow_and_collect(connector, merged, events=events)
    events.step(tag="demo", text="the same eval on ct129 alone, to compare")
    single = start_eval(connector, plan_eval(request, inv), runs_dir=runs_dir, events=events)
    follow_and_collect(connector, single, events=events)
    return ClusterRuns(merged, single)


def tau_table(results: dict) -> list[dict]:
    """The rows of the run's τ table without the measured times (pure)."""
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in drafter_rows(results)]


def same_table_lines(merged: dict, single: dict) -> list[str]:
    """Whether the merged array's τ table equals the single host's, and where not (pure)."""
    ours, theirs = tau_table(merged), tau_table(single)
    if ours == theirs:
        return [f"τ table of the {CLUSTER_SHARDS}-task array (merged) = ct129 alone on the same prompts: identical "
                f"({len(ours)} drafters)"]
    lines = [f"τ table of the {CLUSTER_SHARDS}-task array (merged) differs from ct129 alone:"]
    by_name = {row["drafter"]: row for row in theirs}
    for row in ours:
        other = by_name.get(row["drafter"], {})
        diff = [k for k in row if row[k] != other.get(k)]
        if diff:
            lines.append(f"  {row['drafter']}: " + ", ".join(f"{k} {row[k]} vs {other.get(k)}" for k in diff))
    return lines


def task_lines(record: dict) -> list[str]:
    """Each array task as the run recorded it: Slurm job id, node, state, exit code, queue wait and run time."""
    lines = []
    for host, job in sorted((record.get("jobs") or {}).items()):
        slurm = job.get("slurm") if isinstance(job, dict) else None
        if not isinstance(slurm, dict):
            continue
        lines.append(f"{host}: array job {slurm.get('array_job_id')}, folder {slurm.get('job_dir')}")
        for task, t in sorted((slurm.get("tasks") or {}).items(), key=lambda kv: int(kv[0])):
            ran = (t["finished_at"] - t["started_at"]) if t.get("finished_at") and t.get("started_at") else None
            lines.append(f"  task {task}: job {t.get('job_id')} on {t.get('node')}, {t.get('state')}, exit "
                         f"{t.get('exit_code')}; queued {fmt_number(t.get('queued_s'), '.2f')} s, ran "
                         f"{fmt_number(ran, '.1f')} s")
    return lines
