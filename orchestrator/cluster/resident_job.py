"""`dfo watch --host CLUSTER --resident-job`: the resident eval worker as one long-running Slurm job.

Off by default: between checkpoints the job holds its node's GPUs idle. Asked for, it spares each checkpoint
the task's Python + torch start and the target's load, as the resident worker does on an SSH host, and keeps
that host's record and handover: the worker is a one-task array submitted with the cluster's `slurm:` section
(its folder, inbox and heartbeat in a new 0700 job folder under the host's workdir on the shared filesystem,
cluster/plan.py jobs_root), each checkpoint is relayed to the shared filesystem and handed over by a small
client job on the login node, which writes the request into the worker's inbox and waits for its results (in the
client's job folder: the workdir is on the shared filesystem too). The client cannot see a process on a compute
node, so it is told the worker's Slurm job and judges it by Slurm's state of that job and the heartbeat
(remote_payload/resident.py).

The watcher waits for a queued worker (Slurm's pending reason shown), cancels it with scancel, and replaces one
that was preempted or lost its node, or that hit its time limit or idled out after serving; a worker that
failed, ran out of memory, was cancelled by someone else or ended before it served leaves the watcher to one
array job per checkpoint, as `--shards` alone does.
"""

from __future__ import annotations

import re
import time

from orchestrator.cluster.operation import cancel, login_session, submit, task_states
from orchestrator.cluster.plan import BatchRequest, job_folder, task_dir
from orchestrator.cluster.replies import TaskState
from orchestrator.core.errors import DfoError, InputError
from orchestrator.core.slurm_section import resident_section
from orchestrator.deploy.operation import payload_dir
from orchestrator.evaluation.plan import EvalPlan
from orchestrator.evaluation.runs import Run
from orchestrator.jobs.operation import new_job_id
from orchestrator.relay.strip import Stripper
from orchestrator.watch.resident import Resident, kill_point_env

POLL_S = 2.0
BEFORE = "before it took a checkpoint"
# Ends that are not the worker's doing: another job replaces it. A time limit or an idle exit only after the job
# served a checkpoint (else the limit is shorter than the target's load, and a new job would end the same way);
# running out of memory would recur.
TRANSIENT = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
AFTER_SERVING = frozenset({"TIMEOUT", "DEADLINE", "COMPLETED"})


def check_resident_job(inventory, host: str, shards: int, resident: bool = True) -> None:
    """What `--resident-job` needs before anything connects (pure): a cluster host, one task per eval."""
    if not resident:
        raise InputError("--resident-job and --no-resident ask for opposite things", hint="give one of them")
    if inventory.hosts[host].slurm is None:
        raise InputError(f"--resident-job: {host} is not a Slurm cluster (no slurm: section in {inventory.source})",
                         hint="on an SSH eval host the resident worker is the default (--resident)")
    if shards != 1:
        raise InputError(f"--resident-job with --shards {shards}: one resident job serves the whole eval",
                         hint="drop --shards (one task) or --resident-job (one array of N tasks per checkpoint)")


