"""The executor protocol: what `dfo eval`, `dfo runs pull` and `dfo watch` ask of the place a job runs.

An executor submits a prepared eval step (the payload's argv, sharded in as many parts as the place runs),
follows it, reattaches to it later (`dfo runs pull`), resumes the parts without complete results, cancels it,
and collects the parts (pulled, hash-verified) into the run folder, where the eval merges and reports them
(``finish``: the eval's own step, passed in so that the place never imports the eval). A place may offer a
resident worker to `dfo watch`. A job's record in run.json (``run.record["jobs"][HOST]``) is the executor's:
``owns`` tells whose it is when a run is picked up again.

Adding a place: one module beside ``ssh.py`` and ``slurm.py`` with an object following ``Executor``, and one line
in ``registry.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

from orchestrator.core.events import Events

# The eval's last step over the collected parts: (run, parts, part_jobs, jobs, events) -> run (merged, reported).
Finish = Callable[[Any, dict[str, Path], dict[str, dict], dict, Events], Any]


class Detached(Exception):
    """Following was interrupted on purpose (Ctrl-C); the remote jobs keep running."""

    def __init__(self, run: Any):
        super().__init__(run.name)
        self.run = run


def reattach_hint(run: Any) -> str:
    jobs = " / ".join(f"dfo jobs logs {h}:{j['job_id']} -f" for h, j in run.record.get("jobs", {}).items())
    return f"the remote job keeps running; follow it with `{jobs}` and collect the results with " \
           f"`dfo runs pull {run.name}`"


class Executor(Protocol):
    """One place to run an eval's payload (and a watch's resident worker)."""

    name: str

    def runs_on(self, inv_host: Any) -> bool:
        """This place runs the jobs of inventory host INV_HOST."""

    def owns(self, job: dict) -> bool:
        """JOB (a run's job record) was submitted by this place."""

    def submit(self, connector: Any, job: Any, run_name: str, argv: list[str], *, shards: int,
               env: dict[str, str], events: Events, force: bool) -> dict:
        """Start ARGV (the payload's eval, prepared on the plan's JOB.host for its JOB.shard) as SHARDS parts;
        the job record for run.json."""

    def follow_and_collect(self, connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
        """Follow every job of RUN to its end, collect the parts and FINISH the run. Raises Detached on Ctrl-C."""

    def reattach(self, connector: Any, run: Any, *, events: Events, finish: Finish) -> Any:
        """`dfo runs pull RUN`: collect what finished, follow what still runs."""

    def resume(self, connector: Any, run: Any, *, events: Events) -> None:
        """`dfo runs pull RUN --resume`: submit again the parts without complete results."""

    def cancel(self, connector: Any, host: str, job: dict) -> None:
        """Cancel JOB (every part of it)."""

    def part_facts(self, part_job: dict) -> dict:
        """What results.json's ``hosts[PART]`` records of the place beside the part's own figures."""

    def resident_worker(self, connector: Any, cfg: Any, folder: Path, events: Events) -> Any | None:
        """The resident eval worker `dfo watch` hands checkpoints to here (None: one-off evals)."""

    def open_watch(self, connector: Any, cfg: Any, folder: Path, events: Events) -> None:
        """A watcher starts on this place: settle what an earlier watcher of the series left."""
