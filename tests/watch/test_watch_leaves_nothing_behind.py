"""What a finished watch leaves in its series folder: series.json whole (its journal folded in) and no lock file."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from orchestrator.core.errors import InputError
from orchestrator.watch import series as series_state
from orchestrator.watch.loop import SeriesLock, Watcher


def test_one_watcher_per_series_and_no_lock_file_after_it(tmp_path):
    lock = SeriesLock(tmp_path / "s")
    with pytest.raises(InputError, match="another `dfo watch` .* is watching series s"):
        SeriesLock(tmp_path / "s")
    lock.release()
    assert not (tmp_path / "s" / ".watch.lock").exists()
    again = SeriesLock(tmp_path / "s")  # taken again after a release
    again.release()


def test_a_stopping_watcher_folds_the_journal_into_series_json(tmp_path):
    folder = tmp_path / "s"
    series = series_state.new_series("s", source="kpro6:/ck", eval_host="ct129", settings={"target": "/m/t"})
    series_state.save(folder, series)  # the snapshot at start: no checkpoint yet
    for step in (100, 200, 300):
        entry = {"name": f"step_{step}.pt", "step": step, "status": "failed", "error": "x"}
        series["checkpoints"][entry["name"]] = entry
        series_state.record(folder, series, entry=entry)  # a journal line each
    assert json.loads((folder / "series.json").read_text())["checkpoints"] == {}
    Watcher._fold_journal(SimpleNamespace(series=series, folder=folder))  # type: ignore[arg-type]
    on_disk = json.loads((folder / "series.json").read_text())
    assert sorted(on_disk["checkpoints"]) == ["step_100.pt", "step_200.pt", "step_300.pt"]
    assert not (folder / series_state.JOURNAL).exists()
