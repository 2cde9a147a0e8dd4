"""The watcher's calls on hosts: list a checkpoint folder on the training host (the only I/O discovery needs),
remove a relayed checkpoint from the eval host once it was evaluated, and the stripped copies a relay left
on the training host.

Both are ``host_script`` functions run with the host's own Python through ``hostcall`` (folders and names
travel as JSON arguments, never through a shell). The listing is data from another machine:
``discovery.parse_listing`` checks every field before anything uses it.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from orchestrator.relay.strip import STRIP_DIR, strip_key
from orchestrator.transport import Connector, hostcall

__all__ = ["list_folder", "remove_relayed", "remove_stripped", "strip_key"]

HOST_SCRIPT = Path(__file__).with_name("host_script.py")


def list_folder(connector: Connector, host: str, folder: str) -> object:
    """The host's raw answer for ``folder`` (``{"error": …}`` when the folder cannot be listed)."""
    python = connector.inventory.hosts[host].python
    return hostcall.call(connector.session(host), HOST_SCRIPT, "list_folder", python=python, timeout=120,
                         folder=folder)


def remove_relayed(connector: Connector, host: str, root: str, name: str) -> None:
    """Remove ROOT/NAME (a relayed checkpoint folder) and its manifest from HOST."""
    python = connector.inventory.hosts[host].python
    hostcall.call(connector.session(host), HOST_SCRIPT, "remove_relayed", python=python, timeout=300, root=root,
                  name=name)


def remove_stripped(connector: Connector, host: str, keys: list[str]) -> list[str]:
    """Remove <workdir>/relay-strip/KEY on HOST for each KEY (``strip_key``); returns those that were there."""
    inv_host = connector.inventory.hosts[host]
    removed = hostcall.call(connector.session(host), HOST_SCRIPT, "remove_stripped", python=inv_host.python,
                            timeout=300, root=posixpath.join(inv_host.workdir, STRIP_DIR), keys=keys)
    return [k for k in removed if k in keys] if isinstance(removed, list) else []
