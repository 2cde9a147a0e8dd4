"""`python -m remote_payload eval --temperature T --samples-per-prompt K`: the draws as samples, the figures as
expectations with their CIs, the online check at T, the cache per seed, and two shards merged into the figures of
one run; bad combinations refused with one line."""

from __future__ import annotations

import pytest
from payload_helpers import json_lines, read_results

from remote_payload.metrics.aggregate import merge_shards

SAMPLED = ["--samples", "4", "--temperature", "0.6", "--max-new-tokens", "32", "--dtype", "float32", "--threads", "1"]


def _eval(run_payload, fixture_dir, out, cache, *extra):
    proc = run_payload("eval", "--target", fixture_dir / "target", "--drafter", f"z={fixture_dir / 'zlab-drafter'}",
                       "--drafter", f"rand={fixture_dir / 'random-drafter'}", *SAMPLED, "--cache-dir", cache,
                       "--out", out, *extra)
    assert proc.returncode == 0, proc.stderr
    return (*read_results(out), json_lines(proc.stdout))


@pytest.fixture(scope="module")
def whole(fixture_dir, tmp_path_factory):
    """One run over 4 prompts × 2 draws with the online check, and its cache folder."""
    import os
    import subprocess
    import sys

    from payload_helpers import REPO

    tmp = tmp_path_factory.mktemp("sampled-eval")

    def run_payload(*args):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        return subprocess.run([sys.executable, "-m", "remote_payload", *map(str, args)], cwd=str(REPO),
                              capture_output=True, text=True, env=env, timeout=900)

    results, lines, records = _eval(run_payload, fixture_dir, tmp / "run", tmp / "cache", "--samples-per-prompt", "2",
                                    "--online-check")
    return {"results": results, "lines": lines, "records": records, "tmp": tmp, "run_payload": run_payload}


def test_every_draw_is_a_sample_with_its_seed_and_the_figures_are_their_expectations(whole):
    results, lines = whole["results"], whole["lines"]
    assert [line["id"] for line in lines[:4]] == ["code-fizzbuzz#0", "code-fizzbuzz#1", "code-reverse-string#0",
                                                  "code-reverse-string#1"]
    assert [(line["prompt_index"], line["draw"]) for line in lines] == [(p, j) for p in range(4) for j in range(2)]
    assert len({line["seed"] for line in lines}) == 8 and all(line["teacher_forced_mismatches"] is None
                                                                for line in lines)
    s = results["settings"]["sampling"]
    assert (s["temperature"], s["top_p"], s["top_k"], s["samples_per_prompt"], s["seed"]) == (0.6, 1.0, 0, 2, 0)
    assert results["settings"]["samples"] == 8
    m = results["drafters"]["z"]["metrics"]
    taus = [line["drafters"]["z"]["tau"] for line in lines]
    sampled = m["sampled"]
    assert sampled["prompts"] == 4 and sampled["draws"] == 8
    assert sampled["tau_macro"]["value"] == pytest.approx(sum(taus) / len(taus)) == pytest.approx(m["tau_macro"])
    lo, hi = sampled["tau_macro"]["ci"]
    assert lo <= m["tau_macro"] <= hi
    assert sampled["zlab_2604_tau_macro"]["value"] == pytest.approx(m["conventions"]["zlab-2604"]["tau_macro"])
    assert sampled["ddtree"]["value"] == pytest.approx(m["tree"]["topk"]["tau_macro"])
    assert "exact in expectation" not in sampled["estimator"] and "unbiased" in sampled["estimator"]
    assert "cluster bootstrap over prompts" in sampled["ci"] and "sampled" in m["definitions"]
    assert m["tau_macro"] > results["drafters"]["rand"]["metrics"]["tau_macro"]
    (pair,) = results["comparison"]["pairs"]
    assert "paired by prompt and seed" in results["comparison"]["definition"] and pair["samples"] == 8
    assert "warnings" not in results, results.get("warnings")


def test_the_online_check_at_t_compares_expectations(whole):
    results, lines = whole["results"], whole["lines"]
    check = results["drafters"]["z"]["online_check"]
    # the default rule is the sampled one: its loop against its exact estimate (zlab-2604 counts the greedy rule)
    assert results["settings"]["draft_rule"] == results["settings"]["sampling"]["draft_rule"] == "sampled"
    assert results["drafters"]["z"]["metrics"]["draft_rule"] == "sampled" and check["draft_rule"] == "sampled"
    assert check["sampled"] and check["samples"] == 8 and set(check["agreement"]) == {"committed"}
    assert check["agreement"]["committed"]["prompts"] == 4 and check["all_agree"] is True
    online = [line["drafters"]["z"]["online"] for line in lines]
    assert len({o["seed"] for o in online} | {line["seed"] for line in lines}) == 16  # its own seeds
    stages = {r["stage"] for r in whole["records"] if r["dfo"] == "progress"}
    assert {"online:z", "online:rand"} <= stages


