"""The provision host script's replies and the controller's wheelhouse cache, checked as data from another
machine (pure: the host script's functions run here, in this process; no sshd).

The attacks themselves, through a lying sandbox host, are in tests/security/test_hostile_provision.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from provision_helpers import make_wheel, write_lock

from orchestrator.core.errors import HostError
from orchestrator.provision.lock import load_lock
from orchestrator.provision.operation import HOST_SCRIPT
from orchestrator.provision.replies import (
    Prepared,
    ProbeFacts,
    PythonFacts,
    StepFailure,
    Synced,
    all_reachable,
    check_accepted,
    pool_listing,
    pool_need,
)
from orchestrator.provision.wheelhouse import MANIFEST, Target, cached_wheelhouse, wheelhouse_dir
from orchestrator.transport.hostcall import program_source


@pytest.fixture(scope="module")
def host_script() -> dict:
    """The host script's functions (prelude included), as the host runs them."""
    scope: dict = {"__name__": "dfo_host_script"}
    exec(compile(program_source(HOST_SCRIPT), str(HOST_SCRIPT), "exec"), scope)
    return scope


@pytest.fixture(scope="module")
def here(host_script) -> dict:
    """This interpreter's facts, as python_facts reports them."""
    return host_script["python_facts"](sys.executable)


def _error(excinfo) -> str:
    assert excinfo.value.host == "h" and "compromised" in (excinfo.value.hint or "")
    return excinfo.value.message


# ------------------------------------------------------------------------- honest replies parse


def test_the_host_scripts_own_replies_parse(host_script, here, tmp_path):
    venv = tmp_path / "venv"
    probe = host_script["probe"](workdir=str(tmp_path), venv=str(venv), interpreter=sys.executable,
                                 dfo_uv=str(tmp_path / "tools" / "uv"), detect_gpu=True)
    facts = ProbeFacts.parse("h", probe)
    assert facts.python.found and facts.python.version == here["version"]
    assert facts.python.target.label.startswith(f"{here['abi'][:2]}{sys.version_info[0]}{sys.version_info[1]}-")
    assert facts.venv.exists is False and facts.venv.marker is None and isinstance(facts.gpu_found, bool)
    assert isinstance(facts.free_bytes, int)
    missing = PythonFacts.parse("h", "interpreter_facts", host_script["python_facts"]("python3.99-nowhere"))
    assert not missing.found and "python3.99-nowhere" in missing.error

    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "a-1.0-py3-none-any.whl").write_bytes(b"a")
    files = {"a-1.0-py3-none-any.whl": "0" * 64, "b-1.0-py3-none-any.whl": "1" * 64}
    assert pool_need("h", host_script["pool_state"](str(pool), files), files) == sorted(files)
    assert pool_listing("h", host_script["pool_listing"](str(pool))) == {"a-1.0-py3-none-any.whl": 1}
    assert all_reachable("h", {"pypi.org": True, "files.pythonhosted.org": False}, ["pypi.org"])
    assert not all_reachable("h", {"pypi.org": True}, ["pypi.org", "files.pythonhosted.org"])  # unanswered
    check_accepted("h", {"accepted": ["a", "b"]}, {"b": "", "a": ""})

    failed = Prepared.parse("h", {"ok": False, "step": "uv venv", "command": ["uv", "venv"], "message": "no\npython"})
    assert failed == StepFailure("uv venv", ("uv", "venv"), "no\npython")
    assert Prepared.parse("h", {"ok": True, "python": dict(here, found=True), "output": ""}).python.found
    synced = Synced.parse("h", {"ok": True, "packages": {"torch": "2.13.0+cpu", "triton": None}, "seconds": 1.5,
                                "output": "", "marker": {"engine_check": {"vllm": "0.32.0", "seconds": 12}}})
    assert synced == Synced({"torch": "2.13.0+cpu", "triton": None}, 1.5, 12.0)


