"""`dfo lint` in this process: local paths need no inventory, bad input is one clear message (exit 2), errors
found exit 1, --json is one document."""

from __future__ import annotations

import json

from cli_runner import dfo
from lint_fixtures import target, zlab_config, zlab_drafter


def test_a_local_lint_needs_no_inventory_and_exits_1_on_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no inventory.yaml here
    tgt = target(tmp_path / "t")
    good = dfo("lint", str(zlab_drafter(tmp_path / "good")), "--target", str(tgt))
    assert good.returncode == 0 and "0 error(s), 0 warning(s)" in good.stdout, good.stderr
    bad = zlab_drafter(tmp_path / "bad", zlab_config(target_layer_ids=[1, 3, 3]))
    proc = dfo("lint", str(bad), "--target", str(tgt), "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert not report["ok"] and report["errors"] >= 1
    assert {"code": "layer-ids-duplicate", "severity": "error", "field": "dflash_config.target_layer_ids"}.items() \
        <= next(f for f in report["findings"] if f["code"] == "layer-ids-duplicate").items()
    shown = dfo("lint", str(bad), "--target", str(tgt))
    assert "[layer-ids-duplicate]" in shown.stdout and "→ list each trained layer once" in shown.stdout


def test_bad_paths_are_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    proc = dfo("lint", str(tmp_path / "nothing"))
    assert proc.returncode == 2 and "no such file or folder here" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "inventory.yaml").write_text("hosts:\n  kpro6:\n    address: 127.0.0.1\n    workdir: /srv/dfo\n")
    proc = dfo("lint", "nohost:/x", inventory=tmp_path / "inventory.yaml")
    assert proc.returncode == 2 and "unknown host 'nohost'" in proc.stderr, proc.stderr
