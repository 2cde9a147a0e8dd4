"""`dfo inventory check/set/remove-host` apply the rules every other command applies (issue 20, item 4), and
`env` values may be `${VAR}` references read from the controller's environment when used.

Bad inventories are a table: the command, its exit code, a phrase of its message, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import expand_env_value, load_inventory, parse_inventory
from orchestrator.core.inventory_edit import cli_value

UNSET = "DFO_TEST_SURELY_UNSET_VAR"
SECRET = "s3cret-value-never-printed"

# Every file a host names exists (tmp_path holds key, known_hosts, ssh_config), so only the case's edit fails.
BASE = """\
# test inventory
ssh_config: ssh_config
hosts:
  a:
    address: 10.9.0.1
    port: 22
    identity_file: key
    known_hosts: known_hosts
    workdir: /w
  b:
    address: 10.9.0.2
    identity_file: key
    known_hosts: known_hosts
    workdir: /w
    proxy_jump: a
"""


def _box(tmp_path: Path, text: str = BASE, ssh_config: str = "") -> Path:
    for name in ("key", "known_hosts"):
        (tmp_path / name).write_text("")
    (tmp_path / "ssh_config").write_text(ssh_config)
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


def _edit(old: str, new: str):
    return lambda text: text.replace(old, new, 1)


def _behind_alias(alias: str):
    """Host b reached as ssh_config alias ALIAS, with no proxy_jump of its own (ssh_config's ProxyJump rules)."""
    return lambda text: (text.replace("    address: 10.9.0.2\n", f"    ssh_alias: {alias}\n")
                         .replace("    proxy_jump: a\n", ""))


def _append_host(block: str):
    return lambda text: text + block


CASES = [
    # (case id, change to BASE, ssh_config text, dfo arguments, exit code, phrase)
    ("valid", None, "", ["inventory", "check"], 0, "valid, 2 host(s): a, b"),
    ("proxy_jump is an option", _edit("proxy_jump: a", "proxy_jump: '-oProxyCommand=id'"), "",
     ["inventory", "check"], 2, "hosts.b.proxy_jump: expected host names separated by commas"),
    ("ssh_config ProxyJump is an option", _behind_alias("evil"),
     "Host evil\n    ProxyJump -oProxyCommand=id\n", ["inventory", "check"], 2,
     "b: proxy jump '-oProxyCommand=id': HostName '-oProxyCommand=id'"),
    ("proxy-jump loop", _edit("    workdir: /w\n  b:", "    workdir: /w\n    proxy_jump: b\n  b:"), "",
     ["inventory", "check"], 2, "proxy_jump loop through a -> b -> a"),
    ("missing ssh_config file", _edit("ssh_config: ssh_config", "ssh_config: nowhere/ssh_config"), "",
     ["inventory", "check"], 2, "ssh_config file not found"),
    ("missing key", _edit("identity_file: key\n    known_hosts: known_hosts\n    workdir: /w\n  b:",
                          "identity_file: no_such_key\n    known_hosts: known_hosts\n    workdir: /w\n  b:"), "",
     ["inventory", "check"], 2, "no_such_key does not exist (hosts.a.identity_file)"),
    ("missing ssh_config key", _append_host("  c:\n    ssh_alias: c\n    known_hosts: known_hosts\n    workdir: /w\n"),
     "Host c\n    IdentityFile ~/no/such/key_%h\n", ["inventory", "check"], 2, "key_c does not exist (IdentityFile in"),
    ("missing known_hosts", _edit("known_hosts: known_hosts\n    workdir: /w\n  b:",
                                  "known_hosts: kh_missing\n    workdir: /w\n  b:"), "",
     ["inventory", "check"], 2, "kh_missing does not exist (hosts.a.known_hosts)"),
    ("missing known_hosts, trusting new keys", _edit("known_hosts: known_hosts\n    workdir: /w\n  b:",
                                                     "known_hosts: kh_missing\n    workdir: /w\n  b:"), "",
     ["--trust-new-host-keys", "inventory", "check"], 0, "valid"),
    ("unset env reference",
     _edit("    workdir: /w\n  b:", f"    workdir: /w\n    env: {{TOKEN: '${{{UNSET}}}'}}\n  b:"), "",
     ["inventory", "check"], 2, f"a: env TOKEN refers to ${{{UNSET}}}, which is not set"),
    ("malformed env reference", _edit("    workdir: /w\n  b:", "    workdir: /w\n    env: {TOKEN: '${1x}'}\n  b:"),
     "", ["inventory", "check"], 2, "env value of TOKEN has a malformed reference"),
    ("no hosts", lambda text: "hosts: {}\n", "", ["inventory", "check"], 2, "inventory.yaml:1 hosts: no hosts"),
    ("top-level list", lambda text: "- a\n- b\n", "", ["inventory", "check"], 2,
     "expected a mapping with 'hosts:' at the top, got a list"),
    ("remove a jump host", None, "", ["inventory", "remove-host", "a"], 2, "host 'a' is a jump host of b"),
    ("remove a jump host named in ssh_config", _behind_alias("behind"),
     "Host behind\n    ProxyJump a\n", ["inventory", "remove-host", "a"], 2, "host 'a' is a jump host of b"),
    ("remove a host in reaches", _edit("    proxy_jump: a\n", "    proxy_jump: none\n    reaches: [a]\n"), "",
     ["inventory", "remove-host", "a"], 2, "is listed in 'reaches' of b"),
    ("set a bad port: the real file's line", None, "", ["inventory", "set", "a.port", "twenty-two"], 2,
     "inventory.yaml:6 (as edited) hosts.a.port: expected an integer 1-65535, got 'twenty-two'"),
    ("set a new field badly: said to be new", None, "", ["inventory", "set", "b.paths.models", "rel"], 2,
     "inventory.yaml (new line after line 15) hosts.b.paths.models: expected an absolute path"),
    ("set a jump that is an option", None, "", ["inventory", "set", "--", "b.proxy_jump", "-oProxyCommand=id"], 2,
     "inventory.yaml:15 (as edited) hosts.b.proxy_jump: expected host names"),
]


@pytest.mark.parametrize("change, ssh_config, args, code, phrase", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_inventory_commands_apply_every_rule(tmp_path, monkeypatch, change, ssh_config, args, code, phrase):
    monkeypatch.delenv(UNSET, raising=False)
    path = _box(tmp_path, change(BASE) if change else BASE, ssh_config)
    before = path.read_text()
    proc = dfo("--inventory", str(path), *args, env={"COLUMNS": "400"})
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert phrase in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    if code != 0:
        assert path.read_text() == before and not list(tmp_path.glob("*.dfo-tmp"))  # nothing written


def test_check_reports_every_problem_of_every_host_at_once(tmp_path):
    text = BASE.replace("proxy_jump: a", "proxy_jump: zz,a") + (
        "  c:\n    address: 10.9.0.3\n    identity_file: gone\n    known_hosts: known_hosts\n    workdir: /w\n")
    proc = dfo("--inventory", str(_box(tmp_path, text)), "inventory", "check", "--json")
    assert proc.returncode == 2
    problems = __import__("json").loads(proc.stdout)["problems"]
    assert any(p.startswith("b: jump host 'zz': known_hosts") or "zz" in p for p in problems)
    assert any(p.startswith("c: key file") for p in problems)


def test_remove_host_with_force_removes_it_and_says_who_still_names_it(tmp_path):
    path = _box(tmp_path)
    proc = dfo("--inventory", str(path), "inventory", "remove-host", "a", "--force", env={"COLUMNS": "400"})
    assert proc.returncode == 0, proc.stderr
    assert "the jump chain of b still names 'a'" in proc.stderr
    assert list(load_inventory(path).hosts) == ["b"]


@pytest.mark.parametrize("field, raw, stored", [
    ("env.X", "1", "1"),
    ("env.X", "true", "true"),
    ("env.TOKEN", "${HF_TOKEN}", "${HF_TOKEN}"),
    ("description", "eval host: A6000", "eval host: A6000"),
    ("description", "[not, a, list]", "[not, a, list]"),
    ("python", "3", "3"),
    ("paths.models", "/data/m: x", "/data/m: x"),
    ("paths.models", '"/data/quoted: x"', "/data/quoted: x"),  # a quoted YAML string is unquoted
    ("description", "'it''s'", "it's"),
    ("port", "2222", 2222),
    ("gpu", "false", False),
    ("roles", "[eval]", ["eval"]),
])
def test_set_types_value_by_the_fields_schema(tmp_path, field, raw, stored):
    path = _box(tmp_path)
    proc = dfo("--inventory", str(path), "inventory", "set", f"a.{field}", raw)
    assert proc.returncode == 0, proc.stderr
    value = load_inventory(path).hosts["a"].model_dump()
    for key in field.split("."):
        value = value[key]
    assert value == stored
    assert path.read_text().startswith("# test inventory\n")  # the rest of the file kept


def test_cli_value_reads_yaml_only_for_fields_that_are_not_strings():
    assert cli_value(["env", "X"], "1") == "1" and cli_value(["port"], "1") == 1
    assert cli_value(["reaches"], "[a, b]") == ["a", "b"] and cli_value(["proxy_jump"], "a,b") == "a,b"
    assert cli_value(["nosuchfield"], "1") == 1  # unknown: read as YAML, then refused by the validation


# ------------------------------------------------------------------------------------ env ${VAR}


def test_env_references_are_read_when_used(monkeypatch, tmp_path):
    inv = parse_inventory("hosts:\n  a:\n    address: h\n    workdir: /w\n    env:\n"
                          "      TOKEN: '${DFO_TEST_TOKEN}'\n      URL: 'https://x/${DFO_TEST_TOKEN}/$${LITERAL}'\n"
                          "      PLAIN: 'a$$b'\n", tmp_path / "inventory.yaml")
    monkeypatch.setenv("DFO_TEST_TOKEN", SECRET)
    assert inv.host_env("a") == {"TOKEN": SECRET, "URL": f"https://x/{SECRET}/${{LITERAL}}", "PLAIN": "a$$b"}
    assert inv.hosts["a"].env["TOKEN"] == "${DFO_TEST_TOKEN}"  # the file's text is kept: resolved at use
    monkeypatch.delenv("DFO_TEST_TOKEN")
    with pytest.raises(InputError) as exc:
        inv.host_env("a")
    assert exc.value.message.startswith("a: env TOKEN refers to ${DFO_TEST_TOKEN}, which is not set")


def test_an_env_reference_error_never_shows_a_value(monkeypatch):
    monkeypatch.setenv("DFO_TEST_TOKEN", SECRET + "\nsecond line")
    with pytest.raises(InputError) as exc:
        expand_env_value("a", "TOKEN", "${DFO_TEST_TOKEN}")
    assert "newline" in exc.value.message and SECRET not in str(exc.value)


@pytest.mark.sshd
def test_a_job_gets_the_referenced_value_and_an_unset_one_stops_it_before_the_host(sandbox, tmp_path, monkeypatch):
    from orchestrator.jobs.operation import follow_job, launch_job
    from orchestrator.transport import Connector

    text = sandbox.inventory_path.read_text().replace(
        "    reaches: []", "    env:\n      TOKEN: '${DFO_TEST_TOKEN}'\n    reaches: []")
    assert "${DFO_TEST_TOKEN}" in text
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    monkeypatch.setenv("DFO_TEST_TOKEN", SECRET)
    with Connector(load_inventory(path)) as connector:
        handle = launch_job(connector, "ct129", ["sh", "-c", 'echo "token=$TOKEN"'], lock=None)
        assert follow_job(connector, "ct129", handle.job_id).state == "succeeded"
        assert f"token={SECRET}" in Path(handle.job_dir, "log").read_text()
        assert SECRET not in Path(handle.job_dir, "job.json").read_text()
        monkeypatch.delenv("DFO_TEST_TOKEN")
        with pytest.raises(InputError, match=r"ct129: env TOKEN refers to \$\{DFO_TEST_TOKEN\}"):
            launch_job(connector, "ct129", ["true"], lock=None)
    shown = dfo("--inventory", str(path), "inventory", "show", "--json", env={"DFO_TEST_TOKEN": SECRET})
    assert shown.returncode == 0 and SECRET not in shown.stdout and "${DFO_TEST_TOKEN}" not in shown.stdout
    assert os.environ.get("DFO_TEST_TOKEN") is None