@pytest.mark.parametrize("field, value", [
    ("machine", "aarch64"), ("machine", "ppc64le"), ("machine", "s390x"), ("machine", "armv7l"),
    ("version", "3.13.0rc1"), ("version", "3.14.0a1+"), ("version", "3.11.12"),
    ("abi", "cp313t"), ("abi", "pp310"), ("implementation", "graalpy"),
    ("glibc", None), ("glibc", "2.17"),
])
def test_python_facts_of_real_interpreters_are_accepted(here, field, value):
    facts = PythonFacts.parse("h", "probe", dict(here, **{field: value}))
    assert getattr(facts, field) == value


@pytest.mark.parametrize("field, value", [
    ("machine", "x86_64/../../../proc/self/cwd"), ("machine", ""), ("machine", "x86 64"), ("machine", ".."),
    ("machine", "x" * 33), ("machine", None), ("machine", ["x86_64"]),
    ("version", "3.11"), ("version", "3.11.2/.."), ("version", 311),
    ("implementation", "CP"), ("implementation", "cp/"), ("abi", "cp311/x"), ("abi", "abi3"),
    ("glibc", "2.36.x"), ("glibc", "2/36"), ("glibc", 2.36),
    ("path", ""), ("path", "/usr/bin/python3\n"), ("path", None), ("found", "yes"),
])
def test_python_facts_that_no_interpreter_prints_are_refused(here, field, value):
    with pytest.raises(HostError) as err:
        PythonFacts.parse("h", "probe", dict(here, **{field: value}), "python.")
    assert f"malformed reply to probe: python.{field} is {value!r:.120}" in _error(err)


def test_markers_must_all_be_there_as_lines_of_text(here):
    markers = dict(here["markers"], extra="dropped")
    assert "extra" not in PythonFacts.parse("h", "probe", dict(here, markers=markers)).markers
    short = {k: v for k, v in markers.items() if k != "python_version"}
    for bad, shown in ((dict(markers, sys_platform=["linux"]), "markers.sys_platform is ['linux']"),
                       (dict(markers, os_name="posix\x1b]52;c;eA==\x07"), "markers.os_name is 'posix\\x1b"),
                       (short, "markers.python_version is missing"), ("linux", "markers is 'linux'")):
        with pytest.raises(HostError) as err:
            PythonFacts.parse("h", "probe", dict(here, markers=bad))
        assert shown in _error(err)


@pytest.mark.parametrize("need, shown", [
    (["/home/u/.ssh/id_ed25519"], "/home/u/.ssh/id_ed25519"), (["../x.whl"], "../x.whl"), ([7], "[7]"),
    (["a.whl", "a.whl"], "['a.whl', 'a.whl']"),
])
def test_the_pool_may_lack_only_offered_wheels_once_each(need, shown):
    with pytest.raises(HostError) as err:
        pool_need("h", {"need": need}, {"a.whl": "0" * 64})
    assert "the host asked for wheels the controller did not offer" in _error(err) and shown in err.value.message
    assert pool_need("h", {"need": []}, {"a.whl": ""}) == []


# ------------------------------------------------------------------------- the controller's cache


@pytest.fixture
def cached(tmp_path, here):
    """(lock, target, root, folder): a wheelhouse laid out in the cache as build_wheelhouse leaves one."""
    wheel, sha = make_wheel(tmp_path / "src", "dfo_probe_cached", "1.0")
    lock = load_lock(write_lock(tmp_path / "c.lock", [("dfo_probe_cached", "1.0", sha)]))
    target = PythonFacts.parse("h", "probe", here).target
    root = tmp_path / "cache"
    folder = wheelhouse_dir(lock, target, root, host="h")
    folder.mkdir(parents=True)
    os.replace(wheel, folder / wheel.name)
    manifest = {"lock": lock.name, "lock_sha256": lock.sha256, "target": target.label,
                "files": {wheel.name: {"sha256": sha, "size": (folder / wheel.name).stat().st_size}}}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return lock, target, root, folder


