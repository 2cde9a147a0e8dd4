"""`inventory check --connect` facts: a host script run through hostcall (no shell lines), what a host without
the inventory's interpreter still tells, and a reply of the wrong shapes kept out of the output."""

from __future__ import annotations

import json
import re

import pytest
from cli_runner import dfo

from orchestrator.core.errors import HostError
from orchestrator.transport.facts import parse_facts

PATHS = ["/w", "/w/venv"]


@pytest.mark.sshd
def test_a_missing_interpreter_is_reported_and_the_rest_still_measured(sandbox, tmp_path):
    text = re.sub(r"(?ms)(^  ct129:\n.*?^    python: ).*?$", r"\g<1>/nonexistent/python3.99",
                  sandbox.inventory_path.read_text(), count=1)
    assert "/nonexistent/python3.99" in text
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    proc = dfo("--inventory", str(path), "inventory", "check", "--connect", "--json")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)["hosts"]
    assert facts["ct129"]["reachable"] and facts["ct129"]["python"] is None  # measured with python3, not shown
    assert facts["ct129"]["free_disk"][str(sandbox.hosts["ct129"].workdir)] > 0
    assert facts["kpro6"]["python"].startswith("3.")
    table = dfo("--inventory", str(path), "inventory", "check", "--connect", env={"COLUMNS": "200"})
    assert "missing" in table.stdout


def test_a_reply_of_the_wrong_shapes_is_kept_out():
    facts = parse_facts("h", {"python": "3.11.2\x1b[2J", "gpus": ["A6000, 48 GiB", 7, {"x": 1}],
                              "free_disk": {"/w": -5, "/w/venv": True, "/etc": 10}}, PATHS, python_runs=True)
    assert facts.python is None and facts.gpus == ["A6000, 48 GiB"]
    assert facts.free_disk == {"/w": None, "/w/venv": None}  # only the paths asked about, only counts
    good = parse_facts("h", {"python": "3.12.1", "gpus": [], "free_disk": {"/w": 1024, "/w/venv": 0}}, PATHS,
                       python_runs=True)
    assert good.python == "3.12.1" and good.free_disk == {"/w": 1024, "/w/venv": 0}
    fallback = parse_facts("h", {"python": "3.12.1", "gpus": [], "free_disk": {}}, PATHS, python_runs=False)
    assert fallback.python is None  # the version of python3, not of the inventory's interpreter
    with pytest.raises(HostError, match="unexpected reply"):
        parse_facts("h", ["not", "an", "object"], PATHS, python_runs=True)
