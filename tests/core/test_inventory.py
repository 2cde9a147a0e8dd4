"""Inventory loading, error messages and in-place editing (pure: no hosts involved)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import load_inventory
from orchestrator.core.inventory_edit import add_host, remove_host, set_field
from orchestrator.transport.resolve import resolve_host

REPO = Path(__file__).resolve().parents[2]

BASE = """\
# team inventory
hosts:
  kpro6:
    address: kpro6          # ssh alias
    port: 22
    workdir: /data/dfo
    roles: [train]
    paths:
      checkpoints: /data/ckpt

  ct129:
    # eval box
    address: 10.9.9.9
    port: 22
    workdir: /data/dfo
"""




def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


def test_shipped_inventory_is_valid_and_names_the_team_hosts():
    inv = load_inventory(REPO / "inventory.yaml")
    assert list(inv.hosts) == ["kpro6", "ct129", "ct200"]
    assert {h.address for h in inv.hosts.values()} == {"kpro6", "ct129", "ct200"}
    text = (REPO / "inventory.yaml").read_text()
    # The eval host's IP may only appear in a comment.
    assert all("10.1.230.172" not in line.split("#")[0] for line in text.splitlines())


def test_wrong_type_names_file_line_field_expected_and_found(tmp_path):
    path = write(tmp_path, BASE.replace("port: 22\n", "port: twenty-two\n", 1))
    with pytest.raises(InputError) as exc:
        load_inventory(path)
    assert str(exc.value).startswith(f"{path}:5 hosts.kpro6.port: expected an integer 1-65535, got 'twenty-two'")


def test_unknown_key_lists_the_allowed_ones(tmp_path):
    path = write(tmp_path, BASE.replace("    roles: [train]\n", "    roles: [train]\n    gpus: 8\n"))
    with pytest.raises(InputError) as exc:
        load_inventory(path)
    msg = exc.value.message
    assert f"{path}:8 hosts.kpro6.gpus: unknown key 'gpus'" in msg
    assert "workdir" in msg and "identity_file" in msg


def test_duplicate_host_is_reported_with_both_lines(tmp_path):
    path = write(tmp_path, BASE + "\n  kpro6:\n    address: other\n    workdir: /x\n")
    with pytest.raises(InputError) as exc:
        load_inventory(path)
    assert f"{path}:17: duplicate key 'kpro6'" in exc.value.message
    assert "line 3" in exc.value.message


def test_missing_file_explains_how_to_point_at_one(tmp_path):
    with pytest.raises(InputError) as exc:
        load_inventory(tmp_path / "nope.yaml")
    assert "inventory file not found" in exc.value.message and "DFO_INVENTORY" in exc.value.hint


def test_relative_remote_path_and_unknown_reaches_are_refused(tmp_path):
    path = write(tmp_path, BASE.replace("workdir: /data/dfo\n    roles", "workdir: data/dfo\n    roles"))
    with pytest.raises(InputError, match=r":6 hosts.kpro6.workdir: expected an absolute path"):
        load_inventory(path)
    path = write(tmp_path, BASE + "    reaches: [kpro7]\n")
    with pytest.raises(InputError, match=r":16 hosts.ct129.reaches\[0\]: unknown host 'kpro7'"):
        load_inventory(path)


def test_unknown_host_on_the_command_line_lists_known_hosts(tmp_path):
    inv = load_inventory(write(tmp_path, BASE))
    with pytest.raises(InputError) as exc:
        inv.select(["ct130"])
    assert "'ct130'" in exc.value.message and "kpro6, ct129" in exc.value.hint


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["inventory", "check"], "port: expected an integer 1-65535, got 'twenty-two'"),
        (["deploy", "--dry-run"], "port: expected an integer 1-65535, got 'twenty-two'"),
    ],
)
def test_cli_bad_inventory_exits_2_without_traceback(tmp_path, args, fragment):
    path = write(tmp_path, BASE.replace("address: 10.9.9.9\n    port: 22", "address: 10.9.9.9\n    port: twenty-two"))
    proc = dfo("--inventory", str(path), *args)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr


def test_cli_unknown_host_and_missing_file_exit_2(tmp_path):
    path = write(tmp_path, BASE)
    proc = dfo("--inventory", str(path), "deploy", "--host", "ct130")
    assert proc.returncode == 2 and "known hosts: kpro6, ct129" in proc.stderr and "Traceback" not in proc.stderr
    proc = dfo("deploy", env={"DFO_INVENTORY": str(tmp_path / "missing.yaml")})
    assert proc.returncode == 2 and "inventory file not found" in proc.stderr


def test_set_keeps_every_other_byte(tmp_path):
    path = write(tmp_path, BASE)
    proc = dfo("--inventory", str(path), "inventory", "set", "ct129.port", "2222")
    assert proc.returncode == 0, proc.stderr
    assert path.read_text() == BASE.replace("10.9.9.9\n    port: 22", "10.9.9.9\n    port: 2222")
    assert load_inventory(path).hosts["ct129"].port == 2222


def test_set_adds_missing_nested_field_in_place(tmp_path):
    new = set_field(BASE, "ct129", ["paths", "models"], "/data/models", ["kpro6", "ct129"])
    assert new == BASE + "    paths:\n      models: /data/models\n"
    new = set_field(BASE, "kpro6", ["paths", "models"], "/m o d", ["kpro6", "ct129"])
    assert "      checkpoints: /data/ckpt\n      models: /m o d\n\n  ct129:" in new


def test_set_invalid_value_is_refused_and_file_untouched(tmp_path):
    path = write(tmp_path, BASE)
    proc = dfo("--inventory", str(path), "inventory", "set", "ct129.port", "twenty-two")
    assert proc.returncode == 2
    assert "hosts.ct129.port: expected an integer 1-65535, got 'twenty-two'" in proc.stderr
    assert path.read_text() == BASE
    assert not list(tmp_path.glob("*.dfo-tmp"))


def test_add_and_remove_host_round_trip(tmp_path):
    path = write(tmp_path, BASE)
    proc = dfo("--inventory", str(path), "inventory", "add-host", "ct130", "--address", "ct130", "--port", "2200")
    assert proc.returncode == 0, proc.stderr
    inv = load_inventory(path)
    assert inv.hosts["ct130"].port == 2200 and path.read_text().startswith(BASE)
    proc = dfo("--inventory", str(path), "inventory", "remove-host", "ct130")
    assert proc.returncode == 0, proc.stderr
    assert path.read_text() == BASE
    assert remove_host(BASE, "ct129", ["kpro6", "ct129"]) == BASE.split("\n  ct129:")[0].rstrip("\n") + "\n"


def test_add_existing_host_is_refused():
    with pytest.raises(InputError, match="already exists"):
        add_host(BASE, "kpro6", {"address": "x", "workdir": "/x"})


def test_ssh_config_supplies_what_the_inventory_leaves_out(tmp_path):
    (tmp_path / "ssh_config").write_text(
        "Host kp\n  HostName 127.0.0.5\n  Port 2201\n  User trainer\n  IdentityFile ~/.ssh/kp_key\n"
        "  ProxyJump bastion\n"
        "Host bastion\n  HostName 127.0.0.6\n  User jump\n"
    )
    path = write(tmp_path, "ssh_config: ssh_config\nhosts:\n  kpro6:\n    ssh_alias: kp\n    workdir: /w\n"
                           "  other:\n    address: kp\n    user: me\n    workdir: /w\n")
    inv = load_inventory(path)
    r = resolve_host(inv, "kpro6")
    assert (r.hostname, r.port, r.user) == ("127.0.0.5", 2201, "trainer")
    assert r.identity_files == (os.path.expanduser("~/.ssh/kp_key"),)
    assert r.proxy_jump is not None and (r.proxy_jump.hostname, r.proxy_jump.user) == ("127.0.0.6", "jump")
    assert resolve_host(inv, "other").user == "me"  # inventory fields win over ssh_config


README_STYLE = """hosts:
  kpro6: {address: kpro6, user: research, workdir: /data/dfo, roles: [train]}
  ct129:
    address: ct129
    workdir: /data/dfo
    paths: {models: /data/models, checkpoints: /data/dfo/checkpoints}  # the README's own example
