"""`dfo provision`: the payload's Python environment on a host, built with uv from a hash-pinned lock.

Public API (used by `dfo eval` and the CLI):

    provision(connector, host, *, offline=None, force=False, dry_run=False, events=None,
              lock=None, venv=None) -> ProvisionResult
        Make ``host``'s venv match its lock. ``result.python`` is the venv's interpreter on the host and
        ``result.status`` is "up-to-date" (nothing done), "installed" or "would-install" (dry run).
        offline=None decides per host (offline when it cannot reach the package index); True pushes a
        wheelhouse built on the controller and installs with `--offline --no-index`. Raises HostError
        (uv's message, the host, the step) or InputError (bad inventory/lock).
    provision_hosts(connector, hosts, **same options) -> {host: HostOutcome[ProvisionResult]}

How (facts in, plan out, then execute; see architecture.md "uv on the hosts"):
- one probe round trip gathers the host's Python, uv binaries, GPU (when the inventory does not say),
  and the venv's marker; the marker holds a hash of (lock, Python version, flavour/backend, uv version)
  and matching means nothing to do (the no-op path is one SSH exec);
- flavour: inventory ``torch_backend``/``gpu``, else nvidia-smi; lock ``remote_payload/requirements-
  <flavour>.lock`` (``requirements-cuda-<backend>.lock`` for another CUDA backend);
- uv: the host's own when it is recent enough, else the controller's uv binary pushed (hash-checked)
  into ``<workdir>/tools/uv-<version>/uv``; no shell profile is touched;
- offline: wheels downloaded on the controller (cached, see wheelhouse.py), pushed over the system ssh
  (only files the host lacks; sha256-checked on arrival), `uv pip sync --offline --no-index --find-links`;
- the marker is removed before anything changes and written only after a verified sync.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import posixpath
import shlex
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.core.errors import HostError, InputError
from orchestrator.core.events import Events, QuietEvents
from orchestrator.core.hashing import sha256_file
from orchestrator.core.inventory import Host
from orchestrator.provision.wheelhouse import (
    PAYLOAD_DIR,
    Lock,
    Target,
    Wheelhouse,
    build_wheelhouse,
    cached_wheelhouse,
    load_lock,
)
from orchestrator.transport import Connector, HostOutcome, for_each_host, hostcall
from orchestrator.transport.bulk import FAST_CIPHER, ssh_argv, ssh_binary

HOST_SCRIPT = Path(__file__).with_name("host_script.py")  # sent to the host on stdin, see transport.hostcall

MIN_HOST_UV = (0, 8, 0)  # --torch-backend, --allow-existing, --no-config and --require-hashes all behave
# Never installed next to a CPU build: triton beside fla breaks every Qwen3.5 forward on CPU (ml-stack.md).
FORBIDDEN = {"cpu": ["triton", "flash-linear-attention", "fla-core"]}
INDEX_HOSTS = ["pypi.org", "files.pythonhosted.org"]
PYTORCH_INDEX_HOST = "download.pytorch.org"
# Space a sync needs beyond the pushed wheels: uv unpacks into its cache, the venv hardlinks from there.
UNPACK_FACTOR = 2.5


# ------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class ControllerUv:
    path: str
    version: str

    @property
    def sha256(self) -> str:
        return _sha256_cached(self.path)


_SHA_CACHE: dict[tuple[str, float, int], str] = {}
_CONTROLLER_UV: ControllerUv | None = None


def _sha256_cached(path: str) -> str:
    st = os.stat(path)
    key = (path, st.st_mtime, st.st_size)
    if key not in _SHA_CACHE:
        _SHA_CACHE[key] = sha256_file(path)
    return _SHA_CACHE[key]


def controller_uv() -> ControllerUv:
    """The uv binary that ships in the controller's `uv` wheel (pushed to hosts that have none)."""
    global _CONTROLLER_UV
    if _CONTROLLER_UV is None:
        from orchestrator.provision.wheelhouse import _controller_uv

        path = _controller_uv()
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.split()
        if len(out) < 2 or out[0] != "uv":
            raise InputError(f"{path} does not look like uv (`uv --version` printed {' '.join(out)!r})")
        _CONTROLLER_UV = ControllerUv(path, out[1])
    return _CONTROLLER_UV


