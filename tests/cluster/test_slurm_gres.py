"""GPUs on the real sandbox Slurm: a node with two count-only GPUs (GRES without hardware) and the inventory's
`slurm.gres` / `slurm.gpus_per_task` submitted through dfo's own path (the login node over SSH, the batch
script rendered there). Slurm's own view decides: which GPU index each task was allocated (`scontrol -d show
job`), the task's environment, which tasks ran at once, and sbatch's refusal of more GPUs than a node has."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.cluster.operation import (
    follow,
    login_session,
    refusal_hint,
    refusal_reason,
    submit,
    task_records,
    task_states,
)
from orchestrator.cluster.plan import BatchRequest
from orchestrator.cluster.probe import partition_gpus, probe_cluster
from orchestrator.cluster.replies import CommandReply
from orchestrator.core.errors import HostError
from orchestrator.core.inventory import load_inventory
from orchestrator.core.slurm_section import SlurmSection
from orchestrator.testing.slurm import SandboxSlurm, cluster_inventory, missing_reason, start_in_sandbox
from orchestrator.transport import Connector

# Each task records the GPUs Slurm gave it, then waits (at most 60 s) for the test's "go" beside the tasks.
WAIT_FOR_GO = ('echo "${SLURM_GPUS_ON_NODE:-none}" > "$1/gpus"; '
               'for i in $(seq 300); do [ -e "$1/../../go" ] && exit 0; sleep 0.2; done; exit 9')


@pytest.fixture(scope="module")
def gpu_slurm(sandbox, tmp_path_factory: pytest.TempPathFactory):
    """A second sandbox Slurm (login node ct129, as the session's) whose node has two GPUs."""
    if reason := missing_reason():
        pytest.skip(reason)
    cluster = start_in_sandbox(sandbox, tmp_path_factory.mktemp("gpu-slurm"), gpus=2)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gpu_inventory(sandbox, gpu_slurm: SandboxSlurm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sandbox's inventory plus cluster hosts on the GPU Slurm (ct129's SSH), one per way to ask GPUs."""
    return cluster_inventory(sandbox, gpu_slurm, tmp_path_factory.mktemp("gpu-inventory") / "inventory.yaml",
                             name="gpu", variants={"gpu-one": "gres: gpu:1", "gpu-per-task": "gpus_per_task: 1",
                                                   "gpu-two": "gres: gpu:2", "gpu-three": "gres: gpu:3"})


@pytest.fixture(scope="module")
def gpu_connector(gpu_inventory: Path):
    with Connector(load_inventory(gpu_inventory)) as connector:
        yield connector


def _request(connector, host: str, tasks=(0, 1)) -> BatchRequest:
    shared = connector.inventory.host(host).slurm.shared
    name = f"gres-{host}-{secrets.token_hex(3)}"
    return BatchRequest(name, f"{shared}/dfo-jobs/{name}", tuple(tasks), ("bash", "-c", WAIT_FOR_GO, "_", "{task_dir}"))


def _wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.3)
    return result


def _allocated_gpus(slurm: SandboxSlurm, array_job_id: str) -> dict[int, str]:
    """Task -> the GPU indices Slurm's controller allocated it (`scontrol -d show job`: GRES=gpu:1(IDX:0))."""
    shown = slurm.shell(f"scontrol -d show job {array_job_id} --oneliner")
    assert shown.ok, shown.err_text
    allocated = {}
    for line in shown.text.splitlines():
        task, gres = re.search(r"ArrayTaskId=(\d+)", line), re.search(r" GRES=gpu:\d+\(IDX:([0-9,-]+)\)", line)
        if task and gres:
            allocated[int(task.group(1))] = gres.group(1)
    return allocated


@pytest.mark.parametrize("host", ["gpu-one", "gpu-per-task"])
def test_one_gpu_tasks_get_a_gpu_each_and_run_at_once_on_the_two_gpu_node(gpu_connector, gpu_slurm, host):
    login = login_session(gpu_connector, host)
    request = _request(gpu_connector, host)
    submitted = submit(login, gpu_connector.inventory.host(host).slurm, request)
    assert ("--gres=gpu:1" if host == "gpu-one" else "--gpus-per-task=1") in submitted.script

    def both_running() -> bool:
        states = task_states(login, submitted.array_job_id)
        return len(states) == 2 and all(s.state == "RUNNING" for s in states.values())

    _wait_for(both_running, "the two one-GPU tasks never ran at once")
    assert sorted(_allocated_gpus(gpu_slurm, submitted.array_job_id).values()) == ["0", "1"]
    Path(request.job_dir, "go").touch()
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=60)
    assert {t: (s.state, s.exit_code) for t, s in final.items()} == {0: ("COMPLETED", 0), 1: ("COMPLETED", 0)}
    for task in (0, 1):  # what the task itself saw: one GPU on its node
        assert Path(request.job_dir, "tasks", str(task), "gpus").read_text() == "1\n"


