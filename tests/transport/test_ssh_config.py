"""transport.ssh_config against OpenSSH itself: for every config and host below, what dfo reads must be what
`ssh -G` (and, for IdentityFile, what ssh opens) makes of the same file. ssh is run locally; it connects
nowhere (`-G` only prints, and the IdentityFile probe's ProxyCommand is `true`)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.transport.ssh_config import host_case, lookup

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client")
REPO = Path(__file__).resolve().parents[2]

BASIC = """\
# a comment, then blocks in OpenSSH's order: the first value obtained wins
Host alpha
    HostName 10.1.2.3
    Port 2201
    User trainer
    IdentityFile ~/.ssh/a_%h_%r_%p
    IdentityFile "/keys/with space"
    IdentityFile ~/.ssh/a_%h_%r_%p
Host *.lab !bad.lab
    User=labuser
    IdentityFile ~/.ssh/lab_%h   # a trailing comment
    UserKnownHostsFile ~/kh/%h_%p_%r /etc/kh_second
Host UpperAlias
    HostName Upper.Example.ORG
Host beta
    hostname = %h.example.net
    PORT = 2202
Host gamma delta
    ProxyJump none
Host *
    ServerAliveInterval 30
    Port 2299
    ProxyJump bastion,user2@hop:2022
"""

MATCHES = """\
Host alpha
    HostName 10.1.2.3
Match host 10.1.2.3 user {me}
    User matched_via_hostname
Match originalhost ALPHA2
    Port 2333
Match !host nomatch,other localuser {me}
    UserKnownHostsFile /kh/%h-%n-%p-%r
Match exec "test %n = execme"
    Port 2444
Match exec "false"
    User never
Match user trainer2
    Port 2555
Host *
    User trainer2
Match user trainer2
    IdentityFile /keys/seen_after_user
Match all
    ProxyJump last
"""

FINAL = """\
Host alpha
    HostName 10.1.2.3
Host 10.1.2.3
    User via_final_pass
Match final host 10.1.2.3
    Port 2666
"""

TOKENS = """\
Host alpha
    HostName 10.7.7.7
    User tok
    Port 2777
    UserKnownHostsFile /kh/%%_%C_%d_%h_%i_%k_%L_%l_%n_%p_%r_%u
Host beta
    UserKnownHostsFile ~/known_%h
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _ssh_g(config: Path, host: str) -> dict[str, list[str]]:
    proc = subprocess.run(["ssh", "-G", "-F", str(config), "--", host], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, []).append(value)
    return out