def _version_tuple(version: str | None) -> tuple[int, ...]:
    parts = []
    for piece in (version or "").split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


# ------------------------------------------------------------------------------ pure planning


@dataclass(frozen=True)
class UvChoice:
    path: str
    version: str
    source: str  # "host" (already on the host), "dfo" (pushed earlier), "push" (to push now)


def resolve_flavour(host: Host, gpu_found: bool | None) -> tuple[str, str | None]:
    """(flavour, torch backend) from the inventory, else from GPU detection. Backend None: the lock's."""
    backend = host.torch_backend
    if backend == "cpu":
        return "cpu", "cpu"
    if backend:  # cu128, cu130, ...: a GPU build was asked for explicitly
        return "cuda", backend
    gpu = host.gpu if host.gpu is not None else bool(gpu_found)
    return ("cuda", None) if gpu else ("cpu", "cpu")


def lock_path_for(flavour: str, backend: str | None, locks_dir: Path = PAYLOAD_DIR) -> Path:
    """The lock for a flavour; another CUDA backend than the shipped lock's needs its own lock file."""
    if flavour == "cpu":
        return locks_dir / "requirements-cpu.lock"
    specific = locks_dir / f"requirements-cuda-{backend}.lock"
    if backend and specific.is_file():
        return specific
    return locks_dir / "requirements-cuda.lock"


def choose_uv(found: list[dict], controller: ControllerUv, dfo_path: str) -> UvChoice:
    """The host's uv when it is recent enough; else dfo's own copy (pushed earlier or to push now)."""
    for entry in found:
        if entry["source"] == "host" and entry.get("version") and _version_tuple(entry["version"]) >= MIN_HOST_UV:
            return UvChoice(entry["path"], entry["version"], "host")
    for entry in found:
        if entry["source"] == "dfo" and entry["path"] == dfo_path and entry.get("version") == controller.version:
            return UvChoice(dfo_path, controller.version, "dfo")
    return UvChoice(dfo_path, controller.version, "push")


def marker_fields(lock: Lock, python_version: str | None, flavour: str, backend: str | None,
                  uv_version: str) -> dict:
    return {"lock": lock.name, "lock_sha256": lock.sha256, "python": python_version, "flavour": flavour,
            "torch_backend": backend, "uv": uv_version}


def marker_hash(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def marker_differences(stored: dict | None, expected: dict) -> list[str]:
    """Why a venv is not up to date, in words."""
    if not stored:
        return ["no dfo marker in the venv (never provisioned, or the last attempt did not finish)"]
    out = []
    if stored.get("lock_sha256") != expected["lock_sha256"]:
        out.append(f"lock changed ({stored.get('lock')} {str(stored.get('lock_sha256'))[:12]} -> "
                   f"{expected['lock']} {expected['lock_sha256'][:12]})")
    for key, label in (("python", "python"), ("flavour", "flavour"), ("torch_backend", "torch backend"),
                       ("uv", "uv")):
        if stored.get(key) != expected[key]:
            out.append(f"{label} {stored.get(key)} -> {expected[key]}")
    if not out and stored.get("hash") != marker_hash(expected):
        out.append("marker hash differs")
    return out


@dataclass
class ProvisionPlan:
    host: str
    venv: str
    flavour: str
    torch_backend: str | None
    lock: str
    lock_sha256: str
    python_version: str | None
    uv: UvChoice
    up_to_date: bool
    reasons: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)


