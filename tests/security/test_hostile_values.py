"""Issue 30, the small ones: DDTree's k from a host, a short write of the series journal, integers from hosts.

A host writes results.json: its DDTree k became part of a TensorBoard tag and of the metric names the W&B and
MLflow hooks log, unchecked. The series journal took one os.write(2) as whole: a short one left a fragment
that the next change joined into a line the series then reads as damage.
"""

from __future__ import annotations

import os

import pytest

from orchestrator.core.errors import InputError, OperationError
from orchestrator.watch import series as series_state
from orchestrator.watch import tensorboard
from orchestrator.watch.measures import measure


def _results_and_samples(k: object, block_size: object = 8) -> tuple[dict, list[dict]]:
    rounds = {"tau": 2.0, "rounds": 2, "anchors": [20, 22], "accepted": [1, 1], "produced": [2, 2]}
    samples = [{"index": i, "id": f"p{i}", "prompt_tokens": 20, "continuation_tokens": 5,
                "drafters": {"ck": {**rounds, "tree": {"topk": {"k": k, **rounds}}}}} for i in range(3)]
    metrics = {"tau_macro": 2.0, "tau_micro": 2.0, "tree": {"topk": {"k": k, "tau_macro": 2.0}},
               "per_position": [{"k": 1, "p": 0.5}], "block_size": block_size, "samples": 3, "rounds": 6}
    return {"drafters": {"ck": {"metrics": metrics}}}, samples


@pytest.mark.parametrize("k", ["8/../../x", "8 \x1b[2J", 10**30, True, 0, -8, 2.5, [8]])
def test_a_hosts_ddtree_k_is_checked_before_it_names_a_tag_or_metric(k):
    results, samples = _results_and_samples(k)
    with pytest.raises(InputError, match="the DDTree k of drafter 'ck' is .*, not a whole number from 1 to 4096"):
        measure(results, samples, "ck")


def test_a_valid_k_names_the_tag_and_an_older_series_bad_one_names_none():
    results, samples = _results_and_samples(16)
    m = measure(results, samples, "ck")
    assert m["ddtree"]["k"] == 16
    assert "dflash/ddtree_16" in dict(tensorboard.scalars({"measures": m}))
    m["ddtree"]["k"] = "16/../../etc"  # a series written before the check
    assert not [tag for tag, _ in tensorboard.scalars({"measures": m}) if tag.startswith("dflash/ddtree")]


def test_a_huge_block_size_from_a_host_is_a_clear_error():
    results, samples = _results_and_samples(8, block_size=1e400)  # JSON's 1e400 reads as inf
    with pytest.raises(InputError, match="unexpected content for drafter 'ck'"):
        measure(results, samples, "ck")


def _entry(step: int) -> dict:
    stat = {"value": 2.0, "ci": [1.8, 2.2]}
    return {"name": f"step_{step}.pt", "step": step, "status": "done", "run": f"run-{step}",
            "measures": {"tau_macro": stat, "tau_micro": stat, "ddtree": {"k": 8, **stat},
                         "p": [{"k": 1, **stat}]}}


def test_a_short_write_of_the_series_journal_is_completed(tmp_path, monkeypatch):
    s = series_state.new_series("s", source="kpro6:/ck", eval_host="ct129", settings={})
    series_state.save(tmp_path, s)
    real_write = os.write

    def short(fd, data):  # the kernel takes 7 bytes at a time (a signal, a nearly full disk)
        return real_write(fd, bytes(data[:7]))

    monkeypatch.setattr(os, "write", short)
    for step in (100, 200):
        series_state.record(tmp_path, s, entry=_entry(step))
    monkeypatch.setattr(os, "write", real_write)
    loaded = series_state.load_series(tmp_path)
    assert sorted(loaded["checkpoints"]) == ["step_100.pt", "step_200.pt"]


def test_a_journal_write_that_cannot_finish_leaves_no_fragment(tmp_path, monkeypatch):
    s = series_state.new_series("s", source="kpro6:/ck", eval_host="ct129", settings={})
    series_state.save(tmp_path, s)
    series_state.record(tmp_path, s, entry=_entry(100))
    journal = tmp_path / series_state.JOURNAL
    before = journal.read_bytes()
    real_write = os.write
    calls: list[int] = []

    def full_disk(fd, data):  # 10 bytes go, then the disk is full
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OperationError, match="could not append the change .*No space left on device"):
        series_state.record(tmp_path, s, entry=_entry(200))
    monkeypatch.setattr(os, "write", real_write)
    assert journal.read_bytes() == before  # no fragment for the next change to join
    series_state.record(tmp_path, s, entry=_entry(300))
    assert sorted(series_state.load_series(tmp_path)["checkpoints"]) == ["step_100.pt", "step_300.pt"]


def _job(**fields) -> dict:
    return {"job_id": "20260101-000000-abcd", "state": "succeeded", "job_dir": "/w/jobs/x", **fields}


@pytest.mark.parametrize("field, value", [("pid", 2**64), ("pid", 2**22 + 1), ("exit_code", 10**30),
                                          ("exit_code", 256), ("log_size", 2**63), ("results", -1)])
def test_integers_in_a_job_reply_are_bounded(field, value):
    from orchestrator.core.errors import HostError
    from orchestrator.jobs.replies import JobStatus

    assert JobStatus.from_host("ct129", _job(pid=4242, exit_code=0, log_size=10)).pid == 4242
    with pytest.raises(HostError, match=f"ct129: malformed jobs reply from the host: .* is {value}"):
        JobStatus.from_host("ct129", _job(**{field: value}))


def test_sizes_in_relay_and_provision_replies_are_bounded():
    from orchestrator.core.errors import HostError
    from orchestrator.provision.replies import pool_listing
    from orchestrator.relay.replies import DestFacts, SourceFacts

    listing = {"kind": "dir", "path": "/ck", "files": [{"rel": "a.pt", "size": 2**64, "mtime_ns": 1}]}
    with pytest.raises(HostError, match="kpro6: malformed answer about kpro6:/ck .*size is 18446744073709551616"):
        SourceFacts.parse(listing, "kpro6")
    dest = {"kind": "dir", "free_measured_at": "t", "writable": True, "writable_checked_at": "t", "files": []}
    for bad in (float("inf"), "12", 2**70, -1):  # inf: an OverflowError (a traceback) before
        with pytest.raises(HostError, match="ct129: malformed destination facts"):
            DestFacts.parse({**dest, "free_bytes": bad}, "ct129")
    assert DestFacts.parse({**dest, "free_bytes": 5}, "ct129").free_bytes == 5
    with pytest.raises(HostError, match="a whole number from 0 to 2\\*\\*63-1"):
        pool_listing("ct129", {"w-1.whl": 2**63})


def test_a_hosts_k_in_an_engine_sweep_is_a_small_ascii_number():
    from orchestrator.evaluation.k_schedule import step_points

    timing = {"tokens_per_s": 100.0, "mean_acceptance_length": 3.0}
    row = {"concurrency": 1, "plain_tokens_per_s": 50.0, "dflash_tokens_per_s": 90.0, "mean_acceptance_length": 2.5,
           "per_k": {"²": timing, "9" * 5000: timing, "4": timing}}
    assert [k for k, _ in step_points([row], 8)[1]] == [0, 4, 8]  # '²' and the 5000 digits ignored
