"""A long series: the journal (appended per change, folded into series.json rarely), series.md and `series show`
summarised, the plot's last-N window, and TensorBoard event files read back with TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import series_data
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.watch import series as series_state
from orchestrator.watch import tensorboard
from orchestrator.watch.plot import tau_figure
from orchestrator.watch.render import MD_ROWS, series_markdown


def _series(folder: Path, n: int, **kw) -> dict:
    s = series_state.new_series("long", source="kpro6:/ck", eval_host="ct129", settings={"target": "/m/t"})
    series_state.save(folder, s)
    for i in range(1, n + 1):
        e = series_data.entry(100 * i, 2.0 + i / n, **kw)
        s["checkpoints"][e["name"]] = e
        series_state.record(folder, s, entry=e)
    return s


def test_a_change_appends_one_line_and_the_series_reads_back_whole(tmp_path):
    s = _series(tmp_path, 5)
    snapshot = (tmp_path / "series.json").read_text()
    assert json.loads(snapshot)["checkpoints"] == {}  # the snapshot was not rewritten per change
    journal = (tmp_path / series_state.JOURNAL).read_text().splitlines()
    assert len(journal) == 5 and json.loads(journal[-1])["entry"]["step"] == 500
    loaded = series_state.load_series(tmp_path)
    assert loaded["checkpoints"] == s["checkpoints"]
    assert [p["step"] for p in loaded["steps"]] == [100, 200, 300, 400, 500]
    series_state.record(tmp_path, loaded, removed="step_300.pt")
    assert "step_300.pt" not in series_state.load_series(tmp_path)["checkpoints"]


def test_the_journal_is_folded_into_a_new_snapshot_every_compact_every_lines(tmp_path, monkeypatch):
    monkeypatch.setattr(series_state, "COMPACT_EVERY", 4)
    _series(tmp_path, 9)
    lines = (tmp_path / series_state.JOURNAL).read_text().splitlines()
    assert len(lines) < 4  # folded twice
    assert len(json.loads((tmp_path / "series.json").read_text())["checkpoints"]) == 9 - len(lines)
    assert len(series_state.load_series(tmp_path)["checkpoints"]) == 9


def test_a_line_a_crash_cut_short_is_ignored_and_a_bad_line_inside_is_named(tmp_path):
    _series(tmp_path, 3)
    journal = tmp_path / series_state.JOURNAL
    with journal.open("a") as fh:
        fh.write('{"t": "x", "entry": {"name": "step_4')  # the write a SIGKILL interrupted
    assert len(series_state.load_series(tmp_path)["checkpoints"]) == 3
    lines = journal.read_text().split("\n")
    lines[1] = '{"what": 1}'
    journal.write_text("\n".join(lines))
    with pytest.raises(InputError, match=r"series.journal line 2: expected"):
        series_state.load_series(tmp_path)
    lines[1] = json.dumps({"entry": {"name": "step_200.pt", "step": "200", "status": "done"}})
    journal.write_text("\n".join(lines))
    with pytest.raises(InputError, match=r"with .*series.journal\): checkpoints.step_200.pt.step: expected an integer"):
        series_state.load_series(tmp_path)


def test_a_series_json_of_an_older_dfo_reads_as_before(tmp_path):
    s = series_state.new_series("old", source="kpro6:/ck", eval_host="ct129", settings={})
    s["checkpoints"] = {e["name"]: e for e in (series_data.entry(10), series_data.entry(20))}
    (tmp_path / "series.json").write_text(json.dumps(s))  # no journal beside it
    assert [p["step"] for p in series_state.load_series(tmp_path)["steps"]] == [10, 20]


def _old_measures(e: dict) -> dict:
    """An entry's measures as dfo.series/1 wrote them: z-lab's April loop count under the name ``zlab``."""
    conv = e["measures"]["conventions"]
    e["measures"]["conventions"] = {"zlab": conv.pop("zlab-2604"), **conv}
    return e


def test_a_series_of_schema_1_reads_its_zlab_points_as_zlab_2604(tmp_path):
    """Before dfo.series/2 a point's ``zlab`` was z-lab's April loop: an old snapshot, its journal and its
    baselines read back with that figure under ``zlab-2604``; the next snapshot is written as dfo.series/2."""
    s = series_state.new_series("old", source="kpro6:/ck", eval_host="ct129", settings={})
    first = _old_measures(series_data.entry(10, 2.0))
    baseline = _old_measures(series_data.entry(5, 3.0))["measures"]
    s.update(schema="dfo.series/1", checkpoints={first["name"]: first},
             baselines={"key": "k", "run": "rb", "drafters": {"zlab": baseline}})
    (tmp_path / "series.json").write_text(json.dumps(s))
    late = _old_measures(series_data.entry(20, 2.5))
    (tmp_path / series_state.JOURNAL).write_text(json.dumps({"t": "x", "entry": late}) + "\n")
    loaded = series_state.load_series(tmp_path)
    points = {e["step"]: e["measures"]["conventions"] for e in loaded["checkpoints"].values()}
    assert points == {10: {"zlab-2604": 2.05, "vllm": 2.1}, 20: {"zlab-2604": 2.55, "vllm": 2.6}}
    assert loaded["baselines"]["drafters"]["zlab"]["conventions"] == {"zlab-2604": 3.05, "vllm": 3.1}
    assert (loaded["schema"], loaded["migrated_from"]) == ("dfo.series/2", "dfo.series/1")
    tags = dict(tensorboard.scalars(loaded["checkpoints"]["step_20.pt"]))
    assert tags["dflash/tau_zlab-2604"] == 2.55 and "dflash/tau_zlab" not in tags
    new = series_data.entry(30, 3.0)  # this dfo appends to the old snapshot's journal: read back unchanged
    loaded["checkpoints"][new["name"]] = new
    series_state.record(tmp_path, loaded, entry=new)
    again = series_state.load_series(tmp_path)
    assert again["checkpoints"]["step_30.pt"]["measures"]["conventions"] == {"zlab-2604": 3.05, "vllm": 3.1}
    series_state.save(tmp_path, again)
    assert json.loads((tmp_path / "series.json").read_text())["schema"] == "dfo.series/2"
    assert series_state.load_series(tmp_path)["checkpoints"] == again["checkpoints"]


def test_series_md_of_a_thousand_checkpoints_stays_readable(tmp_path):
    s = series_state.new_series("long", source="kpro6:/ck", eval_host="ct129", settings={})
    for i in range(1, 1001):
        e = series_data.entry(100 * i, 2.0 + i / 1000, verdict="down" if i % 40 == 0 else "flat")
        s["checkpoints"][e["name"]] = e
    md = series_markdown(s, plotted=True)
    rows = [line for line in md.splitlines() if line.startswith("| ") and "step_" in line]
    assert len(rows) == MD_ROWS and "step_100000.pt" in rows[-1] and "step_100.pt |" not in md
    assert "(the latest 50 of 1000)" in md and "1000 checkpoints: 1000 evaluated, 0 failed, 25 regression(s)" in md
    assert "best: step 100000 (step_100000.pt)" in md and "(the latest 20 of 25)" in md
    assert len(md) < 20_000


def test_series_show_prints_a_summary_and_the_latest_rows(tmp_path):
    runs = tmp_path / "runs"
    _series(runs / "series" / "long", 40)
    shown = dfo("series", "show", "long", "--last", "5", runs=runs)
    assert shown.returncode == 0, shown.stderr
    out = " ".join(shown.stdout.split())
    assert "40 checkpoints: 40 evaluated" in out and "the latest 5 of 40; --all for every one" in out
    assert "step_4000.pt" in out and "step_3500.pt" not in out
    every = dfo("series", "show", "long", "--all", runs=runs)
    assert "step_100.pt" in every.stdout and "step_4000.pt" in every.stdout
    whole = json.loads(dfo("series", "show", "long", "--json", runs=runs).stdout)
    assert len(whole["checkpoints"]) == 40 and "journal_lines" not in whole


def test_the_plot_window_draws_the_last_n_checkpoints_with_round_ticks(tmp_path):
    from orchestrator.core import plotting

    plt = plotting.pyplot()
    if plt is None:
        pytest.skip("matplotlib is not installed")  # the plots extra; setup.sh installs it
    s = series_state.new_series("long", source="kpro6:/ck", eval_host="ct129", settings={})
    for i in range(1, 1001):
        e = series_data.entry(100 * i, 2.0)
        s["checkpoints"][e["name"]] = e
    fig = tau_figure(plt, s, last=100)
    ax = fig.axes[0]
    xs = ax.lines[0].get_xdata()
    assert len(xs) == 100 and xs[0] == 90_100
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert 3 <= len(ticks) <= 12 and all(t % 500 == 0 for t in ticks)
    assert "the last 100 of 1000 checkpoints" in ax.get_title()
    plt.close(fig)


def _read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in FOLDER's event files, by tag, through TensorBoard's own event file loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tensor.string_val:  # a text summary (the proxy alert), no scalar
                    continue
                number = value.simple_value if value.HasField("simple_value") else \
                    value.tensor.float_val[0]  # TensorBoard's loader turns simple values into tensors
                out.setdefault(value.tag, []).append((event.step, round(number, 4)))
    return out


def test_tensorboard_events_read_back_with_tensorboards_reader(tmp_path):
    entries = [series_data.entry(100, 2.5), series_data.entry(200, 3.0)]
    baselines = {"drafters": {"zlab": {"tau_macro": {"value": 3.5, "ci": None}}}}
    tensorboard.write_local(tmp_path, tensorboard.file_name("run7", 100, now=1), tensorboard.event_bytes(entries[:1]))
    tensorboard.write_local(tmp_path, tensorboard.file_name("run7", 200, now=2),
                            tensorboard.event_bytes(entries[1:], baselines))
    got = _read_scalars(tmp_path)
    assert got["dflash/tau_macro"] == [(100, 2.5), (200, 3.0)]
    assert got["dflash/tau_micro"] == [(100, 2.4), (200, 2.9)]
    assert got["dflash/tau_zlab-2604"] == [(100, 2.55), (200, 3.05)] and got["dflash/tau_vllm"][1] == (200, 3.1)
    assert got["dflash/ddtree_8"] == [(100, 4.5), (200, 5.0)]
    assert [k for k in got if k.startswith("dflash/p")] == ["dflash/p1", "dflash/p2", "dflash/p3", "dflash/p4"]
    assert got["dflash/p2"] == [(100, 0.45), (200, 0.45)]
    assert got["dflash_dataset/humaneval"] == [(100, 2.8), (200, 3.3)]
    assert got["dflash_baseline/zlab"] == [(200, 3.5)]
    assert not list(tmp_path.glob(".*"))  # written under a temporary name, renamed


def test_event_file_names_sort_in_writing_order():
    names = [tensorboard.file_name("run7", step, now=t) for step, t in ((900, 5), (100, 60), (50, 1000))]
    assert names == sorted(names)
