"""`dfo deploy` against real sshd hosts: verified uploads, no-op redeploys, compile gate, rollback."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from cli_runner import dfo

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sshd




def make_payload(root: Path, version: str) -> Path:
    pkg = root / "remote_payload"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f'VERSION = "{version}"\n')
    (pkg / "__main__.py").write_text("from . import VERSION\nprint(VERSION)\n")
    (pkg / "data").mkdir(exist_ok=True)
    (pkg / "data" / "blob.bin").write_bytes(os.urandom(50_000))
    return root


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts and p.name != "MANIFEST.json"
    }


def deployed(box, host: str) -> Path:
    return box.hosts[host].workdir / "payload"


def run_payload(box, host: str) -> str:
    workdir = box.hosts[host].workdir
    proc = box.run_ssh(host, f"cd {workdir}/payload && /usr/bin/python3 -m remote_payload")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_deploy_both_hosts_then_noop_then_change_then_rollback(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    payload = make_payload(tmp_path / "src", "v1")

    first = dfo(box, "deploy", "--json", payload=payload)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    for host in ("kpro6", "ct129"):
        assert report["hosts"][host]["status"] == "deployed"
        assert report["hosts"][host]["uploaded_files"] == 3
        assert tree_hashes(deployed(box, host)) == tree_hashes(payload)
        assert run_payload(box, host) == "v1"  # runs from the switched directory on the host itself

    again = json.loads(dfo(box, "deploy", "--json", payload=payload).stdout)
    assert {h["status"] for h in again["hosts"].values()} == {"up-to-date"}
    assert sum(h["uploaded_bytes"] for h in again["hosts"].values()) == 0
    human = dfo(box, "deploy", payload=payload)
    assert "up-to-date" in human.stdout and "0 files, 0 B" in human.stdout

    (payload / "remote_payload" / "__init__.py").write_text('VERSION = "v2"\n')
    second = json.loads(dfo(box, "deploy", "--json", "--host", "ct129", payload=payload).stdout)["hosts"]["ct129"]
    assert second["status"] == "deployed" and second["uploaded_files"] == 1  # only the changed file moved
    assert second["uploaded_bytes"] == len('VERSION = "v2"\n')
    assert run_payload(box, "ct129") == "v2" and run_payload(box, "kpro6") == "v1"

    back = dfo(box, "deploy", "--rollback", "--host", "ct129", payload=payload)
    assert back.returncode == 0, back.stderr
    assert run_payload(box, "ct129") == "v1"


def test_dry_run_changes_nothing(sandbox, tmp_path):
    payload = make_payload(tmp_path / "src", "dry")
    before = {h: sorted(os.listdir(sandbox.hosts[h].workdir)) for h in sandbox.hosts}
    proc = dfo(sandbox, "deploy", "--dry-run", "--json", payload=payload)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["hosts"]
    assert {h["status"] for h in plan.values()} == {"would-deploy"}
    assert "remote_payload/data/blob.bin" in plan["ct129"]["plan"]["changed"]
    assert {h: sorted(os.listdir(sandbox.hosts[h].workdir)) for h in sandbox.hosts} == before


def test_syntax_error_deploys_nothing_anywhere(sandbox, tmp_path):
    payload = make_payload(tmp_path / "src", "bad")
    (payload / "remote_payload" / "broken.py").write_text("def f(:\n    pass\n")
    before = {h: sorted(os.listdir(sandbox.hosts[h].workdir)) for h in sandbox.hosts}
    proc = dfo(sandbox, "deploy", payload=payload)
    assert proc.returncode == 2
    assert "remote_payload/broken.py:1:7:" in proc.stderr and "nothing was deployed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert {h: sorted(os.listdir(sandbox.hosts[h].workdir)) for h in sandbox.hosts} == before


def test_unreachable_host_fails_fast_while_the_other_deploys(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    payload = make_payload(tmp_path / "src", "v1")
    box.stop_host("kpro6")
    proc = dfo(box, "--connect-timeout", "3", "deploy", "--json", payload=payload)
    assert proc.returncode == 1
    hosts = json.loads(proc.stdout)["hosts"]
    assert hosts["kpro6"]["status"] == "failed"
    assert "connection refused" in hosts["kpro6"]["error"] or "cannot connect" in hosts["kpro6"]["error"]
    assert hosts["ct129"]["status"] == "deployed"
    assert tree_hashes(deployed(box, "ct129")) == tree_hashes(payload)


@pytest.mark.netns
def test_silent_host_times_out_within_the_connect_timeout(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    if not box.isolated:
        pytest.skip(f"needs a host whose link can go down: {box.reason}")
    payload = make_payload(tmp_path / "src", "v1")
    box.link_down("kpro6", drop=True)
    proc = dfo(box, "--connect-timeout", "2", "deploy", "--json", payload=payload)
    hosts = json.loads(proc.stdout)["hosts"]
    assert proc.returncode == 1 and hosts["ct129"]["status"] == "deployed"
    assert "within 2s" in hosts["kpro6"]["error"] or "unreachable" in hosts["kpro6"]["error"]


def test_hostile_path_reaches_the_remote_shell_quoted(fresh_sandbox, tmp_path):
    box = fresh_sandbox
    payload = make_payload(tmp_path / "src", "quoted")
    weird = box.hosts["ct129"].root_dir / "we ird'; touch PWNED; $(touch PWNED2) \"dir\""
    proc = dfo(box, "inventory", "set", "ct129.workdir", json.dumps(str(weird)))
    assert proc.returncode == 0, proc.stderr
    proc = dfo(box, "deploy", "--host", "ct129", payload=payload)
    assert proc.returncode == 0, proc.stderr
    assert tree_hashes(weird / "payload") == tree_hashes(payload)
    strays = [p for p in box.root.rglob("PWNED*")] + [p for p in Path.home().glob("PWNED*")]
    assert strays == []
