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

Pure stdlib + subprocess: used by tests/conftest.py and by the demo command. Manual use:

    python -m orchestrator.testing.sandbox up ROOT        # start, print paths, wait for Ctrl-C, tear down
    python -m orchestrator.testing.sandbox up ROOT --keep # start and leave running
    python -m orchestrator.testing.sandbox down ROOT      # tear down a sandbox left running with --keep
"""

from __future__ import annotations

import argparse
import atexit
import base64
import hashlib
import hmac
import ipaddress
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

SSHD = "/usr/sbin/sshd"
HOST_PYTHON = "/usr/bin/python3"  # Debian's interpreter; sshd sessions have a minimal PATH
DEFAULT_HOSTS: dict[str, list[str]] = {"kpro6": ["train"], "ct129": ["eval"]}
NETNS_BASE_PORT = 2222  # inside a fresh namespace every port is free; not 22, so dfo must honour `port`
# Our subnets get an "unreachable" route with this metric: it reserves the /24 atomically (a second
# `ip route add` of the same route fails) and, while a veth is down, keeps packets for the sandbox
# addresses from leaking out of the default route to the real network.
ROUTE_METRIC = 4242
SUBNET_SECOND_OCTETS = range(200, 251)  # 10.200-250.x.0/24
STATE_FILE = "sandbox.json"
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,30}$")


class SandboxError(RuntimeError):
    """A sandbox step failed. The message says what, the command, and the sshd log tail where relevant."""


# ------------------------------------------------------------------------------------- helpers


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (empty)"


def _run(argv: Sequence[str], what: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a short local command; a failure becomes a SandboxError naming the step and the command."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SandboxError(f"{what}: command not found: {argv[0]}") from None
    except subprocess.TimeoutExpired:
        raise SandboxError(f"{what}: timed out after {timeout}s: {shlex.join(argv)}") from None
    if proc.returncode != 0:
        out = (proc.stderr or proc.stdout).strip()
        raise SandboxError(f"{what} failed (exit {proc.returncode}): {shlex.join(argv)}\n    {out}")
    return proc


def _keygen(paths: Iterable[Path], comment: str) -> None:
    """Generate ed25519 keys, all at once (ssh-keygen is the slowest part of starting)."""
    procs = []
    for path in paths:
        for p in (path, path.with_name(path.name + ".pub")):
            p.unlink(missing_ok=True)  # ssh-keygen would ask before overwriting
        argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
        try:
            procs.append((argv, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)))
        except FileNotFoundError:
            raise SandboxError("ssh-keygen not found: install openssh-client") from None
    for argv, proc in procs:
        out, _ = proc.communicate(timeout=30)
        if proc.returncode != 0:
            raise SandboxError(f"key generation failed: {shlex.join(argv)}\n    {out.strip()}")
        os.chmod(argv[-1], 0o600)  # ssh refuses a private key readable by others


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _quote_conf(value: object) -> str:
    """A value for sshd_config / ssh_config: quoted only when it contains whitespace."""
    s = str(value)
    return f'"{s}"' if re.search(r'\s', s) else s


_YAML_PLAIN = re.compile(r"^[A-Za-z0-9/_][A-Za-z0-9/_.+@-]*$")
_YAML_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _yaml_str(value: str) -> str:
    """A YAML scalar for a string: plain when unambiguous, else a JSON string (valid YAML)."""
    try:
        float(value)
        numeric = True
    except ValueError:
        numeric = False
    if _YAML_PLAIN.match(value) and value.lower() not in _YAML_RESERVED and not numeric:
        return value
    return json.dumps(value)


def _proc_state(pid: int) -> str | None:
    """The process state letter from /proc, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0]


def _alive(pid: int) -> bool:
    return _proc_state(pid) not in (None, "Z")  # a zombie is dead, just not yet reaped


def _descendants(pid: int) -> list[int]:
    """All processes below pid (e.g. an sshd's per-connection processes and their commands)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pids_with_env(entry: bytes) -> list[int]:
    """Processes (that we may inspect) whose environment holds `entry`, e.g. b"DFO_SANDBOX_RUN=ab12cd"."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if entry in env.split(b"\0"):
            found.append(int(pid))
    return found


