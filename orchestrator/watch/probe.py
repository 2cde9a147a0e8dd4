"""List a checkpoint folder on the training host (the only I/O discovery needs).

The listing is ``host_script.list_folder``, run with the host's own Python through ``hostcall`` (the
folder travels as a JSON argument, never through a shell). Its answer is data from another machine:
``discovery.parse_listing`` checks every field before anything uses it.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.transport import Connector, hostcall

HOST_SCRIPT = Path(__file__).with_name("host_script.py")


def list_folder(connector: Connector, host: str, folder: str) -> object:
    """The host's raw answer for ``folder`` (``{"error": …}`` when the folder cannot be listed)."""
    python = connector.inventory.hosts[host].python
    return hostcall.call(connector.session(host), HOST_SCRIPT, "list_folder", python=python, timeout=120,
                         folder=folder)
