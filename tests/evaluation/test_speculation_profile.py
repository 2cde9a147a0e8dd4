"""speculation_profile.json (schema 1.0) and the K plan: pure logic on hand-made results."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.host_text import md_text
from orchestrator.evaluation.k_schedule import fit_line, k_plan_markdown, k_plans, plan_for_drafter, schedule
from orchestrator.evaluation.profile import accept_length_at, build_profile, load_profile, write_profiles


def _results(engine: dict | None = None) -> tuple[dict, list[dict]]:
    by_k = {"1": {"mean_accept_length": 1.6}, "2": {"mean_accept_length": 2.0}, "3": {"mean_accept_length": 3.0}}
    drafter = {"spec": {"block_size": 4}, "source": {"path": "/m/d", "digest": "ab" * 32},
               "metrics": {"block_size": 4, "tau_macro": 2.0, "tau_micro": 2.1,
                           "accept_length_by_k": {"by_k": by_k}}}
    if engine is not None:
        drafter["engine"] = engine
    results = {"created_utc": "2026-12-04T00:00:00Z", "target": {"name": "tiny", "weights_digest": "cd" * 32},
               "versions": {"payload": "0.9"}, "settings": {"max_new_tokens": 64}, "drafters": {"d": drafter}}
    samples = [{"id": "a", "dataset": "gsm8k", "drafters": {"d": {"accepted": [3, 0, 1, 2]}}},
               {"id": "b", "dataset": "mbpp", "drafters": {"d": {"accepted": [3, 3]}}}]
    return results, samples


def test_profile_rates_positions_means_and_validation():
    results, samples = _results()
    p = build_profile(results, samples, "d")
    assert p["schema_version"] == "1.0" and p["num_speculative_tokens"] == p["max_supported_k"] == 3
    # rounds accepted 3,0,1,2,3,3: position i is draft i+1 (accept length i + 2)
    assert p["marginal_accept_rates"] == [round(5 / 6, 6), round(4 / 6, 6), 0.5]
    assert p["conditional_accept_rates"] == [round(5 / 6, 6), round(4 / 5, 6), 0.75]
    assert p["mean_accept_length"] == 1 + 12 / 6
    assert p["mean_accept_length_per_request"] == ((1 + 6 / 4) + (1 + 6 / 2)) / 2
    assert p["acceptance_length_histogram"] == {"1": 1, "2": 1, "3": 1, "4": 3}
    assert p["validation"]["passed"] and p["validation"]["marginals_non_increasing"]
    assert set(p["per_category"]) == {"gsm8k", "mbpp"} and p["per_category"]["mbpp"]["mean_accept_length"] == 4
    assert p["accept_length_by_k"] == {"1": 1.6, "2": 2.0, "3": 3.0}
    mc = p["measurement_conditions"]
    assert mc["temperature"] == 0.0 and mc["drafter_digest"] == "ab" * 32 and mc["dfo_version"] == "0.9"


def test_written_profiles_load_and_foreign_schemas_are_refused(tmp_path):
    results, samples = _results()
    (path,) = write_profiles(tmp_path, results, samples)
    assert path.name == "d.speculation_profile.json" and load_profile(path)["mean_accept_length"] == 3.0
    other = {"schema_version": "2.0", "marginal_accept_rates": [0.5], "mean_accept_length": 1.5}
    (tmp_path / "x.json").write_text(json.dumps(other))
    with pytest.raises(InputError, match="schema_version '2.0'"):
        load_profile(tmp_path / "x.json")
    foreign = {"schema_version": "1.0", "marginal_accept_rates": [0.8, 0.5], "mean_accept_length": 2.3}
    (tmp_path / "y.json").write_text(json.dumps(foreign))
    # another tool's card without accept_length_by_k: the accept length at K comes from its marginals
    assert accept_length_at(load_profile(tmp_path / "y.json"), 1) == pytest.approx(1.8)


def test_cost_model_fits_the_plain_and_dflash_points_and_picks_k_per_concurrency():
    # c=1: plain 100 tok/s (10 ms/step); DFlash at K=3 with τ 3.0 at 240 tok/s -> 12.5 ms/step
    # c=8: plain 400 tok/s (20 ms/step); DFlash at K=3 with τ 3.0 at 300 tok/s -> 80 ms/step
    rows = [{"concurrency": 1, "plain_tokens_per_s": 100.0, "dflash_tokens_per_s": 240.0,
             "mean_acceptance_length": 3.0, "speedup": 2.4},
            {"concurrency": 8, "plain_tokens_per_s": 400.0, "dflash_tokens_per_s": 300.0,
             "mean_acceptance_length": 3.0, "speedup": 0.75}]
    results, samples = _results({"num_speculative_tokens": 3, "concurrency": rows})
    plan = k_plans(results, samples)["d"]
    low, high = plan["predicted"]
    assert low["plain_step_ms"] == low["step_ms_intercept"] == pytest.approx(10.0)  # one K: through plain
    assert low["ms_per_extra_k"] == pytest.approx(2.5 / 3, abs=1e-3)
    assert low["best_k"] == 3 and high["best_k"] == 1  # under load every extra draft costs more than it gains
    assert plan["num_speculative_tokens_per_batch_size"] == [[1, 7, 3], [8, 8, 1]]
    # one K measured: it is the calibration point, and the profile's τ(3) = 3.0 is the engine's: no error
    assert [(c["relative_error"], c["held_out"]) for c in plan["check"]] == [(0.0, False), (0.0, False)]
    table = "\n".join(k_plan_markdown({"d": plan}, md_text))
    assert "| d | 8 | 1 |" in table and "[[1, 7, 3], [8, 8, 1]]" in table


def test_line_fit_and_schedule_merge_equal_neighbours():
    assert fit_line([(0, 1.0), (2, 2.0), (4, 3.0)]) == pytest.approx((1.0, 0.5))
    assert schedule([{"concurrency": 1, "best_k": 4}, {"concurrency": 4, "best_k": 4},
                     {"concurrency": 16, "best_k": 2}]) == [[1, 15, 4], [16, 16, 2]]
    assert plan_for_drafter({"num_speculative_tokens": 3, "concurrency": []}, lambda k: 2.0, 3) is None


def test_each_measured_k_is_predicted_from_a_drafted_line_that_did_not_see_it():
    # c=1: plain 10 ms/step; the DFlash steps cost 16, 17.5 and 18 ms at K = 1, 2, 3 (the drafter's own cost
    # makes even K = 1 far dearer than plain); the profile's τ: 1.6, 2.0, 3.0
    def at(k, tau, step_ms):
        return {"tokens_per_s": tau / (step_ms / 1000), "mean_acceptance_length": tau, "speedup": tau * 10 / step_ms}

    row = {"concurrency": 1, "plain_tokens_per_s": 100.0, **{f"{key}": v for key, v in (
        ("dflash_tokens_per_s", 3.0 / 0.018), ("mean_acceptance_length", 3.0), ("speedup", 3.0 * 10 / 18))},
        "per_k": {"1": at(1, 1.6, 16.0), "2": at(2, 2.0, 17.5)}}
    results, samples = _results({"num_speculative_tokens": 3, "concurrency": [row]})
    plan = k_plans(results, samples)["d"]
    assert plan["k_measured"] == [1, 2, 3]
    (pred,) = plan["predicted"]
    assert pred["step_ms_intercept"] == pytest.approx(15.0 + 1 / 6, abs=1e-3)  # the line over K = 1..3 only
    by_k = {c["k"]: c for c in plan["check"]}
    assert all(c["held_out"] for c in by_k.values())
    # K = 2 from the line through K = 1 and 3: 17 ms, speedup 2.0·10/17 beside the measured 2.0·10/17.5
    assert by_k[2]["predicted_speedup"] == pytest.approx(20 / 17, abs=1e-3)
    assert by_k[2]["relative_error"] == pytest.approx((20 / 17 - 20 / 17.5) / (20 / 17.5), abs=1e-3)
    # K = 1 from the line through K = 2 and 3: 17 ms, speedup 1.6·10/17 beside the measured 1.0
    assert by_k[1]["predicted_speedup"] == pytest.approx(16 / 17, abs=1e-3)


def test_runs_compare_reads_two_profiles_and_refuses_an_unknown_schema(tmp_path):
    from cli_runner import dfo

    results, samples = _results()
    (ours,) = write_profiles(tmp_path, results, samples)
    other = tmp_path / "other.json"  # another tool's card: marginals only, no accept_length_by_k
    other.write_text(json.dumps({"schema_version": "1.0", "marginal_accept_rates": [0.5, 0.25, 0.1],
                                 "mean_accept_length": 1.85}))
    proc = dfo("runs", "compare", str(other), str(ours), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["by_k"]
    assert [(r["k"], r["accept_length_a"], r["accept_length_b"]) for r in rows] == [
        (1, 1.5, 1.6), (2, 1.75, 2.0), (3, pytest.approx(1.85), 3.0)]
    other.write_text(json.dumps({"schema_version": "0.3", "marginal_accept_rates": [], "mean_accept_length": 1}))
    bad = dfo("runs", "compare", str(other), str(ours))
    assert bad.returncode == 2 and "schema_version '0.3' is not one dfo reads" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_two_engine_runs_paired_by_prompt_name_the_side_that_lost_acceptance():
    from orchestrator.evaluation.compare import dataset_lines, engine_pairing

    def run(version: str, taus: list[float]) -> tuple[dict, list[dict]]:
        results = {"engine": {"name": "vllm", "version": version},
                   "drafters": {"d": {"engine": {"num_speculative_tokens": 7}}}}
        return results, [{"id": f"p{i}", "drafters": {"d": {"engine": {"tau": t}}}} for i, t in enumerate(taus)]

    ra, sa = run("0.31.0", [3.0, 3.2, 2.9, 3.1, 3.0, 3.3, 2.8, 3.1])
    rb, sb = run("0.32.0", [2.6, 2.9, 2.5, 2.8, 2.7, 2.9, 2.4, 2.8])
    e = engine_pairing(ra, rb, sa, sb, "d")
    assert e is not None and e["paired_samples"] == 8 and e["ci"][1] < 0
    assert e["verdict"] == "B (vllm 0.32.0) lost acceptance" and e["a"]["k"] == e["b"]["k"] == 7
    line = dataset_lines({"drafters": [{"drafter": "d", "engine": e}]})[0]
    assert "A: vllm 0.31.0, K 7" in line and "B (vllm 0.32.0) lost acceptance" in line
    same = engine_pairing(ra, ra, sa, sa, "d")
    assert same is not None and same["verdict"] == "no clear difference (CI includes 0)"
    assert engine_pairing(ra, {}, sa, [{"id": "p0", "drafters": {}}], "d") is None


def test_the_engine_synthetic_check_travels_with_the_profile_and_the_report():
    from orchestrator.evaluation.engine_report import notes

    check = {"rates": [0.83, 0.67, 0.5], "expected_mean": 3.0, "measured_mean": 2.96, "bound": 0.09, "rounds": 600,
             "within": True, "problems": []}
    results, samples = _results(engine={"synthetic_check": check})
    x = build_profile(results, samples, "d")["x_dfo"]["engine_synthetic_check"]
    assert x == {"expected_mean": 3.0, "measured_mean": 2.96, "bound": 0.09, "rounds": 600, "within": True}
    row = {"drafter": "d", "problems": [], "notes": [], "exported": None, "offline_source": None, "tolerance": None,
           "per_step": None, "counter_check": None, "synthetic": check}
    assert notes([row]) == ["d: engine with the synthetic sampler fed the profile's marginals: mean accept length "
                            "2.960 vs the profile's 3.000 ±0.090 over 600 rounds: matches the profile"]
    row["synthetic"] = {"rates": [0.5], "unsupported": "vLLM 0.32.0 refused the synthetic sampler on this host"}
    assert notes([row]) == ["d: synthetic-sampler check not run: vLLM 0.32.0 refused the synthetic sampler on "
                            "this host"]
    assert "engine_synthetic_check" not in build_profile(*_results(), "d")["x_dfo"]


def test_profile_counts_steps_as_the_engine_does_and_names_its_per_k_method():
    results, samples = _results()
    block = results["drafters"]["d"]["metrics"]["accept_length_by_k"]
    block.update(method="replanned", definition="K + 1 rows", exact=True)
    block["by_k"]["2"].update(ci95=[1.8, 2.2], committed={"mean_accept_length": 1.9})
    # every sample has the vllm convention's record (drafts accepted past the stop counted): the card uses it
    samples[0]["drafters"]["d"]["conventions"] = {"vllm": {"accepted": [3, 0, 1, 3]}}
    samples[1]["drafters"]["d"]["conventions"] = {"vllm": {"accepted": [3, 3]}}
    p = build_profile(results, samples, "d")
    assert p["mean_accept_length"] == round(1 + 13 / 6, 6) and "past the stop token" in \
        p["measurement_conditions"]["convention"]
    assert p["measurement_conditions"]["accept_length_by_k"]["method"] == "replanned"
    assert p["x_dfo"]["accept_length_by_k_ci95"] == {"2": [1.8, 2.2]}
    assert p["x_dfo"]["accept_length_by_k_committed"] == {"2": 1.9}
    del samples[1]["drafters"]["d"]["conventions"]  # one sample without: the committed rounds, said so
    p = build_profile(results, samples, "d")
    assert p["mean_accept_length"] == 3.0 and "lower bound" in p["measurement_conditions"]["convention"]


def test_an_old_dfo_profile_is_recognised_and_compare_says_the_methods_differ(tmp_path):
    from cli_runner import dfo

    from orchestrator.evaluation.profile import BY_K_METHOD, OLD_BY_K_METHOD, by_k_method
    from remote_payload.metrics import by_k

    assert (BY_K_METHOD, OLD_BY_K_METHOD) == (by_k.METHOD, by_k.OLD_METHOD)  # the controller's copy of the names

    results, samples = _results()  # a results.json from before: per-K figures without a method
    old = build_profile(results, samples, "d")
    assert by_k_method(old) == "truncated"
    results["drafters"]["d"]["metrics"]["accept_length_by_k"]["method"] = "replanned"
    new = build_profile(results, samples, "d")
    assert by_k_method(new) == "replanned"
    del old["measurement_conditions"]["accept_length_by_k"]  # as dfo wrote it then: no such field
    assert by_k_method(old) == "truncated"
    assert by_k_method({"accept_length_by_k": {"1": 1.5}}) is None  # another tool's card that does not say
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    proc = dfo("runs", "compare", str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    assert proc.returncode == 0, proc.stderr
    err = " ".join(proc.stderr.split())
    assert "warning: accept_length_by_k was measured by different methods: A truncated, B replanned" in err
    same = dfo("runs", "compare", str(tmp_path / "new.json"), str(tmp_path / "new.json"), "--json")
    assert "methods_differ" not in json.loads(same.stdout) and "warning" not in same.stderr


@pytest.mark.parametrize("change,message", [
    ({"marginal_accept_rates": [float("nan"), 0.25, 0.1]}, r"marginal_accept_rates\[0\] is nan: expected a rate in"),
    ({"marginal_accept_rates": [1.5, 0.25, 0.1], "mean_accept_length": 2.85},
     r"marginal_accept_rates\[0\] is 1.5: expected a rate in \[0, 1\]"),
    ({"marginal_accept_rates": [0.5, -0.2, 0.1], "mean_accept_length": 1.4}, r"marginal_accept_rates\[1\] is -0.2"),
    ({"marginal_accept_rates": [0.5, 0.25, 0.4], "mean_accept_length": 2.15},
     r"marginal_accept_rates increase at position 2 \(0.25 -> 0.4\)"),
    ({"mean_accept_length": 3.5}, r"mean_accept_length is 3.5, expected 1 \+ the sum of marginal_accept_rates = 1.85"),
    ({"conditional_accept_rates": [0.5, 2.0, 0.4]}, r"conditional_accept_rates\[1\] is 2.0"),
    ({"accept_length_by_k": {"1": float("inf")}}, r"accept_length_by_k\['1'\] is inf"),
])
def test_runs_compare_validates_each_profile_with_the_exports_rules(tmp_path, change, message):
    """Issue 44, item 7: NaN, rates outside [0, 1] and increasing marginals are refused on read, naming the file
    and the field (exit 2), as dfo's own export checks them."""
    from cli_runner import dfo

    results, samples = _results()
    (ours,) = write_profiles(tmp_path, results, samples)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema_version": "1.0", "marginal_accept_rates": [0.5, 0.25, 0.1],
                                 "mean_accept_length": 1.85, **change}))
    before = other.read_text()
    proc = dfo("runs", "compare", str(other), str(ours))
    assert proc.returncode == 2, proc.stdout
    assert f"{other}: " in proc.stderr and re.search(message, proc.stderr), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == "" and other.read_text() == before


def test_a_block_size_or_accepted_count_beyond_the_evals_bounds_is_refused_at_once():
    """Issue 42, finding 3: a block size of 10^12 in a host's results built lists per draft position until
    the OOM killer came; so would a round that accepted more drafts than a block holds (an index error)."""
    results, samples = _results()
    results["drafters"]["d"]["metrics"]["block_size"] = 10 ** 12
    with pytest.raises(InputError, match="block size 1000000000000, more than 256"):
        build_profile(results, samples, "d")
    results, samples = _results()
    samples[0]["drafters"]["d"]["accepted"] = [3, -7]
    with pytest.raises(InputError, match="a round with -7 accepted drafts; a block of 4 holds 0-3"):
        build_profile(results, samples, "d")
    results, samples = _results()
    samples[1]["drafters"]["d"]["accepted"] = [10 ** 9]
    with pytest.raises(InputError, match="a round with 1000000000 accepted drafts"):
        build_profile(results, samples, "d")
