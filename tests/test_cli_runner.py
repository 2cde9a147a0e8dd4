"""tests/cli_runner.py: ``dfo`` in this process gives what ``dfo_process``, a real ``python -m orchestrator``, gives."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest
from cli_runner import _warnings_and_logs_on_stderr, dfo, dfo_process

INVENTORY = """\
hosts:
  {first}:
    address: 10.9.9.9
    port: 22
    workdir: /data/dfo
    roles: [train]
  {second}:
    address: 10.9.9.10
    port: 2222
    workdir: /data/dfo
    roles: [eval]
"""


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "inventory.yaml"
    good.write_text(INVENTORY.format(first="kpro6", second="ct129"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(INVENTORY.format(first="kpro6", second="ct129").replace("port: 2222", "port: twenty-two"))
    return {"good": good, "bad": bad, "missing": tmp_path / "missing.yaml", "runs": tmp_path / "runs"}


CASES = {
    "help": ["--help"],
    "command help": ["relay-checkpoint", "--help"],
    "no such command": ["deplyo"],
    "no such option": ["deploy", "--hots", "ct129"],
    "show": ["--inventory", "{good}", "inventory", "show"],
    "show json": ["--inventory", "{good}", "inventory", "show", "--json"],
    "bad inventory": ["--inventory", "{bad}", "deploy", "--dry-run"],
    "missing inventory": ["--inventory", "{missing}", "deploy"],
    "unknown host": ["--inventory", "{good}", "deploy", "--host", "ct130"],
    "no runs": ["runs", "list", "--runs-dir", "{runs}"],
}


@pytest.mark.parametrize("argv", CASES.values(), ids=CASES.keys())
def test_in_process_gives_the_exit_code_and_output_of_a_process(files, argv):
    args = [a.format(**files) for a in argv]
    ours, real = dfo(*args), dfo_process(*args)
    assert (ours.returncode, ours.stdout, ours.stderr) == (real.returncode, real.stdout, real.stderr)


def test_an_exception_leaving_main_is_a_traceback_and_exit_1_as_in_a_process(files):
    args = ["--inventory", str(files["bad"]), "deploy", "--dry-run"]
    ours, real = (run(*args, env={"DFO_DEBUG": "1"}) for run in (dfo, dfo_process))
    assert ours.returncode == real.returncode == 1
    for proc in (ours, real):
        assert proc.stderr.startswith("Traceback (most recent call last):"), proc.stderr
    assert ours.stderr.splitlines()[-1] == real.stderr.splitlines()[-1]
    assert "expected an integer 1-65535, got 'twenty-two'" in ours.stderr.splitlines()[-1]


def test_each_call_gets_its_own_context_and_leaves_the_process_as_it_was(tmp_path, files):
    other = tmp_path / "other.yaml"
    other.write_text(INVENTORY.format(first="a1", second="b2"))
    before = (dict(os.environ), os.getcwd(), sys.argv, sys.stdin, sys.stdout, sys.stderr)
    first = dfo("inventory", "show", "--json", inventory=files["good"], cwd=tmp_path, env={"DFO_X": "1"})
    second = dfo("inventory", "show", "--json", inventory=other)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert '"kpro6"' in first.stdout and '"a1"' not in first.stdout
    assert '"a1"' in second.stdout and '"kpro6"' not in second.stdout  # not the first call's inventory
    assert (dict(os.environ), os.getcwd(), sys.argv, sys.stdin, sys.stdout, sys.stderr) == before


def test_a_command_sees_the_environment_and_folder_it_was_given(tmp_path, files):
    (tmp_path / "inventory.yaml").write_text(files["good"].read_text())
    relative = dfo("inventory", "show", "--json", env={"DFO_INVENTORY": "inventory.yaml"}, cwd=tmp_path)
    assert relative.returncode == 0 and '"kpro6"' in relative.stdout, relative.stderr


def test_warnings_and_library_logs_reach_stderr_as_in_a_process(capsys):
    with _warnings_and_logs_on_stderr():
        warnings.warn("tight layout not applied", UserWarning, stacklevel=1)
        warnings.warn("an old call", DeprecationWarning, stacklevel=1)  # hidden outside __main__, as in a process
        # (not paramiko's logger: dfo keeps that one off the terminal once it connects, unless DFO_DEBUG=1)
        logging.getLogger("invoke.runners").error("Socket exception: reset")
        logging.getLogger("invoke.runners").info("chatter")
    err = capsys.readouterr().err
    assert "UserWarning: tight layout not applied" in err and "an old call" not in err
    assert "Socket exception: reset\n" in err and "chatter" not in err
