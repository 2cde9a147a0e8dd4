"""The two SSH planes: no option injection, no forwarding, the same host for both (jump chains included)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import load_inventory, parse_inventory
from orchestrator.transport.bulk import ssh_argv
from orchestrator.transport.control import connect
from orchestrator.transport.resolve import resolve_host


def _inv(tmp_path: Path, hosts: str, ssh_config: str | None = None):
    text = "hosts:\n" + hosts
    if ssh_config is not None:
        (tmp_path / "ssh_config").write_text(ssh_config)
        text = "ssh_config: ssh_config\n" + text
    return parse_inventory(text, tmp_path / "inventory.yaml")


def _ssh_g(argv: list[str]) -> dict[str, list[str]]:
    """What the system ssh would use for ARGV (``ssh -G``: resolves config, connects nowhere)."""
    assert argv[-3] == "--", argv
    proc = subprocess.run([*argv[:-3], "-G", "--", argv[-2]], capture_output=True, text=True, check=True)
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


# ------------------------------------------------------------------------------ option injection


@pytest.mark.parametrize("field", ["address", "ssh_alias", "user"])
def test_a_leading_dash_is_refused_in_the_inventory(tmp_path, field):
    marker = tmp_path / "pwned"
    value = f"-oProxyCommand=touch {marker}" if field != "user" else "-oProxyCommand=x"
    extra = "" if field != "user" else "address: h, "
    with pytest.raises(InputError, match=f"hosts.h.{field}"):
        _inv(tmp_path, f"  h: {{{extra}{field}: {value!r}, workdir: /w}}\n")


def test_a_leading_dash_from_ssh_config_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    inv = _inv(tmp_path, "  h: {ssh_alias: evil, workdir: /w}\n",
               f"Host evil\n    HostName -oProxyCommand=touch\\ {marker}\n")
    with pytest.raises(InputError, match="HostName '-oProxyCommand"):
        resolve_host(inv, "h")
    assert not marker.exists()


def test_every_bulk_argv_ends_its_options_before_the_destination(tmp_path):
    inv = _inv(tmp_path, "  a: {address: 10.9.0.1, workdir: /w}\n"
                         "  b: {address: 10.9.0.2, workdir: /w, proxy_jump: a}\n")
    argv = ssh_argv(resolve_host(inv, "b"), ["echo", "-x"])
    assert argv[-3:] == ["--", "10.9.0.2", "echo -x"]
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert shlex.split(proxy.partition("=")[2])[-2:] == ["--", "10.9.0.1"]


# ------------------------------------------------------------------------------------ forwarding


def test_forwarding_is_off_whatever_ssh_config_says(tmp_path):
    inv = _inv(tmp_path, "  h: {ssh_alias: box, workdir: /w}\n",
               "Host *\n    ForwardAgent yes\n    ForwardX11 yes\n    LocalForward 9999 localhost:22\n"
               "    PermitLocalCommand yes\n    LocalCommand touch /tmp/x\n")
    seen = _ssh_g(ssh_argv(resolve_host(inv, "h"), "true"))
    assert seen["forwardagent"] == ["no"] and seen["forwardx11"] == ["no"]
    assert seen["clearallforwardings"] == ["yes"] and seen["permitlocalcommand"] == ["no"]


# ------------------------------------------------------------------------------------ jump hosts


SSH_CONFIG = """\
Host target
    HostName 10.9.0.30
    Port 2222
    User bob
    IdentityFile "{key}"
    ProxyJump hop1,hop2
Host hop1
    HostName 10.9.0.10
    User alice
Host hop2
    HostName 10.9.0.20
    Port 2200
# A block keyed by the resolved address must not change what the alias said.
Host 10.9.0.30
    Port 9999
    User mallory
    ProxyCommand nc evil 22
