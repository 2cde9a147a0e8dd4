"""The per-host lock around deploy, provision and job launch, and releases a running job uses."""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import dfo_process
from waiting import wait_for

from orchestrator.core.inventory import load_inventory
from orchestrator.deploy.operation import deploy
from orchestrator.jobs.operation import cancel_job, launch_job
from orchestrator.transport import Connector
from orchestrator.transport.hostlock import HostLocked, host_lock

pytestmark = pytest.mark.sshd
HOST = "ct129"


def _payload(root: Path, version: str) -> Path:
    pkg = root / "remote_payload"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(f'VERSION = "{version}"\n')
    (pkg / "__main__.py").write_text("import time\nfrom . import VERSION\nprint(VERSION, flush=True)\ntime.sleep(60)\n")
    return root


def _lock_file(box) -> Path:
    return box.hosts[HOST].workdir / "locks" / "host.lock"


def test_a_second_dfo_is_refused_while_one_holds_the_host(sandbox, tmp_path):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        with host_lock(conn, HOST, "deploy"):
            holder = json.loads(_lock_file(sandbox).read_text())
            assert holder["op"] == "deploy"
            for args in (["deploy", "--host", HOST], ["jobs", "run", "-H", HOST, "--lock", "", "--", "true"]):
                # A process of its own: the holder named must be the other dfo's, not this one's.
                proc = dfo_process(sandbox, *args, env={"DFO_PAYLOAD_ROOT": str(_payload(tmp_path / "p", "1"))})
                assert proc.returncode == 1, proc.stdout + proc.stderr
                out = " ".join((proc.stdout + proc.stderr).split())  # tables wrap long messages
                assert "another dfo" in out and holder["owner"] in out, out
            with host_lock(conn, HOST, "nested"):  # re-entrant within one dfo
                pass
            assert _lock_file(sandbox).exists()
    assert not _lock_file(sandbox).exists()  # released with the block


def test_the_lock_names_its_holder_without_the_operators_user_or_controller_host(sandbox):
    # Every host dfo uses reads the holder record: it said `user@controller-host pid N` to all of them.
    code = ("import json, sys\nfrom orchestrator.core.inventory import load_inventory\n"
            "from orchestrator.transport import Connector\nfrom orchestrator.transport.hostlock import host_lock\n"
            f"c = Connector(load_inventory({str(sandbox.inventory_path)!r}))\n"
            f"with host_lock(c, {HOST!r}, 'deploy'):\n    print(open({str(_lock_file(sandbox))!r}).read())\n")
    records = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout) for _ in range(2)]
    tokens = [r["owner"].split()[1] for r in records]
    for record in records:
        assert re.fullmatch(r"dfo [0-9a-f]{8} pid \d+", record["owner"]), record
        text = json.dumps(record)
        assert f"{getpass.getuser()}@" not in text and socket.gethostname() not in text, text
    assert tokens[0] != tokens[1]  # each dfo process draws its own token
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        with host_lock(conn, HOST, "deploy"):
            owner = json.loads(_lock_file(sandbox).read_text())["owner"]
            proc = dfo_process(sandbox, "jobs", "run", "-H", HOST, "--lock", "", "--", "true")
    assert proc.returncode == 1 and owner in " ".join(proc.stderr.split()), proc.stderr  # still names the holder


def test_the_lock_ends_with_the_dfo_that_held_it(sandbox):
    code = ("import sys, time\nfrom orchestrator.core.inventory import load_inventory\n"
            "from orchestrator.transport import Connector\nfrom orchestrator.transport.hostlock import host_lock\n"
            f"c = Connector(load_inventory({str(sandbox.inventory_path)!r}))\n"
            f"with host_lock(c, {HOST!r}, 'provision'):\n    print('held', flush=True)\n    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert _lock_file(sandbox).exists()
        proc.kill()  # the controller dies without releasing anything
    finally:
        proc.wait(10)
    wait_for(lambda: not _lock_file(sandbox).exists(), "the host to drop the lock of a dead controller", timeout=20)


def test_a_stale_host_lock_is_cleared_with_a_notice(sandbox):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        with host_lock(conn, HOST, "deploy"):
            holder = json.loads(_lock_file(sandbox).read_text())
            os.kill(holder["pid"], signal.SIGKILL)  # the holder dies without cleaning up (host crash)
            wait_for(lambda: not Path(f"/proc/{holder['pid']}").exists(), "the holder to die", timeout=20)
            assert _lock_file(sandbox).exists()
        with host_lock(conn, HOST, "deploy") as notices:
            assert notices and "cleared a stale host lock" in notices[0]
        with pytest.raises(HostLocked):
            with host_lock(conn, HOST, "deploy"), Connector(conn.inventory) as other, host_lock(other, HOST, "x"):
                pass


def test_redeploy_and_pruning_never_remove_a_release_a_job_runs_in(sandbox, tmp_path):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        workdir = Path(conn.inventory.hosts[HOST].workdir)
        first = deploy(conn, [HOST], root=_payload(tmp_path / "v1", "v1"))[HOST].value.release
        handle = launch_job(conn, HOST, [sys.executable, "-m", "remote_payload"], cwd=str(workdir / "payload"),
                            lock=None)
        try:
            wait_for(lambda: (workdir / "jobs" / handle.job_id / "pid.json").exists(), "the job to start", timeout=20)
            release_dir = workdir / "releases" / first
            # A host-side change to the live release, then the same release deployed again: it is
            # re-published, but the folder the job runs in is never deleted under it.
            (release_dir / "remote_payload" / "__init__.py").write_text('VERSION = "tampered"\n')
            again = deploy(conn, [HOST], root=tmp_path / "v1")[HOST].value
            assert again.status == "deployed" and again.release == first
            replaced = [p for p in (workdir / "releases").iterdir() if p.name.startswith(f".replaced-{first}")]
            assert len(replaced) == 1
            # Two newer releases: pruning keeps the current and previous ones, and the one the job uses.
            for version in ("v2", "v3"):
                deploy(conn, [HOST], root=_payload(tmp_path / version, version))
            assert release_dir.is_dir() and replaced[0].is_dir()
        finally:
            cancel_job(conn, HOST, handle.job_id, grace=1)
        deploy(conn, [HOST], root=_payload(tmp_path / "v4", "v4"))  # no job runs: now they go
        assert not release_dir.exists() and not replaced[0].exists()
