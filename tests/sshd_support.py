"""Skip helpers for tests that need real OpenSSH test hosts (importable under a unique module name)."""

from __future__ import annotations

import os
import shutil

import pytest

from orchestrator.testing.sandbox import SSHD


def require_sshd() -> None:
    """Skip (with the fix) when this machine cannot run real test hosts."""
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} not found: apt-get install -y openssh-server (needed for real-sshd tests)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not found: apt-get install -y openssh-client (needed for real-sshd tests)")
