"""The --on-result examples for W&B and MLflow (orchestrator/watch/examples/): their contract, run as --on-result
runs them (the result JSON on stdin), against stand-in modules on PYTHONPATH (tests/watch/fake_trackers/):
wandb and mlflow are not installed here, so what is tested is the calls the scripts make, not the trackers."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import series_data

from orchestrator.watch import tensorboard
from orchestrator.watch.hooks import run_hook

EXAMPLES = Path(__file__).resolve().parents[2] / "orchestrator" / "watch" / "examples"
FAKES = Path(__file__).resolve().parent / "fake_trackers"


def _result(status: str = "done") -> dict:
    e = series_data.entry(1500, 2.75)
    return {"series": "run7", "checkpoint": e["name"], "step": 1500, "status": status, "run": e["run"],
            "measures": e["measures"] if status == "done" else None, "verdict": e["verdict"], "error": None,
            "baselines": {"zlab": {"tau_macro": {"value": 3.5, "ci": None}}}}


def _run(script: str, result: dict, tmp_path: Path, **env: str) -> list:
    log = tmp_path / "calls.jsonl"
    old = dict(os.environ)
    os.environ.update(PYTHONPATH=str(FAKES), FAKE_TRACKER_LOG=str(log), **env)
    try:
        outcome = run_hook(f"{sys.executable} {EXAMPLES / script}", result)
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert outcome["ok"], outcome
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _tags(result: dict) -> dict:
    entry = {"step": result["step"], "measures": result["measures"]}
    return dict(tensorboard.scalars(entry, {"drafters": result["baselines"]}))


def test_wandb_logs_the_tensorboard_scalars_against_the_training_step(tmp_path):
    calls = _run("wandb_on_result.py", _result(), tmp_path, WANDB_PROJECT="drafters")
    assert calls[0] == ["init", {"project": "drafters", "id": "dfo-run7", "resume": "allow", "name": "dfo-run7"}]
    assert ["define_metric", "dflash*", "trainer/global_step"] in calls
    logged = next(c[1] for c in calls if c[0] == "log")
    assert logged.pop("trainer/global_step") == 1500
    assert logged == pytest.approx(_tags(_result())) and logged["dflash_baseline/zlab"] == 3.5
    assert calls[-1] == ["finish"]


def test_wandb_attaches_to_the_trainers_run_and_skips_a_failed_checkpoint(tmp_path):
    calls = _run("wandb_on_result.py", _result(), tmp_path, WANDB_RUN_ID="trainer-abc")
    assert calls[0][1]["id"] == "trainer-abc"
    failed = tmp_path / "failed"
    failed.mkdir()
    assert _run("wandb_on_result.py", _result("failed"), failed) == []  # not even an init


def test_mlflow_logs_the_same_names_at_the_step_into_the_given_or_a_found_run(tmp_path):
    calls = _run("mlflow_on_result.py", _result(), tmp_path, MLFLOW_RUN_ID="trainer-run")
    assert calls[0] == ["start_run", "trainer-run", None]
    assert calls[1] == ["log_metrics", pytest.approx(_tags(_result())), 1500]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    calls = _run("mlflow_on_result.py", _result(), fresh)
    assert calls[0] == ["set_experiment", "dfo"]
    assert calls[1] == ["search_runs", "tags.mlflow.runName = 'dfo-run7'"]
    assert calls[2] == ["start_run", None, "dfo-run7"] and calls[3] == ["start_run", "made-run", None]
    assert calls[4][0] == "log_metrics" and calls[4][2] == 1500
