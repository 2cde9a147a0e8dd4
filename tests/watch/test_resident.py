"""The resident worker's pure parts: the worker's arguments from a checkpoint's eval, and the worker's checks on a
request (every path confined, the relayed files' digests) before it loads anything."""

from __future__ import annotations

import hashlib
import os

import pytest

from orchestrator.watch.resident import drafter_spec_of, handover_args, worker_args
from remote_payload.errors import PayloadError
from remote_payload.eval.worker import checked_request, verify_relayed


def test_the_worker_takes_the_evals_options_without_drafter_and_output():
    args = ["eval", "--target", "/m/t", "--drafter", "step_1=/r/step_1-weights", "--samples", "3", "--out",
            "{results}", "--dtype", "float32"]
    assert worker_args(args, drafter_root="/r", jobs_root="/w/jobs", idle=300) == [
        "eval-worker", "--target", "/m/t", "--samples", "3", "--dtype", "float32", "--worker-dir", "{job_dir}/worker",
        "--drafter-root", "/r", "--jobs-root", "/w/jobs", "--idle-exit", "300"]
    assert handover_args("s", "/r/s-weights", "/w/jobs/J/worker", [{"rel": "model.safetensors", "sha256": "ab"}]) == [
        "eval-handover", "--worker-dir", "/w/jobs/J/worker", "--drafter", "s=/r/s-weights", "--sha256",
        "model.safetensors=ab"]


def test_a_drafter_spec_travels_with_the_handover_not_in_the_workers_arguments():
    """`dfo watch --drafter-spec FILE` gives each checkpoint's eval `--drafter-spec=NAME=FILE`: NAME changes with
    every checkpoint, so the worker (started once, keyed by its arguments) does not take it; each handover does."""
    args = ["eval", "--target", "/m/t", "--drafter", "step_1=/r/step_1-weights", "--out", "{results}",
            "--drafter-spec=step_1=/specs/run.json"]
    assert worker_args(args, drafter_root="/r", jobs_root="/w/jobs", idle=300)[:3] == [
        "eval-worker", "--target", "/m/t"]
    assert not any("spec" in a for a in worker_args(args, drafter_root="/r", jobs_root="/w/jobs", idle=300))
    assert not any("spec" in a for a in worker_args([*args[:-1], "--drafter-spec", "step_1=/s.json"],
                                                    drafter_root="/r", jobs_root="/w/jobs", idle=300))
    assert drafter_spec_of(args, "step_1") == "/specs/run.json" and drafter_spec_of(args, "step_2") is None
    assert drafter_spec_of(["eval", "--drafter-spec", "s=/a=b.json"], "s") == "/a=b.json"
    assert handover_args("step_1", "/r/w", "/w/J/worker", [], "/specs/run.json")[-2:] == [
        "--drafter-spec", "/specs/run.json"]


@pytest.fixture
def roots(tmp_path):
    relay, jobs = tmp_path / "relay", tmp_path / "jobs"
    (relay / "s-weights").mkdir(parents=True)
    (relay / "s-weights" / "model.safetensors").write_bytes(b"weights")
    (jobs / "J1" / "results").mkdir(parents=True)
    os.symlink(tmp_path, relay / "escape")
    return relay, jobs


def _request(relay, jobs, **change):
    digest = hashlib.sha256(b"weights").hexdigest()
    doc = {"name": "s", "path": str(relay / "s-weights"), "sha256": {"model.safetensors": digest},
           "job_dir": str(jobs / "J1")}
    return {**doc, **change}


def test_a_good_request_is_read_with_its_paths_resolved(roots):
    relay, jobs = roots
    r = checked_request(_request(relay, jobs), drafter_root=relay, jobs_root=jobs)
    assert r["out"] == (jobs / "J1" / "results").resolve() and r["name"] == "s" and r["spec"] is None
    assert checked_request(_request(relay, jobs, spec="/specs/run.json"), drafter_root=relay,
                           jobs_root=jobs)["spec"] == "/specs/run.json"
    verify_relayed(r["path"], r["sha256"])


@pytest.mark.parametrize("change, phrase", [
    ({"path": "/etc"}, "is not inside"),
    ({"path": "{relay}/escape/jobs"}, "is not inside"),        # a link inside the relay folder that leaves it
    ({"path": "{relay}/../jobs"}, "is not inside"),
    ({"job_dir": "{jobs}/J1/results"}, "is not a job folder"),  # outputs only into a job folder of jobs/
    ({"job_dir": "/tmp"}, "is not inside"),
    ({"name": "../x"}, "not a plain name"),
    ({"sha256": {"../../etc/passwd": "a" * 64}}, "leaves the drafter folder"),
    ({"sha256": {"model.safetensors": "zz"}}, "sha256 entry"),
    ({"sha256": {}}, "no sha256"),
    ({"spec": "specs/run.json"}, "not an absolute path"),
    ({"spec": 7}, "not an absolute path"),
])
def test_a_request_that_leaves_its_folders_is_refused(roots, change, phrase):
    relay, jobs = roots
    change = {k: v.format(relay=relay, jobs=jobs) if isinstance(v, str) else v for k, v in change.items()}
    with pytest.raises(PayloadError, match=phrase):
        checked_request(_request(relay, jobs, **change), drafter_root=relay, jobs_root=jobs)


def test_a_relayed_file_changed_since_the_relay_is_refused(roots):
    relay, jobs = roots
    r = checked_request(_request(relay, jobs), drafter_root=relay, jobs_root=jobs)
    (relay / "s-weights" / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(PayloadError, match="no longer has the sha256 the relay verified"):
        verify_relayed(r["path"], r["sha256"])
    (relay / "s-weights" / "model.safetensors").unlink()
    with pytest.raises(PayloadError, match="is missing"):
        verify_relayed(r["path"], r["sha256"])
