"""What `dfo inventory check` finds without connecting: every rule a command applies before it reaches a host.

Each host is resolved as a command resolves it (ssh_config read, jump chain built: a loop or a hop that would
reach ssh as an option is refused), the files its resolution names must exist (the ssh_config, every key,
the known_hosts file unless new host keys are to be trusted and recorded), and every ``${VAR}`` of its
``env`` must be set. Problems are collected for all hosts, not just the first.
"""

from __future__ import annotations

import os

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import Inventory, expand_env_value
from orchestrator.transport.resolve import ResolvedHost, resolve_host


def inventory_problems(inv: Inventory, names: list[str], *, trust_new_host_keys: bool) -> list[str]:
    """One line per problem (host first), in host order, each said once."""
    problems: list[str] = []
    for name in names:
        for problem in _host_problems(inv, name, trust_new_host_keys):
            if problem not in problems:
                problems.append(problem)
    return problems


def _host_problems(inv: Inventory, name: str, trust_new_host_keys: bool) -> list[str]:
    problems = _env_problems(inv, name)
    try:
        resolved = resolve_host(inv, name)
    except InputError as exc:
        return [_prefixed(name, exc)] + problems
    for hop in resolved.chain():
        label = hop.name if hop.name in inv.hosts else f"{name}: jump host {hop.name!r}"
        problems += _file_problems(inv, hop, label, trust_new_host_keys)
    return problems


def _env_problems(inv: Inventory, name: str) -> list[str]:
    problems = []
    for key, value in inv.hosts[name].env.items():
        try:
            expand_env_value(name, key, value)
        except InputError as exc:
            problems.append(_prefixed(name, exc))
    return problems


def _file_problems(inv: Inventory, hop: ResolvedHost, label: str, trust_new_host_keys: bool) -> list[str]:
    own = inv.hosts.get(hop.name)
    problems = []
    for key in hop.identity_files:
        if not os.path.isfile(key):
            origin = (f"hosts.{hop.name}.identity_file" if own is not None and own.identity_file
                      else f"IdentityFile in {hop.ssh_config}")
            problems.append(f"{label}: key file {key} does not exist ({origin})")
    if not trust_new_host_keys and not os.path.isfile(hop.known_hosts):
        origin = (f"hosts.{hop.name}.known_hosts" if own is not None and own.known_hosts
                  else "UserKnownHostsFile or ssh's default")
        problems.append(f"{label}: known_hosts file {hop.known_hosts} does not exist ({origin}): no host key can "
                        "be verified; run with --trust-new-host-keys once to record them")
    return problems


def _prefixed(name: str, exc: InputError) -> str:
    text = exc.message if exc.message.startswith(f"{name}:") else f"{name}: {exc.message}"
    return text + (f" ({exc.hint})" if exc.hint else "")