"""


def test_set_edits_flow_style_mappings_in_their_style(tmp_path):
    known = ["kpro6", "ct129"]
    new = set_field(README_STYLE, "ct129", ["paths", "models"], "/srv/models", known)
    assert new == README_STYLE.replace("{models: /data/models,", "{models: /srv/models,")
    new = set_field(README_STYLE, "ct129", ["paths", "engine_venv"], "/shared/engines/vllm", known)
    assert "paths: {models: /data/models, checkpoints: /data/dfo/checkpoints, engine_venv: /shared/engines/vllm}  #" \
        in new
    new = set_field(README_STYLE, "kpro6", ["paths", "checkpoints"], "/data/ck", known)  # a flow host
    assert "  kpro6: {address: kpro6, user: research, workdir: /data/dfo, roles: [train], paths: {checkpoints: " \
        "/data/ck}}\n" in new
    assert set_field("hosts:\n  a: {address: a, env: {}}\n", "a", ["env", "X"], "1", ["a"]) == \
        "hosts:\n  a: {address: a, env: {X: \"1\"}}\n"
    path = write(tmp_path, README_STYLE)
    proc = dfo("--inventory", str(path), "inventory", "set", "ct129.paths.models", "/srv/models")
    assert proc.returncode == 0, proc.stderr
    assert load_inventory(path).hosts["ct129"].paths.models == "/srv/models"


def test_set_below_a_scalar_is_refused_with_nothing_written(tmp_path):
    path = write(tmp_path, README_STYLE)
    proc = dfo("--inventory", str(path), "inventory", "set", "ct129.address.port", "22")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "hosts.ct129.address is not a mapping, so it has no field 'port'" in proc.stderr
    assert f"nothing was written: {path} is unchanged" in " ".join(proc.stderr.split())
    assert path.read_text() == README_STYLE
