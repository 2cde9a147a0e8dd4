"""Sandbox host names: the inventory's rule, narrowed to what `hostname` accepts (a host's name is its hostname)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from orchestrator.core.inventory import HOST_NAME_RE
from orchestrator.testing.errors import SandboxError
from orchestrator.testing.host import HOST_NAME_MAX, check_host_name

GOOD = ["kpro6", "ct129", "judge-a", "gpu1.lab", "A9", "x" * HOST_NAME_MAX]
# Valid inventory names that cannot be hostnames, then names neither accepts.
BAD = ["a_b", "a-", "a.", "a..b", "a-.b", "x" * (HOST_NAME_MAX + 1), "kpro6; rm -rf /", "-a", ""]


@pytest.mark.parametrize("name", GOOD)
def test_accepted_names_are_inventory_names(name):
    check_host_name(name)
    assert HOST_NAME_RE.match(name)


@pytest.mark.parametrize("name", BAD)
def test_refused_names(name):
    with pytest.raises(SandboxError, match="bad host name"):
        check_host_name(name)


def test_the_inventory_allows_what_hostname_refuses():
    # Why the sandbox narrows the inventory's rule instead of using it alone.
    assert HOST_NAME_RE.match("a_b") and HOST_NAME_RE.match("a-")


def _can_set_hostname() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and \
        subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0


@pytest.mark.parametrize("name", GOOD + BAD[:5])
def test_rule_agrees_with_hostname(name):
    """The real `hostname` (in a throw-away UTS namespace) accepts exactly the names the rule accepts."""
    if not _can_set_hostname():
        pytest.skip("needs root and unshare --uts to try names with hostname(1)")
    tried = subprocess.run(["unshare", "--uts", "hostname", name], capture_output=True, text=True, timeout=10)
    try:
        check_host_name(name)
        accepted = True
    except SandboxError:
        accepted = False
    assert (tried.returncode == 0) == accepted, tried.stderr
