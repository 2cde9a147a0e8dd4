"""`check --connect`'s cluster facts against the real sandbox Slurm."""

from __future__ import annotations

from orchestrator.cluster.probe import probe_cluster


def test_probe_reports_version_up_partition_and_a_shared_folder_a_compute_node_sees(login, section):
    facts = probe_cluster(login, section, wait_s=60)
    assert facts.version and facts.version[0].isdigit()
    assert (facts.partition, facts.partition_state, facts.shared_visible) == ("debug", "up", True)
    assert not list((login.slurm.root / "shared").glob(".dfo-probe-*"))  # the token is removed


def test_probe_of_a_down_or_unknown_partition_says_so_without_submitting(login, section):
    down = probe_cluster(login, section.model_copy(update={"partition": "down"}))
    assert down.partition_state == "down" and down.shared_visible is None and "pending" in down.detail
    unknown = probe_cluster(login, section.model_copy(update={"partition": "nosuch"}))
    assert unknown.partition_state is None and "nosuch" in unknown.detail
