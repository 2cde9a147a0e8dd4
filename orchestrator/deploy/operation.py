"""`dfo deploy`: ship the compiled-clean payload to hosts as verified, content-addressed releases.

Plan (pure) from facts: the local manifest and each host's current release (hashed on the host).
Execute: stage (reusing files the host already has), upload only what is missing, verify every hash on
the host, then switch the `payload` symlink atomically; the previous release is kept for rollback.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.core.events import Events, QuietEvents
from orchestrator.deploy.manifest import Manifest, build_manifest, check_compiles
from orchestrator.deploy.protocol import ReleaseState, Staged, Switched
from orchestrator.transport import Connector, HostOutcome, for_each_host, hostcall
from orchestrator.transport.hostlock import host_lock

HOST_SCRIPT = Path(__file__).with_name("host_script.py")  # sent to the host on stdin, see transport.hostcall


@dataclass
class DeployPlan:
    host: str
    release: str
    current: str | None
    changed: list[str] = field(default_factory=list)   # new or different on the host
    removed: list[str] = field(default_factory=list)   # on the host, not in the payload any more
    upload_bytes: int = 0

    @property
    def up_to_date(self) -> bool:
        return self.current == self.release and not self.changed and not self.removed


@dataclass
class DeployResult:
    host: str
    status: str                 # "up-to-date" | "deployed" | "would-deploy" | "rolled-back"
    release: str
    previous: str | None = None
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    plan: DeployPlan | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["plan"] = asdict(self.plan) if self.plan else None
        return d


def plan_host(host: str, manifest: Manifest, host_state: ReleaseState) -> DeployPlan:
    """What a deploy would change on one host, from the host's own hashes of its current release."""
    remote = host_state.files
    changed = [p for p, f in sorted(manifest.files.items()) if remote.get(p) != f["sha256"]]
    removed = sorted(set(remote) - set(manifest.files))
    return DeployPlan(
        host=host, release=manifest.release_id, current=host_state.current, changed=changed,
        removed=removed, upload_bytes=sum(manifest.files[p]["size"] for p in changed),
    )


def payload_dir(workdir: str) -> str:
    """Where the active payload lives on a host (cwd for `python -m remote_payload`)."""
    return posixpath.join(workdir, "payload")


def deploy(
    connector: Connector,
    hosts: list[str],
    *,
    root: Path,
    dry_run: bool = False,
    events: Events | None = None,
) -> dict[str, HostOutcome[DeployResult]]:
    check_compiles(root)  # before touching any host: a syntax error deploys nothing anywhere
    manifest = build_manifest(root)
    events = events or QuietEvents()
    return for_each_host(hosts, lambda h: _deploy_host(connector, h, root, manifest, dry_run, events))


def _deploy_host(connector, host, root, manifest, dry_run, events: Events) -> DeployResult:
    if dry_run:
        return _deploy_locked(connector, host, root, manifest, dry_run, events)
    with host_lock(connector, host, "deploy") as notices:  # no other dfo changes this host meanwhile
        for notice in notices:
            events.warn(notice)
        return _deploy_locked(connector, host, root, manifest, dry_run, events)


def _deploy_locked(connector, host, root, manifest, dry_run, events: Events) -> DeployResult:
    started = time.monotonic()
    inv_host = connector.inventory.hosts[host]
    session = connector.session(host)
    call = lambda func, **kw: hostcall.call(session, HOST_SCRIPT, func, python=inv_host.python, **kw)  # noqa: E731
    plan = plan_host(host, manifest, ReleaseState.from_host(host, call("state", workdir=inv_host.workdir)))
    if plan.up_to_date:
        return DeployResult(host, "up-to-date", manifest.release_id, plan=plan, seconds=time.monotonic() - started)
    if dry_run:
        return DeployResult(host, "would-deploy", manifest.release_id, plan=plan, seconds=time.monotonic() - started)
    staged = Staged.from_host(host, call("prepare", workdir=inv_host.workdir, release=manifest.release_id,
                                         files=manifest.files), manifest.files)
    need = staged.need
    total = sum(manifest.files[p]["size"] for p in need)
    with events.transfer(f"{host}: uploading", total) as advance:
        sent = 0
        for rel in need:
            base = sent
            session.put(root / rel, posixpath.join(staged.staging, rel),
                        progress=lambda done, _total, base=base: advance(base + done))
            sent += manifest.files[rel]["size"]
    done = Switched.from_host(host, call("commit", workdir=inv_host.workdir, release=manifest.release_id,
                                         files=manifest.files, staging=staged.staging))
    return DeployResult(
        host, "deployed", manifest.release_id, previous=done.previous, uploaded_files=len(need),
        uploaded_bytes=total, plan=plan, seconds=time.monotonic() - started,
    )


def rollback(connector: Connector, hosts: list[str], *, dry_run: bool = False) -> dict[str, HostOutcome[DeployResult]]:
    def one(host: str) -> DeployResult:
        if dry_run:
            return one_locked(host)
        with host_lock(connector, host, "roll back"):
            return one_locked(host)

    def one_locked(host: str) -> DeployResult:
        inv_host = connector.inventory.hosts[host]
        session = connector.session(host)
        if dry_run:
            st = ReleaseState.from_host(host, hostcall.call(session, HOST_SCRIPT, "state", python=inv_host.python,
                                                            workdir=inv_host.workdir))
            return DeployResult(host, "would-roll-back", st.previous or "-", previous=st.current)
        done = Switched.from_host(host, hostcall.call(session, HOST_SCRIPT, "rollback", python=inv_host.python,
                                                      workdir=inv_host.workdir))
        return DeployResult(host, "rolled-back", done.release, previous=done.previous)

    return for_each_host(hosts, one)
