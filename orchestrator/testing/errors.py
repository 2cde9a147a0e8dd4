"""The sandbox's one error type (every module of the package raises it)."""


class SandboxError(RuntimeError):
    """A sandbox step failed. The message says what, the command, and the sshd log tail where relevant."""
