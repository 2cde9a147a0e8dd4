"""Inventory `env` reaches the processes it is meant for, never a command line or a message."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import load_inventory, parse_inventory
from orchestrator.transport import Connector

SECRET = "s3cr3t-value-7f1d"


@pytest.mark.sshd
def test_env_reaches_every_process_of_the_command_and_no_command_line(sandbox):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        session = conn.session("ct129")
        # The strip process runs as `cd DIR && python …`: the environment must reach what follows the cd,
        # and the shell's own command line (what `ps` shows on the host) must not hold the value.
        res = session.run('cd / && printenv DFO_T_SECRET && tr "\\0" " " < /proc/$$/cmdline && echo && cat',
                          env={"DFO_T_SECRET": SECRET}, stdin=b"own input\n")
    first, cmdline, own = res.text.splitlines()[:3]
    assert first == SECRET
    assert SECRET not in cmdline and "cat" in cmdline
    assert own == "own input"  # the command's stdin is intact after the environment line
    assert SECRET not in res.command


@pytest.mark.sshd
def test_a_failing_command_does_not_print_env_values(sandbox):
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        with pytest.raises(Exception) as info:
            conn.session("ct129").run("exit 3", env={"DFO_T_SECRET": SECRET})
    assert "exited with 3" in str(info.value) and SECRET not in str(info.value)


@pytest.mark.parametrize("key", ["A;id;B", "1X", "A B", "$(id)", "A=B"])
def test_env_keys_must_be_shell_identifiers(tmp_path, key):
    with pytest.raises(InputError, match="not a shell identifier"):
        parse_inventory(f"hosts:\n  h: {{address: h, workdir: /w, env: {{{key!r}: x}}}}\n", tmp_path / "i.yaml")


def test_env_values_are_not_echoed_in_inventory_errors(tmp_path):
    with pytest.raises(InputError) as info:
        parse_inventory("hosts:\n  h: {address: h, workdir: /w, env: {TOKEN: [9173625]}}\n", tmp_path / "i.yaml")
    assert "hosts.h.env.TOKEN" in str(info.value) and "9173625" not in str(info.value)


@pytest.mark.sshd
def test_rekey_limits_are_raised_on_one_session_only(sandbox):
    import paramiko

    default = paramiko.packet.Packetizer.REKEY_BYTES
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        bulk, other = conn.session("ct129"), conn.session("kpro6")
        bulk.raise_rekey_limits()
        assert bulk.transport.packetizer.REKEY_BYTES > 1 << 60
        assert other.transport.packetizer.REKEY_BYTES == default == paramiko.packet.Packetizer.REKEY_BYTES
        assert bulk.run("echo ok").text.strip() == "ok"