def plan_provision(name: str, host: Host, venv: str, facts: dict, lock: Lock, flavour: str,
                   backend: str | None, uv: UvChoice, force: bool) -> ProvisionPlan:
    """Decide from the probe's facts whether the venv matches the lock, and what a sync would do."""
    py = facts.get("python") or {}
    stored = (facts.get("venv") or {}).get("marker")
    python_version = py.get("version") if py.get("found") else (stored or {}).get("python")
    expected = marker_fields(lock, python_version, flavour, backend, uv.version)
    reasons = []
    if force:
        reasons.append("--force")
    if not (facts.get("venv") or {}).get("python"):
        reasons.append(f"no venv at {venv}")
    reasons += [r for r in marker_differences(stored, expected) if not (r.startswith("no dfo marker") and
                                                                        any(x.startswith("no venv") for x in reasons))]
    up_to_date = not reasons and stored is not None and stored.get("hash") == marker_hash(expected)
    steps = []
    if not up_to_date:
        if uv.source == "push":
            steps.append(f"push uv {uv.version} to {uv.path}")
        steps.append(("recreate" if force else "create/keep") + f" venv {venv} with {host.python}"
                     + (f" (Python {python_version})" if python_version else ""))
        steps.append(f"uv pip sync {lock.name} ({len(lock.requirements)} pinned packages, flavour {flavour}"
                     + (f", torch backend {backend}" if backend else "") + ")")
        steps.append("verify installed packages, write the marker")
    return ProvisionPlan(name, venv, flavour, backend, lock.name, lock.sha256, python_version, uv, up_to_date,
                         reasons, steps)


def disk_shortfall(free_bytes: int | None, push_bytes: int, wheel_bytes: int) -> int:
    """Bytes missing for a sync (0 when it fits, or when free space is unknown)."""
    if free_bytes is None:
        return 0
    need = push_bytes + int(UNPACK_FACTOR * wheel_bytes)
    return max(0, need - free_bytes)


# ----------------------------------------------------------------------------------- results


@dataclass
class ProvisionResult:
    host: str
    status: str                 # "up-to-date" | "installed" | "would-install"
    python: str                 # the venv's interpreter on the host
    venv: str
    flavour: str
    torch_backend: str | None
    lock: str
    lock_sha256: str
    uv: str
    uv_version: str
    uv_source: str              # "host" | "dfo" | "pushed" (| "push" in a dry run)
    offline: bool | None
    reasons: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    pushed_files: int = 0
    pushed_bytes: int = 0
    wheelhouse: str | None = None
    packages: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------ execute


def _call(session, host: Host, func: str, python: str | None = None, **kwargs):
    return hostcall.call(session, HOST_SCRIPT, func, python=python or host.python, **kwargs)


def _probe(session, name: str, host: Host, venv: str, dfo_uv: str) -> dict:
    kwargs = dict(workdir=host.workdir, venv=venv, interpreter=host.python, dfo_uv=dfo_uv,
                  detect_gpu=host.gpu is None and host.torch_backend is None)
    try:
        return _call(session, host, "probe", **kwargs)
    except HostError as exc:
        if "cannot run the host's Python" not in exc.message:
            raise
    # The inventory's interpreter is missing: probe with any python3 so uv can say what it cannot find.
    for fallback in ("python3", "/usr/bin/python3"):
        if fallback != host.python:
            try:
                return _call(session, host, "probe", python=fallback, **kwargs)
            except HostError as exc:
                if "cannot run the host's Python" not in exc.message:
                    raise
    raise HostError(name, f"no Python interpreter on the host ({host.python!r}, python3 and /usr/bin/python3 "
                    "all failed to run)", hint="install python3 on the host or set 'python:' in the inventory")


def _failure(name: str, venv: str, res: dict) -> HostError:
    message = res.get("message", "").strip()
    low = message.lower()
    if "no space left" in low or "disk quota" in low:
        hint = "free disk space on the host, or point paths.venv / workdir at a larger filesystem"
    elif res["step"] == "uv venv" and ("interpreter" in low or "python" in low):
        hint = ("set 'python:' for this host in the inventory to an interpreter that exists, or "
                "'allow_python_download: true' (needs internet on the host)")
    elif res["step"] == "uv pip sync":
        hint = ("fix remote_payload/requirements-<flavour>.in and regenerate the lock "
                "(python -m orchestrator.provision.wheelhouse compile-lock ...); the venv is not marked as provisioned")
    else:
        hint = "the venv is not marked as provisioned; fix the cause and run dfo provision again"
    cmd = " ".join(shlex.quote(str(a)) for a in res.get("command", [])[:3])
    return HostError(name, f"{res['step']} failed for {venv} (`{cmd} …`):\n{message}", hint=hint)


