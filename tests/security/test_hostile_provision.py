"""A compromised eval host lies in its answers to `dfo provision`: its Python facts cannot steer the
controller's wheelhouse cache path out of the cache, the wheels it asks for must be ones the controller put in
the wheelhouse, a cache folder holding anything but the lock's wheels is never used, no controller file reaches
the host, and a malformed reply is a clear error naming the host and the field, never a traceback."""

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
from provision_helpers import make_wheel, write_lock

from orchestrator.core.errors import HostError
from orchestrator.core.events import QuietEvents
from orchestrator.core.inventory import load_inventory
from orchestrator.provision.lock import PAYLOAD_DIR, load_lock
from orchestrator.provision.operation import provision
from orchestrator.provision.plan import controller_uv
from orchestrator.provision.wheelhouse import MANIFEST, Target, wheelhouse_key
from orchestrator.transport import Connector

pytestmark = pytest.mark.sshd
HOST = "ct129"
# The Python facts the hostile host reports (its real interpreter's, pinned so the test knows the cache key).
FAKE_PYTHON = {"version": "3.11.2", "implementation": "cp", "abi": "cp311", "glibc": "2.36",
               "markers": {"implementation_name": "cpython", "implementation_version": "3.11.2", "os_name": "posix",
                           "platform_machine": "x86_64", "platform_release": "6.1.0", "platform_system": "Linux",
                           "platform_version": "#1 SMP", "python_full_version": "3.11.2",
                           "platform_python_implementation": "CPython", "python_version": "3.11",
                           "sys_platform": "linux"}}


@pytest.fixture
def wheels(tmp_path, monkeypatch) -> Path:
    """pip (wheelhouse builds) sees only this folder: no index, no network."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


@pytest.fixture
def secret(tmp_path) -> Path:
    """A controller file the host must never get (a private key in a home folder)."""
    path = tmp_path / "home" / ".ssh" / "id_ed25519"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\n" + secrets.token_hex(32).encode() + b"\n")
    return path


def _meta(path: Path) -> dict:
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "size": path.stat().st_size}


def _pool(box) -> Path:
    return Path(box.hosts[HOST].workdir) / "wheelhouse"


def _fresh_venv(box, tmp_path) -> str:
    return str(Path(box.hosts[HOST].workdir) / f"venv-{tmp_path.name}")


def _edit_hook(func: str, statement: str) -> str:
    """A tamper hook that runs STATEMENT (on ``ok``, the decoded answer) for FUNC's replies."""
    return (f"import os\ndef tamper(func, reply):\n    if func != {func!r} or 'ok' not in reply:\n"
            f"        return reply\n    ok = reply['ok']\n    {statement}\n    return {{'ok': ok}}\n")


# Hook code: the names the controller offered in this pool_state call (its arguments travel in the program text).
_OFFERED = ("import __main__, ast, json, re\n"
            "    found = re.search(rb'_json[.]loads[(](.*)[)][)][}]\\n', __main__.program)\n"
            "    offered = sorted(json.loads(ast.literal_eval(found.group(1).decode()))['files'])")


def _cleanup_pool(box, secret: Path) -> None:
    """The session's host: what an attack left in its pool goes."""
    shutil.rmtree(_pool(box) / "keys", ignore_errors=True)
    for path in _holding(_pool(box), secret.read_bytes()):
        path.unlink()


class _Notes(QuietEvents):
    def __init__(self):
        self.lines: list[str] = []

    def info(self, text: str) -> None:
        self.lines.append(text)


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


def test_python_facts_cannot_lead_the_cache_to_a_host_filled_folder_and_upload_a_controller_file(sandbox, tmp_path,
                                                                                                   secret):
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
    # The folder "the host filled": a manifest naming the controller's secret (absolute, and through a link).
    planted.mkdir(parents=True)
    (planted / "keys").symlink_to(secret.parent)
    names = [str(secret), "keys/id_ed25519"]
    (planted / MANIFEST).write_text(json.dumps({"lock": lock.name, "lock_sha256": lock.sha256, "target": "x",
                                                "files": {n: _meta(secret) for n in names}}))
    pool = _pool(sandbox)
    uv = controller_uv()
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    evil.inventory.write_text(_with_venv(evil.inventory.read_text(), HOST, _fresh_venv(sandbox, tmp_path)))
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
    finally:
        _cleanup_pool(sandbox, secret)
    assert proc.returncode == 1, proc.stdout
    _no_traceback(proc)
    out = proc.stdout + proc.stderr
    assert HOST in out and "machine" in out and "x86_64/../" in out, out
    assert "pool_state" not in evil.called()


