"""The only place that touches SSH.

``Connector`` hands out verified, cached sessions per inventory host (control plane, Fabric/paramiko);
``bulk`` builds system-`ssh` argv for the data plane; ``pool`` runs per-host work in parallel.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable

from orchestrator.core.inventory import Inventory
from orchestrator.transport.pool import HostOutcome, for_each_host
from orchestrator.transport.resolve import ResolvedHost, resolve_host

if TYPE_CHECKING:
    from orchestrator.transport.control import CommandResult, HostSession, command_line, fingerprint

# paramiko (~0.4 s to import) loads on the first control-plane connection, not with the package: a relay's
# data plane and the pure commands never need it.
_CONTROL_NAMES = {"CommandResult", "HostSession", "command_line", "fingerprint"}


def __getattr__(name: str):
    if name in _CONTROL_NAMES:
        from orchestrator.transport import control

        return getattr(control, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CommandResult", "Connector", "HostOutcome", "HostSession", "command_line", "fingerprint", "for_each_host",
]


class Connector:
    """Opens (once) and caches one verified session per host; thread-safe."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        trust_new_host_keys: bool = False,
        connect_timeout: float = 10.0,
        on_notice: Callable[[str], None] | None = None,
    ):
        self.inventory = inventory
        self.trust_new_host_keys = trust_new_host_keys
        self.connect_timeout = connect_timeout
        self.on_notice = on_notice
        self._sessions: dict[str, "HostSession"] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.host_locks: dict[str, int] = {}  # host lock depth per host (transport.hostlock)

    def resolved(self, name: str) -> ResolvedHost:
        return resolve_host(self.inventory, name, connect_timeout=self.connect_timeout)

    def session(self, name: str) -> "HostSession":
        from orchestrator.transport.control import connect

        with self._guard:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            existing = self._sessions.get(name)
            if existing is not None and existing.transport is not None and existing.transport.is_active():
                return existing
            session = connect(self.resolved(name), trust_new=self.trust_new_host_keys, on_trust=self.on_notice)
            self._sessions[name] = session
            return session

    def drop(self, name: str) -> None:
        """Forget (and close) a host's session, e.g. after its connection broke."""
        with self._guard:
            session = self._sessions.pop(name, None)
        if session is not None:
            session.close()

    def close(self) -> None:
        with self._guard:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()

    def __enter__(self) -> "Connector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
