"""Errors that dfo reports to the user as one clear message (never a traceback).

Every expected failure is a ``DfoError``; the CLI prints ``message`` (and ``hint``) and exits with
``exit_code``: 2 for bad input (inventory, arguments), 1 for an operation that failed.
"""

from __future__ import annotations


class DfoError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class InputError(DfoError):
    """The user's input is wrong: inventory file, command-line arguments, paths that do not exist."""

    exit_code = 2


class OperationError(DfoError):
    """An operation was attempted and failed (network, remote command, verification)."""

    exit_code = 1


class HostError(OperationError):
    """An operation failed on one host; ``host`` names it so multi-host output can attribute it."""

    def __init__(self, host: str, message: str, hint: str | None = None):
        super().__init__(f"{host}: {message}", hint)
        self.host = host
        self.detail = message


class ConnectionLost(HostError):
    """The SSH link to a host failed or stopped answering (connect, handshake, a dropped or silent channel).

    Worth a retry on a fresh connection; the remote side may still be running (a detached job is).
    """
