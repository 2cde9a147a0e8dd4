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
