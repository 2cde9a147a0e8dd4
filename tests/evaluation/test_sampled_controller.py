"""The controller's side of T > 0: the sampling options refused before anything connects, carried to the payload
only when given (a greedy command line is today's), the run table's T column and report.md's Sampling section,
`runs compare` paired by prompt (and seed), and a watch series from before these options still accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import dfo

from orchestrator.core.errors import InputError
from orchestrator.evaluation.compare import compare_runs
from orchestrator.evaluation.report import summary_table, write_report
from orchestrator.evaluation.runs import new_run, write_json_atomic
from remote_payload.eval import protocols

INVENTORY = """hosts:
  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k, roles: [train], paths: {checkpoints: /tmp/ck}}
  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}
"""
EVAL = ["eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d"]
WATCH = ["watch", "kpro6:/tmp/ck/run7/", "--target", "/m/t"]
BAD = [
    (["--samples-per-prompt", "4"], "--samples-per-prompt 4 needs --temperature T > 0: it shapes sampling"),
    (["--top-k", "5"], "--top-k 5 needs --temperature T > 0: it shapes sampling"),
    (["--temperature", "-0.5"], "--temperature -0.5: expected a number of at least 0"),
    (["--temperature", "1", "--top-p", "0"], "--top-p 0.0: expected a probability mass above 0 and at most 1"),
    (["--temperature", "1", "--samples-per-prompt", "0"], "--samples-per-prompt 0: expected an integer of at least 1"),
    (["--temperature", "hot"], "Invalid value for '--temperature'"),
]


@pytest.fixture
def inventory(tmp_path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.mark.parametrize("command", [EVAL, WATCH], ids=["eval", "watch"])
@pytest.mark.parametrize("extra, phrase", BAD, ids=[" ".join(b[0]) for b in BAD])
def test_bad_sampling_options_are_refused_before_anything_connects(inventory, tmp_path, command, extra, phrase):
    proc = dfo(*command, *extra, "--dry-run", inventory=inventory, runs=tmp_path / "runs", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert phrase in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def _args(inventory, *extra) -> list[str]:
    proc = dfo(*EVAL, *extra, "--dry-run", "--json", inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    (job,) = json.loads(proc.stdout)["plan"]["jobs"]
    return job["args"]


def test_the_sampling_options_reach_the_payload_only_when_given(inventory):
    greedy = _args(inventory)
    assert not {"--temperature", "--top-p", "--top-k", "--samples-per-prompt"} & set(greedy)
    assert greedy[greedy.index("--seed") + 1] == "0"
    args = _args(inventory, "--temperature", "0.6", "--top-p", "0.95", "--samples-per-prompt", "8", "--seed", "3")
    for flag, value in (("--temperature", "0.6"), ("--top-p", "0.95"), ("--samples-per-prompt", "8"), ("--seed", "3")):
        assert args[args.index(flag) + 1] == value


def _sampled_run(root: Path, taus: dict[str, list[list[float]]], seed: int = 0, temperature: float = 1.0,
                 draft_rule: str | None = None, protocol: bool = False):
    """A run at T > 0: per drafter, per prompt, the τ of each draw (``draft_rule`` None: a run from before the
    option, which followed the greedy rule)."""
    run = new_run(root, ["ct129"], {"request": {}})
    names = list(taus)
    prompts, draws = len(taus[names[0]]), len(taus[names[0]][0])
    lines = [{"index": p * draws + j, "id": f"p{p}#{j}", "prompt_index": p, "prompt_id": f"p{p}", "draw": j,
              "seed": 1000 * seed + 10 * p + j, "continuation_tokens": 20,
              "drafters": {n: {"tau": taus[n][p][j]} for n in names}} for p in range(prompts) for j in range(draws)]
    mean = {n: sum(sum(d) for d in t) / (prompts * draws) for n, t in taus.items()}
    sampling = {"temperature": temperature, "top_p": 1.0, "top_k": 0, "samples_per_prompt": draws, "seed": seed,
                **({"draft_rule": draft_rule} if draft_rule else {})}
    settings = {"max_new_tokens": 64, "sampling": sampling, **({"draft_rule": draft_rule} if draft_rule else {}),
                **({"protocol": protocols.record("zlab-card-gsm8k-t1")} if protocol else {})}
    results = {"schema": "dfo.results/2", "status": "ok", "settings": settings,
               "target": {"weights_digest": "aa"}, "extraction": {"kernel_path": "torch"},
               "drafters": {n: {"spec": {"format": "zlab"}, "metrics": {
                   "tau_macro": mean[n], "tau_micro": mean[n], "samples": len(lines), "rounds": 99, "block_size": 8,
                   "per_position": [{"k": 1, "p": 0.5}],
                   "sampled": {**sampling, "prompts": prompts, "draws": len(lines), "draws_per_prompt": draws,
                               "tau_macro": {"value": mean[n], "ci": [mean[n] - 0.2, mean[n] + 0.2]},
                               "variance": {"between": 0.5, "within": 0.25},
                               "estimator": "E over drawn y <b>of</b> the replay", "ci": "cluster bootstrap"}}}
                   for n in names}}
    (run.path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines))
    write_report(run.path, results, lines)
    write_json_atomic(run.results_path, results)
    run.set(status="succeeded")
    return run


def test_the_run_table_has_the_t_column_and_the_report_its_sampling_section(tmp_path):
    from rich.console import Console

    run = _sampled_run(tmp_path, {"ours": [[2.0, 3.0], [4.0, 5.0]]})
    console = Console(width=200, record=True)
    console.print(summary_table(run.results()))
    text = console.export_text()
    assert "T=1, greedy rule τ [CI]" in text and "3.50 [3.30, 3.70]" in text and "2 per prompt, seeded" in text
    report = (run.path / "report.md").read_text()
    assert "## Sampling (T=1, greedy rule)" in report and "| ours | 3.50 [3.30, 3.70] |" in report
    assert "sampling: T=1, greedy rule, 2 draw(s) per prompt, seed 0" in report
    assert "<b>" not in report and "**estimator**" in report  # the host's text is escaped


def test_runs_compare_pairs_the_draws_by_prompt_and_seed(tmp_path):
    a = _sampled_run(tmp_path, {"ours": [[2.0, 3.0], [4.0, 6.0], [1.0, 1.0]]})
    b = _sampled_run(tmp_path, {"ours": [[3.0, 3.0], [5.0, 5.0], [2.0, 2.0]]})
    report = compare_runs(a, b)
    (row,) = report["drafters"]
    # per prompt: the mean over its draws; Δ = mean over prompts of (B − A) = (0.5 + 0 + 1) / 3
    assert row["paired_samples"] == 3 and row["delta"] == pytest.approx(0.5)
    assert any("paired by prompt and seed" in n for n in report["notes"])
    other = _sampled_run(tmp_path, {"ours": [[3.0, 3.0], [5.0, 5.0], [2.0, 2.0]]}, seed=7)
    assert any("the runs' draws are independent" in n for n in compare_runs(a, other)["notes"])
    hotter = _sampled_run(tmp_path, {"ours": [[3.0, 3.0], [5.0, 5.0], [2.0, 2.0]]}, temperature=0.6)
    with pytest.raises(InputError, match="drew its continuations at T=1 and .* at T=0.6: the temperature changes τ"):
        compare_runs(a, hotter)
    notes = compare_runs(a, hotter, across_temperatures=True)["notes"]
    assert "temperatures differ: T=1 in A, T=0.6 in B (--across-temperatures): Δτ includes the temperature's " \
        "effect" in notes
    assert "sampling differs: T=1, top-p 1, top-k 0, 2 draw(s) per prompt, seed 0 in A; T=0.6, top-p 1, top-k 0, " \
        "2 draw(s) per prompt, seed 0 in B" in notes and not any("{" in n for n in notes)


def test_runs_compare_refuses_two_draft_rules_unless_told(tmp_path):
    """A run from before --draft-rule (greedy rule) against a sampled-rule run: refused, with the flag that allows
    it; with the flag the notes say so. The table headers name the rule."""
    from orchestrator.core.errors import InputError

    old = _sampled_run(tmp_path, {"ours": [[2.0, 3.0], [4.0, 6.0]]})
    new = _sampled_run(tmp_path, {"ours": [[1.5, 2.0], [3.0, 4.0]]}, draft_rule="sampled")
    with pytest.raises(InputError, match="greedy draft rule .* the sampled one") as err:
        compare_runs(old, new)
    assert "--across-rules" in (err.value.hint or "")
    report = compare_runs(old, new, across_rules=True)
    assert report["draft_rule"] == {"a": "greedy", "b": "sampled"}
    assert any("draft rules differ: greedy in A, sampled in B" in n for n in report["notes"])
    same = _sampled_run(tmp_path, {"ours": [[1.0, 2.0], [3.0, 3.0]]}, draft_rule="sampled", protocol=True)
    assert compare_runs(new, same)["draft_rule"] == {"a": "sampled", "b": "sampled"}
    assert "## Sampling (T=1, sampled rule)" in (new.path / "report.md").read_text()
    # a run under a protocol prints it with its results: the table's caption and the report's settings
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(summary_table(same.results()))
    assert "protocol zlab-card-gsm8k-t1: z-lab's Qwen3.8-27B-DFlash2 card" in console.export_text()
    assert "- protocol: zlab-card-gsm8k-t1: z-lab" in (same.path / "report.md").read_text()


def test_a_watch_series_from_before_the_sampling_options_is_still_the_same_series(tmp_path):
    from orchestrator.evaluation.plan import EvalRequest
    from orchestrator.watch import series as series_state
    from orchestrator.watch.config import WatchConfig

    cfg = WatchConfig(series="s", source_host="kpro6", folder="/ck/run", runs_dir=tmp_path,
                      request=EvalRequest(hosts=["ct129"], target="/m/t", drafters=[]))
    now = cfg.settings()
    new = ("temperature", "top_p", "top_k", "samples_per_prompt")
    assert set(new) <= set(now) and all(now[k] is None for k in new)
    before = {"name": "s", "source": cfg.source, "eval_host": "ct129",
              "settings": {k: v for k, v in now.items() if k not in new}}
    series_state.check_same_settings(before, cfg.source, "ct129", now, cfg.settings_defaults())
    hot = WatchConfig(series="s", source_host="kpro6", folder="/ck/run", runs_dir=tmp_path,
                      request=EvalRequest(hosts=["ct129"], target="/m/t", drafters=[], temperature=1.0))
    with pytest.raises(Exception, match="temperature None → 1.0"):
        series_state.check_same_settings(before, cfg.source, "ct129", hot.settings(), hot.settings_defaults())
