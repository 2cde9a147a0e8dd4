"""Facts about hosts (reachability, auth, Python, GPUs, free disk, latency) for `inventory check --connect`.

Facts in, decisions elsewhere: this module only observes. The facts are ``host_script.host_facts``, run with
the host's Python through hostcall (the paths travel as JSON, never through a shell). When the inventory's
interpreter does not run, Python is reported missing and the rest is measured with python3 (or
/usr/bin/python3), as provision's probe does; on a host with no Python at all nothing else is measured, and
no shell fallback is kept for it: every dfo operation on a host runs a host script, so such a host is
reported as what it is. The reply is data from another machine: each field is checked before it is shown.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.core.errors import DfoError, HostError
from orchestrator.transport import Connector, for_each_host, hostcall

HOST_SCRIPT = Path(__file__).with_name("host_script.py")
FALLBACK_PYTHONS = ("python3", "/usr/bin/python3")
_VERSION_RE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+[A-Za-z0-9+.]{0,20}")


@dataclass
class HostFacts:
    host: str
    reachable: bool
    error: str | None = None
    hint: str | None = None
    auth: str = ""
    python: str | None = None
    gpus: list[str] = field(default_factory=list)
    free_disk: dict[str, int | None] = field(default_factory=dict)
    latency_ms: float = 0.0
    connect_ms: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def parse_facts(host: str, reply: object, paths: list[str], *, python_runs: bool) -> HostFacts:
    """HostFacts from ``host_facts``'s reply (None: no interpreter ran). Only the paths asked about are kept."""
    facts = HostFacts(host=host, reachable=True, free_disk={p: None for p in paths})
    if reply is None:
        return facts
    if not isinstance(reply, dict):
        raise HostError(host, f"host_facts: unexpected reply from the host: {str(reply)[:200]}")
    version = reply.get("python")
    if python_runs and isinstance(version, str) and _VERSION_RE.fullmatch(version):
        facts.python = version
    gpus = reply.get("gpus")
    facts.gpus = [g[:200] for g in gpus if isinstance(g, str)] if isinstance(gpus, list) else []
    free = reply.get("free_disk")
    for p in paths:
        value = free.get(p) if isinstance(free, dict) else None
        facts.free_disk[p] = value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
    return facts


def host_paths(connector: Connector, name: str) -> list[str]:
    host = connector.inventory.hosts[name]
    paths = [host.workdir, host.venv, host.paths.checkpoints, host.paths.models]
    return list(dict.fromkeys(p for p in paths if p))


def _facts_reply(session, python: str, paths: list[str]) -> tuple[object, str | None]:
    """(the reply, the interpreter that gave it): the inventory's first, then the usual python3s."""
    for candidate in dict.fromkeys((python, *FALLBACK_PYTHONS)):
        try:
            return hostcall.call(session, HOST_SCRIPT, "host_facts", python=candidate, timeout=120,
                                 paths=paths), candidate
        except HostError as exc:
            if "cannot run the host's Python" not in exc.message:
                raise
    return None, None


def gather_one(connector: Connector, name: str) -> HostFacts:
    try:
        session = connector.session(name)
    except DfoError as exc:
        return HostFacts(host=name, reachable=False, error=exc.message.removeprefix(f"{name}: "), hint=exc.hint)
    latency = session.round_trip_seconds() * 1000
    paths = host_paths(connector, name)
    python = connector.inventory.hosts[name].python
    reply, ran_with = _facts_reply(session, python, paths)
    facts = parse_facts(name, reply, paths, python_runs=ran_with == python)
    facts.auth = session.auth
    facts.latency_ms = latency
    facts.connect_ms = session.connect_seconds * 1000
    return facts


def gather_facts(connector: Connector, names: list[str]) -> dict[str, HostFacts]:
    outcomes = for_each_host(names, lambda n: gather_one(connector, n))
    return {
        n: o.value if o.ok and o.value is not None else HostFacts(host=n, reachable=False, error=str(o.error))
        for n, o in outcomes.items()
    }
