"""The sandbox's network: a namespace per host joined to this machine by a veth pair on a private /24.

A /24 is reserved atomically by an "unreachable" route with our metric (a second `ip route add` of the
same route fails); while a veth is down, that route also keeps packets for the sandbox addresses from
leaking out of the default route to the real network. Teardown steps here ignore "already gone".
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
from typing import Callable

from orchestrator.testing.errors import SandboxError
from orchestrator.testing.host import SandboxHost
from orchestrator.testing.processes import kill_pids, run

NETNS_BASE_PORT = 2222  # inside a fresh namespace every port is free; not 22, so dfo must honour `port`
ROUTE_METRIC = 4242
SUBNET_SECOND_OCTETS = range(200, 251)  # 10.200-250.x.0/24

# Registers the undo of a resource right after creating it: (what, how).
PushUndo = Callable[[str, Callable[[], object]], None]


def netns_available(probe: str) -> tuple[bool, str]:
    """Can we make network namespaces here? Tries one named `probe` (and deletes it); (ok, why not)."""
    if os.geteuid() != 0:
        return False, f"not root (uid {os.geteuid()}): network namespaces need CAP_NET_ADMIN"
    if shutil.which("ip") is None:
        return False, "iproute2 ('ip') is not installed"
    proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return False, f"`ip netns add` failed: {proc.stderr.strip() or proc.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


def ip_quiet(*args: str) -> None:
    """`ip ARGS`, ignoring 'already gone' (teardown must be idempotent)."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    err = proc.stderr.strip()
    if proc.returncode != 0 and not re.search(r"Cannot find device|No such (file|process)|does not exist", err):
        raise SandboxError(f"ip {' '.join(args)}: {err}")


def netns_pids(netns: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(x) for x in proc.stdout.split() if x.isdigit()] if proc.returncode == 0 else []


def delete_netns(ns: str) -> None:
    # Everything still inside is ours (detached remote jobs, sessions); without killing it the
    # namespace would outlive `ip netns del`.
    left = kill_pids(netns_pids(ns), grace=0.5)
    if left:
        raise SandboxError(f"processes in {ns} survived SIGKILL: {left}")
    ip_quiet("netns", "del", ns)


def delete_veth(veth: str) -> None:
    ip_quiet("link", "del", veth)


def release_subnet(subnet: str) -> None:
    ip_quiet("route", "del", "unreachable", subnet, "metric", str(ROUTE_METRIC))


def used_networks() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """IPv4 networks already in use on this machine: interface addresses and routes."""
    addrs = run(["ip", "-j", "-4", "addr"], "listing addresses").stdout
    routes = run(["ip", "-j", "-4", "route", "show", "table", "all"], "listing routes").stdout
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
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


def claim_subnet(push: PushUndo) -> ipaddress.IPv4Network:
    """A random 10.200-250.x.0/24 that nothing on this machine uses, reserved by our route."""
    used = used_networks()
    for _ in range(100):
        second = SUBNET_SECOND_OCTETS[secrets.randbelow(len(SUBNET_SECOND_OCTETS))]
        net = ipaddress.IPv4Network(f"10.{second}.{secrets.randbelow(256)}.0/24")
        if any(net.overlaps(u) for u in used):
            continue
        argv = ["ip", "route", "add", "unreachable", str(net), "metric", str(ROUTE_METRIC)]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode == 0:
            push(f"delete route {net}", functools.partial(release_subnet, str(net)))
            return net
        if "File exists" not in proc.stderr:
            raise SandboxError(f"reserving a subnet failed: {shlex.join(argv)}\n    {proc.stderr.strip()}")
        used.append(net)  # another sandbox claimed it a moment ago
    raise SandboxError("no free /24 in 10.200-250.x.0 after 100 tries")


def setup_host_network(host: SandboxHost, run_id: str, index: int, push: PushUndo) -> None:
    """Give `host` its namespace, veth pair, subnet, address and port (the index-th host of run_id)."""
    ns = f"dfo-{run_id}-{host.name}"
    veth = f"dfo-{run_id}-{index}"  # interface names are at most 15 characters
    net = claim_subnet(push)
    host.subnet, host.gateway, host.address = str(net), str(net[1]), str(net[2])
    host.port = NETNS_BASE_PORT + index

    run(["ip", "netns", "add", ns], f"creating network namespace for {host.name}")
    host.netns = ns
    push(f"delete network namespace {ns}", lambda: delete_netns(ns))
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
        f"creating veth pair for {host.name}")
    host.veth = veth
    push(f"delete veth {veth}", lambda: delete_veth(veth))
    for argv in (
        ["ip", "addr", "add", f"{host.gateway}/24", "dev", veth],
        ["ip", "link", "set", veth, "up"],
        ["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "lo", "up"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
    ):
        run(argv, f"configuring the network of {host.name}")


def set_link(host: SandboxHost, up: bool, *, host_side: bool) -> None:
    """Bring one end of the host's veth pair up or down: this machine's end, or (host_side) the host's."""
    state = "up" if up else "down"
    if host_side:
        argv = ["ip", "-n", str(host.netns), "link", "set", "eth0", state]
    else:
        argv = ["ip", "link", "set", str(host.veth), state]
    run(argv, f"link {state} for {host.name}")


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def ssh_banner(address: str, port: int) -> bool:
    """True when address:port answers with an SSH banner (an sshd is listening)."""
    try:
        with socket.create_connection((address, port), timeout=0.5) as sock:
            sock.settimeout(1.0)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False