def push_files(connector: Connector, name: str, files: dict[str, tuple[Path, str]], remote_dir: str, *,
               python: str, executable: bool = False,
               progress: Callable[[int, int], None] | None = None) -> int:
    """Upload ``files`` ({name: (local path, sha256)}) into ``remote_dir`` on host ``name``.

    Bytes go as one tar stream through the system ssh (fast cipher, no paramiko rekey trouble on multi-GB
    wheels) into a staging folder; the host checks every sha256 before moving files into place, so a
    broken transfer never leaves a file under its final name. Returns the bytes sent.
    """
    if not files:
        return 0
    session = connector.session(name)
    staging = posixpath.join(remote_dir, f".incoming-{uuid.uuid4().hex[:10]}")
    total = sum(p.stat().st_size for p, _ in files.values())
    if ssh_binary() is None:
        raise HostError(name, "the system `ssh` binary is needed for uploads and was not found",
                        hint="install openssh-client on the controller")
    remote = f"mkdir -p {shlex.quote(staging)} && tar -x -f - -C {shlex.quote(staging)}"
    proc = subprocess.Popen(ssh_argv(connector.resolved(name), remote, cipher=FAST_CIPHER),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    errors = bytearray()
    reader = threading.Thread(target=lambda: errors.extend(proc.stderr.read()), daemon=True)
    reader.start()
    sent = 0

    class _Counting:
        def __init__(self, fh):
            self.fh = fh

        def read(self, n=-1):
            nonlocal sent
            data = self.fh.read(n)
            sent += len(data)
            if progress:
                progress(sent, total)
            return data

    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for arcname, (path, _sha) in sorted(files.items()):
                info = tar.gettarinfo(str(path), arcname=arcname)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mode = 0o644
                with open(path, "rb") as fh:
                    tar.addfile(info, _Counting(fh))
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the remote side went away; its stderr says why
    code = proc.wait()
    reader.join(10)
    if code != 0:
        detail = errors.decode("utf-8", "replace").strip()[-1500:]
        session.run(["rm", "-rf", staging], check=False)  # tar wrote only into the staging folder
        raise HostError(name, f"upload into {staging} failed (ssh exit {code}): {detail or 'no message'}")
    hostcall.call(session, HOST_SCRIPT, "accept", python=python, staging=staging, dest=remote_dir,
                        files={n: sha for n, (_p, sha) in files.items()}, executable=executable)
    return sent


def _decide_offline(session, name: str, host: Host, python: str, facts: dict, lock: Lock,
                    offline: bool | None) -> bool:
    if offline is not None:
        return offline
    if facts.get("https_proxy"):
        return False
    targets = INDEX_HOSTS + ([PYTORCH_INDEX_HOST] if lock.online_torch_backend else [])
    reach = _call(session, host, "reachable", python=python, targets=targets)
    return not all(reach.values())


def provision(
    connector: Connector,
    host: str,
    *,
    offline: bool | None = None,
    force: bool = False,
    dry_run: bool = False,
    events: Events | None = None,
    lock: str | os.PathLike | None = None,
    venv: str | None = None,
    wheelhouse_cache: str | os.PathLike | None = None,
) -> ProvisionResult:
    """Make ``host``'s payload venv match its lock (see the module docstring).

    ``lock`` overrides the flavour's lock file (tests, experiments); ``venv`` overrides the inventory's
    venv path; ``wheelhouse_cache`` the controller cache root (default $DFO_CACHE or ~/.cache/dfo).
    ``events`` receives progress notices (the CLI renders them on stderr).
    """
    wheelhouse_cache = Path(wheelhouse_cache) if wheelhouse_cache else None
    started = time.monotonic()
    if host not in connector.inventory.hosts:
        raise InputError(f"unknown host {host!r}", hint=f"known hosts: {', '.join(connector.inventory.hosts)}")
    inv_host = connector.inventory.hosts[host]
    venv = venv or inv_host.venv
    events = events or QuietEvents()

    def note(message: str) -> None:
        events.info(f"{host}: {message}")

    cuv = controller_uv()
    dfo_uv = posixpath.join(inv_host.workdir, "tools", f"uv-{cuv.version}", "uv")
    session = connector.session(host)
    facts = _probe(session, host, inv_host, venv, dfo_uv)
    probe_python = inv_host.python if facts["python"].get("found") else "python3"

    gpu = facts.get("gpu") or {}
    flavour, backend = resolve_flavour(inv_host, gpu.get("found"))
    lk = load_lock(lock) if lock else load_lock(lock_path_for(flavour, backend))
    if lk.flavour and lk.flavour != flavour and not lock:
        raise InputError(f"{lk.path} declares flavour {lk.flavour!r} but host {host} needs {flavour!r}")
    if backend is None:
        backend = lk.torch_backend
    elif lk.torch_backend and lk.torch_backend != backend:
        raise InputError(
            f"{host}: torch_backend {backend!r} in the inventory, but {lk.path} is built for {lk.torch_backend!r}",
            hint=f"generate remote_payload/requirements-cuda-{backend}.lock (same packages, torch from the {backend} "
            f"index) or set torch_backend: {lk.torch_backend} for this host",
        )
    uv = choose_uv(facts["uv"], cuv, dfo_uv)
    plan = plan_provision(host, inv_host, venv, facts, lk, flavour, backend, uv, force)

    def result(status: str, **extra) -> ProvisionResult:
        return ProvisionResult(
            host=host, status=status, python=posixpath.join(venv, "bin", "python"), venv=venv, flavour=flavour,
            torch_backend=backend, lock=lk.name, lock_sha256=lk.sha256, uv=uv.path, uv_version=uv.version,
            uv_source=extra.pop("uv_source", uv.source), reasons=plan.reasons, steps=plan.steps,
            seconds=time.monotonic() - started, **extra,
        )

    if plan.up_to_date:
        return result("up-to-date", offline=offline,
                      packages=((facts["venv"].get("marker") or {}).get("packages") or {}))

    use_offline = _decide_offline(session, host, inv_host, probe_python, facts, lk, offline)
    target = Target.from_facts(facts["python"]) if facts["python"].get("found") else None
    if dry_run:
        steps = list(plan.steps)
        if use_offline:
            cached = cached_wheelhouse(lk, target, wheelhouse_cache) if target else None
            pool = posixpath.join(inv_host.workdir, "wheelhouse")
            if cached is None:
                steps.insert(-2, f"build a wheelhouse on the controller for {target.label if target else 'the venv'}")
                steps.insert(-2, "push the wheels the host lacks (hash-checked)")
            else:
                listing = _call(session, inv_host, "pool_listing", python=probe_python, pool=pool)
                missing = {n: m for n, m in cached.files.items() if listing.get(n) != m["size"]}
                steps.insert(-2, f"push {len(missing)} of {len(cached.files)} wheels "
                             f"({sum(m['size'] for m in missing.values()) / 2**20:.1f} MiB) to {pool}")
        plan.steps = steps
        return result("would-install", offline=use_offline)

    # 1. what must travel, and whether it fits -- decided before anything on the host changes
    uv_source = uv.source
    if uv.source == "push":
        machine = facts["python"].get("machine") if facts["python"].get("found") else None
        if machine and (machine != platform.machine() or not facts["python"].get("glibc")):
            raise HostError(
                host, f"no usable uv on the host (need >= {'.'.join(map(str, MIN_HOST_UV))}) and the controller's "
                f"uv is built for {platform.machine()} glibc Linux, the host is {machine}"
                + ("" if facts["python"].get("glibc") else " without glibc"),
                hint="install uv on the host (e.g. pip install --user uv) and run dfo provision again",
            )
    pool = posixpath.join(inv_host.workdir, "wheelhouse")
    wh: Wheelhouse | None = None
    if use_offline and target is not None:
        wh = build_wheelhouse(lk, target, root=wheelhouse_cache, host=host, on_notice=note)
    uv_bytes = os.path.getsize(cuv.path) if uv.source == "push" else 0
    if wh is not None:
        listing = _call(session, inv_host, "pool_listing", python=probe_python, pool=pool)
        new_bytes = sum(m["size"] for n, m in wh.files.items() if listing.get(n) != m["size"])
        short = disk_shortfall(facts.get("free_bytes"), uv_bytes + new_bytes, wh.total_bytes)
    else:
        short = disk_shortfall(facts.get("free_bytes"), uv_bytes, 0)
    if short:
        wheels = f"; wheels {_mib(wh.total_bytes)}, unpacked ~{UNPACK_FACTOR}x" if wh is not None else ""
        raise HostError(
            host, f"not enough disk space under {inv_host.workdir}: about {_mib(short)} more needed "
            f"({_mib(facts['free_bytes'])} free{', uv ' + _mib(uv_bytes) if uv_bytes else ''}{wheels})",
            hint="free disk space on the host, or point workdir / paths.venv at a larger filesystem",
        )

    # 2. uv
    if uv.source == "push":
        note(f"pushing uv {cuv.version} to {uv.path}")
        push_files(connector, host, {"uv": (Path(cuv.path), cuv.sha256)}, posixpath.dirname(uv.path),
                   python=probe_python, executable=True)
        uv_source = "pushed"

    # 3. venv (the marker goes away first: from here on a failure leaves a venv nobody takes for good)
    note(("recreating" if force else "preparing") + f" venv {venv}")
    res = _call(session, inv_host, "prepare_venv", python=probe_python, uv=uv.path, venv=venv,
                interpreter=inv_host.python, workdir=inv_host.workdir, clear=force,
                allow_download=inv_host.allow_python_download, offline=use_offline)
    if not res["ok"]:
        raise _failure(host, venv, res)
    venv_facts = res["python"]
    fields = marker_fields(lk, venv_facts["version"], flavour, backend, uv.version)
    fields["hash"] = marker_hash({k: v for k, v in fields.items() if k != "hash"})

    # 4. wheels (offline): only those the host's pool lacks or holds with other bytes
    pushed_files = pushed_bytes = 0
    if use_offline:
        venv_target = Target.from_facts(venv_facts)
        if wh is None or venv_target != target:  # the venv's interpreter is what counts
            wh = build_wheelhouse(lk, venv_target, root=wheelhouse_cache, host=host, on_notice=note)
        need = _call(session, inv_host, "pool_state", python=probe_python, pool=pool,
                     files={n: m["sha256"] for n, m in wh.files.items()})["need"]
        if need:
            push_bytes = sum(wh.files[n]["size"] for n in need)
            note(f"pushing {len(need)} of {len(wh.files)} wheels ({_mib(push_bytes)}) to {pool}")
            pushed_bytes = push_files(connector, host, {n: (wh.path / n, wh.files[n]["sha256"]) for n in need},
                                      pool, python=probe_python)
            pushed_files = len(need)
        else:
            note(f"all {len(wh.files)} wheels already on the host")
    wheelhouse_path = str(wh.path) if wh is not None and use_offline else None

    # 5. sync, verify, mark
    note(f"uv pip sync {lk.name}" + (" (offline)" if use_offline else ""))
    res = _call(session, inv_host, "sync", python=probe_python, uv=uv.path, venv=venv, workdir=inv_host.workdir,
                lock_name=f"{lk.sha256[:16]}-{lk.name}", lock_text=lk.text, marker=fields, offline=use_offline,
                find_links=pool, torch_backend=None if use_offline else lk.online_torch_backend,
                forbidden=FORBIDDEN.get(flavour, []))
    if not res["ok"]:
        raise _failure(host, venv, res)
    note(f"venv ready: {posixpath.join(venv, 'bin', 'python')} ({res['seconds']:.1f}s in uv pip sync)")
    return result("installed", offline=use_offline, uv_source=uv_source, pushed_files=pushed_files,
                  pushed_bytes=pushed_bytes, wheelhouse=wheelhouse_path, packages=res["packages"])


def _mib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def provision_hosts(connector: Connector, hosts: list[str], **options) -> dict[str, HostOutcome[ProvisionResult]]:
    """``provision`` on several hosts in parallel; one host failing does not stop the others."""
    return for_each_host(hosts, lambda h: provision(connector, h, **options))


__all__ = [
    "ProvisionPlan", "ProvisionResult", "UvChoice", "choose_uv", "controller_uv", "disk_shortfall", "lock_path_for",
    "marker_differences", "marker_fields", "marker_hash", "plan_provision", "provision", "provision_hosts",
    "push_files", "resolve_flavour",
]
