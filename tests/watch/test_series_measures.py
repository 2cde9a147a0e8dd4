"""Measures with CIs, verdicts, the series state, series.md, the plot and --on-result: pure or local."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import series_data
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.watch import series as series_state
from orchestrator.watch.discovery import Checkpoint
from orchestrator.watch.hooks import run_hook
from orchestrator.watch.loop import removable
from orchestrator.watch.measures import judge, measure, per_sample_tau, verdict_text
from orchestrator.watch.plot import write_plot
from orchestrator.watch.render import series_markdown


def test_measure_reports_the_runs_values_with_bootstrap_cis_around_them():
    lines = series_data.samples("ck", 0.6)
    results = series_data.results("ck", lines)
    m = measure(results, lines, "ck")
    point = results["drafters"]["ck"]["metrics"]
    assert m["tau_macro"]["value"] == point["tau_macro"]
    for key in ("tau_macro", "tau_micro", "ddtree"):
        lo, hi = m[key]["ci"]
        assert lo < m[key]["value"] < hi, key
    assert m["ddtree"]["k"] == 8 and m["ddtree"]["value"] > m["tau_macro"]["value"]
    assert [p["k"] for p in m["p"]] == [1, 2, 3, 4]
    assert all(p["ci"][0] <= p["value"] <= p["ci"][1] for p in m["p"])
    assert m["p"][0]["value"] > m["p"][3]["value"]  # acceptance falls with depth


def test_measure_rejects_a_truncated_record_naming_the_sample():
    lines = series_data.samples("ck", 0.6, n=3)
    lines[1]["drafters"]["ck"]["produced"].pop()
    lines[1]["drafters"]["ck"]["accepted"].pop()
    lines[1]["drafters"]["ck"]["anchors"].pop()
    with pytest.raises(InputError, match="sample p1, drafter 'ck'.*truncated"):
        measure(series_data.results("ck", series_data.samples("ck", 0.6, n=3)), lines, "ck")


@pytest.mark.parametrize("tamper", [
    lambda r, s: r["drafters"]["ck"]["metrics"].update(tau_macro="9.9"),   # a string printed with :.2f
    lambda r, s: r["drafters"]["ck"].update(metrics=[1]),
    lambda r, s: r["drafters"]["ck"]["metrics"].update(per_position=[{"p": 0.5}]),
    lambda r, s: s[0]["drafters"]["ck"].update(tau="high"),
    lambda r, s: s[0].update(drafters=["ck"]),
])
def test_measure_turns_results_it_cannot_read_into_an_input_error(tamper):
    # The run's files come from the eval host: a traceback here crashed the watcher, and the restarted one
    # reattached to the same run and crashed again.
    lines = series_data.samples("ck", 0.6, n=3)
    results = series_data.results("ck", lines)
    tamper(results, lines)
    with pytest.raises(InputError, match="drafter 'ck'"):
        measure(results, lines, "ck")
        per_sample_tau(lines, "ck")


def test_verdicts_up_flat_down_and_plateau():
    weak, strong = series_data.samples("a", 0.3), series_data.samples("b", 0.8)
    tw, ts = per_sample_tau(weak, "a"), per_sample_tau(strong, "b")
    assert judge(tw, None, best_name=None, recent=[])["verdict"] == "first"
    up = judge(ts, tw, best_name="step_100.pt", recent=["first"])
    assert up["verdict"] == "up" and up["ci"][0] > 0 and up["paired_samples"] == 8 and not up["regression"]
    down = judge(tw, ts, best_name="step_200.pt", recent=["first", "up"])
    assert down["verdict"] == "down" and down["regression"] and down["ci"][1] < 0
    assert "DOWN (regression)" in verdict_text(down) and "step_200.pt" in verdict_text(down)
    same = per_sample_tau(series_data.samples("c", 0.8, seed=0), "c")
    flat = judge(same, ts, best_name="step_200.pt", recent=["first", "up", "flat"])
    assert flat["verdict"] == "flat" and not flat["plateau"]  # same prompts, same figures: Δ = 0
    plateau = judge(same, ts, best_name="step_200.pt", recent=["first", "up", "flat", "flat"])
    assert plateau["plateau"] and verdict_text(plateau).endswith("; plateau")


def ckpt(name, step, size=100, mtime=1.0):
    return Checkpoint(name=name, path=f"/d/{name}", step=step, step_source="name", size=size, mtime=mtime,
                      is_dir=False)


def done(series, name, step, accept, run):
    lines = series_data.samples(name, accept)
    series_state.begin_attempt(series, ckpt(name, step))
    m = measure(series_data.results(name, lines), lines, name)
    best = series_state.best_before(series, step)
    v = judge(per_sample_tau(lines, name), None if best is None else {k: best["measures"]["tau_macro"]["value"]
                                                                      for k in per_sample_tau(lines, name)},
              best_name=best and best["name"], recent=series_state.recent_verdicts(series, step))
    series_state.mark(series, name, "done", run=run, drafter=name, measures=m, verdict=v)


def make_series():
    s = series_state.new_series("run7", source="kpro6:/d", eval_host="ct129",
                                settings={"target": "/m/t", "samples": 8, "prompts": "builtin", "max_new_tokens": 64,
                                "dtype": "float32"})
    done(s, "step_100.pt", 100, 0.3, "r100")
    done(s, "step_200.pt", 200, 0.6, "r200")
    series_state.begin_attempt(s, ckpt("step_250.pt", 250))
    series_state.mark(s, "step_250.pt", "failed",
                      error="relay/launch: kpro6: strip-checkpoint of /d/step_250.pt failed: not a torch checkpoint")
    done(s, "step_300.pt", 300, 0.8, "r300")
    s["baselines"] = {"key": "k", "run": "rb", "drafters": {"zlab": s["checkpoints"]["step_300.pt"]["measures"]}}
    return s


def test_series_entries_count_a_checkpoint_once_and_keep_failures_with_their_reason():
    s = make_series()
    assert [p["step"] for p in series_state.points(s)] == [100, 200, 300]
    assert [p["run"] for p in series_state.points(s)] == ["r100", "r200", "r300"]
    assert [e["name"] for e in series_state.failures(s)] == ["step_250.pt"]
    assert series_state.best_before(s, 300)["name"] == "step_200.pt"
    # A redo of an attempt counts attempts and keeps the abandoned run folder's name.
    series_state.mark(s, "step_250.pt", "evaluating", run="r250a")
    again = series_state.begin_attempt(s, ckpt("step_250.pt", 250, size=5))
    assert again["attempts"] == 2 and again["superseded_runs"] == ["r250a"] and again["status"] == "relaying"
    assert "strip-checkpoint" in again["previous_error"]


def test_settings_must_stay_the_same_and_a_corrupt_state_file_is_a_clear_error(tmp_path):
    s = make_series()
    with pytest.raises(InputError, match=r"eval host ct129 → ct200; samples 8 → 16"):
        series_state.check_same_settings(s, "kpro6:/d", "ct200", {**s["settings"], "samples": 16})
    series_state.save(tmp_path, s)
    assert series_state.load_series(tmp_path)["steps"][0]["step"] == 100
    (tmp_path / "series.json").write_text("{not json")
    with pytest.raises(InputError, match="series.json: not readable JSON"):
        series_state.load_series(tmp_path)


def test_an_option_newer_than_the_series_is_no_difference_while_it_keeps_its_default():
    s = make_series()
    newer = {**s["settings"], "temperature": 0.0}
    series_state.check_same_settings(s, s["source"], s["eval_host"], newer, {"temperature": 0.0})
    with pytest.raises(InputError, match=r"temperature None → 1.0"):
        series_state.check_same_settings(s, s["source"], s["eval_host"], {**newer, "temperature": 1.0},
                                         {"temperature": 0.0})
    with pytest.raises(InputError, match=r"temperature None → 0.0"):  # without the defaults: still a difference
        series_state.check_same_settings(s, s["source"], s["eval_host"], newer)


def test_a_series_keeps_its_draft_rule_and_one_older_than_the_option_was_greedy_at_t():
    """At T > 0 a series started before --draft-rule existed followed the greedy rule: continuing it under the
    new default (sampled) is refused; --draft-rule greedy continues it. At T = 0 the rule does not apply."""
    s = make_series()
    hot = {**s, "settings": {**s["settings"], "temperature": 1.0}}
    given = {**hot["settings"], "draft_rule": None}  # not given: the payload's default, sampled
    with pytest.raises(InputError, match=r"draft rule 'greedy' → 'sampled' \(pass --draft-rule greedy"):
        series_state.check_same_settings(hot, hot["source"], hot["eval_host"], given, {"draft_rule": None})
    series_state.check_same_settings(hot, hot["source"], hot["eval_host"], {**given, "draft_rule": "greedy"},
                                     {"draft_rule": None})
    new = {**hot, "settings": given}  # a series started with the option: None and "sampled" are one rule
    series_state.check_same_settings(new, new["source"], new["eval_host"], {**given, "draft_rule": "sampled"})
    cold = {**s["settings"], "temperature": 0.0}
    series_state.check_same_settings({**s, "settings": cold}, s["source"], s["eval_host"],
                                     {**cold, "draft_rule": "greedy"}, {"draft_rule": None})


def test_series_markdown_and_plot(tmp_path):
    s = make_series()
    md = series_markdown(s, plotted=True)
    assert "| 100 | step_100.pt |" in md and "| 250 | step_250.pt | failed |" in md
    assert "not a torch checkpoint" in md and "## Baselines" in md and "| zlab |" in md
    assert "tau_vs_step.png" in md
    row300 = next(line for line in md.splitlines() if line.startswith("| 300 |"))
    assert "up: Δτ macro +" in row300
    path = write_plot(tmp_path, s)
    assert path == tmp_path / "tau_vs_step.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def test_on_result_gets_the_result_json_on_stdin_and_its_failure_is_reported(tmp_path):
    script = tmp_path / "hook.py"
    script.write_text("import json, os, sys\nd = json.load(sys.stdin)\n"
                      f"open({str(tmp_path / 'got.json')!r}, 'w').write(json.dumps([d, os.environ['DFO_STEP']]))\n")
    outcome = run_hook(f"{sys.executable} {script}", {"series": "run7", "step": 300, "status": "done",
                                                       "measures": {"tau_macro": {"value": 3.1}}})
    assert outcome == {"ok": True, "exit_code": 0, "detail": ""}
    got, step = json.loads((tmp_path / "got.json").read_text())
    assert got["measures"]["tau_macro"]["value"] == 3.1 and step == "300"
    bad = run_hook("echo webhook down >&2; exit 3", {"step": 1})
    assert bad == {"ok": False, "exit_code": 3, "detail": "webhook down"}


def test_a_hook_that_cannot_run_for_a_checkpoint_is_a_failure_not_an_exception():
    # A NUL cannot travel in an environment variable: subprocess raises ValueError, which once crashed the
    # watcher (and, the hook still pending in series.json, every restart after it).
    outcome = run_hook("true", {"checkpoint": "step\x007.pt", "step": 7})
    assert outcome["ok"] is False and outcome["exit_code"] is None
    assert "could not start" in outcome["detail"] and "null byte" in outcome["detail"]


@pytest.mark.parametrize("path,ok", [("/w/checkpoints/dfo-relayed/kpro6/step_7.pt", True),
                                     ("/w/checkpoints/dfo-relayed/kpro6/", False),
                                     ("/w/checkpoints/dfo-relayed/kpro6", False),
                                     ("/w/checkpoints/dfo-relayed/kpro6/..", False),
                                     ("/w/checkpoints/dfo-relayed/kpro6/a/../../x", False),
                                     ("/w/checkpoints/dfo-relayed/kpro6//x", False),
                                     ("/w/checkpoints/dfo-relayed/kpro6/st\x00ep", False),
                                     ("/w/checkpoints/dfo-relayed/kpro6x/step_7.pt", False)])
def test_the_clean_up_removes_only_one_checkpoint_inside_the_relay_folder(path, ok):
    assert removable(path, "/w/checkpoints/dfo-relayed/kpro6") is ok


def test_series_cli_list_show_plot(tmp_path):
    runs = tmp_path / "runs"
    folder = runs / "series" / "run7"
    series_state.save(folder, make_series())
    listed = dfo("series", "list", "--json", runs=runs)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["series"]
    assert (row["series"], row["evaluated"], row["failed"], row["last_step"]) == ("run7", 3, 1, 300)
    shown = dfo("series", "show", "run7", runs=runs)
    assert shown.returncode == 0, shown.stderr
    assert "step_250.pt" in shown.stdout and "failed" in shown.stdout and "baseline zlab" in shown.stdout
    plotted = dfo("series", "plot", "run7", runs=runs)
    assert plotted.returncode == 0 and Path(plotted.stdout.strip()).is_file() and (folder / "series.md").is_file()
    missing = dfo("series", "show", "run8", runs=runs)
    assert missing.returncode == 2 and "no series 'run8'" in missing.stderr and "known series: run7" in missing.stderr


def test_the_drafter_spec_is_a_series_setting_and_a_series_from_before_it_continues(tmp_path):
    """`dfo watch --drafter-spec` changes how every later checkpoint is read: a series keeps it like its other
    settings. A series started before the option (no key) reads as "no spec" and continues; a spec given to a
    series with nothing evaluated yet (its checkpoints failed for lacking one) is taken."""
    from orchestrator.evaluation.plan import EvalRequest
    from orchestrator.watch.config import WatchConfig

    def cfg(spec):
        return WatchConfig(series="run7", source_host="kpro6", folder="/d", runs_dir=tmp_path, drafter_spec=spec,
                           request=EvalRequest(hosts=["ct129"], target="/m/t", drafters=[]))

    def check(series, spec):
        c = cfg(spec)
        series_state.check_same_settings(series, c.source, c.eval_host, c.settings(), c.settings_defaults())

    s = make_series()
    older = {**s, "settings": {k: v for k, v in cfg(None).settings().items() if k != "drafter_spec"}}
    check(older, None)  # started before the option: absent is none
    with pytest.raises(InputError, match=r"drafter_spec None → '/specs/a.json'"):
        check(older, "/specs/a.json")
    started = {**s, "settings": cfg("/specs/a.json").settings()}
    check(started, "/specs/a.json")
    with pytest.raises(InputError, match=r"drafter_spec '/specs/a.json' → '/specs/b.json'"):
        check(started, "/specs/b.json")
    with pytest.raises(InputError, match=r"drafter_spec '/specs/a.json' → None"):
        check(started, None)
    failed_only = {**older, "checkpoints": {"step_250.pt": s["checkpoints"]["step_250.pt"]}}
    check(failed_only, "/specs/a.json")  # nothing evaluated yet: the spec the failure asked for is taken