class ResidentJob(Resident):
    holds_gpu_lock = False  # Slurm places the baselines' and one-off arrays beside it
    handed = 0  # checkpoints handed to the current job by this watcher
    replace_now = False  # the recorded job ended in a way that calls for a new one at once (_after_end)
    worker_dir = "{task_dir}/worker"  # the batch script's placeholder for the task's folder

    def hand_over(self, plan: EvalPlan, stripper: Stripper | None = None) -> Run:
        run = super().hand_over(plan, stripper)
        self.handed += 1
        return run

    def ensure(self, stand_in: EvalPlan) -> bool:
        """As for an SSH host; and a job found ended (idled out, preempted …) when a checkpoint comes is replaced
        at once, not left to an array for that checkpoint."""
        if super().ensure(stand_in):
            return True
        if self.replace_now and self.record is None and not self.disabled:
            self.replace_now = False
            return super().ensure(stand_in)
        return False

    def _task(self) -> TaskState | None:
        """Slurm's view of the worker's task (None when Slurm no longer knows it)."""
        assert self.record is not None
        return task_states(login_session(self.connector, self.record["host"]), self.record["job_id"]).get(0)

    def running(self) -> bool:
        if self.record is None:
            return False
        try:
            state = self._task()
        except DfoError:
            return False
        return state is not None and state.active

    def stop(self) -> None:
        if self.record is None:
            return
        try:
            if self.running():  # an ended job needs no scancel (and would answer with an error)
                cancel(login_session(self.connector, self.record["host"]), self.record["job_id"])
                self.events.info(f"  resident job {self.record['host']}:{self.record['job_id']} cancelled")
        except DfoError as exc:
            self.events.warn(f"could not cancel the resident job {self.record['job_id']}: {exc.message}")
        self._forget()

    def _start(self, plan: EvalPlan, host: str, python: str, key: str, args: list[str]) -> bool:
        self._upload_inputs(plan)
        cluster = self.connector.inventory.hosts[host].slurm
        assert cluster is not None  # check_resident_job: a cluster host
        section = resident_section(cluster)
        workdir = self.connector.inventory.hosts[host].workdir
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"dfo-worker-{self.folder.name}")[:48]
        job_dir = job_folder(workdir, f"{name}-{new_job_id()}")[1]  # a new folder per worker job
        request = BatchRequest(name, job_dir, (0,), (python, "-m", "remote_payload", *args),
                               kill_point_env("worker-"), payload_dir(self.connector.inventory.hosts[host].workdir))
        submitted = submit(login_session(self.connector, host), section, request)
        self.handed = 0
        self._keep({"host": host, "job_id": submitted.array_job_id, "job_dir": task_dir(job_dir, 0), "key": key,
                    "python": python, "slurm_job": f"{submitted.array_job_id}_0"})
        self.events.step(f"resident eval job {host}:{submitted.array_job_id} submitted (target, references and "
                         f"features loaded once; stops after {self.idle:g}s without a checkpoint)", tag="watch")
        return True

    def _usable(self) -> bool:
        """Wait while the worker's job is queued (telling its reason); False when it ended meanwhile."""
        assert self.record is not None
        said = None
        while True:
            try:
                state = self._task()
            except DfoError as exc:
                self.events.warn(f"resident job {self.record['job_id']}: {exc.message}; one array job this time")
                return False
            if state is None or not state.active:
                self._after_end(state, BEFORE, served=self.handed > 0)
                return False
            if state.state != "PENDING":
                return True
            if state.reason != said:  # Slurm's reason is "None" until the scheduler has looked at the job
                why = f" ({state.reason})" if state.reason not in ("", "None") else ""
                self.events.info(f"  resident job {self.record['job_id']} pending{why}")
                said = state.reason
            time.sleep(POLL_S)

    def _handover_extra(self) -> list[str]:
        assert self.record is not None
        return ["--slurm-job", self.record.get("slurm_job") or f"{self.record['job_id']}_0"]

    def fell_through(self, why: str) -> None:
        """The worker stopped under a handover: replaced at the next checkpoint when the scheduler ended it or it
        idled out; else (it failed, or still runs but took nothing: cancelled) one array job per checkpoint."""
        if self.record is None:  # nothing recorded to ask Slurm about (a run reattached after its record went)
            super().fell_through(why)
            return
        try:
            state = self._task()
        except DfoError:
            state = None
        if state is not None and state.active:
            self.stop()  # alive to Slurm but not serving: it must not hold its GPUs
            super().fell_through(f"{why}; its job still ran ({state.state}) and is cancelled")
            return
        self._after_end(state, "under a handover", served=self.handed > 1)  # the last handover is this one

    def _after_end(self, state: TaskState | None, when: str, *, served: bool) -> None:
        assert self.record is not None
        job = self.record["job_id"]
        what = state.state + (f" on {state.node}" if state.node else "") if state else "no longer known to Slurm"
        if state is None or state.state in TRANSIENT or (served and state.state in AFTER_SERVING):
            self.replace_now = when == BEFORE  # under a handover, that checkpoint goes to an array
            self.events.warn(f"resident job {job} ended {when} ({what}); a new one is submitted for " +
                             ("this checkpoint" if self.replace_now else "the next checkpoint"))
        else:
            self.disabled = f"resident job {job} {what}"
            hint = ("; give slurm.resident_time_limit more than the target's load" if state.state in AFTER_SERVING
                    else "")
            self.events.warn(f"resident job {job} ended {when} ({what}){hint}; one array job per checkpoint from "
                             f"now on (its log: {self.record['job_dir']}/slurm.log)")
        self._forget()