@pytest.mark.parametrize("asked", ["{secret}", "../../../home/.ssh/id_ed25519", "keys/id_ed25519", "uv", "{wheel}"])
def test_a_host_gets_only_wheels_the_controller_offered(sandbox, tmp_path, wheels, secret, asked):
    """`need` names only wheels of the controller's own wheelhouse (once each); anything else is refused before a
    byte is uploaded."""
    wheel, sha = make_wheel(wheels, "dfo_probe_need", "1.0")
    lock = write_lock(tmp_path / "need.lock", [("dfo_probe_need", "1.0", sha)])
    asked_for = [asked.format(secret=secret, wheel=wheel.name)]
    if asked == "{wheel}":
        asked_for *= 2  # an offered wheel, twice
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    evil.tamper(_edit_hook("pool_state", f"ok = {{'need': {asked_for!r}}}"))
    try:
        with Connector(load_inventory(evil.inventory)) as conn, pytest.raises(HostError) as err:
            provision(conn, HOST, offline=True, lock=lock, venv=_fresh_venv(sandbox, tmp_path),
                      wheelhouse_cache=tmp_path / "cache")
        held = _holding(_pool(sandbox), secret.read_bytes())
    finally:
        _cleanup_pool(sandbox, secret)
    assert held == [], "a controller file reached the host"
    assert err.value.host == HOST
    assert "the host asked for wheels the controller did not offer" in err.value.message
    assert asked_for[0] in err.value.message
    calls = evil.called()
    assert "accept" not in calls[calls.index("pool_state"):], "something was uploaded after the host's answer"


@pytest.mark.parametrize("planted", ["absolute name", "name through a link", "file the lock does not pin"])
def test_a_cached_wheelhouse_holding_anything_but_the_locks_wheels_is_not_used(sandbox, tmp_path, wheels, secret,
                                                                                planted):
    """Whoever wrote the cache folder, only wheels whose sha256 the lock pins can leave the controller from it: a
    manifest listing anything else is set aside and the wheelhouse rebuilt."""
    wheel, sha = make_wheel(wheels, "dfo_probe_cache", "1.0")
    lock = write_lock(tmp_path / "cache.lock", [("dfo_probe_cache", "1.0", sha)])
    cache = tmp_path / "cache"
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        first = provision(conn, HOST, offline=True, lock=lock, venv=_fresh_venv(sandbox, tmp_path) + "-1",
                          wheelhouse_cache=cache)
    folder = Path(first.wheelhouse)
    manifest = json.loads((folder / MANIFEST).read_text())
    if planted == "absolute name":
        name = str(secret)
    elif planted == "name through a link":
        (folder / "keys").symlink_to(secret.parent)
        name = "keys/id_ed25519"
    else:
        name = "dfo_probe_cache-0.1-py3-none-any.whl"
        shutil.copy(secret, folder / name)
    manifest["files"][name] = _meta(secret)
    (folder / MANIFEST).write_text(json.dumps(manifest))

    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")  # says it lacks every wheel offered
    evil.tamper(_edit_hook("pool_state", f"{_OFFERED}\n    ok = {{'need': offered}}\n"
                           f"    os.makedirs({str(_pool(sandbox) / 'keys')!r}, exist_ok=True)"))
    notes = _Notes()
    try:
        with Connector(load_inventory(evil.inventory)) as conn:
            try:
                again = provision(conn, HOST, offline=True, lock=lock, venv=_fresh_venv(sandbox, tmp_path) + "-2",
                                  wheelhouse_cache=cache, events=notes)
            except HostError as exc:  # what the code before the fix said once the planted file was on its way
                again = exc
        assert _holding(_pool(sandbox), secret.read_bytes()) == [], "a controller file reached the host"
        assert not isinstance(again, HostError), again
        assert again.status == "installed" and again.pushed_files == 1
        assert any("not using the cached wheelhouse" in line for line in notes.lines), notes.lines
        rebuilt = json.loads((Path(again.wheelhouse) / MANIFEST).read_text())["files"]
        assert list(rebuilt) == [wheel.name]
    finally:
        _cleanup_pool(sandbox, secret)


# ----------------------------------------------------------------------------- malformed replies


