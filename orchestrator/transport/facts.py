"""Facts about hosts (reachability, auth, Python, GPUs, free disk, latency) for `inventory check`.

Facts in, decisions elsewhere: this module only observes. One shell round trip per host gathers
everything; values reach the remote shell quoted.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field

from orchestrator.core.errors import DfoError
from orchestrator.transport import Connector, for_each_host


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


def facts_script(python: str, paths: list[str]) -> str:
    """A POSIX sh script printing tagged lines; every path is quoted."""
    lines = [
        f"echo PY=$({shlex.quote(python)} -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo)",
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU=/'; fi",
    ]
    for p in paths:
        q = shlex.quote(p)
        # Free space where the path is, or would be created (its nearest existing parent).
        lines.append(
            f"p={q}; while [ ! -e \"$p\" ] && [ \"$p\" != / ]; do p=$(dirname \"$p\"); done; "
            f"echo DF={q}=$(df -Pk \"$p\" 2>/dev/null | awk 'NR==2 {{print $4}}')"
        )
    return "\n".join(lines) + "\n"


def parse_facts(host: str, text: str, paths: list[str]) -> HostFacts:
    facts = HostFacts(host=host, reachable=True)
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "PY":
            facts.python = value.strip() or None
        elif key == "GPU":
            facts.gpus.append(value.strip())
        elif key == "DF":
            path, _, kib = value.rpartition("=")
            facts.free_disk[path] = int(kib) * 1024 if kib.strip().isdigit() else None
    for p in paths:
        facts.free_disk.setdefault(p, None)
    return facts


def host_paths(connector: Connector, name: str) -> list[str]:
    host = connector.inventory.hosts[name]
    paths = [host.workdir, host.venv, host.paths.checkpoints, host.paths.models]
    return list(dict.fromkeys(p for p in paths if p))


def gather_one(connector: Connector, name: str) -> HostFacts:
    try:
        session = connector.session(name)
    except DfoError as exc:
        return HostFacts(host=name, reachable=False, error=exc.message.removeprefix(f"{name}: "), hint=exc.hint)
    started = time.monotonic()
    session.run("true")
    latency = (time.monotonic() - started) * 1000
    paths = host_paths(connector, name)
    result = session.run(["sh", "-c", facts_script(connector.inventory.hosts[name].python, paths)])
    facts = parse_facts(name, result.text, paths)
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
