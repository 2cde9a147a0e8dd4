"""What every command gets: the inventory (loaded on first use), consoles and an SSH connector.

Like httpie's environment object: commands and operations take this instead of reaching for globals,
so tests can inject their own consoles and inventory.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from orchestrator.core.inventory import Inventory, inventory_path, load_inventory
from orchestrator.ui.safe_console import SafeConsole


def _console(stderr: bool) -> Console:
    # Piped or redirected output gets a wide page instead of rich's 80 columns, so tables stay readable
    # in logs and CI; a terminal keeps its own width ($COLUMNS still wins).
    probe = SafeConsole(stderr=stderr)
    width = None if probe.is_terminal or os.environ.get("COLUMNS") else 160
    # SafeConsole: whatever a command prints, the hosts' text in it carries no control characters.
    return SafeConsole(stderr=stderr, highlight=False, width=width)


@dataclass
class AppContext:
    inventory_arg: str | None = None
    trust_new_host_keys: bool = False
    connect_timeout: float = 10.0
    # stdout carries results (tables, or JSON with --json); stderr carries progress and notices.
    out: Console = field(default_factory=lambda: _console(stderr=False))
    err: Console = field(default_factory=lambda: _console(stderr=True))
    _inventory: Inventory | None = None
    _connector: Any = None  # a transport.Connector, created on first use (paramiko loads late)

    @property
    def inventory_path(self) -> Path:
        return inventory_path(self.inventory_arg)

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.inventory_path)
        return self._inventory

    @property
    def events(self):
        """Progress and notices of long operations, rendered on stderr."""
        from orchestrator.ui.console_events import ConsoleEvents

        return ConsoleEvents(self.err)

    def out_events(self):
        """The same, on stdout (for commands whose job output is the result, e.g. `dfo jobs logs`)."""
        from orchestrator.ui.console_events import ConsoleEvents

        return ConsoleEvents(self.out)

    def reload_inventory(self) -> Inventory:
        self._inventory = None
        return self.inventory

    @property
    def connector(self):
        from orchestrator.transport import Connector  # paramiko/fabric load only for commands that connect

        if self._connector is None:
            self._connector = Connector(
                self.inventory,
                trust_new_host_keys=self.trust_new_host_keys,
                connect_timeout=self.connect_timeout,
                on_notice=lambda msg: self.err.print(Text(msg, style="yellow")),
            )
        return self._connector

    def close(self) -> None:
        if self._connector is not None:
            self._connector.close()

    def print_json(self, data: Any) -> None:
        """Machine-readable output: exactly one JSON document on stdout."""
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()
