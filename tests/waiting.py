"""``wait_for``: the one way tests wait for something another process does (importable by any test module)."""

from __future__ import annotations

import subprocess
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 30.0, every: float = 0.05,
             proc: subprocess.Popen | None = None) -> T:
    """Poll until ``predicate()`` is truthy and return that value.

    The deadline is against hangs, not a speed assertion: past ``timeout`` seconds, or as soon as ``proc``
    (a process the condition depends on) has ended, an AssertionError names ``what``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            stderr = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}: {stderr}")
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout:.0f}s")
        time.sleep(every)
