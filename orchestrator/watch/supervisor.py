"""--detach: the watcher under a small supervisor process on the controller.

``start`` launches ``python -m orchestrator.watch.supervisor`` in its own session (it survives the
terminal closing), with the watch command line minus --detach. The supervisor runs the watcher as its
child and starts it again when it dies (backoff 10 s doubling to 5 min); bad input (exit 2) or a clean
exit stops it. SIGTERM to the supervisor stops the watcher too. Its pid is in ``supervisor.pid`` and the
output of both in ``watch.log`` in the series folder. A restarted watcher resumes from series.json.

For a supervisor you already run, use the same command without --detach: the systemd user unit shipped
as ``orchestrator/watch/dfo-watch@.service`` or a tmux window (docs/watch.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

BACKOFF_START, BACKOFF_MAX = 10.0, 300.0
INPUT_ERROR = 2


def start(folder: Path, dfo_args: list[str]) -> int:
    """Start the supervisor detached; returns its pid."""
    folder.mkdir(parents=True, exist_ok=True)
    log = open(folder / "watch.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.watch.supervisor", str(folder), *dfo_args],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            close_fds=True)
    log.close()
    (folder / "supervisor.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def running_pid(folder: Path) -> int | None:
    try:
        pid = int((folder / "supervisor.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:  # a recycled pid is not ours
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid
    return pid if b"orchestrator.watch.supervisor" in cmdline else None


def supervise(folder: Path, dfo_args: list[str], *, argv: list[str] | None = None,
              sleep=time.sleep, clock=time.monotonic) -> int:
    """Run the watcher (``argv``: its command line, default `python -m orchestrator DFO_ARGS`) until it exits
    0 or 2 or SIGTERM stops it, restarting it after each other exit with the backoff."""
    child: subprocess.Popen | None = None
    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    backoff = BACKOFF_START
    while True:
        started = clock()
        child = subprocess.Popen(argv or [sys.executable, "-m", "orchestrator", *dfo_args], stdin=subprocess.DEVNULL)
        code = child.wait()
        if stopping or code in (0, INPUT_ERROR):
            print(f"dfo watch supervisor: watcher exited with {code}; stopping", flush=True)
            return code
        if clock() - started > BACKOFF_MAX:
            backoff = BACKOFF_START  # it ran a good while: a fresh failure, not a crash loop
        print(f"dfo watch supervisor: watcher exited with {code}; restarting in {backoff:.0f}s", flush=True)
        sleep(backoff)
        if stopping:
            return code
        backoff = min(BACKOFF_MAX, backoff * 2)


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1]), sys.argv[2:]))