def _ssh_identity_files(config: Path, host: str) -> list[str]:
    """The key files ssh would try (after its own ~ and % expansion): its debug log, with a ProxyCommand
    that exits at once instead of a connection."""
    proc = subprocess.run(["ssh", "-v", "-F", str(config), "-o", "ProxyCommand=true", "-o", "BatchMode=yes",
                           "--", host, "true"], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    files = [line.split("identity file ", 1)[1].rsplit(" type ", 1)[0] for line in proc.stderr.splitlines()
             if line.startswith("debug1: identity file ")]
    return [f for f in files if not f.endswith("-cert")]


def _agrees_with_ssh(config: Path, host: str) -> None:
    ours = lookup(str(config), host)
    theirs = _ssh_g(config, host)
    port = int(ours.port or 22)
    user = ours.user or getpass.getuser()
    assert theirs["hostname"] == [host_case(ours.hostname)], host
    assert theirs["port"] == [str(port)], host
    assert theirs["user"] == [user], host
    assert theirs.get("proxyjump") == ([ours.proxy_jump] if ours.proxy_jump and ours.proxy_jump != "none" else None)
    if ours.identity_files:
        assert theirs["identityfile"] == list(ours.identity_files), host  # -G prints them as written
        assert _ssh_identity_files(config, host) == [ours.expand_path(p, user=user, port=port)
                                                     for p in ours.identity_files], host
    else:
        assert theirs["identityfile"][0] == "~/.ssh/id_rsa"  # ssh's defaults; dfo lets paramiko look for keys
    known = [ours.expand_path(p, user=user, port=port) for p in ours.known_hosts_files]
    default = [os.path.expanduser("~/.ssh/known_hosts"), os.path.expanduser("~/.ssh/known_hosts2")]
    assert theirs["userknownhostsfile"] == [" ".join(known or default)], host


@pytest.mark.parametrize("host", ["alpha", "node1.lab", "bad.lab", "other", "UpperAlias", "upperalias", "beta",
                                  "gamma", "delta"])
def test_blocks_patterns_and_first_value_wins_as_ssh_reads_them(tmp_path, host):
    _agrees_with_ssh(_write(tmp_path, "ssh_config", BASIC), host)


def test_the_basic_config_reads_as_written(tmp_path):
    """The same facts spelled out, so a wrong reference (an ssh that ignores the file) cannot pass."""
    config = str(_write(tmp_path, "ssh_config", BASIC))
    alpha = lookup(config, "alpha")
    assert (alpha.hostname, alpha.port, alpha.user) == ("10.1.2.3", "2201", "trainer")
    assert alpha.identity_files == ("~/.ssh/a_%h_%r_%p", "/keys/with space")  # a repeated key is dropped
    assert alpha.proxy_jump == "bastion,user2@hop:2022"
    assert alpha.expand_path(alpha.identity_files[0], user="trainer", port=2201) == os.path.expanduser(
        "~/.ssh/a_10.1.2.3_trainer_2201")
    assert lookup(config, "node1.lab").known_hosts_files == ("~/kh/%h_%p_%r", "/etc/kh_second")
    assert lookup(config, "bad.lab").user is None  # the negated pattern wins over *.lab
    assert lookup(config, "gamma").proxy_jump == "none"
    assert lookup(config, "upperalias").hostname == "upperalias"  # Host patterns are case-sensitive
    assert lookup(config, "beta").hostname == "beta.example.net" and lookup(config, "beta").port == "2202"


@pytest.mark.parametrize("host", ["alpha", "ALPHA2", "execme", "other"])
def test_match_criteria_as_ssh_evaluates_them(tmp_path, host):
    _agrees_with_ssh(_write(tmp_path, "ssh_config", MATCHES.format(me=getpass.getuser())), host)


def test_match_reads_what_earlier_lines_set(tmp_path):
    config = str(_write(tmp_path, "ssh_config", MATCHES.format(me=getpass.getuser())))
    assert lookup(config, "alpha").user == "matched_via_hostname"  # `Match host` sees the HostName
    assert lookup(config, "ALPHA2").port == "2333"  # originalhost ignores case
    assert lookup(config, "execme").port == "2444"  # the exec ran with %n expanded
    other = lookup(config, "other")
    assert other.user == "trainer2" and other.port is None  # `Match user` before `User` was set: no match
    assert other.identity_files == ("/keys/seen_after_user",) and other.proxy_jump == "last"
    assert other.known_hosts_files == ()  # `!host nomatch,other`: a negated pattern list that names it
    assert lookup(config, "alpha").known_hosts_files == ("/kh/%h-%n-%p-%r",)


def test_match_final_reads_the_file_again_with_the_resolved_hostname(tmp_path):
    config = _write(tmp_path, "ssh_config", FINAL)
    _agrees_with_ssh(config, "alpha")
    alpha = lookup(str(config), "alpha")
    assert (alpha.user, alpha.port) == ("via_final_pass", "2666")
    # Without a `Match final`, a block keyed by the resolved address does not apply (ssh makes one pass).
    once = _write(tmp_path, "once", FINAL.split("Match final")[0])
    _agrees_with_ssh(once, "alpha")
    assert lookup(str(once), "alpha").user is None


def test_tokens_in_known_hosts_files_expand_as_ssh_expands_them(tmp_path):
    config = _write(tmp_path, "ssh_config", TOKENS)
    _agrees_with_ssh(config, "alpha")
    _agrees_with_ssh(config, "beta")


def test_include_globs_and_blocks_inside_included_files(tmp_path):
    (tmp_path / "conf.d").mkdir()
    _write(tmp_path / "conf.d", "10-a.conf", "Host alpha\n    User from_include\nHost *\n    Port 2888\n")
    _write(tmp_path / "conf.d", "20-b.conf", "Host beta\n    HostName 10.3.3.3\n")
    _write(tmp_path, "inactive.conf", "Host *\n    User never_applies\n")
    config = _write(tmp_path, "ssh_config",
                    f"Host nothing\n    Include {tmp_path}/inactive.conf\n"
                    f"Host *\n    Include {tmp_path}/conf.d/*.conf {tmp_path}/missing-*.conf\n"
                    "    IdentityFile /keys/after_include\n")
    for host in ("alpha", "beta", "gamma"):
        _agrees_with_ssh(config, host)
    alpha = lookup(str(config), "alpha")
    assert (alpha.user, alpha.port) == ("from_include", "2888")
    # The included file's `Host *` does not end the including block: its IdentityFile still applies.
    assert alpha.identity_files == ("/keys/after_include",)


def test_relative_include_is_under_the_users_ssh_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    _write(tmp_path / ".ssh", "extra.conf", "Host alpha\n    User relative_include\n")
    config = _write(tmp_path, "ssh_config", "Include extra.conf\n")
    assert lookup(str(config), "alpha").user == "relative_include"


@pytest.mark.parametrize("text, phrase, ssh_refuses", [
    ("Host alpha\n    User \"unterminated\n", ":2: unterminated quote", True),
    ("Host alpha\n    User\n", ":2: no argument after keyword 'User'", True),
    ("Host alpha\n    HostName a b\n", ":2: hostname takes one argument, got 2", True),
    ("Match all host x\n    User x\n", ":1: Match all cannot be combined", True),
    ("Match host\n    User x\n", ":1: Match host needs an argument", True),
    ("Match bogus x\n    User x\n", ":1: Match bogus is not supported by dfo", True),
    ("Match localnetwork 10.0.0.0/8\n    User x\n", ":1: Match localnetwork is not supported by dfo", None),
    ("Host *\n    CanonicalizeHostname yes\n", ":2: CanonicalizeHostname yes applies to 'alpha'", False),
    ("Host alpha\n    UserKnownHostsFile /kh/%z\n", "unknown token %z", True),
])
def test_lines_dfo_cannot_read_are_refused_with_file_and_line(tmp_path, text, phrase, ssh_refuses):
    config = _write(tmp_path, "ssh_config", text)
    with pytest.raises(InputError) as exc:
        ours = lookup(str(config), "alpha")
        [ours.expand_path(p, user="u", port=22) for p in ours.known_hosts_files]
    assert phrase in exc.value.message and (str(config) in exc.value.message or "%z" in phrase)
    proc = subprocess.run(["ssh", "-G", "-F", str(config), "alpha"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=30)
    if ssh_refuses is not None:  # None: depends on the ssh version (localnetwork came with OpenSSH 9.4)
        assert (proc.returncode != 0) == ssh_refuses, proc.stderr  # refused by ssh too, or by dfo only


def test_a_missing_file_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="ssh_config file not found"):
        lookup(str(tmp_path / "nope"), "alpha")


def test_reading_ssh_config_loads_neither_paramiko_nor_invoke(tmp_path):
    """A relay over the system ssh and the pure commands resolve hosts without paying paramiko's import."""
    config = _write(tmp_path, "ssh_config", MATCHES.format(me=getpass.getuser()))
    probe = textwrap.dedent("""\
        import json, sys
        from orchestrator.transport.ssh_config import lookup
        lookup(sys.argv[1], "execme")
        print(json.dumps(sorted(m for m in ("paramiko", "invoke", "fabric") if m in sys.modules)))
        """)
    proc = subprocess.run([sys.executable, "-c", probe, str(config)], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
