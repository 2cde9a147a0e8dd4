"""Merging the shards of a run on benchmark datasets: each drafter's per-dataset block is recomputed over every
sample, a dataset read from the same bytes on each host merges whatever its path there, other bytes are
refused. On the synthetic runs of test_aggregate_shards.py."""

from __future__ import annotations

import copy

import pytest
from test_aggregate_shards import _all_lines, _run

from remote_payload.errors import PayloadError
from remote_payload.metrics.aggregate import dataset_breakdown, merge_shards


def _record(host: int, sha: str) -> dict:
    return {"name": "gsm8k", "split": "test", "rows": 7, "row_ids": [str(i) for i in range(7)],
            "selection": {"rule": "zlab-transformers", "seed": 0, "requested": None},
            "source": {"files": [f"/host{host}/inputs/datasets/gsm8k.jsonl"], "format": "jsonl", "sha256": sha}}


def _parts(sha1: str = "s" * 64):
    lines = _all_lines()
    for line in lines:
        line["dataset"] = "gsm8k" if line["index"] < 4 else "mt-bench"
        line["category"] = "math" if line["index"] % 3 else "writing"
    halves = [[x for x in lines if x["index"] % 2 == i] for i in (0, 1)]
    parts = []
    for i, (half, sha) in enumerate(zip(halves, ("s" * 64, sha1), strict=True)):
        results = _run(copy.deepcopy(half), (i, 2))
        results["settings"]["datasets"] = [_record(i, sha)]
        parts.append((results, copy.deepcopy(half)))
    return lines, parts


def test_the_per_dataset_block_is_recomputed_over_every_sample():
    lines, parts = _parts()
    merged, samples = merge_shards(parts)
    assert [s["index"] for s in samples] == list(range(len(lines)))
    for name in ("a", "b"):
        block = merged["drafters"][name]["metrics"]["by_dataset"]
        assert block == dataset_breakdown(samples, name, seed=0)
        assert block["gsm8k"]["samples"] == 4 and block["mt-bench"]["samples"] == len(lines) - 4
        taus = [x["drafters"][name]["tau"] for x in lines if x["dataset"] == "gsm8k"]
        assert block["gsm8k"]["tau_macro"]["value"] == pytest.approx(sum(taus) / len(taus))


def test_a_dataset_read_from_other_bytes_on_one_host_is_refused():
    _, parts = _parts(sha1="t" * 64)
    with pytest.raises(PayloadError, match="datasets"):
        merge_shards(parts)
