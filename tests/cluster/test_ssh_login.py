"""The login node reached over real SSH (the sandbox's ct129, in whose namespace the Slurm daemons run)."""

from __future__ import annotations

import json

from cli_runner import dfo

from orchestrator.cluster.operation import follow, login_session, submit, task_records
from orchestrator.cluster.plan import BatchRequest


def test_an_array_submitted_over_ssh_runs_and_is_followed(cluster_connector):
    section = cluster_connector.inventory.host("hpc").slurm
    login = login_session(cluster_connector, "hpc")
    request = BatchRequest("over-ssh", f"{section.shared}/jobs/over-ssh", (0, 1),
                           ("bash", "-c", 'echo "$1" > "$2/result.txt"', "_", "{task}", "{task_dir}"))
    final = follow(login, submit(login, section, request), poll=0.5, max_poll=1, timeout=60)
    assert {s.state for s in final.values()} == {"COMPLETED"}
    assert {r.exit_code for r in task_records(login, request.job_dir, request.tasks).values()} == {0}


def test_inventory_check_connect_reports_the_cluster(cluster_inventory):
    result = dfo("inventory", "check", "--connect", "-H", "hpc", "--json", inventory=cluster_inventory)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)["hosts"]["hpc"]["slurm"]
    assert (facts["partition"], facts["partition_state"], facts["shared_visible"]) == ("debug", "up", True)
    assert facts["version"]
