"""`dfo lint` over SSH on the sandbox hosts (the eval tests' session fixture: a training checkpoint on kpro6, the
target and z-lab drafters on ct129), and `dfo eval` stopping on a bad drafter before anything is relayed."""

from __future__ import annotations

import json
import shutil

import pytest
from cli_runner import dfo

pytestmark = [pytest.mark.sshd]


def test_lint_reads_each_side_on_its_host_and_the_fixtures_are_clean(sandbox, eval_hosts, tmp_path):
    ours = eval_hosts["ours"].split("=", 1)[1]  # kpro6:/…/trained-drafter/checkpoint.pt (spec.json beside it)
    for drafter in (ours, f"ct129:{eval_hosts['zlab']}"):
        proc = dfo(sandbox, "lint", drafter, "--target", f"ct129:{eval_hosts['target']}", "--json")
        assert proc.returncode == 0, proc.stderr[-2000:]
        report = json.loads(proc.stdout)
        assert report["ok"] and report["warnings"] == 0, report["findings"]
        assert any(f["code"] == "layer-convention" for f in report["findings"])


def test_eval_with_a_bad_drafter_stops_before_any_relay(sandbox, eval_hosts, tmp_path):
    # A z-lab drafter on kpro6 (so the eval would relay it) whose layer list has a duplicate.
    bad = sandbox.hosts["kpro6"].checkpoints / "lint-bad-drafter"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(eval_hosts["zlab"], bad)
    config = json.loads((bad / "config.json").read_text())
    ids = config["dflash_config"]["target_layer_ids"]
    config["dflash_config"]["target_layer_ids"] = [ids[0], *ids[:-1]]
    (bad / "config.json").write_text(json.dumps(config))
    relayed = sandbox.hosts["ct129"].checkpoints / "dfo-relayed" / "kpro6" / bad.name
    runs = tmp_path / "runs"
    proc = dfo(sandbox, "eval", "--host", "ct129", "--target", eval_hosts["target"], "--drafter",
               f"bad=kpro6:{bad}", "--samples", "2", "--max-new-tokens", "16", runs=runs)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "dfo lint found errors; nothing was relayed or started" in proc.stderr
    assert "[layer-ids-duplicate]" in proc.stderr and "drafter 'bad'" in proc.stderr
    assert "Traceback" not in proc.stderr and "relay drafter" not in proc.stderr
    assert not relayed.exists() and not (runs.exists() and any(runs.iterdir()))
    shutil.rmtree(bad)