"""


def test_both_planes_resolve_a_host_identically(tmp_path):
    """One inventory entry: the paramiko plane's ResolvedHost and the system ssh's own view agree on
    address, port, user, key, known_hosts and the whole jump chain (ProxyJump a,b kept whole)."""
    inv = _inv(tmp_path, "  t: {ssh_alias: target, workdir: /w}\n", SSH_CONFIG.format(key=tmp_path / "id key"))
    host = resolve_host(inv, "t")
    chain = []
    hop = host
    while hop is not None:
        chain.append((hop.hostname, hop.port, hop.user))
        hop = hop.proxy_jump
    assert [c[:2] for c in chain] == [("10.9.0.30", 2222), ("10.9.0.20", 2200), ("10.9.0.10", 22)]
    assert chain[0][2] == "bob" and chain[2][2] == "alice"
    argv = ssh_argv(host, "true")
    seen = _ssh_g(argv)
    assert seen["hostname"] == [host.hostname] and seen["port"] == [str(host.port)] and seen["user"] == [host.user]
    assert seen["identityfile"] == list(host.identity_files)
    assert seen["userknownhostsfile"] == [host.known_hosts]
    # Each ProxyCommand, as the ssh running it expands it, reaches the next hop of the chain.
    assert _walk_proxies(argv) == [("10.9.0.30", "2222", "10.9.0.20"), ("10.9.0.20", "2200", "10.9.0.10")]


def _percent_expand(text: str, hostname: str, port: str) -> str:
    """OpenSSH's expansion of a ProxyCommand (the tokens that matter here)."""
    out, i = "", 0
    while i < len(text):
        if text[i] == "%" and i + 1 < len(text):
            out += {"%": "%", "h": hostname, "p": port}.get(text[i + 1], "%" + text[i + 1])
            i += 2
        else:
            out += text[i]
            i += 1
    return out


def _walk_proxies(argv: list[str]) -> list[tuple[str, str, str]]:
    """(-W host, -W port, the address of the hop it runs ssh to) for every nested ProxyCommand, outermost
    first."""
    hops = []
    while True:
        opts = dict(a.split("=", 1) for a in argv if "=" in a and a.split("=", 1)[0] in ("HostName", "ProxyCommand"))
        port = argv[argv.index("-p") + 1]
        proxy = opts["ProxyCommand"]
        if proxy == "none":
            return hops
        argv = shlex.split(_percent_expand(proxy, opts["HostName"], port))
        w_host, _, w_port = argv[argv.index("-W") + 1].rpartition(":")
        hostname = next(a for a in argv if a.startswith("HostName=")).partition("=")[2]
        hops.append((w_host, w_port, hostname))


def test_known_hosts_path_with_space_and_percent(sandbox, tmp_path):
    odd = tmp_path / "known hosts %d"
    odd.mkdir()
    (odd / "kh").write_text(Path(sandbox.known_hosts_path).read_text())
    text = sandbox.inventory_path.read_text().replace(str(sandbox.known_hosts_path), str(odd / "kh"))
    assert str(odd / "kh") in text
    (tmp_path / "inventory.yaml").write_text(text)
    host = resolve_host(load_inventory(tmp_path / "inventory.yaml"), "ct129")
    proc = subprocess.run(ssh_argv(host, "echo reached"), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and proc.stdout.strip() == "reached", proc.stderr


@pytest.mark.sshd
def test_a_two_hop_chain_works_on_both_planes(sandbox, tmp_path):
    """Real sshd: hop1 and hop2 are the same host (so the chain works in isolated namespaces), and the
    target is reached through both; the client address the target sees is the hop's on both planes."""
    base = load_inventory(sandbox.inventory_path).hosts["kpro6"]
    entry = (f"address: {base.address}, port: {base.port}, user: {base.user}, identity_file: {base.identity_file!r}, "
             f"known_hosts: {base.known_hosts!r}, workdir: /w, python: {base.python!r}")
    inv = parse_inventory("hosts:\n" + "".join(
        f"  {name}: {{{entry}{extra}}}\n" for name, extra in
        (("hop1", ""), ("hop2", ""), ("direct", ""), ("t", ", proxy_jump: 'hop1,hop2'"))
    ), tmp_path / "inventory.yaml")
    target = resolve_host(inv, "t")
    assert target.proxy_jump.name == "hop2" and target.proxy_jump.proxy_jump.name == "hop1"
    bulk = subprocess.run(ssh_argv(target, "echo $SSH_CONNECTION"), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert bulk.returncode == 0, bulk.stderr
    session = connect(target)
    try:
        control = session.run("echo $SSH_CONNECTION").text
    finally:
        session.close()
    direct = connect(resolve_host(inv, "direct"))
    try:
        straight = direct.run("echo $SSH_CONNECTION").text
    finally:
        direct.close()
    client = lambda line: line.split()[0]  # noqa: E731
    assert client(bulk.stdout) == client(control) == base.address  # the hop itself connected to the target
    if sandbox.isolated:
        assert client(straight) != base.address  # and that differs from the controller's own address
