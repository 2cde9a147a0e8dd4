"""`dfo provision`: locks, planning (pure), and uv venvs built on real sshd hosts without internet.

The CPU payload venv (torch 2.13.0+cpu, ≈900 MB) is built once per session by ``provisioned_ct129``;
the other host tests use tiny hand-made wheels and locks, with pip pointed at a local folder only, so
they are quick and hermetic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runner import dfo
from provision_helpers import make_wheel, read_marker, write_lock

from orchestrator.core.errors import HostError, InputError, OperationError
from orchestrator.core.inventory import Host, load_inventory
from orchestrator.provision.lock import PAYLOAD_DIR, load_lock, parse_lock
from orchestrator.provision.operation import provision
from orchestrator.provision.plan import (
    ControllerUv,
    UvChoice,
    choose_uv,
    disk_shortfall,
    lock_path_for,
    marker_differences,
    marker_fields,
    marker_hash,
    plan_provision,
    resolve_flavour,
)
from orchestrator.provision.replies import ProbeFacts, PythonFacts, UvFound, VenvFacts
from orchestrator.provision.wheelhouse import Target
from orchestrator.transport import Connector

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------- helpers


def host_python(sandbox, host: str, venv: str, code: str) -> subprocess.CompletedProcess:
    """Run Python code in a host venv through the system ssh (a real remote command, not local)."""
    return sandbox.run_ssh(host, f"{venv}/bin/python -c {json.dumps(code)}", timeout=120)


# ------------------------------------------------------------------------------- pure logic


def test_shipped_cpu_lock_is_cpu_torch_without_fla_or_triton():
    lock = load_lock(PAYLOAD_DIR / "requirements-cpu.lock")
    names = {r.name: r for r in lock.requirements}
    assert names["torch"].version == "2.13.0+cpu"
    assert names["transformers"].version == "5.24.0"
    for required in ("safetensors", "accelerate", "tokenizers", "numpy"):
        assert required in names
    assert not {"triton", "flash-linear-attention", "fla-core"} & set(names)
    assert not [n for n in names if n.startswith("nvidia-")], "a CUDA package slipped into the CPU lock"
    assert lock.flavour == "cpu" and lock.torch_backend == "cpu"
    local = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
    if local:  # the hash in the lock is that of the wheel pip resolves here
        digest = hashlib.sha256(local[0].read_bytes()).hexdigest()
        assert f"sha256:{digest}" in names["torch"].hashes


def test_shipped_cuda_lock_has_cuda_torch_fla_and_triton():
    lock = load_lock(PAYLOAD_DIR / "requirements-cuda.lock")
    names = {r.name: r for r in lock.requirements}
    assert names["torch"].version == "2.13.0"  # PyPI's build (CUDA), not a +cpu one
    assert "flash-linear-attention" in names and "triton" in names
    assert any(n.startswith("nvidia-cuda-runtime") for n in names)
    assert lock.flavour == "cuda" and lock.torch_backend
    assert "compile-lock cuda" in lock.text.split("\n\n")[0]  # the header says how to regenerate


@pytest.mark.parametrize("text, expected", [
    ("torch>=2\n", "expected `name==version` (pinned)"),
    ("torch==2.13.0\n", "has no --hash"),
    ("torch==2.13.0 --hash=md5:abc\n", "malformed hash"),
    ("torch==2.13.0 ; python_version >>> '3' --hash=sha256:" + "a" * 64 + "\n", "invalid environment marker"),
    ("--index-url https://x\ntorch==2.13.0 --hash=sha256:" + "a" * 64 + "\n", "unsupported option"),
])
def test_parse_lock_rejects_bad_lines_with_file_and_line(text, expected):
    with pytest.raises(InputError) as err:
        parse_lock(text, Path("req.lock"))
    assert expected in err.value.message and "req.lock:" in err.value.message


def test_parse_lock_reads_continuations_markers_and_header():
    text = ("# dfo-flavour: cuda\n# dfo-torch-backend: cu130\nNumPy==2.4.6 ; python_full_version < '3.12' \\\n"
            "    --hash=sha256:" + "1" * 64 + " \\\n    --hash=sha256:" + "2" * 64 + "\n    # via torch\n")
    lock = parse_lock(text, Path("x.lock"))
    (req,) = lock.requirements
    assert (req.name, req.version, len(req.hashes)) == ("numpy", "2.4.6", 2)
    assert lock.flavour == "cuda" and lock.torch_backend == "cu130"
    assert req.applies({"python_full_version": "3.11.2"}) and not req.applies({"python_full_version": "3.12.1"})


def _host(**kw) -> Host:
    return Host(address="h", workdir="/w", **kw)


@pytest.mark.parametrize("kw, gpu_found, expected", [
    ({"gpu": False}, None, ("cpu", "cpu")),
    ({"gpu": True}, None, ("cuda", None)),
    ({}, True, ("cuda", None)),          # detected with nvidia-smi
    ({}, False, ("cpu", "cpu")),
    ({"torch_backend": "cu128"}, False, ("cuda", "cu128")),
    ({"gpu": True, "torch_backend": "cpu"}, True, ("cpu", "cpu")),
])
def test_resolve_flavour(kw, gpu_found, expected):
    assert resolve_flavour(_host(**kw), gpu_found) == expected


def test_lock_path_for_prefers_a_backend_specific_cuda_lock(tmp_path):
    (tmp_path / "requirements-cuda-cu128.lock").write_text("x")
    assert lock_path_for("cpu", "cpu", tmp_path).name == "requirements-cpu.lock"
    assert lock_path_for("cuda", "cu128", tmp_path).name == "requirements-cuda-cu128.lock"
    assert lock_path_for("cuda", "cu126", tmp_path).name == "requirements-cuda.lock"


def test_choose_uv_prefers_a_recent_host_uv_then_dfo_copy_then_push():
    ctl = ControllerUv("/ctl/uv", "0.13.9")
    dfo = "/w/tools/uv-0.13.9/uv"
    assert choose_uv([UvFound("host", "/usr/bin/uv", "0.9.1")], ctl, dfo).source == "host"
    old_host = UvFound("host", "/usr/bin/uv", "0.4.0")
    assert choose_uv([old_host], ctl, dfo) == UvChoice(dfo, "0.13.9", "push")
    ours = UvFound("dfo", dfo, "0.13.9")
    assert choose_uv([old_host, ours], ctl, dfo).source == "dfo"
    assert choose_uv([UvFound("dfo", dfo, None)], ctl, dfo).source == "push"  # broken copy


def test_plan_up_to_date_only_when_the_marker_matches(tmp_path):
    lock = parse_lock("a==1 --hash=sha256:" + "a" * 64 + "\n", tmp_path / "a.lock")
    host = _host(python="/usr/bin/python3")
    uv = UvChoice("/w/uv", "0.13.9", "dfo")
    fields = marker_fields(lock, "3.11.2", "cpu", "cpu", "0.13.9")
    good = dict(fields, hash=marker_hash(fields))
    facts = ProbeFacts(PythonFacts(True, version="3.11.2"), venv=VenvFacts(True, True, good))
    assert plan_provision("h", host, "/w/venv", facts, lock, "cpu", "cpu", uv, force=False).up_to_date
    assert not plan_provision("h", host, "/w/venv", facts, lock, "cpu", "cpu", uv, force=True).up_to_date
    newer_py = dataclasses.replace(facts, python=PythonFacts(True, version="3.11.9"))
    plan = plan_provision("h", host, "/w/venv", newer_py, lock, "cpu", "cpu", uv, force=False)
    assert not plan.up_to_date and "python 3.11.2 -> 3.11.9" in plan.reasons
    other = parse_lock("a==2 --hash=sha256:" + "b" * 64 + "\n", tmp_path / "a.lock")
    plan = plan_provision("h", host, "/w/venv", facts, other, "cpu", "cpu", uv, force=False)
    assert not plan.up_to_date and plan.reasons[0].startswith("lock changed")
    assert any("uv pip sync" in s for s in plan.steps)
    no_venv = dataclasses.replace(facts, venv=VenvFacts())
    no_venv_plan = plan_provision("h", host, "/w/venv", no_venv, lock, "cpu", "cpu", uv, False)
    assert no_venv_plan.reasons == ["no venv at /w/venv"]


def test_marker_differences_names_what_changed():
    exp = {"lock": "l", "lock_sha256": "x" * 64, "python": "3.11.2", "flavour": "cpu", "torch_backend": "cpu",
           "uv": "0.13.9"}
    assert marker_differences(None, exp)[0].startswith("no dfo marker")
    assert marker_differences(dict(exp, uv="0.12.0", hash="?"), exp) == ["uv 0.12.0 -> 0.13.9"]


def test_target_platform_tags_cover_older_manylinux():
    t = Target("3.11.2", "cp", "cp311", "x86_64", "2.36", {})
    assert t.platforms[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_17_x86_64" in t.platforms and "manylinux2014_x86_64" in t.platforms
    assert Target("3.11.2", "cp", "cp311", "x86_64", None, {}).platforms == []  # musl: pure wheels only


def test_disk_shortfall():
    assert disk_shortfall(None, 10, 10) == 0
    assert disk_shortfall(100, 10, 10) == 0
    assert disk_shortfall(20, 10, 10) == 15  # 10 pushed + 2.5 x 10 unpacked = 35 needed


# --------------------------------------------------------------------------- real hosts: CPU


@pytest.mark.sshd
@pytest.mark.slow
def test_cpu_venv_built_offline_then_second_run_installs_nothing(sandbox, provisioned_ct129, provision_cache,
                                                                  connector):
    first = provisioned_ct129
    assert first.status == "installed" and first.offline is True
    assert first.flavour == "cpu" and first.packages["torch"] == "2.13.0+cpu"
    # No uv on the sandbox hosts: dfo pushes its own, unless the engine venv (engine_host) went first on ct129.
    assert first.uv_source in ("pushed", "dfo") and first.pushed_files > 0
    marker_before = read_marker(first.venv)
    assert marker_before and marker_before["lock_sha256"] == first.lock_sha256

    again = provision(connector, "ct129", offline=True, wheelhouse_cache=provision_cache)
    assert again.status == "up-to-date" and again.reasons == []
    assert again.pushed_files == 0 and again.python == first.python
    assert read_marker(first.venv) == marker_before  # untouched


@pytest.mark.sshd
@pytest.mark.slow
def test_cpu_venv_has_cpu_torch_and_no_fla_or_triton(sandbox, provisioned_ct129):
    code = ("import importlib.util as u, torch, transformers; "
            "print(torch.__version__, torch.version.cuda, transformers.__version__, "
            "u.find_spec('fla') is None, u.find_spec('triton') is None, float(torch.ones(3).sum()))")
    proc = host_python(sandbox, "ct129", provisioned_ct129.venv, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.13.0+cpu", "None", "5.24.0", "True", "True", "3.0"]


@pytest.mark.sshd
@pytest.mark.slow
def test_offline_install_came_from_the_pushed_wheelhouse(sandbox, provisioned_ct129, connector):
    if not sandbox.isolated:
        pytest.skip(f"hosts are not network-isolated here ({sandbox.reason})")
    # The host really has no route out: the install could only use the pushed wheels.
    probe = sandbox.run_ssh("ct129", "/usr/bin/python3 -c \"import socket; "
                            "socket.create_connection(('pypi.org', 443), timeout=3)\"")
    assert probe.returncode != 0
    wheels = Path(provisioned_ct129.wheelhouse)
    manifest = json.loads((wheels / "MANIFEST.json").read_text())["files"]
    pool = Path(sandbox.hosts["ct129"].workdir) / "wheelhouse"
    for name, meta in manifest.items():
        assert hashlib.sha256((pool / name).read_bytes()).hexdigest() == meta["sha256"]
    assert any(n.startswith("torch-2.13.0+cpu") for n in manifest)


@pytest.mark.sshd
def test_cli_provision_reports_up_to_date_as_json(sandbox, provisioned_ct129, provision_cache):
    proc = dfo(sandbox, "provision", "-H", "ct129", "--json", env={"DFO_CACHE": str(provision_cache)}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] and doc["hosts"]["ct129"]["status"] == "up-to-date"
    assert doc["hosts"]["ct129"]["python"] == provisioned_ct129.python


# ------------------------------------------------------------------ real hosts: tiny locks


@pytest.mark.sshd
def test_lock_change_resyncs_and_pushes_only_new_wheels(sandbox, connector, local_wheels, tmp_path):
    venv = str(sandbox.hosts["kpro6"].workdir / "venv-resync")
    _, sha_a = make_wheel(local_wheels, "dfo_probe_a", "1.0")
    _, sha_b = make_wheel(local_wheels, "dfo_probe_b", "2.0")
    lock1 = write_lock(tmp_path / "one.lock", [("dfo_probe_a", "1.0", sha_a)])
    cache = tmp_path / "cache"

    first = provision(connector, "kpro6", offline=True, lock=lock1, venv=venv, wheelhouse_cache=cache)
    assert first.status == "installed" and first.pushed_files == 1
    assert provision(connector, "kpro6", offline=True, lock=lock1, venv=venv,
                     wheelhouse_cache=cache).status == "up-to-date"

    lock2 = write_lock(tmp_path / "two.lock", [("dfo_probe_a", "1.0", sha_a), ("dfo_probe_b", "2.0", sha_b)])
    second = provision(connector, "kpro6", offline=True, lock=lock2, venv=venv, wheelhouse_cache=cache)
    assert second.status == "installed" and second.reasons[0].startswith("lock changed")
    assert second.pushed_files == 1  # dfo_probe_a was already on the host
    proc = host_python(sandbox, "kpro6", venv, "import dfo_probe_a, dfo_probe_b; print(dfo_probe_b.VERSION)")
    assert proc.stdout.strip() == "2.0", proc.stderr

    # A sync makes the venv exactly the lock: what the lock dropped is removed.
    lock3 = write_lock(tmp_path / "three.lock", [("dfo_probe_b", "2.0", sha_b)])
    third = provision(connector, "kpro6", offline=True, lock=lock3, venv=venv, wheelhouse_cache=cache)
    assert third.status == "installed"
    proc = host_python(sandbox, "kpro6", venv, "import dfo_probe_a")
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr


@pytest.mark.sshd
def test_force_rebuilds_and_dry_run_changes_nothing(sandbox, connector, local_wheels, tmp_path):
    workdir = sandbox.hosts["kpro6"].workdir
    _, sha = make_wheel(local_wheels, "dfo_probe_c", "1.0")
    lock = write_lock(tmp_path / "c.lock", [("dfo_probe_c", "1.0", sha)])
    cache = tmp_path / "cache"

    fresh = str(workdir / "venv-dry")
    dry = provision(connector, "kpro6", offline=True, lock=lock, venv=fresh, dry_run=True, wheelhouse_cache=cache)
    assert dry.status == "would-install" and any("uv pip sync" in s for s in dry.steps)
    assert not Path(fresh).exists()

    venv = str(workdir / "venv-force")
    provision(connector, "kpro6", offline=True, lock=lock, venv=venv, wheelhouse_cache=cache)
    (Path(venv) / "stray-file").write_text("left by someone")
    forced = provision(connector, "kpro6", offline=True, lock=lock, venv=venv, force=True, wheelhouse_cache=cache)
    assert forced.status == "installed" and "--rebuild" in forced.reasons
    assert not (Path(venv) / "stray-file").exists()  # recreated (uv venv --clear)
    assert read_marker(venv)["lock_sha256"] == forced.lock_sha256


@pytest.mark.sshd
def test_requirement_for_another_python_is_refused_and_the_venv_keeps_its_state(sandbox, connector, local_wheels,
                                                                              tmp_path):
    venv = str(sandbox.hosts["kpro6"].workdir / "venv-bad")
    _, ok_sha = make_wheel(local_wheels, "dfo_probe_d", "1.0")
    cache = tmp_path / "cache"
    good = write_lock(tmp_path / "good.lock", [("dfo_probe_d", "1.0", ok_sha)])
    provision(connector, "kpro6", offline=True, lock=good, venv=venv, wheelhouse_cache=cache)
    marker = read_marker(venv)

    _, bad_sha = make_wheel(local_wheels, "dfo_probe_future", "1.0", requires_python=">=3.99")
    bad = write_lock(tmp_path / "bad.lock", [("dfo_probe_d", "1.0", ok_sha), ("dfo_probe_future", "1.0", bad_sha)])
    with pytest.raises(OperationError) as err:
        provision(connector, "kpro6", offline=True, lock=bad, venv=venv, wheelhouse_cache=cache)
    text = err.value.message
    assert "kpro6" in text and "bad.lock" in text
    assert "dfo_probe_future" in text.replace("-", "_") and "3.99" in text  # pip's own words
    # Refused on the controller: the host's venv still is exactly the good lock, and says so.
    assert read_marker(venv) == marker
    assert provision(connector, "kpro6", offline=True, lock=good, venv=venv,
                     wheelhouse_cache=cache).status == "up-to-date"


@pytest.mark.sshd
def test_failed_sync_reports_uv_message_and_leaves_no_good_marker(sandbox, connector, local_wheels, tmp_path):
    venv = str(sandbox.hosts["kpro6"].workdir / "venv-online")
    _, sha = make_wheel(local_wheels, "dfo_probe_g", "1.0")
    cache = tmp_path / "cache"
    lock = write_lock(tmp_path / "g.lock", [("dfo_probe_g", "1.0", sha)])
    provision(connector, "kpro6", offline=True, lock=lock, venv=venv, wheelhouse_cache=cache)
    assert read_marker(venv) is not None
    lock2 = write_lock(tmp_path / "g2.lock", [("dfo_probe_g", "1.0", sha), ("dfo_probe_h", "1.0", "1" * 64)])
    # --online on a host without internet (or, unisolated, a package no index has): uv itself fails mid-way.
    with pytest.raises(HostError) as err:
        provision(connector, "kpro6", offline=False, lock=lock2, venv=venv, wheelhouse_cache=cache)
    assert err.value.host == "kpro6" and "uv pip sync failed" in err.value.message
    uv_words = err.value.message.split(":\n", 1)[1]  # uv's own message follows the step
    assert "error" in uv_words.lower() and ("dfo-probe-h" in uv_words or "dns" in uv_words.lower()), uv_words
    assert read_marker(venv) is None  # the venv was touched and matches no lock: never marked good
    again = provision(connector, "kpro6", offline=True, lock=lock, venv=venv, wheelhouse_cache=cache)
    assert again.status == "installed" and again.reasons[0].startswith("no dfo marker")


@pytest.mark.sshd
def test_missing_package_fails_the_wheelhouse_build_with_pips_message(sandbox, connector, local_wheels, tmp_path):
    lock = write_lock(tmp_path / "missing.lock", [("dfo_no_such_package", "9.9", "0" * 64)])
    with pytest.raises(OperationError) as err:
        provision(connector, "kpro6", offline=True, lock=lock, venv=str(sandbox.hosts["kpro6"].workdir / "venv-m"),
                  wheelhouse_cache=tmp_path / "cache")
    assert "kpro6" in err.value.message and "dfo_no_such_package" in err.value.message.replace("-", "_")
    assert "missing.lock" in err.value.message


@pytest.mark.sshd
def test_missing_python_reports_uv_message_with_the_host(sandbox, local_wheels, tmp_path):
    inv = load_inventory(sandbox.inventory_path)
    inv.hosts["kpro6"].python = "/usr/bin/python3.99"
    _, sha = make_wheel(local_wheels, "dfo_probe_e", "1.0")
    lock = write_lock(tmp_path / "e.lock", [("dfo_probe_e", "1.0", sha)])
    venv = str(sandbox.hosts["kpro6"].workdir / "venv-nopy")
    with Connector(inv) as conn, pytest.raises(HostError) as err:
        provision(conn, "kpro6", offline=True, lock=lock, venv=venv, wheelhouse_cache=tmp_path / "cache")
    assert err.value.host == "kpro6" and "uv venv failed" in err.value.message
    assert "python3.99" in err.value.message  # uv names the interpreter it could not find
    assert "python:" in (err.value.hint or "")
    assert read_marker(venv) is None


@pytest.mark.sshd
def test_not_enough_disk_space_is_refused_before_touching_the_host(sandbox, local_wheels, tmp_path):
    if os.geteuid() != 0 or not shutil.which("nsenter"):
        pytest.skip("mounting a small filesystem on the host needs root and nsenter")
    small = tmp_path / "small"
    small.mkdir()
    # Mount it in the host's own mount namespace (`ip netns exec` gave sshd one): the host sees 4 MiB there.
    in_host = ["nsenter", "-t", str(sandbox.hosts["kpro6"].pid), "-m"]
    if subprocess.run([*in_host, "mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(small)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs in the host's mount namespace here")
    try:
        assert "4.0M" in sandbox.run_ssh("kpro6", f"df -h {small}").stdout
        inv = load_inventory(sandbox.inventory_path)
        inv.hosts["kpro6"].workdir = str(small / "dfo")
        _, sha = make_wheel(local_wheels, "dfo_probe_f", "1.0")
        lock = write_lock(tmp_path / "f.lock", [("dfo_probe_f", "1.0", sha)])
        with Connector(inv) as conn, pytest.raises(HostError) as err:
            provision(conn, "kpro6", offline=True, lock=lock, wheelhouse_cache=tmp_path / "cache")
        assert err.value.host == "kpro6" and "not enough disk space" in err.value.message  # uv (38 MB) won't fit
        assert sandbox.run_ssh("kpro6", f"ls -A {small}").stdout == ""  # nothing was written on the host
    finally:
        subprocess.run([*in_host, "umount", str(small)], capture_output=True)