def test_two_gpu_tasks_of_an_array_run_one_at_a_time(gpu_connector, gpu_slurm):
    login = login_session(gpu_connector, "gpu-two")
    request = _request(gpu_connector, "gpu-two")
    submitted = submit(login, gpu_connector.inventory.host("gpu-two").slurm, request)

    def one_running():
        states = task_states(login, submitted.array_job_id)
        running = [s for s in states.values() if s.state == "RUNNING"]
        return running[0] if len(running) == 1 else None

    first = _wait_for(one_running, "no task started")
    other = 1 - first.task
    for _ in range(6):  # the scheduler runs every second: the node's two CPUs are free, its two GPUs are not
        states = task_states(login, submitted.array_job_id)
        assert states[first.task].state == "RUNNING"
        assert other not in states or states[other].state == "PENDING"
        time.sleep(0.5)
    assert _allocated_gpus(gpu_slurm, submitted.array_job_id)[first.task] == "0-1"
    Path(request.job_dir, "go").touch()
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=60)
    assert {t: (s.state, s.exit_code) for t, s in final.items()} == {0: ("COMPLETED", 0), 1: ("COMPLETED", 0)}
    records = task_records(login, request.job_dir, request.tasks)
    assert records[first.task].finished_at is not None and records[other].started_at is not None
    assert records[other].started_at >= records[first.task].finished_at  # the second waited for the first's GPUs
    assert Path(request.job_dir, "tasks", str(other), "gpus").read_text() == "2\n"


def test_more_gpus_than_the_node_has_are_refused_at_submission_with_slurms_reason(gpu_connector, gpu_slurm):
    login = login_session(gpu_connector, "gpu-three")
    request = _request(gpu_connector, "gpu-three", tasks=(0,))
    with pytest.raises(HostError) as refused:
        submit(login, gpu_connector.inventory.host("gpu-three").slurm, request)
    assert refused.value.message == "gpu-three: sbatch refused the job: Requested node configuration is not available"
    assert refused.value.hint and "--gres=gpu:3" in refused.value.hint and "sinfo" in refused.value.hint
    assert "gres-gpu-three" not in gpu_slurm.shell("squeue -h -o %j").text  # nothing queued


def test_check_connect_reports_the_partitions_gpus_and_sbatchs_refusal_of_the_probe_job(gpu_connector, gpu_inventory):
    facts = probe_cluster(login_session(gpu_connector, "gpu-one"), gpu_connector.inventory.host("gpu-one").slurm,
                          wait_s=60)
    assert (facts.gpus, facts.partition_state, facts.shared_visible) == ("gpu:2", "up", True)
    proc = dfo("inventory", "check", "--connect", "--host", "gpu-three", inventory=gpu_inventory)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("gpu-three:"))
    assert "partition debug up, GPUs per node gpu:2, shared folder not probed" in line
    assert line.endswith("(sbatch refused the probe job: Requested node configuration is not available)")


def test_probe_of_a_partition_without_gpus_says_none(login, section):
    assert probe_cluster(login, section, compute_probe=False).gpus == ""


@pytest.mark.slow
def test_an_eval_asking_more_gpus_than_the_node_has_fails_with_one_clear_line(eval_hosts, gpu_inventory, tmp_path):
    proc = dfo("eval", "--host", "gpu-three", "--target", eval_hosts["target"], "--drafter", eval_hosts["random"],
               "--samples", "2", "--max-new-tokens", "8", "--dtype", "float32", "--threads", "1",
               inventory=gpu_inventory, runs=tmp_path / "runs")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: gpu-three: sbatch refused the job: Requested node configuration is not available"]


def test_sbatchs_refusal_is_its_last_line_without_the_prefixes():
    text = ("sbatch: warning: can't honor --ntasks-per-node set to 2\n"
            "sbatch: error: Batch job submission failed: Requested node configuration is not available\n")
    assert refusal_reason(text) == "Requested node configuration is not available"
    assert refusal_reason("sbatch: error: invalid partition specified: nosuch\n") == \
        "invalid partition specified: nosuch"
    assert refusal_reason("") == "no reason given"
    assert "--gpus-per-task=2" in refusal_hint(SlurmSection(shared="/s", gpus_per_task=2))
    plain = refusal_hint(SlurmSection(shared="/s"))
    assert "partition" in plain and "GPU" not in plain


def test_partition_gpus_keeps_only_gpu_entries_of_sinfos_gres_column():
    assert partition_gpus(CommandReply(0, "gpu:a100:4(S:0-1),mps:400\ngpu:h100:8\ngpu:a100:4(S:0-1)\n", "")) == \
        "gpu:a100:4, gpu:h100:8"
    assert partition_gpus(CommandReply(0, "(null)\n", "")) == ""
    assert partition_gpus(CommandReply(0, "gpu:2;rm -rf /\ngpu:$(id):1\n", "")) == ""  # odd text is no GPU
    assert partition_gpus(CommandReply(1, "", "sinfo: error")) is None
