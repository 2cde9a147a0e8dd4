"""The sshd processes of sandbox hosts: check a config, launch, wait for the banner, stop by PID."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Iterable

from orchestrator.testing.errors import SandboxError
from orchestrator.testing.host import SandboxHost
from orchestrator.testing.network import ssh_banner
from orchestrator.testing.processes import descendants, kill_pids

SSHD = "/usr/sbin/sshd"


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log, indented under an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (empty)"


def sshd_version(sshd: str) -> tuple[int, int]:
    proc = subprocess.run([sshd, "-V"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", proc.stdout + proc.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def check_configs(sshd: str, hosts: Iterable[SandboxHost]) -> None:
    """`sshd -t` on every host's config, concurrently; the first rejection is a SandboxError."""
    procs = [(h, [sshd, "-t", "-f", str(h.sshd_config)]) for h in hosts]
    running = [(h, argv, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True)) for h, argv in procs]
    for host, argv, proc in running:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise SandboxError(f"sshd rejected the config of {host.name}: {shlex.join(argv)}\n    {out.strip()}")


def launch(sshd: str, host: SandboxHost, *, own_hostname: bool) -> None:
    """Start the host's sshd in the foreground of its own session, logging to host.log_path."""
    argv = [sshd, "-D", "-e", "-f", str(host.sshd_config)]
    # Every wrapper execs the next program, so the Popen PID is sshd's PID.
    if own_hostname:
        argv = ["unshare", "--uts", "--", "/bin/sh", "-c", 'hostname "$0" && exec "$@"', host.name, *argv]
    if host.netns:
        argv = ["ip", "netns", "exec", host.netns, *argv]
    host.last_argv = argv
    with open(host.log_path, "ab") as log:
        log.write(f"--- orchestrator.sandbox {time.strftime('%H:%M:%S')}: {shlex.join(argv)}\n".encode())
        log.flush()
        # Own session: Ctrl-C in the terminal reaches us, not sshd; we stop it ourselves.
        host.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)


def wait_ready(host: SandboxHost, deadline: float, timeout: float) -> str | None:
    """None once host answers with an SSH banner, else why not (timeout: the wait, for the message)."""
    proc = host.proc
    if proc is None:
        return f"sshd for {host.name} is not running"
    while True:
        if proc.poll() is not None:
            return f"sshd for {host.name} exited with status {proc.returncode} before accepting connections"
        if ssh_banner(host.address, host.port):
            return None
        if time.monotonic() > deadline:
            return f"sshd for {host.name} did not accept connections on {host.address}:{host.port} within {timeout}s"
        time.sleep(0.005)


def kill_sshd(host: SandboxHost) -> None:
    """Stop the listener and its connections (by PID: never by name)."""
    proc = host.proc
    if proc is None:
        return
    if proc.poll() is None:
        victims = descendants(proc.pid)
        proc.terminate()
        try:
            proc.wait(2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2)
        left = kill_pids(victims)
        if left:
            raise SandboxError(f"processes of {host.name}'s sshd survived SIGKILL: {left}")
    else:
        proc.wait()
    host.proc = None
    host.pidfile.unlink(missing_ok=True)