@pytest.mark.parametrize("statement, field", [
    ("ok = 'probably fine'", "the reply is 'probably fine'"),
    ("del ok['python']", "python is missing"),
    ("ok['python']['found'] = 1", "python.found is 1"),
    ("ok['python']['machine'] = 64", "python.machine is 64"),
    ("ok['python']['glibc'] = '2.36; rm -rf ~'", "python.glibc is '2.36; rm -rf ~'"),
    ("ok['python']['version'] = '3.11/../../x'", "python.version is '3.11/../../x'"),
    ("ok['python']['markers'] = ['linux']", "python.markers is ['linux']"),
    ("del ok['python']['markers']['sys_platform']", "python.markers.sys_platform is missing"),
    ("ok['free_bytes'] = -1", "free_bytes is -1"),
    ("ok['uv'] = {'path': '/usr/bin/uv'}", "uv is {'path': '/usr/bin/uv'}"),
    ("ok['uv'] = [{'source': 'host', 'path': 'uv', 'version': '0.13.9'}]", "uv[0].path is 'uv'"),
    ("ok['venv']['marker'] = ['lock']", "venv.marker is ['lock']"),
    ("ok['venv']['marker'] = {'packages': ['torch']}", "venv.marker.packages is ['torch']"),
    ("ok['gpu'] = 'yes'", "gpu is 'yes'"),
])
def test_cli_malformed_probe_replies_are_clear_errors(sandbox, tmp_path, statement, field):
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    evil.inventory.write_text(_with_venv(evil.inventory.read_text(), HOST, _fresh_venv(sandbox, tmp_path)))
    evil.tamper(_edit_hook("probe", statement))
    proc = dfo("provision", "-H", HOST, "--json", inventory=evil.inventory, env={"DFO_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _no_traceback(proc)
    error = json.loads(proc.stdout)["hosts"][HOST]["error"]
    assert error.startswith(f"{HOST}: provision: malformed reply to probe: {field} "), error
    assert "hint: " in error
    assert evil.called() == ["probe"]  # refused before anything else was asked or done


@pytest.mark.parametrize("func, statement, field, options", [
    ("reachable", "ok = {k: 'yes' for k in ok}", "malformed reply to reachable: pypi.org is 'yes'", {"offline": None}),
    ("pool_listing", "ok = {'dfo_probe_bad-1.0-py3-none-any.whl': '12'}",
     "malformed reply to pool_listing: dfo_probe_bad-1.0-py3-none-any.whl is '12'", {}),
    ("prepare_venv", "ok = 'done'", "malformed reply to prepare_venv: the reply is 'done'", {}),
    ("prepare_venv", "del ok['python']", "malformed reply to prepare_venv: python is missing", {}),
    ("prepare_venv", "ok['python']['abi'] = 'cp311/../../x'", "prepare_venv: python.abi is 'cp311/../../x'", {}),
    ("prepare_venv", "ok = {'ok': False, 'step': 'uv venv', 'command': 'rm -rf /', 'message': 'no'}",
     "malformed reply to prepare_venv: command is 'rm -rf /'", {}),
    ("pool_state", "ok = {'need': 'everything'}", "malformed reply to pool_state: need is 'everything'", {}),
    ("pool_state", "ok = ['dfo_probe_bad-1.0-py3-none-any.whl']", "pool_state: the reply is [", {}),
    ("accept", "ok = {'accepted': ['../../etc/passwd']}", "malformed reply to accept: accepted is ['../", {}),
    ("sync", "ok['packages'] = ['torch']", "malformed reply to sync: packages is ['torch']", {}),
    ("sync", "ok['seconds'] = 'fast'", "malformed reply to sync: seconds is 'fast'", {}),
    ("sync", "ok['ok'] = 'yes'", "malformed reply to sync: ok is 'yes'", {}),
    ("interpreter_facts", "ok = {'found': True, 'path': '/usr/bin/python3.99', 'version': '3.99'}",
     "malformed reply to interpreter_facts: version is '3.99'", {"engine": "vllm"}),
])
def test_malformed_replies_after_the_probe_are_clear_errors(sandbox, tmp_path, wheels, func, statement, field,
                                                            options):
    _, sha = make_wheel(wheels, "dfo_probe_bad", "1.0")
    lock = write_lock(tmp_path / "bad.lock", [("dfo_probe_bad", "1.0", sha)])
    if func == "interpreter_facts":  # asked for only when an engine lock wants another Python than the host's
        lock.write_text("# dfo-python: 3.99 (test)\n" + lock.read_text())
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    evil.tamper(_edit_hook(func, statement))
    with Connector(load_inventory(evil.inventory)) as conn, pytest.raises(HostError) as err:
        provision(conn, HOST, **{"offline": True, **options}, lock=lock, venv=_fresh_venv(sandbox, tmp_path),
                  wheelhouse_cache=tmp_path / "cache")
    assert func in evil.called()
    assert err.value.host == HOST and field in err.value.message, err.value.message
    assert err.value.hint and "compromised" in err.value.hint
