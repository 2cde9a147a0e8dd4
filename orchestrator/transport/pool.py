"""Run one function per host in a bounded thread pool and keep every host's outcome.

Fabric's ThreadingGroup has no concurrency cap and stops at the first failure's exception; dfo wants
"the other hosts still finish, and each host says what happened to it".
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Generic, Iterable, TypeVar, cast

from orchestrator.core.errors import DfoError, HostError

T = TypeVar("T")
MAX_PARALLEL_HOSTS = 8


@dataclass
class HostOutcome(Generic[T]):
    host: str
    value: T | None = None
    error: DfoError | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def result(self) -> T:
        """The value ``fn`` returned; raises the host's error when it failed (``.value`` is None then)."""
        if self.error is not None:
            raise self.error
        return cast(T, self.value)  # no error: ``value`` holds what ``fn`` returned, a T (which may be None)


def for_each_host(
    hosts: Iterable[str], fn: Callable[[str], T], max_workers: int = MAX_PARALLEL_HOSTS
) -> dict[str, HostOutcome[T]]:
    """``fn(host)`` for every host in parallel; results in the given host order."""
    names = list(hosts)

    def one(name: str) -> HostOutcome[T]:
        started = time.monotonic()
        try:
            return HostOutcome(name, value=fn(name), seconds=time.monotonic() - started)
        except DfoError as exc:
            return HostOutcome(name, error=exc, seconds=time.monotonic() - started)
        except Exception as exc:  # an unexpected bug on one host must not hide the others' results
            return HostOutcome(name, error=HostError(name, f"{type(exc).__name__}: {exc}"),
                               seconds=time.monotonic() - started)

    if len(names) <= 1:
        return {n: one(n) for n in names}
    # Daemon threads, waited for with a timeout: Ctrl-C ends the wait at once, and the process exits without
    # them. (A ThreadPoolExecutor's workers are joined at exit, so a connect to a silent host held an interrupt
    # for the whole connect timeout.)
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for name in names:
        todo.put(name)
    outcomes: dict[str, HostOutcome[T]] = {}
    lock, finished = threading.Lock(), threading.Event()

    def worker() -> None:
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            try:
                outcome = one(name)
            except BaseException as exc:  # noqa: BLE001 - the waiting thread must hear of every host
                outcome = HostOutcome(name, error=HostError(name, f"{type(exc).__name__}: {exc}"))
            with lock:
                outcomes[name] = outcome
                if len(outcomes) == len(names):
                    finished.set()

    for i in range(min(max_workers, len(names))):
        threading.Thread(target=worker, name=f"dfo-host-{i}", daemon=True).start()
    while not finished.wait(0.25):
        pass
    return {n: outcomes[n] for n in names}
