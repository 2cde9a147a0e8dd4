"""Real OpenSSH test hosts on this machine: the kpro6/ct129 topology for the test suite and `dfo demo`.

Each host is a real ``sshd`` with throw-away keys, its own root directory (workdir, checkpoints, models)
and, when we are root, its own Linux network namespace joined to this machine by a veth pair on a
private /24. The namespaces have no route to each other (nor to anything else), so kpro6 cannot reach
ct129 while the controller reaches both -- the same shape as the team's real hosts. Without network
namespaces (not root, or ``DFO_SANDBOX_NETNS=0``) the hosts run on 127.0.0.2, 127.0.0.3, ... and can
reach each other; ``isolated`` is then False and ``reason`` says why, so tests can skip.

The sandbox writes, in its root: ``known_hosts``, ``ssh_config`` (usable with ``ssh -F`` and Fabric) and
``inventory.yaml`` (dfo's inventory format). Teardown kills only processes it started (by PID, never by
name: other sshd run on this machine) and removes the namespaces, veths and routes it created.

Stdlib + subprocess (plus the inventory's host-name rule): used by tests/conftest.py and by the demo
command. This module orchestrates; the parts live beside it (host, network, sshd, host_files, processes,
state). Manual use (the command is at the end of this module):

    python -m orchestrator.testing.sandbox up ROOT        # start, print paths, wait for Ctrl-C, tear down
    python -m orchestrator.testing.sandbox up ROOT --keep # start and leave running
    python -m orchestrator.testing.sandbox down ROOT      # tear down a sandbox left running with --keep
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from orchestrator.testing import host_files, network, sshd
from orchestrator.testing.errors import SandboxError
from orchestrator.testing.host import SandboxHost, make_hosts
from orchestrator.testing.network import ROUTE_METRIC
from orchestrator.testing.processes import kill_pids, pids_with_env
from orchestrator.testing.sshd import SSHD
from orchestrator.testing.state import STATE_FILE, holds_running_sandbox, manual_cleanup, state_of, teardown_state

__all__ = ["HOST_PYTHON", "ROUTE_METRIC", "SSHD", "STATE_FILE", "Sandbox", "SandboxError", "SandboxHost",
           "teardown_state"]

HOST_PYTHON = "/usr/bin/python3"  # Debian's interpreter; sshd sessions have a minimal PATH

# ------------------------------------------------------------------------------------- exit hooks

_live: set[Sandbox] = set()  # started and not torn down; cleaned at exit / on SIGTERM
_hooks_installed = False


def _cleanup_live(*_: Any) -> None:
    for box in list(_live):
        # A forked child (e.g. a multiprocessing worker) inherits _live and these hooks: only the
        # process that started a sandbox may tear it down.
        if not box.keep and box._owner_pid == os.getpid():
            try:
                box._teardown()
            except Exception as exc:  # at exit there is nobody left to raise to
                print(f"orchestrator.testing.sandbox: teardown of {box.root} incomplete: {exc}", file=sys.stderr)


def _on_signal(signum: int, frame: Any) -> None:
    _cleanup_live()
    # Then die of the same signal, as we would have without this handler.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    atexit.register(_cleanup_live)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:  # never replace someone else's handler
                signal.signal(sig, _on_signal)


# ------------------------------------------------------------------------------------- sandbox


class Sandbox:
    """Real sshd test hosts. Use as a context manager, or call start() and stop().

    root:    directory for everything (created); hosts live in ROOT/hosts/NAME/.
    hosts:   names (roles: kpro6 train, ct129 eval, otherwise the first train and the rest eval)
             or a mapping name -> roles.
    netns:   True/False to force; None: on unless DFO_SANDBOX_NETNS=0. Falls back to 127.0.0.x
             when namespaces are unavailable (see `isolated` and `reason`).
    keep:    stop() leaves everything running and prints how to clean up.
    own_home: sessions get HOME=ROOT/hosts/NAME/home (own ~/.cache, no dotfiles of this machine,
             so the sshd default PATH); off by default: without it all hosts share this user's home.
    """

    # Ten parameters, but all after `hosts` are keyword-only options with defaults (the public API).
    def __init__(
        self,
        root: str | os.PathLike,
        hosts: Sequence[str] | Mapping[str, Sequence[str]] = ("kpro6", "ct129"),
        *,
        netns: bool | None = None,
        keep: bool = False,
        user: str | None = None,
        python: str = HOST_PYTHON,
        sshd: str = SSHD,
        start_timeout: float = 10.0,
        own_home: bool = False,
    ):
        self.root = Path(root).absolute()
        self.keep = keep
        self.user = user or pwd.getpwuid(os.getuid()).pw_name
        self.python = python
        self.sshd = sshd
        self.start_timeout = start_timeout
        self.own_home = own_home
        self.run_id = secrets.token_hex(3)
        self.inventory_path = self.root / "inventory.yaml"
        self.ssh_config_path = self.root / "ssh_config"
        self.known_hosts_path = self.root / "known_hosts"
        self.client_key = self.root / "client_key"
        self.state_path = self.root / STATE_FILE
        self.hosts: dict[str, SandboxHost] = make_hosts(hosts, self.root / "hosts")

        if netns is None:
            env = os.environ.get("DFO_SANDBOX_NETNS", "1").strip().lower()
            self._want_netns = env not in ("0", "no", "false", "off")
            self._no_netns_reason = "network namespaces disabled by DFO_SANDBOX_NETNS=0"
        else:
            self._want_netns = netns
            self._no_netns_reason = "network namespaces disabled by the caller (netns=False)"
        self.isolated = False
        self.reason = "not started"
        self.own_hostname = False  # each host has its own hostname (UTS namespace)
        self._penalties_option = False  # set at start: the sshd knows PerSourcePenalties
        self._cleanups: list[tuple[str, Callable[[], object]]] = []
        self._started = False
        self._owner_pid = os.getpid()

    # ------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.stop()
        except SandboxError as err:
            if exc is None:
                raise
            # Do not hide the error that ended the block; report the teardown trouble beside it.
            print(f"orchestrator.testing.sandbox: {err}", file=sys.stderr)

    def start(self) -> Sandbox:
        if self._started:
            return self
        if not os.path.isfile(self.sshd) or not os.access(self.sshd, os.X_OK):
            raise SandboxError(f"{self.sshd} not found: install openssh-server (apt-get install -y openssh-server)")
        if holds_running_sandbox(self.state_path):  # a previous sandbox left with keep=True
            raise SandboxError(
                f"{self.root} holds a sandbox that is still running; "
                f"tear it down first: python -m orchestrator.testing.sandbox down {self.root}"
            )
        _install_hooks()
        self._owner_pid = os.getpid()
        _live.add(self)
        self._started = True
        try:
            self._start()
        except BaseException:
            try:
                self._teardown()
            except SandboxError as err:
                print(f"orchestrator.testing.sandbox: {err}", file=sys.stderr)
            raise
        return self

    def _start(self) -> None:
        self._make_dirs_and_keys()
        self.isolated, self.reason = self._netns_available()
        # An own UTS namespace (so `hostname` says kpro6/ct129) needs root; without it hosts share ours.
        self.own_hostname = (os.geteuid() == 0 and shutil.which("unshare") is not None
                             and subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0)
        if self.isolated:
            for index, host in enumerate(self.hosts.values()):
                network.setup_host_network(host, self.run_id, index, self._push)
        else:
            # No namespace to empty at teardown: find detached remote jobs by the run marker in
            # their environment (set by sshd's SetEnv) instead.
            marker = f"DFO_SANDBOX_RUN={self.run_id}".encode()
            self._push("stop leftover remote processes", lambda: kill_pids(pids_with_env(marker)))
            for index, host in enumerate(self.hosts.values()):
                host.address = f"127.0.0.{index + 2}"
                host.port = network.free_port(host.address)

        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self._penalties_option = sshd.sshd_version(self.sshd) >= (9, 8)
        for host in self.hosts.values():
            self._write_sshd_config(host)
        sshd.check_configs(self.sshd, self.hosts.values())
        self._boot(list(self.hosts.values()))
        self._write_known_hosts()
        host_files.write_atomic(self.ssh_config_path, host_files.ssh_config_text(self))
        host_files.write_atomic(self.inventory_path, host_files.inventory_text(self))
        self._write_state()

    def _make_dirs_and_keys(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for host in self.hosts.values():
            for d in (host.root_dir, host.workdir, host.checkpoints, host.models):
                d.mkdir(parents=True, exist_ok=True)
            if self.own_home:
                host.home.mkdir(exist_ok=True)
        host_files.keygen([self.client_key, *(h.host_key for h in self.hosts.values())], f"dfo-sandbox-{self.run_id}")
        pub = self.client_key.with_name(self.client_key.name + ".pub").read_text()
        for host in self.hosts.values():
            host_files.write_atomic(host.authorized_keys, pub, 0o600)

    def _netns_available(self) -> tuple[bool, str]:
        if not self._want_netns:
            return False, self._no_netns_reason
        return network.netns_available(f"dfo-{self.run_id}-probe")

    def stop(self) -> None:
        """Tear everything down (or, with keep=True, leave it running and say how to clean up)."""
        if not self._started:
            return
        if self.keep:
            _live.discard(self)
            print(self.cleanup_hint(), file=sys.stderr)
            return
        self._teardown()

    def _teardown(self) -> None:
        errors = []
        for host in self.hosts.values():
            try:
                sshd.kill_sshd(host)
            except Exception as exc:
                errors.append(f"stop sshd of {host.name}: {exc}")
        while self._cleanups:
            what, fn = self._cleanups.pop()
            try:
                fn()
            except Exception as exc:
                errors.append(f"{what}: {exc}")
        self.state_path.unlink(missing_ok=True)
        self._started = False
        _live.discard(self)
        if errors:
            raise SandboxError("sandbox teardown incomplete:\n  " + "\n  ".join(errors))

    def _push(self, what: str, fn: Callable[[], object]) -> None:
        """Register the undo of a resource right after creating it, so any later failure removes it."""
        self._cleanups.append((what, fn))

    def cleanup_hint(self) -> str:
        lines = [f"Sandbox left running in {self.root}:"]
        for h in self.hosts.values():
            lines.append(f"  ssh -F {self.ssh_config_path} {h.name}    # {h.address}:{h.port}, sshd pid {h.pid}")
        lines.append(f"Clean up with: {shlex.quote(sys.executable)} -m orchestrator.testing.sandbox down {self.root}")
        lines.append("  (by hand: " + "; ".join(manual_cleanup(state_of(self))) + ")")
        return "\n".join(lines)

    def _write_state(self) -> None:
        if self._started:
            host_files.write_atomic(self.state_path, json.dumps(state_of(self), indent=2) + "\n")

    # ------------------------------------------------------------------------- sshd

    def _write_sshd_config(self, host: SandboxHost) -> None:
        text = host_files.sshd_config_text(host, self.run_id, own_home=self.own_home,
                                           penalties_option=self._penalties_option)
        host_files.write_atomic(host.sshd_config, text)

    def _launch(self, host: SandboxHost) -> None:
        sshd.launch(self.sshd, host, own_hostname=self.own_hostname)

    def _wait_ready(self, host: SandboxHost, deadline: float) -> str | None:
        return sshd.wait_ready(host, deadline, self.start_timeout)

    def _boot(self, hosts: list[SandboxHost]) -> None:
        for host in hosts:
            self._launch(host)
        deadline = time.monotonic() + self.start_timeout
        for host in hosts:  # they start concurrently, so waiting in turn costs no extra time
            for attempt in range(5):
                error = self._wait_ready(host, deadline)
                if error is None:
                    break
                port_taken = "Address already in use" in sshd.tail(host.log_path, 5)
                if self.isolated or not port_taken or attempt == 4:
                    sshd.kill_sshd(host)
                    raise SandboxError(f"{error}\n  command: {shlex.join(host.last_argv)}\n"
                                       f"  log {host.log_path}:\n{sshd.tail(host.log_path)}")
                # 127.0.0.x: someone took the free port between our check and sshd's bind.
                sshd.kill_sshd(host)
                host.port = network.free_port(host.address)
                self._write_sshd_config(host)
                self._launch(host)

    def stop_host(self, name: str) -> None:
        """Stop a host's sshd (and its sessions): connections are then refused."""
        sshd.kill_sshd(self.host(name))
        self._write_state()

    def start_host(self, name: str) -> None:
        """Start a stopped host again on the same address and port."""
        host = self.host(name)
        if host.running:
            return
        self._launch(host)
        error = self._wait_ready(host, time.monotonic() + self.start_timeout)
        if error:
            sshd.kill_sshd(host)
            raise SandboxError(f"{error}\n  log {host.log_path}:\n{sshd.tail(host.log_path)}")
        self._write_state()

    def regenerate_host_key(self, name: str) -> str:
        """Give a host a new key and restart it; known_hosts keeps the old one (a mismatch).
        Returns the new public key line."""
        host = self.host(name)
        was_running = host.running
        sshd.kill_sshd(host)
        host_files.keygen([host.host_key], f"dfo-sandbox-{self.run_id}-{name}")
        if was_running:
            self.start_host(name)
        return host.host_key_pub.read_text().strip()

    # ------------------------------------------------------------------------- network faults

    def link_down(self, name: str, *, drop: bool = False) -> None:
        """Cut a host's link. Default: this machine's side goes down, connects fail at once
        ("No route to host"). drop=True: the host's side goes down instead, packets are silently
        dropped and connects time out (like a dead host behind a switch)."""
        network.set_link(self._isolated_host(name, "link_down"), False, host_side=drop)

    def link_up(self, name: str) -> None:
        """Restore a host's link; returns once its sshd (if running) answers again."""
        host = self._isolated_host(name, "link_up")
        network.set_link(host, True, host_side=False)
        network.set_link(host, True, host_side=True)
        # The kernel reports carrier a few hundred ms later; wait so callers do not race it.
        if host.running:
            error = self._wait_ready(host, time.monotonic() + self.start_timeout)
            if error:
                raise SandboxError(f"after link_up: {error}\n  log {host.log_path}:\n{sshd.tail(host.log_path)}")

    def _isolated_host(self, name: str, what: str) -> SandboxHost:
        host = self.host(name)
        if not self.isolated:
            raise SandboxError(f"{what} needs network namespaces, which this sandbox does not have: {self.reason}")
        return host

    # ------------------------------------------------------------------------- client side

    def host(self, name: str) -> SandboxHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise SandboxError(f"no sandbox host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def known_hosts_line(self, name: str) -> str:
        return host_files.known_hosts_line(self.host(name))

    def _write_known_hosts(self) -> None:
        host_files.write_atomic(self.known_hosts_path, "".join(self.known_hosts_line(n) + "\n" for n in self.hosts))

    def forget_host_key(self, name: str) -> None:
        """Remove the host's lines from known_hosts (its key becomes unknown)."""
        pattern = self.host(name).known_hosts_name
        path = self.known_hosts_path
        lines = path.read_text().splitlines(keepends=True) if path.exists() else []
        host_files.write_atomic(path, "".join(ln for ln in lines if not host_files.known_hosts_matches(ln, pattern)))

    def trust_host_key(self, name: str) -> None:
        """Record the host's current key in known_hosts (replacing any older line for it)."""
        self.forget_host_key(name)
        with open(self.known_hosts_path, "a") as f:
            f.write(self.known_hosts_line(name) + "\n")

    def ssh_argv(self, name: str, *remote: str) -> list[str]:
        """argv for the system ssh to a host through the generated ssh_config (for pipes)."""
        self.host(name)
        return ["ssh", "-F", str(self.ssh_config_path), name, *remote]

    def run_ssh(self, name: str, command: str, **kwargs: Any) -> subprocess.CompletedProcess:
        """Run a command on a host with the system ssh; captures text output, 60 s timeout by default."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("timeout", 60)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.ssh_argv(name, command), **kwargs)

    def exec_in(self, name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run a local command inside the host's network namespace (locally when not isolated)."""
        host = self.host(name)
        if host.netns:
            argv = ["ip", "netns", "exec", host.netns, *argv]
        return subprocess.run(list(argv), **kwargs)

    def summary(self) -> str:
        mode = "isolated (network namespaces)" if self.isolated else f"NOT isolated: {self.reason}"
        lines = [f"sandbox {self.root} ({mode})"]
        for h in self.hosts.values():
            where = f"netns {h.netns}, veth {h.veth}" if h.netns else "loopback"
            lines.append(f"  {h.name:8} {h.address}:{h.port}  {where}, sshd pid {h.pid}, workdir {h.workdir}")
        lines += [f"  inventory    {self.inventory_path}", f"  ssh_config   {self.ssh_config_path}",
                  f"  known_hosts  {self.known_hosts_path}", f"  client key   {self.client_key}"]
        return "\n".join(lines)


# -------------------------------------------------------- the command: python -m orchestrator.testing.sandbox


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.testing.sandbox",
                                     description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start test hosts, print paths, wait for Ctrl-C, tear down")
    up.add_argument("root")
    up.add_argument("--hosts", default="kpro6,ct129", help="comma-separated host names (default: kpro6,ct129)")
    up.add_argument("--no-netns", action="store_true", help="use 127.0.0.x instead of network namespaces")
    up.add_argument("--keep", action="store_true", help="leave the hosts running and exit")
    down = sub.add_parser("down", help="tear down a sandbox left running with --keep")
    down.add_argument("root")
    return parser


def _up(args: argparse.Namespace) -> None:
    if not args.keep:
        # A shell without job control starts background commands with SIGINT ignored, and the ignore is
        # inherited; this command promises Ctrl-C (or kill -INT), so it takes SIGINT back before any host
        # exists (an interrupted start tears down what it made).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    box = Sandbox(args.root, [n for n in args.hosts.split(",") if n], netns=False if args.no_netns else None,
                  keep=args.keep)
    t0 = time.monotonic()
    with box:
        print(box.summary())
        print(f"started in {time.monotonic() - t0:.2f}s; try: ssh -F {box.ssh_config_path} "
              f"{next(iter(box.hosts))} hostname")
        if not args.keep:
            print("Ctrl-C to stop and tear down.")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print("\ntearing down")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "down":
            for line in teardown_state(args.root):
                print(line)
        else:
            _up(args)
        return 0
    except SandboxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