def _kill_pids(pids: Iterable[int], grace: float = 2.0) -> list[int]:
    """SIGTERM, wait up to `grace`, then SIGKILL. Returns the PIDs still alive afterwards."""
    pids = [p for p in pids if _alive(p)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 2.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [p for p in pids if _alive(p)]


def _netns_pids(netns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(x) for x in proc.stdout.split() if x.isdigit()] if proc.returncode == 0 else []


def _sshd_version(sshd: str) -> tuple[int, int]:
    proc = subprocess.run([sshd, "-V"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", proc.stdout + proc.stderr)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _ssh_banner(address: str, port: int) -> bool:
    """True when address:port answers with an SSH banner (our sshd is listening)."""
    try:
        with socket.create_connection((address, port), timeout=0.5) as sock:
            sock.settimeout(1.0)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """IPv4 networks already in use on this machine: interface addresses and routes."""
    addrs = _run(["ip", "-j", "-4", "addr"], "listing addresses").stdout
    routes = _run(["ip", "-j", "-4", "route", "show", "table", "all"], "listing routes").stdout
    nets = []
    try:
        for link in json.loads(addrs or "[]"):
            for a in link.get("addr_info", []):
                nets.append(ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network)
        for r in json.loads(routes or "[]"):
            if r.get("dst", "default") != "default":
                nets.append(ipaddress.ip_network(r["dst"], strict=False))
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"cannot read `ip -j` output (iproute2 too old?): {exc}") from None
    return nets


def _known_hosts_matches(line: str, pattern: str) -> bool:
    """Does a known_hosts line name `pattern` (plain, comma list, or hashed |1|salt|hash)?"""
    fields = line.split()
    if not fields or fields[0].startswith(("#", "@")):
        return False
    for name in fields[0].split(","):
        if name == pattern:
            return True
        if name.startswith("|1|"):
            try:
                _, _, salt, digest = name.split("|")
                mac = hmac.new(base64.b64decode(salt), pattern.encode(), hashlib.sha1).digest()
            except ValueError:
                continue
            if hmac.compare_digest(mac, base64.b64decode(digest)):
                return True
    return False


# ------------------------------------------------------------------------------------- hosts


@dataclass
class SandboxHost:
    """One fake host. Paths are on this machine's filesystem, which the hosts share."""

    name: str
    roles: list[str]
    root_dir: Path
    address: str = ""
    port: int = 0
    netns: str | None = None  # network namespace (None when not isolated)
    veth: str | None = None  # host-side veth (None when not isolated)
    subnet: str | None = None  # e.g. "10.213.7.0/24"; the host is .2, this machine's side .1
    gateway: str | None = None  # this machine's address on the host's link (.1)
    proc: subprocess.Popen | None = field(default=None, repr=False)
    last_argv: list[str] = field(default_factory=list, repr=False)  # how sshd was last started

    @property
    def workdir(self) -> Path:
        return self.root_dir / "dfo"

    @property
    def checkpoints(self) -> Path:
        return self.root_dir / "checkpoints"

    @property
    def models(self) -> Path:
        return self.root_dir / "models"

    @property
    def home(self) -> Path:
        """HOME of the host's sessions with own_home=True."""
        return self.root_dir / "home"

    @property
    def host_key(self) -> Path:
        return self.root_dir / "host_key"

    @property
    def host_key_pub(self) -> Path:
        return self.root_dir / "host_key.pub"

    @property
    def sshd_config(self) -> Path:
        return self.root_dir / "sshd_config"

    @property
    def authorized_keys(self) -> Path:
        return self.root_dir / "authorized_keys"

    @property
    def log_path(self) -> Path:
        return self.root_dir / "sshd.log"

    @property
    def pidfile(self) -> Path:
        return self.root_dir / "sshd.pid"

    @property
    def pid(self) -> int | None:
        """The sshd listener's PID while it runs."""
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def known_hosts_name(self) -> str:
        return self.address if self.port == 22 else f"[{self.address}]:{self.port}"


# ------------------------------------------------------------------------------------- sandbox

_live: set["Sandbox"] = set()  # started and not torn down; cleaned at exit / on SIGTERM
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

        if isinstance(hosts, Mapping):
            roles = {name: list(r) for name, r in hosts.items()}
        else:
            names = list(hosts)
            roles = {
                name: DEFAULT_HOSTS.get(name, ["train"] if i == 0 else ["eval"]) for i, name in enumerate(names)
            }
            if len(set(names)) != len(names):
                raise SandboxError(f"duplicate host names: {names}")
        if not roles:
            raise SandboxError("a sandbox needs at least one host")
        for name in roles:
            if not HOST_NAME_RE.match(name):
                raise SandboxError(f"bad host name {name!r}: use letters, digits and '-' (at most 31)")
        self.hosts: dict[str, SandboxHost] = {
            name: SandboxHost(name=name, roles=list(r), root_dir=self.root / "hosts" / name)
            for name, r in roles.items()
        }

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
        self._cleanups: list[tuple[str, Callable[[], None]]] = []
        self._started = False
        self._owner_pid = os.getpid()

    # ------------------------------------------------------------------------- lifecycle

    def __enter__(self) -> "Sandbox":
        return self.start()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.stop()
        except SandboxError as err:
            if exc is None:
                raise
            # Do not hide the error that ended the block; report the teardown trouble beside it.
            print(f"orchestrator.testing.sandbox: {err}", file=sys.stderr)

    def start(self) -> "Sandbox":
        if self._started:
            return self
        if not os.path.isfile(self.sshd) or not os.access(self.sshd, os.X_OK):
            raise SandboxError(f"{self.sshd} not found: install openssh-server (apt-get install -y openssh-server)")
        self._refuse_live_state()
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
        self.root.mkdir(parents=True, exist_ok=True)
        for host in self.hosts.values():
            for d in (host.root_dir, host.workdir, host.checkpoints, host.models):
                d.mkdir(parents=True, exist_ok=True)
            if self.own_home:
                host.home.mkdir(exist_ok=True)
        _keygen([self.client_key, *(h.host_key for h in self.hosts.values())], f"dfo-sandbox-{self.run_id}")
        pub = self.client_key.with_name(self.client_key.name + ".pub").read_text()
        for host in self.hosts.values():
            _write_atomic(host.authorized_keys, pub, 0o600)

        self.isolated, self.reason = self._netns_available()
        # An own UTS namespace (so `hostname` says kpro6/ct129) needs root; without it hosts share ours.
        self.own_hostname = (os.geteuid() == 0 and shutil.which("unshare") is not None
                             and subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0)
        if self.isolated:
            for index, host in enumerate(self.hosts.values()):
                self._setup_network(host, index)
        else:
            # No namespace to empty at teardown: find detached remote jobs by the run marker in
            # their environment (set by sshd's SetEnv) instead.
            marker = f"DFO_SANDBOX_RUN={self.run_id}".encode()
            self._push("stop leftover remote processes", lambda: _kill_pids(_pids_with_env(marker)))
            for index, host in enumerate(self.hosts.values()):
                host.address = f"127.0.0.{index + 2}"
                host.port = _free_port(host.address)

        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self._penalties_option = _sshd_version(self.sshd) >= (9, 8)
        for host in self.hosts.values():
            self._write_sshd_config(host)
        self._check_configs(self.hosts.values())
        self._boot(list(self.hosts.values()))
        self._write_known_hosts()
        self._write_ssh_config()
        self._write_inventory()
        self._write_state()

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
                self._kill_sshd(host)
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

    def _push(self, what: str, fn: Callable[[], None]) -> None:
        """Register the undo of a resource right after creating it, so any later failure removes it."""
        self._cleanups.append((what, fn))

    def cleanup_hint(self) -> str:
        lines = [f"Sandbox left running in {self.root}:"]
        for h in self.hosts.values():
            lines.append(f"  ssh -F {self.ssh_config_path} {h.name}    # {h.address}:{h.port}, sshd pid {h.pid}")
        lines.append(f"Clean up with: {shlex.quote(sys.executable)} -m orchestrator.testing.sandbox down {self.root}")
        lines.append("  (by hand: " + "; ".join(_manual_cleanup(self._state())) + ")")
        return "\n".join(lines)

    def _refuse_live_state(self) -> None:
        """Refuse a root whose previous sandbox (left with keep=True) still runs."""
        if not self.state_path.exists():
            return
        try:
            state = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return
        if any(_state_pid_alive(h) for h in state.get("hosts", {}).values()):
            raise SandboxError(
                f"{self.root} holds a sandbox that is still running; "
                f"tear it down first: python -m orchestrator.testing.sandbox down {self.root}"
            )

    # ------------------------------------------------------------------------- network

    def _netns_available(self) -> tuple[bool, str]:
        if not self._want_netns:
            return False, self._no_netns_reason
        if os.geteuid() != 0:
            return False, f"not root (uid {os.geteuid()}): network namespaces need CAP_NET_ADMIN"
        if shutil.which("ip") is None:
            return False, "iproute2 ('ip') is not installed"
        probe = f"dfo-{self.run_id}-probe"
        proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if proc.returncode != 0:
            return False, f"`ip netns add` failed: {proc.stderr.strip() or proc.returncode}"
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return True, ""

    def _claim_subnet(self) -> ipaddress.IPv4Network:
        """A random 10.200-250.x.0/24 that nothing on this machine uses, reserved by our route."""
        used = _used_networks()
        for _ in range(100):
            net = ipaddress.ip_network(
                f"10.{SUBNET_SECOND_OCTETS[secrets.randbelow(len(SUBNET_SECOND_OCTETS))]}.{secrets.randbelow(256)}.0/24"
            )
            if any(net.overlaps(u) for u in used):
                continue
            argv = ["ip", "route", "add", "unreachable", str(net), "metric", str(ROUTE_METRIC)]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode == 0:
                self._push(f"delete route {net}", lambda: _ip_quiet("route", "del", "unreachable", str(net),
                                                                    "metric", str(ROUTE_METRIC)))
                return net
            if "File exists" not in proc.stderr:
                raise SandboxError(f"reserving a subnet failed: {shlex.join(argv)}\n    {proc.stderr.strip()}")
            used.append(net)  # another sandbox claimed it a moment ago
        raise SandboxError("no free /24 in 10.200-250.x.0 after 100 tries")

    def _setup_network(self, host: SandboxHost, index: int) -> None:
        ns = f"dfo-{self.run_id}-{host.name}"
        veth = f"dfo-{self.run_id}-{index}"  # interface names are at most 15 characters
        net = self._claim_subnet()
        host.subnet, host.gateway, host.address = str(net), str(net[1]), str(net[2])
        host.port = NETNS_BASE_PORT + index

        _run(["ip", "netns", "add", ns], f"creating network namespace for {host.name}")
        host.netns = ns
        self._push(f"delete network namespace {ns}", lambda: _delete_netns(ns))
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
             f"creating veth pair for {host.name}")
        host.veth = veth
        self._push(f"delete veth {veth}", lambda: _ip_quiet("link", "del", veth))
        for argv in (
            ["ip", "addr", "add", f"{host.gateway}/24", "dev", veth],
            ["ip", "link", "set", veth, "up"],
            ["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
            ["ip", "-n", ns, "link", "set", "eth0", "up"],
        ):
            _run(argv, f"configuring the network of {host.name}")

    def link_down(self, name: str, *, drop: bool = False) -> None:
        """Cut a host's link. Default: this machine's side goes down, connects fail at once
        ("No route to host"). drop=True: the host's side goes down instead, packets are silently
        dropped and connects time out (like a dead host behind a switch)."""
        host = self._isolated_host(name, "link_down")
        if drop:
            _run(["ip", "-n", host.netns, "link", "set", "eth0", "down"], f"link down for {name}")
        else:
            _run(["ip", "link", "set", host.veth, "down"], f"link down for {name}")

    def link_up(self, name: str) -> None:
        """Restore a host's link; returns once its sshd (if running) answers again."""
        host = self._isolated_host(name, "link_up")
        _run(["ip", "link", "set", host.veth, "up"], f"link up for {name}")
        _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"], f"link up for {name}")
        # The kernel reports carrier a few hundred ms later; wait so callers do not race it.
        if host.running:
            error = self._wait_ready(host, time.monotonic() + self.start_timeout)
            if error:
                raise SandboxError(f"after link_up: {error}\n  log {host.log_path}:\n{_tail(host.log_path)}")

    def _isolated_host(self, name: str, what: str) -> SandboxHost:
        host = self.host(name)
        if not self.isolated:
            raise SandboxError(f"{what} needs network namespaces, which this sandbox does not have: {self.reason}")
        return host

    # ------------------------------------------------------------------------- sshd

    def _write_sshd_config(self, host: SandboxHost) -> None:
        opts = [
            ("Port", host.port),
            ("ListenAddress", host.address),
            ("HostKey", host.host_key),
            ("PidFile", host.pidfile),
            ("AuthorizedKeysFile", host.authorized_keys),
            ("StrictModes", "no"),  # temp dirs fail sshd's ownership checks
            ("UsePAM", "no"),  # mandatory when not root; no PAM stack needed for keys
            ("PasswordAuthentication", "no"),
            ("KbdInteractiveAuthentication", "no"),
            ("PubkeyAuthentication", "yes"),
            ("PermitRootLogin", "prohibit-password"),  # CI runs as root
            ("Subsystem", "sftp internal-sftp"),
            ("MaxSessions", 64),  # parallel channels/streams in the relay tests
            ("MaxStartups", 64),
            ("LogLevel", "VERBOSE"),
            ("PrintMotd", "no"),
            ("PrintLastLog", "no"),
            # Which fake host a session is on; the run marker finds detached jobs at teardown.
            ("SetEnv", " ".join(_quote_conf(v) for v in (
                f"DFO_SANDBOX_HOST={host.name}", f"DFO_SANDBOX_RUN={self.run_id}",
                *([f"HOME={host.home}"] if self.own_home else [])))),
        ]
        if self._penalties_option:
            # OpenSSH >= 9.8 would lock out 127.0.0.1 after the auth failures tests provoke on purpose.
            opts.append(("PerSourcePenalties", "no"))
        text = f"# Generated by orchestrator.sandbox for test host {host.name}; throw-away keys.\n"
        text += "".join(f"{k} {v if k in ('Subsystem', 'SetEnv') else _quote_conf(v)}\n" for k, v in opts)
        _write_atomic(host.sshd_config, text)

    def _check_configs(self, hosts: Iterable[SandboxHost]) -> None:
        procs = [(h, [self.sshd, "-t", "-f", str(h.sshd_config)]) for h in hosts]
        running = [(h, argv, subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True)) for h, argv in procs]
        for host, argv, proc in running:
            out, _ = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise SandboxError(
                    f"sshd rejected the config of {host.name}: {shlex.join(argv)}\n    {out.strip()}"
                )

    def _launch(self, host: SandboxHost) -> None:
        argv = [self.sshd, "-D", "-e", "-f", str(host.sshd_config)]
        # Every wrapper execs the next program, so the Popen PID is sshd's PID.
        if self.own_hostname:
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

    def _wait_ready(self, host: SandboxHost, deadline: float) -> str | None:
        """None once host answers with an SSH banner, else why not."""
        while True:
            if host.proc.poll() is not None:
                return f"sshd for {host.name} exited with status {host.proc.returncode} before accepting connections"
            if _ssh_banner(host.address, host.port):
                return None
            if time.monotonic() > deadline:
                return (f"sshd for {host.name} did not accept connections on {host.address}:{host.port} "
                        f"within {self.start_timeout}s")
            time.sleep(0.005)

    def _boot(self, hosts: list[SandboxHost]) -> None:
        for host in hosts:
            self._launch(host)
        deadline = time.monotonic() + self.start_timeout
        for host in hosts:  # they start concurrently, so waiting in turn costs no extra time
            for attempt in range(5):
                error = self._wait_ready(host, deadline)
                if error is None:
                    break
                port_taken = "Address already in use" in _tail(host.log_path, 5)
                if self.isolated or not port_taken or attempt == 4:
                    self._kill_sshd(host)
                    raise SandboxError(f"{error}\n  command: {shlex.join(host.last_argv)}\n"
                                       f"  log {host.log_path}:\n{_tail(host.log_path)}")
                # 127.0.0.x: someone took the free port between our check and sshd's bind.
                self._kill_sshd(host)
                host.port = _free_port(host.address)
                self._write_sshd_config(host)
                self._launch(host)

    def _kill_sshd(self, host: SandboxHost) -> None:
        """Stop the listener and its connections (by PID: never by name)."""
        proc = host.proc
        if proc is None:
            return
        if proc.poll() is None:
            victims = _descendants(proc.pid)
            proc.terminate()
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(2)
            left = _kill_pids(victims)
            if left:
                raise SandboxError(f"processes of {host.name}'s sshd survived SIGKILL: {left}")
        else:
            proc.wait()
        host.proc = None
        host.pidfile.unlink(missing_ok=True)

    def stop_host(self, name: str) -> None:
        """Stop a host's sshd (and its sessions): connections are then refused."""
        self._kill_sshd(self.host(name))
        self._write_state()

    def start_host(self, name: str) -> None:
        """Start a stopped host again on the same address and port."""
        host = self.host(name)
        if host.running:
            return
        self._launch(host)
        error = self._wait_ready(host, time.monotonic() + self.start_timeout)
        if error:
            self._kill_sshd(host)
            raise SandboxError(f"{error}\n  log {host.log_path}:\n{_tail(host.log_path)}")
        self._write_state()

    def regenerate_host_key(self, name: str) -> str:
        """Give a host a new key and restart it; known_hosts keeps the old one (a mismatch).
        Returns the new public key line."""
        host = self.host(name)
        was_running = host.running
        self._kill_sshd(host)
        _keygen([host.host_key], f"dfo-sandbox-{self.run_id}-{name}")
        if was_running:
            self.start_host(name)
        return host.host_key_pub.read_text().strip()

    # ------------------------------------------------------------------------- client side

    def host(self, name: str) -> SandboxHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise SandboxError(f"no sandbox host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def known_hosts_line(self, name: str) -> str:
        host = self.host(name)
        key_type, key = host.host_key_pub.read_text().split()[:2]
        return f"{host.known_hosts_name} {key_type} {key}"

    def _write_known_hosts(self) -> None:
        _write_atomic(self.known_hosts_path, "".join(self.known_hosts_line(n) + "\n" for n in self.hosts))

    def forget_host_key(self, name: str) -> None:
        """Remove the host's lines from known_hosts (its key becomes unknown)."""
        pattern = self.host(name).known_hosts_name
        lines = self.known_hosts_path.read_text().splitlines(keepends=True) if self.known_hosts_path.exists() else []
        _write_atomic(self.known_hosts_path, "".join(l for l in lines if not _known_hosts_matches(l, pattern)))

    def trust_host_key(self, name: str) -> None:
        """Record the host's current key in known_hosts (replacing any older line for it)."""
        self.forget_host_key(name)
        with open(self.known_hosts_path, "a") as f:
            f.write(self.known_hosts_line(name) + "\n")

    def _write_ssh_config(self) -> None:
        text = (f"# Generated by orchestrator.sandbox (run {self.run_id}) for throw-away test hosts.\n"
                f"# Use: ssh -F {self.ssh_config_path} HOST\n")
        for h in self.hosts.values():
            text += f"\nHost {h.name}\n" + "".join(
                f"    {k} {_quote_conf(v)}\n"
                for k, v in (
                    ("HostName", h.address),
                    ("Port", h.port),
                    ("User", self.user),
                    ("IdentityFile", self.client_key),
                    ("IdentitiesOnly", "yes"),
                    ("UserKnownHostsFile", self.known_hosts_path),
                    ("GlobalKnownHostsFile", "/dev/null"),  # only the sandbox's keys count
                    ("StrictHostKeyChecking", "yes"),
                    ("BatchMode", "yes"),
                    ("ConnectTimeout", 5),
                )
            )
        _write_atomic(self.ssh_config_path, text)

    def _write_inventory(self) -> None:
        if self.isolated:
            mode = ("# Each host runs in its own network namespace with no route to the others: the hosts cannot\n"
                    "# reach each other; the controller reaches all of them.\n")
        else:
            mode = (f"# NOT isolated ({self.reason}): the hosts run on 127.0.0.x and can reach each other.\n")
        out = [
            f"# Generated by orchestrator.sandbox (run {self.run_id}) for throw-away test hosts; do not edit:\n",
            "# it is rewritten on every start, and its hosts exist only while the sandbox runs.\n",
            mode,
            f"ssh_config: {_yaml_str(str(self.ssh_config_path))}\n",
            "hosts:\n",
        ]
        for h in self.hosts.values():
            kind = "training" if h.roles == ["train"] else "eval" if h.roles == ["eval"] else "test"
            where = f"network namespace {h.netns}" if h.netns else f"sshd on {h.address}, not isolated"
            out += [
                f"  {_yaml_str(h.name)}:\n",
                f"    description: {_yaml_str(f'sandbox {kind} host ({where})')}\n",
                f"    address: {_yaml_str(h.address)}\n",
                f"    port: {h.port}\n",
                f"    user: {_yaml_str(self.user)}\n",
                f"    identity_file: {_yaml_str(str(self.client_key))}\n",
                f"    known_hosts: {_yaml_str(str(self.known_hosts_path))}\n",
                f"    workdir: {_yaml_str(str(h.workdir))}\n",
                f"    python: {_yaml_str(self.python)}\n",
                "    gpu: false\n",
                f"    roles: [{', '.join(_yaml_str(r) for r in h.roles)}]\n",
                "    paths:\n",
                f"      checkpoints: {_yaml_str(str(h.checkpoints))}\n",
                f"      models: {_yaml_str(str(h.models))}\n",
                "    reaches: []  # none: everything relays through the controller\n",
            ]
        _write_atomic(self.inventory_path, "".join(out))

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

    # ------------------------------------------------------------------------- state (for `down`)

    def _state(self) -> dict:
        return {
            "created_by": "orchestrator.testing.sandbox",
            "run_id": self.run_id,
            "controller_pid": os.getpid(),
            "isolated": self.isolated,
            "hosts": {
                h.name: {"sshd_pid": h.pid, "sshd_config": str(h.sshd_config), "netns": h.netns,
                         "veth": h.veth, "subnet": h.subnet}
                for h in self.hosts.values()
            },
        }

    def _write_state(self) -> None:
        if self._started:
            _write_atomic(self.state_path, json.dumps(self._state(), indent=2) + "\n")


def _ip_quiet(*args: str) -> None:
    """`ip ARGS`, ignoring 'already gone' (teardown must be idempotent)."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    err = proc.stderr.strip()
    if proc.returncode != 0 and not re.search(r"Cannot find device|No such (file|process)|does not exist", err):
        raise SandboxError(f"ip {' '.join(args)}: {err}")


def _delete_netns(ns: str) -> None:
    # Everything still inside is ours (detached remote jobs, sessions); without killing it the
    # namespace would outlive `ip netns del`.
    left = _kill_pids(_netns_pids(ns), grace=0.5)
    if left:
        raise SandboxError(f"processes in {ns} survived SIGKILL: {left}")
    _ip_quiet("netns", "del", ns)


def _state_pid_alive(h: dict) -> bool:
    """Is the state file's sshd PID still our sshd (same config on its command line)?"""
    pid = h.get("sshd_pid")
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # sshd rewrites its title ("sshd: /usr/sbin/sshd -D -e -f CONF [listener] ..."): match words.
    words = b" " + cmdline.replace(b"\0", b" ") + b" "
    return b" " + h.get("sshd_config", "").encode() + b" " in words and _alive(pid)


def _manual_cleanup(state: dict) -> list[str]:
    steps = []
    for h in state.get("hosts", {}).values():
        if h.get("sshd_pid"):
            steps.append(f"kill {h['sshd_pid']}")
        if h.get("netns"):
            steps.append(f"ip netns del {h['netns']}")
        if h.get("subnet"):
            steps.append(f"ip route del unreachable {h['subnet']} metric {ROUTE_METRIC}")
    return steps


def teardown_state(root: str | os.PathLike) -> list[str]:
    """Tear down a sandbox left running (keep=True) from ROOT/sandbox.json. Returns what was done."""
    path = Path(root) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise SandboxError(f"no running sandbox in {root} ({STATE_FILE} not found)") from None
    except ValueError as exc:
        raise SandboxError(f"{path} is not valid JSON: {exc}") from None
    done = []
    for name, h in state.get("hosts", {}).items():
        if _state_pid_alive(h):
            pid = h["sshd_pid"]
            left = _kill_pids([*_descendants(pid), pid])
            done.append(f"{name}: stopped sshd {pid}" + (f" (survivors: {left})" if left else ""))
        if h.get("veth"):
            _ip_quiet("link", "del", h["veth"])
        if h.get("netns"):
            _delete_netns(h["netns"])
            done.append(f"{name}: deleted namespace {h['netns']}")
        if h.get("subnet"):
            _ip_quiet("route", "del", "unreachable", h["subnet"], "metric", str(ROUTE_METRIC))
    path.unlink()
    return done


# ------------------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.testing.sandbox", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start test hosts, print paths, wait for Ctrl-C, tear down")
    up.add_argument("root")
    up.add_argument("--hosts", default="kpro6,ct129", help="comma-separated host names (default: kpro6,ct129)")
    up.add_argument("--no-netns", action="store_true", help="use 127.0.0.x instead of network namespaces")
    up.add_argument("--keep", action="store_true", help="leave the hosts running and exit")
    down = sub.add_parser("down", help="tear down a sandbox left running with --keep")
    down.add_argument("root")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "down":
            for line in teardown_state(args.root):
                print(line)
            return 0
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
        return 0
    except SandboxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
