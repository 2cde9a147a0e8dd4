"""The batch script and the slurm: inventory section (pure: no cluster involved)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.cluster.plan import BatchRequest, array_spec, batch_script
from orchestrator.cluster.replies import parse_job_id, parse_sacct, parse_scontrol, parse_squeue
from orchestrator.core.errors import HostError, InputError
from orchestrator.core.inventory import load_inventory
from orchestrator.core.slurm_section import SlurmSection

SECTION = SlurmSection(shared="/shared/team", partition="gpu", account="lab", qos="normal", time_limit="2:00:00",
                       gres="gpu:h100:1", cpus_per_task=8, mem="64G", extra_sbatch=["--constraint=h100"])


def test_array_spec_groups_consecutive_tasks_and_throttles():
    assert array_spec((0, 1, 2, 3)) == "0-3"
    assert array_spec((3, 0, 1, 7)) == "0-1,3,7"
    assert array_spec((0, 1), max_parallel=1) == "0-1%1"
    with pytest.raises(InputError):
        array_spec(())


def test_batch_script_carries_the_section_and_quotes_the_command():
    request = BatchRequest("dfo-eval-r1", "/shared/team/dfo/jobs/r1", (0, 1),
                           ("/shared/team/dfo/venv/bin/python", "-m", "remote_payload", "eval",
                            "--out", "{task_dir}/result.json", "--shard", "{task}/2", "--note", "a b;$(id)"))
    script = batch_script(SECTION, request)
    for line in ("#SBATCH --array=0-1", "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --qos=normal",
                 "#SBATCH --time=2:00:00", "#SBATCH --gres=gpu:h100:1", "#SBATCH --cpus-per-task=8",
                 "#SBATCH --mem=64G", "#SBATCH --constraint=h100",
                 "#SBATCH --output=/shared/team/dfo/jobs/r1/tasks/%a/slurm.log"):
        assert line in script.splitlines()
    assert "'a b;$(id)'" in script  # data, not shell
    assert "\"$task_dir\"/result.json" in script.replace("'", "")
    subprocess.run(["bash", "-n"], input=script.encode(), check=True)  # bash parses it


def test_batch_script_refuses_a_folder_outside_shared_and_bad_names():
    with pytest.raises(InputError, match="inside slurm.shared"):
        batch_script(SECTION, BatchRequest("x", "/tmp/elsewhere", (0,), ("true",)))
    with pytest.raises(InputError, match="job name"):
        batch_script(SECTION, BatchRequest("-x;id", "/shared/team/j", (0,), ("true",)))


@pytest.mark.parametrize("field,value,message", [
    ("partition", "gpu;id", "Slurm name"),
    ("time_limit", "2 hours", "time limit"),
    ("mem", "64 GB", "memory size"),
    ("gres", "gpu:1 --wrap=id", "generic resource"),
    ("extra_sbatch", ["--output=/tmp/x"], "dfo sets --output"),
    # sbatch takes any unambiguous abbreviation of a long option: each one of dfo's own is refused too.
    ("extra_sbatch", ["--outp=/tmp/x"], r"dfo sets --output itself \(sbatch takes an unambiguous abbreviation"),
    ("extra_sbatch", ["--chd=/tmp"], "dfo sets --chdir itself"),
    ("extra_sbatch", ["--wra=id"], "dfo sets --wrap itself"),
    ("extra_sbatch", ["--arr=0-99"], "dfo sets --array itself"),
    ("extra_sbatch", ["--comment=a b"], "--option=value"),
    ("cpus_per_task", 0, "greater than or equal"),
])
def test_inventory_slurm_section_rejects_unsafe_values(tmp_path: Path, field, value, message):
    path = tmp_path / "inventory.yaml"
    rendered = value if isinstance(value, (int, list)) else shlex.quote(value)
    path.write_text("hosts:\n  cluster:\n    address: login1\n    workdir: /shared/dfo\n    slurm:\n"
                    f"      shared: /shared\n      {field}: {rendered}\n")
    with pytest.raises(InputError, match=message) as err:
        load_inventory(path)
    assert f"hosts.cluster.slurm.{field}" in err.value.message and ":7" in err.value.message


def test_inventory_workdir_must_lie_on_the_shared_filesystem(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  cluster:\n    address: login1\n    workdir: /home/me/dfo\n    slurm:\n"
                    "      shared: /shared\n")
    with pytest.raises(InputError, match="not inside slurm.shared"):
        load_inventory(path)
    path.write_text(path.read_text().replace("/home/me/dfo", "/shared/dfo"))
    assert load_inventory(path).host("cluster").slurm.shared == "/shared"


def test_replies_are_typed_and_hostile_text_is_refused():
    assert parse_job_id("c", "1234;cluster\n") == "1234"
    with pytest.raises(HostError):
        parse_job_id("c", "Submitted batch job 12")
    queued = parse_squeue("c", "7", "8|8|1|7|PENDING|PartitionDown|\n9|9|0|7|RUNNING|None|node1\n")
    assert queued[1].state == "PENDING" and queued[1].reason == "PartitionDown"
    assert queued[0].node == "node1" and queued[0].active
    with pytest.raises(HostError, match="unknown job state"):
        parse_squeue("c", "7", "8|8|1|7|$(reboot)|None|node1\n")
    shown = parse_scontrol("c", "7", "JobId=8 ArrayJobId=7 ArrayTaskId=1 JobState=TIMEOUT Reason=TimeLimit "
                                     "ExitCode=0:15 NodeList=node1\n")
    assert shown[1].killed_by_scheduler and shown[1].signal == 15 and not shown[1].active
    with pytest.raises(HostError, match="exit code"):
        parse_scontrol("c", "7", "JobId=8 ArrayJobId=7 ArrayTaskId=1 JobState=FAILED ExitCode=999999:0\n")


def test_accounting_replies_are_typed_and_a_malformed_line_is_refused():
    # accounting names a task ARRAY_TASK; the completion log by its own job id (mapped through the tasks' record);
    # the pending remainder and other jobs are skipped, blank lines too
    text = ("7_0|9|COMPLETED|0:0|node1\n7_[2-3]|7|PENDING|0:0|None assigned\n\n6_0|5|FAILED|1:0|node2\n"
            "8|8|CANCELLED by 0|0:9|(null)\n")
    done = parse_sacct("c", "7", text, {"8": 1})
    assert sorted(done) == [0, 1] and done[0].state == "COMPLETED" and done[0].node == "node1"
    assert done[1].job_id == "8" and done[1].state == "CANCELLED" and done[1].signal == 9 and done[1].node == ""
    with pytest.raises(HostError, match=r"sacct line with 4 fields, expected 5: '7_0\|9\|COMPLETED\|0:0'"):
        parse_sacct("c", "7", "7_0|9|COMPLETED|0:0\n", {})
    with pytest.raises(HostError, match=r"squeue line with 8 fields, expected 7"):
        parse_squeue("c", "7", "9|9|0|7|RUNNING|None|node1\n8|8|1|7|RUNNING|None|node1|extra\n")
    assert parse_squeue("c", "7", "\n  \n") == {} and parse_scontrol("c", "7", "") == {}


def _cluster_inventory(tmp_path: Path, checkpoints: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  hpc:\n    address: login1\n    workdir: /shared/dfo\n"
                    f"    paths:\n      checkpoints: {checkpoints}\n    slurm:\n      shared: /shared\n"
                    "  box:\n    address: box1\n    workdir: /srv/dfo\n")
    return path


def test_watch_on_a_cluster_needs_its_relay_folder_on_the_shared_filesystem(tmp_path: Path):
    from orchestrator.cluster.watch_step import cluster_shards
    from orchestrator.evaluation.plan import EvalRequest

    request = EvalRequest(hosts=["hpc"], target="/shared/models/t", drafters=[], samples=8)
    inv = load_inventory(_cluster_inventory(tmp_path, "/shared/ckpts"))
    assert cluster_shards(inv, "hpc", 2, request, None) == 2
    assert cluster_shards(inv, "box", 1, request, None) is None
    with pytest.raises(InputError, match="box is not a Slurm cluster"):
        cluster_shards(inv, "box", 2, request, None)
    with pytest.raises(InputError, match="more than the 8 prompt"):
        cluster_shards(inv, "hpc", 9, request, None)
    outside = load_inventory(_cluster_inventory(tmp_path, "/home/me/ckpts"))
    with pytest.raises(InputError, match="would not reach the compute nodes"):
        cluster_shards(outside, "hpc", 2, request, None)


def test_an_engine_eval_on_a_cluster_runs_one_engine_per_task_with_no_port_or_key_in_the_batch_script(
        tmp_path: Path):
    from cli_runner import dfo

    path = _cluster_inventory(tmp_path, "/shared/ckpts")
    proc = dfo("eval", "--host", "hpc", "--shards", "2", "--target", "/shared/models/t", "--drafter",
               "z=/shared/models/d", "--engine", "vllm", "--dry-run", inventory=path, runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout[proc.stdout.index("#!/bin/bash"):]
    assert "--engine vllm --engine-python /shared/dfo/engines/vllm/bin/python" in script
    assert "each task starts its own engine server on its compute node's loopback" in proc.stdout
    for secret_or_port in ("API_KEY", "api-key", "api_key", "--port"):  # both are chosen inside each task
        assert secret_or_port not in script


def test_an_engine_venv_the_compute_nodes_cannot_see_is_refused_before_anything_connects(tmp_path: Path):
    from cli_runner import dfo

    path = _cluster_inventory(tmp_path, "/shared/ckpts")
    path.write_text(path.read_text().replace("      checkpoints: /shared/ckpts\n",
                                             "      checkpoints: /shared/ckpts\n      engine_venv: /home/me/vllm\n"))
    proc = dfo("eval", "--host", "hpc", "--shards", "2", "--target", "/shared/models/t", "--drafter",
               "z=/shared/models/d", "--engine", "vllm", "--dry-run", inventory=path, runs=tmp_path / "runs")
    assert proc.returncode == 2 and "engine venv /home/me/vllm is not inside slurm.shared" in proc.stderr


def test_job_ids_are_digits_on_the_login_node_too_and_no_hidden_newline_passes():
    import importlib.util

    import orchestrator.cluster as cluster

    # host_script.py as the login node runs it (stdlib only), checking what the controller sends it
    spec = importlib.util.spec_from_file_location("cluster_host_script", Path(cluster.__file__).with_name(
        "host_script.py"))
    assert spec is not None and spec.loader is not None
    host = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host)
    assert host._job_id("1234") == "1234"
    for bad in ("1234\n", "12 34", "-1", "1234;id", ""):
        with pytest.raises(RuntimeError, match="must be digits"):
            host._job_id(bad)
        with pytest.raises(RuntimeError, match="must be digits"):
            host.states(bad)
    with pytest.raises(RuntimeError, match="scancel target"):
        host.cancel("1234_0\n")


@pytest.mark.parametrize("shared", ["/shared/a --qos=high", "/shared/'x'", "/shared/a\tb", "/shared/%u"])
def test_the_shared_folder_cannot_add_sbatch_options(shared):
    """The shared folder is written into #SBATCH --output/--chdir lines, which sbatch splits at spaces."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="letters, digits"):
        SlurmSection(shared=shared)
    with pytest.raises(InputError, match="letters, digits"):
        batch_script(SECTION, BatchRequest("x", "/shared/team/j --qos=high", (0,), ("true",)))
