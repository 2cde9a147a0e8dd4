"""A Slurm cluster's arrays (orchestrator/cluster/): an inventory host with a ``slurm:`` section runs an eval as one
array, one task per shard, through its login node; `dfo watch --resident-job` keeps the resident worker as one
Slurm job. A thin adapter: the work is cluster/eval_run.py's and cluster/resident_job.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.core.events import Events
from orchestrator.executors.base import Finish


class SlurmExecutor:
    name = "slurm"

    def runs_on(self, inv_host: Any) -> bool:
        return getattr(inv_host, "slurm", None) is not None

    def owns(self, job: dict) -> bool:
        return "slurm" in job

    def submit(self, connector: Any, job: Any, run_name: str, argv: list[str], *, shards: int,
               env: dict[str, str], events: Events, force: bool) -> dict:
        from orchestrator.cluster.eval_run import submit_cluster_eval

        return submit_cluster_eval(connector, job.host, run_name, argv, shards, env, events)

    def follow_and_collect(self, connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
        from orchestrator.cluster.eval_run import follow_and_collect_cluster

        return follow_and_collect_cluster(connector, run, events=events, finish=finish)

    def reattach(self, connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
        return self.follow_and_collect(connector, run, events=events, finish=finish)

    def resume(self, connector: Any, run: Any, *, events: Events) -> None:
        from orchestrator.cluster.eval_run import resume_cluster_run

        resume_cluster_run(connector, run, events)

    def cancel(self, connector: Any, host: str, job: dict) -> None:
        from orchestrator.cluster.eval_run import cancel_eval

        cancel_eval(connector, host, job)

    def part_facts(self, part_job: dict) -> dict:
        # a task: its Slurm job id, node, state and exit code
        return {"slurm": part_job["slurm"]} if part_job.get("slurm") else {}

    def resident_worker(self, connector: Any, cfg: Any, folder: Path, events: Events) -> Any | None:
        if not cfg.resident_job:
            return None
        from orchestrator.cluster.resident_job import ResidentJob

        return ResidentJob(connector, folder, cfg.runs_dir, events, idle=cfg.idle_exit, prompts_file=cfg.prompts_file)

    def open_watch(self, connector: Any, cfg: Any, folder: Path, events: Events) -> None:
        if cfg.shards is not None and not cfg.resident_job:  # a resident job an earlier watcher asked for: not now
            from orchestrator.cluster.resident_job import ResidentJob

            ResidentJob(connector, folder, cfg.runs_dir, events, idle=cfg.idle_exit).stop()