def test_the_greedy_rule_keeps_todays_figures_on_the_same_draws(whole, fixture_dir):
    """--draft-rule greedy: the same draws, the teacher-forced replay as the headline (what the sampled-rule run
    keeps under greedy_rule), and the zlab-2604-rule online loop with both conventions checked."""
    tmp = whole["tmp"]
    results, lines, _ = _eval(whole["run_payload"], fixture_dir, tmp / "greedy", tmp / "cache",
                              "--samples-per-prompt", "2", "--online-check", "--draft-rule", "greedy")
    m, sampled_run = results["drafters"]["z"]["metrics"], whole["results"]["drafters"]["z"]["metrics"]
    assert results["settings"]["draft_rule"] == m["draft_rule"] == "greedy" and "greedy_rule" not in m
    for key in ("tau_macro", "tau_micro", "per_position", "tau_histogram"):
        assert m[key] == sampled_run["greedy_rule"][key], key
    assert [line["drafters"]["z"]["tau"] for line in lines] == [
        line["drafters"]["z"]["greedy_rule_tau"] for line in whole["lines"]]
    assert all("sampled_rule" not in line["drafters"]["z"] for line in lines)
    assert "integrated out" in sampled_run["sampled"]["estimator"]
    assert "integrated out" not in m["sampled"]["estimator"] and "replay" in m["sampled"]["estimator"]
    check = results["drafters"]["z"]["online_check"]
    assert set(check["agreement"]) == {"committed", "zlab-2604"} and check["all_agree"] is True
    assert sampled_run["tau_macro"] != m["tau_macro"]  # the two rules give different τ


def test_more_draws_per_prompt_reuse_the_first_draws(whole, fixture_dir):
    tmp = whole["tmp"]
    results, lines, _ = _eval(whole["run_payload"], fixture_dir, tmp / "three", tmp / "cache",
                              "--samples-per-prompt", "3")
    assert results["reference"]["cache_hits"] == 8 and len(lines) == 12
    by_draw = {(line["prompt_index"], line["draw"]): line for line in lines}
    for old in whole["lines"]:
        new = by_draw[(old["prompt_index"], old["draw"])]
        assert new["seed"] == old["seed"] and new["continuation_text"] == old["continuation_text"]
        assert new["drafters"]["z"]["tau"] == old["drafters"]["z"]["tau"]


def test_two_shards_merge_into_the_figures_of_one_run(whole, fixture_dir):
    tmp = whole["tmp"]
    parts = []
    for i in range(2):
        results, lines, _ = _eval(whole["run_payload"], fixture_dir, tmp / f"shard{i}", tmp / "cache",
                                  "--samples-per-prompt", "2", "--online-check", "--shard", f"{i}/2")
        assert results["settings"]["samples"] == 4
        parts.append((results, lines))
    merged, lines = merge_shards(parts)
    assert [line["id"] for line in lines] == [line["id"] for line in whole["lines"]]
    for name in ("z", "rand"):
        got, want = merged["drafters"][name]["metrics"]["sampled"], whole["results"]["drafters"][name]["metrics"][
            "sampled"]
        for key in ("tau_macro", "tau_micro", "zlab_2604_tau_macro", "ddtree", "per_position", "variance", "prompts"):
            assert _rounded(got[key]) == _rounded(want[key]), (name, key)
        online, want_online = merged["drafters"][name]["online_check"], whole["results"]["drafters"][name][
            "online_check"]
        for convention in want_online["agreement"]:
            g, w = online["agreement"][convention], want_online["agreement"][convention]
            assert g["difference"] == pytest.approx(w["difference"]) and g["agree"] == w["agree"]


def _rounded(value):
    """Floats to 9 digits, everywhere in a JSON value (sums over other orders differ in the last bits)."""
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize("extra, phrase", [
    (["--samples-per-prompt", "3"], "--samples-per-prompt 3 needs --temperature T > 0: it shapes sampling"),
    (["--top-p", "0.9"], "--top-p 0.9 needs --temperature T > 0"),
    (["--temperature", "1", "--top-p", "1.5"], "--top-p 1.5: expected a probability mass above 0 and at most 1"),
    (["--temperature", "-1"], "--temperature -1.0: expected a number of at least 0"),
])
def test_bad_sampling_settings_are_one_error_line(run_payload, fixture_dir, tmp_path, extra, phrase):
    proc = run_payload("eval", "--target", fixture_dir / "target", "--drafter", f"z={fixture_dir / 'zlab-drafter'}",
                       "--out", tmp_path / "out", *extra)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("dfo-payload error: ") and phrase in lines[0], proc.stderr
