"""Host keys are verified on both SSH planes; unknown keys need an explicit trust-on-first-use flag."""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_runner import dfo

from orchestrator.core.inventory import load_inventory
from orchestrator.transport.bulk import ssh_argv
from orchestrator.transport.resolve import resolve_host

pytestmark = pytest.mark.sshd




def fingerprint(pub_path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub_path)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def test_changed_host_key_is_refused_with_both_fingerprints(fresh_sandbox):
    box = fresh_sandbox
    old = fingerprint(box.hosts["ct129"].host_key_pub)
    box.regenerate_host_key("ct129")
    new = fingerprint(box.hosts["ct129"].host_key_pub)
    assert old != new

    proc = dfo(box, "inventory", "check", "--connect", "--json")
    assert proc.returncode == 1
    facts = json.loads(proc.stdout)["hosts"]
    assert facts["kpro6"]["reachable"] is True
    err = facts["ct129"]["error"]
    assert "HOST KEY MISMATCH" in err and old in err and new in err and "Refusing" in err
    # Even trust-on-first-use never accepts a changed key.
    proc = dfo(box, "--trust-new-host-keys", "deploy", "--host", "ct129")
    assert proc.returncode == 1 and "HOST KEY MISMATCH" in proc.stdout + proc.stderr

    # The bulk plane (system ssh) is pinned to the same known_hosts and refuses too.
    resolved = resolve_host(load_inventory(box.inventory_path), "ct129")
    bulk = subprocess.run(ssh_argv(resolved, "true"), capture_output=True, text=True, timeout=30)
    assert bulk.returncode != 0 and "host key" in bulk.stderr.lower()


def test_unknown_host_key_needs_the_flag_and_is_then_recorded(fresh_sandbox):
    box = fresh_sandbox
    box.forget_host_key("kpro6")
    assert "kpro6" not in box.known_hosts_path.read_text() or box.hosts["kpro6"].known_hosts_name not in \
        box.known_hosts_path.read_text()

    proc = dfo(box, "inventory", "check", "--connect", "--host", "kpro6", "--json")
    assert proc.returncode == 1
    err = json.loads(proc.stdout)["hosts"]["kpro6"]["error"]
    expected_fp = fingerprint(box.hosts["kpro6"].host_key_pub)
    assert "unknown host key" in err and expected_fp in err

    proc = dfo(box, "--trust-new-host-keys", "inventory", "check", "--connect", "--host", "kpro6")
    assert proc.returncode == 0, proc.stderr
    assert "trusted new host key" in proc.stderr and expected_fp in proc.stderr
    recorded = [line for line in box.known_hosts_path.read_text().splitlines()
                if line.startswith(box.hosts["kpro6"].known_hosts_name + " ")]
    assert len(recorded) == 1
    assert recorded[0].split()[2] == box.hosts["kpro6"].host_key_pub.read_text().split()[1]

    # Recorded keys now work without the flag, on both planes.
    assert dfo(box, "inventory", "check", "--connect", "--host", "kpro6").returncode == 0
    resolved = resolve_host(load_inventory(box.inventory_path), "kpro6")
    assert subprocess.run(ssh_argv(resolved, "true"), capture_output=True, timeout=30).returncode == 0


def test_inventory_check_connect_reports_facts_for_every_host(sandbox):
    proc = dfo(sandbox, "inventory", "check", "--connect", "--json")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)["hosts"]
    assert set(facts) == {"kpro6", "ct129"}
    for name, f in facts.items():
        assert f["reachable"] and f["auth"] == "publickey"
        assert f["python"] and f["python"].startswith("3.")
        assert f["gpus"] == []  # no nvidia-smi here
        assert f["free_disk"][str(sandbox.hosts[name].workdir)] > 0
        assert f["latency_ms"] > 0
    table = dfo(sandbox, "inventory", "check", "--connect")
    assert table.returncode == 0 and "publickey" in table.stdout and "GiB" in table.stdout


def test_wrong_key_is_an_authentication_failure_naming_the_key(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    assert dfo(box, "inventory", "set", "kpro6.identity_file", str(stranger)).returncode == 0
    proc = dfo(box, "inventory", "check", "--connect", "--json")
    facts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 1 and facts["ct129"]["reachable"]
    assert "authentication failed for root@" in facts["kpro6"]["error"]


def test_dns_failure_is_named(monkeypatch):
    import socket

    from orchestrator.core.errors import HostError
    from orchestrator.transport.control import connect
    from orchestrator.transport.resolve import ResolvedHost

    def no_dns(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    host = ResolvedHost(name="ct999", hostname="ct999.example", port=22, user="u", identity_files=(),
                        known_hosts="/dev/null", ssh_config=None, connect_timeout=1)
    with pytest.raises(HostError, match=r"ct999: cannot resolve host name 'ct999.example'"):
        connect(host)
