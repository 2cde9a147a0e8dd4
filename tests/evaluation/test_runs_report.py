"""Run folders, the report and plots, and `runs compare` — on synthetic results (pure, no hosts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import InputError
from orchestrator.evaluation.compare import compare_runs
from orchestrator.evaluation.report import drafter_rows, write_report
from orchestrator.evaluation.runs import find_run, list_runs, new_run, write_json_atomic

ZLAB_GAIN = 0.5  # zlab-2604 τ (z-lab's April loop) per sample = committed + this, in these synthetic runs
APRIL = "zlab-2604"


def conventions(taus: list[float], unavailable: str | None = None, exact: bool = True, old: bool = False) -> dict:
    """The conventions block as the payload writes it; OLD: as dfo.results/1 wrote it (the April count under
    ``zlab``, no alias)."""
    def block(tau):
        return {"tau_macro": tau, "tau_micro": tau + 0.25, "rounds": 10 * len(taus), "drafts_accepted": 5,
                "per_position": [{"k": 1, "accepted_ge_k": 5, "eligible": 10, "p": 0.5}], "exact": exact,
                "definition": "def"}
    tau = sum(taus) / len(taus)
    april = "zlab" if old else APRIL
    out = {"committed": {**block(tau), "exact": True}, april: block(tau + ZLAB_GAIN), "vllm": block(tau)}
    if unavailable:
        out[april] = out["vllm"] = {"available": False, "reason": unavailable, "definition": "def"}
    if not old:
        out["zlab"] = {"alias_of": "committed", "definition": "zlab = committed"}
    return out


def metrics(taus: list[float], old: bool = False, **conv) -> dict:
    return {"tau_macro": sum(taus) / len(taus), "tau_micro": sum(taus) / len(taus), "rounds": 10 * len(taus),
            "samples": len(taus), "block_size": 4,
            "per_position": [{"k": 1, "p": 0.5}, {"k": 2, "p": 0.25}, {"k": 3, "p": 0.1}],
            "tau_histogram": {"1": 5, "2": 3, "3": 1, "4": 1},
            "tree": {"topk": {"k": 8, "tau_macro": 3.0, "definition": "top-k"},
                     "budgeted": {"budget": 8, "tau_macro": 2.5, "definition": "budgeted"}},
            "conventions": conventions(taus, old=old, **conv)}


def zlab_record(tau: float) -> dict:
    """Two rounds whose mean τ_round is tau + ZLAB_GAIN (produced = accepted + 1)."""
    produced = [round(tau + ZLAB_GAIN - 0.5), round(tau + ZLAB_GAIN + 0.5)]
    return {"accepted": [p - 1 for p in produced], "produced": produced}


def make_run(root: Path, taus: dict[str, list[float]], settings: dict | None = None, conv: dict | None = None,
             old: bool = False):
    """A run folder; OLD: results.json and samples.jsonl as dfo wrote them before results schema dfo.results/2
    (z-lab's April count under the name ``zlab``)."""
    run = new_run(root, ["ct129"], {"request": {}})
    ids = [f"p{i}" for i in range(len(next(iter(taus.values()))))]
    april = "zlab" if old else APRIL
    results = {"schema": "dfo.results/1" if old else "dfo.results/2", "status": "ok",
               "settings": settings or {"max_new_tokens": 64},
               "target": {"weights_digest": {"algorithm": "sha256", "value": "aa"}},
               "extraction": {"kernel_path": "torch"},
               "drafters": {n: {"metrics": metrics(t, old=old, **(conv or {}).get(n, {})), "spec": {"format": "zlab"}}
                            for n, t in taus.items()}}
    samples = [{"id": i, "continuation_tokens": 10, "tail_tokens": 3,
                "drafters": {n: {"tau": t[k], "conventions": {april: zlab_record(t[k]), "vllm": zlab_record(t[k])}}
                             for n, t in taus.items()}}
               for k, i in enumerate(ids)]
    (run.path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    write_report(run.path, results, samples)
    write_json_atomic(run.results_path, results)
    run.set(status="succeeded")
    return run


def test_report_and_plots_are_written(tmp_path):
    run = make_run(tmp_path, {"ours": [2.0, 3.0, 4.0], "zlab": [5.0, 6.0, 7.0]})
    report = (run.path / "report.md").read_text()
    assert "| τ macro (committed) | τ micro (committed) | zlab-2604 τ macro | vllm τ micro |" in report
    assert "| ours | zlab | 3.00 | 3.00 | 3.50 | 3.25 |" in report and "| zlab | zlab | 6.00 |" in report
    assert "## τ conventions" in report and "| ours | zlab-2604 | 3.50 | 3.75 | 30 | 0.50 |" in report
    assert "| ours | zlab | = committed |" in report  # the alias: the committed row's figures, not a second count
    assert "zlab = committed, z-lab's loop since August 2026" in report and "τ ours (committed)" in report
    assert "DDTree-8" in report and "budgeted DDTree" in report and "(budget 8)" in report
    assert "![acceptance](acceptance.png)" in report
    for png in ("acceptance.png", "tau_histogram.png"):
        data = (run.path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    rows = drafter_rows(run.results())
    assert [r["drafter"] for r in rows] == ["ours", "zlab"] and rows[0]["ddtree"] == 3.0


def test_compare_pairs_prompts_and_flags_differences(tmp_path):
    a = make_run(tmp_path, {"ours": [2.0, 3.0, 4.0, 3.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0, 5.0, 4.0], "new": [1.0, 1.0, 1.0, 1.0]},
                 settings={"max_new_tokens": 128})
    report = compare_runs(a, b)
    ours = next(r for r in report["drafters"] if r["drafter"] == "ours")
    assert ours["delta"] == pytest.approx(1.0) and ours["paired_samples"] == 4
    assert ours["ci"] == [pytest.approx(1.0), pytest.approx(1.0)] and "higher" in ours["note"]
    assert next(r for r in report["drafters"] if r["drafter"] == "new")["note"] == "only in B"
    assert any("max_new_tokens" in n for n in report["notes"])


def test_find_run_by_prefix_last_and_errors(tmp_path):
    first = make_run(tmp_path, {"ours": [2.0, 2.0]})
    second = make_run(tmp_path, {"ours": [3.0, 3.0]})
    assert [r.name for r in list_runs(tmp_path)] == sorted([first.name, second.name])
    assert find_run(tmp_path, "last").name == max(first.name, second.name)
    assert find_run(tmp_path, second.name[-4:]).name == second.name
    with pytest.raises(InputError, match="no run matches"):
        find_run(tmp_path, "zzzz")
    with pytest.raises(InputError, match="no runs in"):
        find_run(tmp_path / "empty", "last")


def test_runs_cli_show_and_compare(tmp_path):
    a = make_run(tmp_path, {"ours": [2.0, 3.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0]})
    env = {**os.environ, "DFO_RUNS_DIR": str(tmp_path), "COLUMNS": "200"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "orchestrator", *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=60)
    shown = run("runs", "show", a.name)
    assert shown.returncode == 0 and "ours" in shown.stdout and "2.50" in shown.stdout
    assert "committed τ macro" in shown.stdout and "zlab-2604 τ macro" in shown.stdout and "3.00" in shown.stdout
    compared = run("runs", "compare", a.name, b.name, "--json")
    assert compared.returncode == 0
    assert json.loads(compared.stdout)["drafters"][0]["delta"] == pytest.approx(1.0)
    table = run("runs", "compare", a.name, b.name)
    assert table.returncode == 0 and "committed convention" in table.stdout
    assert "3.00→4.00" in table.stdout and "zlab-2604 A→B" in table.stdout
    assert "zlab = committed" in " ".join(table.stdout.split())  # the title may wrap
    missing = run("runs", "show", "nope")
    assert missing.returncode == 2 and "no run matches" in missing.stderr


def test_report_names_unavailable_and_lower_bound_conventions(tmp_path):
    run = make_run(tmp_path, {"srv": [2.0, 3.0], "short": [2.0, 2.0]},
                   conv={"srv": {"unavailable": "the server refused ignore_eos"}, "short": {"exact": False}})
    report = (run.path / "report.md").read_text()
    assert "| srv | zlab | 2.50 | 2.50 | n/a | n/a |" in report and "| short | zlab | 2.00 | 2.00 | ≥2.50 | ≥2.25 |" \
        in report
    assert "srv: zlab-2604 and vllm τ unavailable: the server refused ignore_eos" in report
    assert "short: zlab-2604 and vllm τ a lower bound" in report
    rows = drafter_rows(run.results())
    assert rows[0][APRIL] == {"value": None, "exact": None, "reason": "the server refused ignore_eos"}
    assert rows[0]["convention"] == "committed" and rows[1]["vllm"]["exact"] is False


def test_compare_carries_the_other_conventions(tmp_path):
    a = make_run(tmp_path, {"ours": [2.0, 3.0, 4.0, 3.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0, 5.0, 4.0]}, conv={"ours": {"unavailable": "no tail"}})
    c = make_run(tmp_path, {"ours": [3.0, 4.0, 5.0, 5.0]})
    report = compare_runs(a, c)
    assert report["convention"] == "committed"
    april = report["drafters"][0]["conventions"][APRIL]
    assert (april["a"], april["b"]) == (3.5, 4.75) and april["paired_samples"] == 4
    assert april["delta"] == pytest.approx(1.25)  # paired over the per-sample zlab-2604 records
    vllm = report["drafters"][0]["conventions"]["vllm"]
    assert (vllm["figure"], vllm["a"], vllm["b"]) == ("tau_micro", 3.25, 4.5) and "delta" not in vllm
    missing = compare_runs(a, b)["drafters"][0]["conventions"][APRIL]
    assert missing["b"] is None and missing["unavailable"] == [None, "no tail"] and "delta" not in missing


def test_a_run_of_results_schema_1_reads_its_zlab_figures_as_zlab_2604(tmp_path):
    """Before dfo.results/2 the name zlab meant z-lab's April loop: an old run reads that figure (results and
    samples) under zlab-2604, with zlab the alias of committed, and compares like with like with a new run."""
    old = make_run(tmp_path, {"ours": [2.0, 3.0, 4.0, 3.0]}, old=True)
    raw = json.loads(old.results_path.read_text())["drafters"]["ours"]["metrics"]["conventions"]
    assert raw["zlab"]["tau_macro"] == 3.0 + ZLAB_GAIN and APRIL not in raw  # as the old payload wrote it
    block = old.results()["drafters"]["ours"]["metrics"]["conventions"]
    assert block[APRIL]["tau_macro"] == 3.0 + ZLAB_GAIN and block["zlab"]["alias_of"] == "committed"
    assert old.results()["schema"] == "dfo.results/2" and old.results()["migrated_from"] == "dfo.results/1"
    assert all(set(s["drafters"]["ours"]["conventions"]) == {APRIL, "vllm"} for s in old.samples())
    assert drafter_rows(old.results())[0][APRIL]["value"] == 3.0 + ZLAB_GAIN
    new = make_run(tmp_path, {"ours": [3.0, 4.0, 5.0, 5.0]})
    april = compare_runs(old, new)["drafters"][0]["conventions"][APRIL]
    assert (april["a"], april["b"]) == (3.5, 4.75) and april["paired_samples"] == 4  # April beside April
    assert april["delta"] == pytest.approx(1.25)
    env = {**os.environ, "DFO_RUNS_DIR": str(tmp_path), "COLUMNS": "200"}
    shown = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "compare", old.name, new.name],
                           env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "3.50→4.75" in shown.stdout, shown.stderr


def test_compare_of_malformed_results_shows_what_it_can_without_a_traceback(tmp_path):
    """results.json and samples.jsonl come from the eval host: a drafter entry, metrics or τ of any shape."""
    a = make_run(tmp_path, {"ours": [2.0, 3.0], "odd": [1.0, 1.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0], "odd": [1.0, 1.0]})
    results = json.loads(b.results_path.read_text())
    results["drafters"]["odd"] = ["not", "an", "object"]
    results["drafters"]["ours"]["metrics"]["tau_macro"] = "5.0"
    results["drafters"]["ours"]["metrics"]["conventions"] = []
    results["settings"] = "fast"
    write_json_atomic(b.results_path, results)
    samples = [json.loads(line) for line in (b.path / "samples.jsonl").read_text().splitlines()]
    samples[0]["drafters"] = "none"
    samples[1]["drafters"]["ours"]["tau"] = {"x": 1}
    (b.path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    report = compare_runs(a, b)
    rows = {r["drafter"]: r for r in report["drafters"]}
    assert rows["odd"]["note"] == "only in A" and rows["ours"]["tau_b"] is None
    assert rows["ours"]["paired_samples"] == 0 and rows["ours"]["note"] == "no prompt in common"
    env = {**os.environ, "DFO_RUNS_DIR": str(tmp_path), "COLUMNS": "200"}
    for extra in ([], ["--json"]):
        proc = subprocess.run([sys.executable, "-m", "orchestrator", "runs", "compare", a.name, b.name, *extra],
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_dflash2_drafter_reads_ddtree_not_defined_in_the_table_and_the_report(tmp_path):
    from rich.console import Console

    from orchestrator.evaluation.report import summary_table

    run = make_run(tmp_path, {"d1": [2.0, 3.0], "d2": [4.0, 5.0]})
    results = json.loads(run.results_path.read_text())
    results["drafters"]["d2"]["metrics"]["tree"] = {"not_defined": "DDTree is not defined for DFlash2: ..."}
    rows = {r["drafter"]: r for r in drafter_rows(results)}
    assert rows["d2"]["ddtree_not_defined"] and not rows["d1"]["ddtree_not_defined"]
    console = Console(record=True, width=250)
    console.print(summary_table(results))
    text = console.export_text()
    assert "not defined" in text and "3.00" in text  # d2's cell says so, d1 keeps its DDTree figure
    assert "DDTree: not defined for DFlash2 drafters" in text
    write_report(run.path, results, [])
    report = (run.path / "report.md").read_text()
    assert "| not defined | not defined |" in report and "DDTree: not defined for DFlash2 drafters" in report


def test_compare_pairs_the_checkpoints_of_a_watched_run(tmp_path):
    """A watch names each checkpoint's drafter after its step: two such runs pair their one drafter each."""
    from cli_runner import dfo

    a = make_run(tmp_path, {"step_20000": [2.0, 3.0, 4.0, 3.0]})
    b = make_run(tmp_path, {"step_25000": [3.0, 4.0, 5.0, 4.0]})
    (row,) = compare_runs(a, b)["drafters"]
    assert row["drafter"] == "step_20000 → step_25000" and row["delta"] == pytest.approx(1.0)
    assert row["paired_samples"] == 4 and row["drafters"] == {"a": "step_20000", "b": "step_25000"}
    shown = dfo("runs", "compare", a.name, b.name, env={"DFO_RUNS_DIR": str(tmp_path)})
    assert shown.returncode == 0, shown.stderr
    assert "step_20000 → step_25000" in shown.stdout and "only in" not in shown.stdout and "+1.00" in shown.stdout
    assert "paired step_20000 (A) with step_25000 (B): each run holds one drafter" in " ".join(shown.stdout.split())
    # two drafters on one side: by name, as before
    c = make_run(tmp_path, {"step_25000": [3.0, 4.0, 5.0, 4.0], "zlab": [5.0, 5.0, 5.0, 5.0]})
    assert {r["note"] for r in compare_runs(a, c)["drafters"]} == {"only in A", "only in B"}


def test_compare_of_a_greedy_and_a_sampled_run_is_refused_unless_asked(tmp_path):
    from cli_runner import dfo

    a = make_run(tmp_path, {"ours": [2.0, 3.0]})
    b = make_run(tmp_path, {"ours": [3.0, 4.0]}, settings={"max_new_tokens": 64, "sampling": {
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "samples_per_prompt": 1, "seed": 0}})
    before = sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*"))
    refused = dfo("runs", "compare", a.name, b.name, env={"DFO_RUNS_DIR": str(tmp_path)})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    text = " ".join(refused.stderr.split())
    assert f"{a.name} drew its continuations at T=0 and {b.name} at T=1" in text and "--across-temperatures" in text
    assert sorted((p, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")) == before
    asked = dfo("runs", "compare", a.name, b.name, "--across-temperatures", env={"DFO_RUNS_DIR": str(tmp_path)})
    assert asked.returncode == 0, asked.stderr
    shown = " ".join(asked.stdout.split())
    assert "temperatures differ: T=0 in A, T=1 in B" in shown and "sampling differs: greedy (T = 0) in A; T=1" in shown
