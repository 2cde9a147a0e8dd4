"""A compromised eval host lies in its answers to `dfo provision`: its Python facts cannot steer the
controller's wheelhouse cache path out of the cache, the wheels it asks for must be ones the controller put in
the wheelhouse, no controller file reaches the host, and a malformed reply is a clear error, never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path

import pytest
from cli_runner import dfo
from hostile import HostileHost, tree

from orchestrator.provision.plan import controller_uv
from orchestrator.provision.wheelhouse import PAYLOAD_DIR, Target, load_lock, wheelhouse_key

pytestmark = pytest.mark.sshd
HOST = "ct129"
# The Python facts the hostile host reports (its real interpreter's, pinned so the test knows the cache key).
FAKE_PYTHON = {"version": "3.11.2", "implementation": "cp", "abi": "cp311", "glibc": "2.36",
               "markers": {"implementation_name": "cpython", "implementation_version": "3.11.2", "os_name": "posix",
                           "platform_machine": "x86_64", "platform_release": "6.1.0", "platform_system": "Linux",
                           "platform_version": "#1 SMP", "python_full_version": "3.11.2",
                           "platform_python_implementation": "CPython", "python_version": "3.11",
                           "sys_platform": "linux"}}


def _with_venv(inventory: str, host: str, venv: str) -> str:
    """The inventory text with HOST's venv at VENV (a fresh one: the session's provisioned venv stays as it is)."""
    block = re.search(rf"(?ms)^  {re.escape(host)}:\n.*?(?=^  \S|\Z)", inventory)
    assert block, f"host {host} not in the inventory"
    new_block = block.group(0).replace("    paths:\n", f"    paths:\n      venv: {json.dumps(venv)}\n", 1)
    return inventory[: block.start()] + new_block + inventory[block.end():]


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


def _holding(folder: Path, data: bytes) -> list[Path]:
    """Files under FOLDER (links not followed) whose bytes are DATA."""
    found = []
    for base, _dirs, files in os.walk(folder):
        for name in files:
            path = Path(base, name)
            if not path.is_symlink() and path.stat().st_size == len(data) and path.read_bytes() == data:
                found.append(path)
    return found


def test_python_facts_cannot_lead_the_cache_to_a_host_filled_folder_and_upload_a_controller_file(sandbox, tmp_path):
    """The attack of issue 19: `machine` walks the wheelhouse cache path out of the cache into a folder the same
    host filled earlier (a results pull of its choosing), whose MANIFEST.json names a controller file; the host
    then says it needs it. Refused at the probe: nothing appears outside the cache, the file never leaves."""
    cache = tmp_path / "cache"
    lock = load_lock(PAYLOAD_DIR / "requirements-cpu.lock")
    # The host computes the key the controller will use (it knows the lock) and walks it to tmp_path/pulled/w-…
    machine = "x86_64/../../../../pulled/w"
    key, _ = wheelhouse_key(lock, Target(machine=machine, python_version="3.11.2", implementation="cp", abi="cp311",
                                         glibc="2.36", markers=FAKE_PYTHON["markers"]))
    planted = Path(os.path.normpath(cache / "wheelhouse" / key))
    assert planted.parent == tmp_path / "pulled"
    # The controller's secret, and the folder "the host filled": a manifest naming it (absolute, and through a link).
    ssh_dir = tmp_path / "home" / ".ssh"
    ssh_dir.mkdir(parents=True)
    secret = ssh_dir / "id_ed25519"
    secret.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n" + secrets.token_hex(32).encode() + b"\n")
    meta = {"sha256": hashlib.sha256(secret.read_bytes()).hexdigest(), "size": secret.stat().st_size}
    planted.mkdir(parents=True)
    (planted / "keys").symlink_to(ssh_dir)
    names = [str(secret), "keys/id_ed25519"]
    (planted / "MANIFEST.json").write_text(json.dumps({"lock": lock.name, "lock_sha256": lock.sha256,
                                                       "target": "x", "files": {n: meta for n in names}}))
    pool = Path(sandbox.hosts[HOST].workdir) / "wheelhouse"
    uv = controller_uv()
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    evil.inventory.write_text(_with_venv(evil.inventory.read_text(), HOST,
                                         str(Path(sandbox.hosts[HOST].workdir) / "venv-hostile-provision")))
    evil.tamper(f"""import json, os
FAKE = json.loads({json.dumps(json.dumps(dict(FAKE_PYTHON, machine=machine)))})
def tamper(func, reply):
    ok = reply.get("ok")
    if func in ("probe", "prepare_venv"):
        ok["python"].update(FAKE)
    if func == "probe":  # a uv of its own, so the controller does not stop at pushing one
        ok["uv"] = [{{"source": "host", "path": {json.dumps(uv.path)}, "version": {json.dumps(uv.version)}}}]
        ok["https_proxy"] = False
    if func == "reachable":  # "no internet": offline, from the controller's wheelhouse
        ok = {{name: False for name in ok}}
    if func == "pool_state":
        os.makedirs(os.path.join({json.dumps(str(pool))}, "keys"), exist_ok=True)
        ok = {{"need": {json.dumps(names)}}}
    return {{"ok": ok}} if "ok" in reply else reply
""")
    before = tree(tmp_path)
    try:
        proc = dfo("provision", "-H", HOST, inventory=evil.inventory, env={"DFO_CACHE": str(cache)})
        assert "probe" in evil.called()
        created = tree(tmp_path) - before - {"hostile/tamper.py.log"}
        assert {p for p in created if not p.startswith("cache")} == set(), "something was created outside the cache"
        assert _holding(pool, secret.read_bytes()) == [], "a controller file reached the host"
    finally:  # the session's host: what the attack left in its pool goes
        shutil.rmtree(pool / "keys", ignore_errors=True)
    assert proc.returncode == 1, proc.stdout
    _no_traceback(proc)
    out = proc.stdout + proc.stderr
    assert HOST in out and "machine" in out and "x86_64/../" in out, out
    assert "pool_state" not in evil.called()
