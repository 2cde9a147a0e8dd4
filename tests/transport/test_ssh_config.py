"""core.ssh_config: paramiko's ssh_config parser loaded without importing paramiko (a relay's start-up).

The same file must resolve exactly as paramiko's own SSHConfig resolves it (both SSH planes depend on it),
including `Match exec`, which needs invoke (imported only when such a line is evaluated)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

CONFIG = textwrap.dedent("""\
    Host alpha
        HostName 10.1.2.3
        Port 2201
        User trainer
    Host *.lab
        User labuser
        IdentityFile ~/.ssh/lab_%h
    Match exec "{marker}"
        ProxyJump bastion
    Host *
        ServerAliveInterval 30
    """)

PROBE = textwrap.dedent("""\
    import json, sys
    from orchestrator.core.inventory import _read_ssh_config
    cfg = _read_ssh_config(sys.argv[1])
    before = sorted(m for m in ("paramiko", "invoke") if m in sys.modules)
    out = {h: dict(cfg.lookup(h)) for h in ("alpha", "node1.lab", "other")}
    import paramiko
    ref = paramiko.SSHConfig.from_path(sys.argv[1])
    print(json.dumps({"before": before, "after": sorted(m for m in ("invoke",) if m in sys.modules),
                      "ours": out, "paramiko": {h: dict(ref.lookup(h)) for h in out},
                      "ours_class": type(cfg).__module__}))
    """)


def _probe(tmp_path: Path, marker: str) -> dict:
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG.format(marker=marker))
    proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_resolves_like_paramiko_without_importing_it(tmp_path):
    got = _probe(tmp_path, "false")  # the Match block does not apply
    assert got["before"] == [], "reading ssh_config imported paramiko or invoke"
    assert got["ours_class"].startswith("_dfo_paramiko_config")
    assert got["ours"] == got["paramiko"]
    assert got["ours"]["alpha"]["hostname"] == "10.1.2.3" and got["ours"]["alpha"]["port"] == "2201"
    assert got["ours"]["node1.lab"]["user"] == "labuser"
    assert "proxyjump" not in got["ours"]["other"]


def test_match_exec_imports_invoke_when_evaluated(tmp_path):
    got = _probe(tmp_path, "true")  # ProxyJump applies to every host
    assert got["before"] == []
    assert got["after"] == ["invoke"], "Match exec runs through invoke, imported when the line is evaluated"
    assert got["ours"] == got["paramiko"]
    assert got["ours"]["other"]["proxyjump"] == "bastion"
