"""From an inventory host to what SSH needs to reach it: ssh_config applied, defaults filled, jump chain built.

The inventory's own fields win over ssh_config; every value that came from ssh_config passes the same checks
as the inventory's (it reaches the system ssh's argv as well). Nothing here opens a connection.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic_core import PydanticCustomError

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import ADDRESS_RE, USER_RE, Inventory, check_port
from orchestrator.transport import ssh_config
from orchestrator.transport.ssh_config import SshConfigHost

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_JUMP_RE = re.compile(r"(?:(?P<user>[^@]+)@)?(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>\d+))?")


@dataclass(frozen=True)
class ResolvedHost:
    """Everything needed to open SSH to one host, after ssh_config and defaults are applied."""

    name: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: str
    ssh_config: str | None
    proxy_jump: "ResolvedHost | None" = None
    connect_timeout: float = 10.0
    extra: dict = field(default_factory=dict, compare=False)
    alias: str = ""  # the name ssh_config was looked up with (the system ssh must look up the same one)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    def chain(self) -> list["ResolvedHost"]:
        """This host and every hop before it, nearest first."""
        hops: list[ResolvedHost] = []
        hop: ResolvedHost | None = self
        while hop is not None:
            hops.append(hop)
            hop = hop.proxy_jump
        return hops


def local_path(value: str, base: Path) -> str:
    """A controller path from the inventory: ``~`` expanded, relative to the inventory's folder."""
    p = Path(os.path.expanduser(value))
    return str(p if p.is_absolute() else (base / p).resolve())


def ssh_config_path(inv: Inventory) -> str | None:
    """The ssh_config file in force: the inventory's, else ~/.ssh/config when it exists."""
    if inv.ssh_config:
        return local_path(inv.ssh_config, inv.source.parent)
    default = Path.home() / ".ssh" / "config"
    return str(default) if default.is_file() else None


def resolve_host(inv: Inventory, name: str, connect_timeout: float = 10.0, _seen: tuple = ()) -> ResolvedHost:
    """Merge the inventory entry with ssh_config (explicit inventory fields win)."""
    host = inv.hosts[name]
    cfg_path = ssh_config_path(inv)
    alias = host.ssh_alias or host.address or name
    cfg = ssh_config.lookup(cfg_path, alias)
    base = inv.source.parent
    port = host.port or _cfg_port(cfg)
    user = host.user or cfg.user or getpass.getuser()
    identity = ((local_path(host.identity_file, base),) if host.identity_file
                else tuple(cfg.expand_path(p, user=user, port=port) for p in cfg.identity_files))
    known = (local_path(host.known_hosts, base) if host.known_hosts
             else _cfg_known_hosts(cfg, user, port, base))
    jump = _jump_chain(inv, host.proxy_jump or cfg.proxy_jump, connect_timeout, _seen + (name,))
    return _checked(ResolvedHost(
        name=name, hostname=cfg.hostname, port=port, user=user, identity_files=identity, known_hosts=known,
        ssh_config=cfg_path, proxy_jump=jump, connect_timeout=connect_timeout, alias=alias,
    ))


def _cfg_port(cfg: SshConfigHost) -> int:
    try:
        return check_port(cfg.port or 22)
    except PydanticCustomError:
        raise InputError(f"{cfg.source}: Port {cfg.port!r} (for {cfg.alias}): expected an integer 1-65535") from None


def _cfg_known_hosts(cfg: SshConfigHost, user: str, port: int, base: Path) -> str:
    """The first UserKnownHostsFile (where paramiko reads and records keys), else ssh's default."""
    first = cfg.known_hosts_files[0] if cfg.known_hosts_files else DEFAULT_KNOWN_HOSTS
    return local_path(cfg.expand_path(first, user=user, port=port), base)


def _checked(host: ResolvedHost, label: str | None = None) -> ResolvedHost:
    """Values that came from ssh_config reach the system ssh's argv too: same rules as the inventory's."""
    for what, value, pattern in (("HostName", host.hostname, ADDRESS_RE), ("User", host.user, USER_RE),
                                 ("host", host.alias, ADDRESS_RE)):
        if not pattern.match(value or ""):
            raise InputError(f"{label or host.name}: {what} {value!r} (from {host.ssh_config or 'the inventory'}) "
                             "is not a plain host or user name",
                             hint="a value starting with '-' would be read as an ssh option")
    return host


def _jump_chain(inv: Inventory, spec: str | None, timeout: float, seen: tuple) -> ResolvedHost | None:
    """``ProxyJump a,b``: reach ``a``, through it ``b``, through that the host; the last hop is returned,
    each hop's ``proxy_jump`` is the one before it (an inventory hop keeps its own jump when first)."""
    if not spec or spec.strip().lower() == "none":
        return None
    previous: ResolvedHost | None = None
    for part in spec.split(","):
        hop = _resolve_jump(inv, part.strip(), timeout, seen)
        if previous is not None:
            hop = replace(hop, proxy_jump=previous)
        previous = hop
    return previous


def _resolve_jump(inv: Inventory, spec: str, timeout: float, seen: tuple) -> ResolvedHost:
    """A ProxyJump hop: an inventory host name, or ``[user@]host[:port]`` / an ssh_config alias."""
    if spec in seen:
        raise InputError(f"proxy_jump loop through {' -> '.join(seen + (spec,))}",
                         hint="a host cannot be reached through itself; fix proxy_jump (or ProxyJump in ssh_config)")
    if spec in inv.hosts:
        return resolve_host(inv, spec, timeout, seen)
    m = _JUMP_RE.fullmatch(spec)
    if not m:
        raise InputError(f"{seen[-1]}: cannot parse proxy jump {spec!r}",
                         hint="use an inventory host name or [user@]host[:port]")
    cfg_path = ssh_config_path(inv)
    alias = m["host"].strip("[]")
    cfg = ssh_config.lookup(cfg_path, alias)
    port = int(m["port"]) if m["port"] else _cfg_port(cfg)
    user = m["user"] or cfg.user or getpass.getuser()
    return _checked(ResolvedHost(
        name=spec, hostname=cfg.hostname, port=port, user=user,
        identity_files=tuple(cfg.expand_path(p, user=user, port=port) for p in cfg.identity_files),
        known_hosts=_cfg_known_hosts(cfg, user, port, inv.source.parent), ssh_config=cfg_path,
        proxy_jump=_jump_chain(inv, cfg.proxy_jump, timeout, seen + (spec,)), connect_timeout=timeout, alias=alias,
    ), label=f"{seen[-1]}: proxy jump {spec!r}")


def hosts_jumping_through(inv: Inventory, name: str) -> list[str]:
    """The other inventory hosts whose jump chain passes through NAME (their proxy_jump or ssh_config's
    ProxyJump). A host that cannot be resolved is judged by its proxy_jump field alone."""
    found = []
    for other, host in inv.hosts.items():
        if other == name:
            continue
        try:
            hops = [hop.name for hop in resolve_host(inv, other).chain()[1:]]
        except InputError:
            hops = [part.strip() for part in (host.proxy_jump or "").split(",")]
        if name in hops:
            found.append(other)
    return found
