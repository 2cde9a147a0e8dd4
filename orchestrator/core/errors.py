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


PAYLOAD_ERROR_PREFIX = "dfo-payload error: "


def payload_error_text(output: str) -> str | None:
    """What a failed payload said, as one line for a message: its own ``dfo-payload error:`` line, else, where
    it ended in a Python traceback (a payload bug), only the exception's line, never the traceback's frames.
    None: neither (the caller shows what else it has)."""
    lines = output.splitlines()
    for line in reversed(lines):
        if line.startswith(PAYLOAD_ERROR_PREFIX):
            return line[len(PAYLOAD_ERROR_PREFIX):].strip()
    if not any(line.startswith("Traceback (most recent call last)") for line in lines):
        return None
    last = next((line for line in reversed(lines) if line.strip() and not line.startswith((" ", "\t"))), "")
    return (f"the payload stopped on an unexpected error ({last.strip()[:200]}): a bug in dfo's payload, "
            "please report it")
