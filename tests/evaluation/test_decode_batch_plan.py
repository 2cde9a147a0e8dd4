"""`--decode-batch` on the controller: in the help of `dfo eval` / `dfo watch`, refused when bad before anything
connects, in the planned payload command, and the reference stage's expected cost in the dry run from the host's
GPU-check figures (inventory ``gpu_check:``), or the reason there is none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.evaluation.decode_cost import decode_rates, reference_cost, rows_per_host

EVAL = ["eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d", "--dry-run"]
FIGURES = {"steps": {"cost": {"sections": {"decode": {"tokens_per_s": 9.0},
                                           "batched_decode": {"by_batch": {"1": {"tokens_per_s": 9.5},
                                                                           "8": {"tokens_per_s": 70.0},
                                                                           "32": {"tokens_per_s": 260.0}}}}}}}


def _inventory(tmp_path: Path, gpu_check: str | None) -> Path:
    extra = f", gpu_check: {gpu_check}" if gpu_check else ""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n  ct129: {{address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]{extra}}}\n")
    return path


@pytest.mark.parametrize("command", ["eval", "watch"])
def test_decode_batch_is_in_the_help(command):
    proc = dfo(command, "--help")
    assert proc.returncode == 0 and "--decode-batch" in proc.stdout and "N|auto" in proc.stdout


def test_decode_batch_is_in_the_payloads_help():
    import argparse

    from remote_payload.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    text = " ".join(sub.choices["eval"].format_help().split())
    assert "--decode-batch N|auto" in text and "1 on the CPU" in text


def test_a_bad_decode_batch_is_refused_before_anything_connects(tmp_path):
    proc = dfo(*EVAL, "--decode-batch", "0", inventory=_inventory(tmp_path, None))
    assert proc.returncode == 2 and "--decode-batch '0': expected a whole number of rows >= 1, or auto" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_dry_run_plans_it_and_prints_the_cost_from_the_hosts_gpu_check(tmp_path):
    (tmp_path / "ct129-gpu-check.json").write_text(json.dumps(FIGURES))
    inventory = _inventory(tmp_path, "ct129-gpu-check.json")  # relative to the inventory file
    proc = dfo(*EVAL, "--decode-batch", "16", "--samples", "10", "--max-new-tokens", "100", inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "--decode-batch 16" in text
    # batch 16 was not measured: the rate of 8 (the largest not above it) bounds it; 10 rows × (100 + 15) tokens
    assert "ct129: at most 16s (10 rows × 100 + 15 tokens at 70 tok/s, batch 8, from its GPU check" in text
    plan = json.loads(dfo(*EVAL, "--json", inventory=inventory).stdout)["plan"]
    assert "--decode-batch" not in plan["jobs"][0]["args"]  # unset: the payload's own default, auto


def test_without_figures_the_dry_run_says_so(tmp_path):
    proc = dfo(*EVAL, inventory=_inventory(tmp_path, None))
    assert proc.returncode == 0 and "ct129: no GPU-check figures (give the host `gpu_check: FILE`" in proc.stdout
    proc = dfo(*EVAL, inventory=_inventory(tmp_path, "missing.json"))
    assert proc.returncode == 0 and "missing.json: cannot read it" in " ".join(proc.stdout.split())


def test_the_cost_takes_the_rate_of_the_batch_the_run_uses():
    rates = decode_rates(FIGURES)
    assert rates == {1: 9.5, 8: 70.0, 32: 260.0}
    assert reference_cost(rates, 64, 2048, 15, "auto")["batch"] == 32  # auto: the largest measured
    assert reference_cost(rates, 64, 2048, 15, "1")["seconds"] == pytest.approx(64 * 2063 / 9.5)
    assert reference_cost(rates, 64, 2048, 15, None)["tokens"] == 64 * 2063
    assert reference_cost({}, 64, 2048, 15, "auto") is None
    assert decode_rates({"steps": {"cost": {"sections": {"decode": {"tokens_per_s": "fast"}}}}}) == {}
    assert decode_rates({"steps": {"cost": {"sections": {"decode": {"tokens_per_s": 5.8}}}}}) == {1: 5.8}
    assert rows_per_host(128, 3, 4) == 43 * 4 and rows_per_host(None, 1, 1) is None