def test_the_cache_folder_of_a_host_target_stays_in_the_cache(cached, tmp_path):
    lock, target, root, folder = cached
    assert folder.parent.parent == root / "wheelhouse" and folder.name.startswith(target.label + "-")
    escaping = Target("3.11.2", "cp", "cp311", "x86_64/../../../../elsewhere", "2.36", target.markers)
    with pytest.raises(HostError) as err:
        wheelhouse_dir(lock, escaping, root, host="h")
    assert "refused wheelhouse label" in err.value.message and "elsewhere" in err.value.message
    (tmp_path / "outside").mkdir()
    lock_dir = folder.parent
    os.rename(lock_dir, tmp_path / "outside" / lock_dir.name)
    lock_dir.symlink_to(tmp_path / "outside" / lock_dir.name)  # a link in the cache that leads out of it
    with pytest.raises(HostError, match="resolves outside"):
        cached_wheelhouse(lock, target, root, host="h")


def _tamper(folder: Path, change) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest, folder)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _add(name: str, meta: dict | None = None):
    def change(manifest, folder):
        first = next(iter(manifest["files"].values()))
        manifest["files"][name] = meta or first
    return change


def _link_wheel(manifest, folder):
    name = next(iter(manifest["files"]))
    os.replace(folder / name, folder.parent / "real.whl")
    (folder / name).symlink_to(folder.parent / "real.whl")


def _grow_wheel(manifest, folder):
    with open(folder / next(iter(manifest["files"])), "ab") as fh:
        fh.write(b"x")


@pytest.mark.parametrize("change, why", [
    (_add("/home/u/.ssh/id_ed25519"), "lists '/home/u/.ssh/id_ed25519'"),
    (_add("../../id_ed25519.whl"), "lists '../../id_ed25519.whl'"),
    (_add("keys/x.whl"), "lists 'keys/x.whl'"),
    (_add("other-1.0-py3-none-any.whl", {"sha256": "0" * 64, "size": 1}), "a sha256 the lock does not pin"),
    (_add("other-1.0-py3-none-any.whl", {"sha256": "0" * 64, "size": "1"}), "not a wheel name, sha256 and size"),
    (lambda m, f: m.update(lock_sha256="0" * 64), "for another lock or target"),
    (lambda m, f: m.update(target="cp311-elsewhere"), "for another lock or target"),
    (lambda m, f: m.update(files=[]), "not a manifest dfo writes"),
    (lambda m, f: m["files"].clear(), "it lacks dfo-probe-cached"),
    (_link_wheel, "is not a regular file"),
    (_grow_wheel, "is not a regular file of"),
    (lambda m, f: os.unlink(f / next(iter(m["files"]))), "is missing"),
])
def test_a_cached_wheelhouse_is_used_only_when_it_holds_exactly_the_locks_wheels(cached, change, why):
    lock, target, root, folder = cached
    assert cached_wheelhouse(lock, target, root, host="h") is not None  # as built: used
    _tamper(folder, change)
    notes: list[str] = []
    assert cached_wheelhouse(lock, target, root, host="h", on_notice=notes.append) is None
    assert len(notes) == 1 and f"not using the cached wheelhouse {folder}" in notes[0] and why in notes[0], notes


def test_a_manifest_that_is_not_json_is_not_used(cached):
    lock, target, root, folder = cached
    (folder / MANIFEST).write_text("{not json")
    notes: list[str] = []
    assert cached_wheelhouse(lock, target, root, host="h", on_notice=notes.append) is None and notes


def test_uploads_come_only_from_inside_the_wheelhouse_with_the_manifests_bytes(cached, tmp_path):
    lock, target, root, folder = cached
    wh = cached_wheelhouse(lock, target, root, host="h")
    assert wh is not None
    (name,) = wh.files
    assert wh.upload_set([name], host="h") == {name: ((folder / name).resolve(), wh.files[name]["sha256"])}
    with pytest.raises(HostError, match="refused to upload '/etc/passwd': not a wheel of"):
        wh.upload_set(["/etc/passwd"], host="h")
    with open(folder / name, "r+b") as fh:  # same size, other bytes: changed after the cache was read
        fh.write(b"Z")
    with pytest.raises(HostError, match="nothing was uploaded"):
        wh.upload_set([name], host="h")
    os.unlink(folder / name)
    secret = tmp_path / "id_ed25519"
    secret.write_bytes(b"k" * wh.files[name]["size"])
    (folder / name).symlink_to(secret)  # planted after the check: confined, refused
    with pytest.raises(HostError, match="resolves outside"):
        wh.upload_set([name], host="h")
