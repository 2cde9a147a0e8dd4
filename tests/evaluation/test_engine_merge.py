"""A sharded eval's engine figures merged over all samples (orchestrator.evaluation.engine_merge), on
hand-built per-host results and sample lines."""

from __future__ import annotations

import random

from orchestrator.evaluation.engine_merge import COMMITTED, merge_engine
from remote_payload.metrics.engine_agreement import compare, sample_counts
from remote_payload.metrics.sampled import sampled_engine_agreement

B1 = 3


def _line(sid, offline, engine, conventions=True, matches=True):
    entry = {"accepted": [min(a, 1) for a in offline],  # committed: capped, differs from the vllm figures
             "engine": {**sample_counts(engine, B1), "tokens": 10, "seconds": 0.5, "matches_reference": matches}}
    if conventions:
        entry["conventions"] = {"vllm": {"accepted": offline, "produced": [a + 1 for a in offline]}}
    return {"id": sid, "drafters": {"ours": entry}}


def _host(tokens, seconds, start, mismatches=()):
    block = {"name": "vllm", "version": "0.32.0", "used_for": ["drafters"], "logs": ["vllm-plain.log"],
             "plain": {"tokens": tokens, "seconds": seconds}, "start_seconds": {"plain": start, "ours": start + 9}}
    drafter = {"engine": {"num_speculative_tokens": B1, "exported": None, "folder": "/d",
                          "outputs": {"mismatches": list(mismatches), "equal_plain": True}}}
    return {"engine": block, "drafters": {"ours": drafter}}


def test_engine_figures_are_recomputed_over_every_host():
    offline = {"a": [3, 0, 1], "b": [2, 2], "c": [3, 3, 0], "d": [1]}
    engine = {"a": [3, 0, 1], "b": [2, 1, 1], "c": [3, 3, 0], "d": [1]}
    samples = [_line(s, offline[s], engine[s]) for s in "abcd"]
    run, drafters = merge_engine({"ct129": _host(40, 2.0, 50.0), "kpro6": _host(20, 2.0, 60.0)}, samples)
    assert run["plain"] == {"tokens": 60, "seconds": 4.0, "tokens_per_s": 15.0}
    assert run["start_seconds"] == {"ct129:plain": 50.0, "ct129:ours": 59.0, "kpro6:plain": 60.0, "kpro6:ours": 69.0}
    assert run["logs"] == ["ct129-vllm-plain.log", "kpro6-vllm-plain.log"] and set(run["hosts"]) == {"ct129", "kpro6"}
    ours = drafters["ours"]
    expected = compare(list("abcd"), [sample_counts(engine[s], B1) for s in "abcd"], [offline[s] for s in "abcd"], B1)
    assert ours["agreement"]["engine"] == expected["engine"] and ours["agreement"]["offline"] == expected["offline"]
    # the bounds are the union's: from the differing rounds of all hosts together
    assert ours["agreement"]["tau_micro"] == expected["tau_micro"] and ours["agreement"]["rounds"] == expected["rounds"]
    assert ours["agreement"]["per_position"] == expected["per_position"]
    assert ours["agreement"]["tolerance"]["differing_rounds"] == [3, 2] and ours["agreement"]["within_tolerance"]
    assert ours["agreement"]["samples"]["identical"] == 3 and ours["agreement"]["offline_source"] == "vllm"
    assert ours["tokens_per_s"] == {"plain": 15.0, "dflash": 20.0, "speedup": round(20 / 15, 3)}
    assert ours["outputs"]["samples"] == 4 and ours["outputs"]["equal_plain"] is True


def test_mismatched_outputs_are_left_out_and_committed_is_the_fallback():
    samples = [_line("a", [3, 0], [3, 0], conventions=False), _line("b", [1], [0, 0], matches=False)]
    run, drafters = merge_engine({"h1": _host(5, 1.0, 1.0), "h2": _host(5, 1.0, 1.0, mismatches=["b"])}, samples)
    ag = drafters["ours"]["agreement"]
    assert ag["left_out"] == ["b"] and ag["samples"]["compared"] == 1
    assert ag["offline_source"] == COMMITTED and ag["offline"]["drafts_accepted"] == 1  # the capped figures
    assert drafters["ours"]["outputs"]["mismatches"] == ["b"]


def test_a_host_whose_engine_failed_makes_the_drafter_an_error():
    bad = _host(5, 1.0, 1.0)
    bad["drafters"]["ours"]["engine"] = {"engine": "vllm", "error": "vLLM server exited with status 1"}
    run, drafters = merge_engine({"h1": _host(5, 1.0, 1.0), "h2": bad}, [_line("a", [1], [1])])
    assert drafters["ours"] == {"engine": "vllm", "error": "h2: vLLM server exited with status 1"}
    assert merge_engine({"h1": {"drafters": {}}}, []) == (None, {})


def test_engine_figures_that_are_not_numbers_make_the_drafter_an_error_not_a_traceback():
    bad = _line("b", [1, 2], [1, 2])
    bad["drafters"]["ours"]["engine"]["rounds"] = "2" * 500  # a host's samples.jsonl says so
    run, drafters = merge_engine({"h1": _host(5, 1.0, 1.0), "h2": _host(5, 1.0, 1.0)}, [_line("a", [1], [1]), bad])
    error = drafters["ours"]["error"]
    assert error.startswith("the hosts' engine figures of 'ours' cannot be merged: ")
    assert "engine counters of sample 'b' are not whole numbers" in error and len(error) < 400
    assert run["plain"]["tokens"] == 10  # the run's other engine figures stand
    missing = _line("c", [1], [1])
    del missing["drafters"]["ours"]["engine"]["per_position_counts"]
    _, drafters = merge_engine({"h1": _host(5, 1.0, 1.0)}, [missing])
    assert drafters["ours"]["error"].startswith("the hosts' engine figures of 'ours' cannot be merged: ")


def _sampled_host(probe, tokens=40, seconds=2.0):
    """One host's results at T > 0: its drafter block says ``sampled`` and carries its agreement (law, probe)."""
    host = _host(tokens, seconds, 30.0)
    host["settings"] = {"device": "cpu"}
    host["drafters"]["ours"]["engine"].update(
        sampled=True, outputs={"note": "draws"},
        agreement={"law": "T=1", "greedy_probe": probe, "within_tolerance": True})
    return host


def _sampled_line(sid, prompt_index, offline, engine):
    line = _line(sid, offline, engine)
    line.update(prompt_index=prompt_index, draw=int(sid.split("#")[1]))
    return line


def test_at_t_above_0_the_merged_agreement_is_the_expectation_test_over_every_hosts_draws():
    rng = random.Random(3)
    draws = [(f"p{p}#{j}", p) for p in range(8) for j in range(2)]
    offline = {sid: [rng.choice([0, 1, 2, 3]) for _ in range(6)] for sid, _ in draws}
    collapsed = {sid: [0] * 12 for sid, _ in draws}  # vLLM-CPU at T > 0: (nearly) nothing accepted
    samples = [_sampled_line(sid, p, offline[sid], collapsed[sid]) for sid, p in draws]
    probe = {"requests": 2, "rounds": 10, "drafts_accepted": 20}
    hosts = {"ct129": _sampled_host(probe), "ct130": _sampled_host(probe)}
    run, drafters = merge_engine(hosts, samples)
    ours = drafters["ours"]
    assert ours["sampled"] is True and "error" not in ours, ours
    expected = sampled_engine_agreement([offline[s] for s, _ in draws],
                                        [{"id": s, **sample_counts(collapsed[s], B1)} for s, _ in draws],
                                        [p for _, p in draws], title="vLLM", law="T=1", device="cpu",
                                        greedy={"requests": 4, "rounds": 20, "drafts_accepted": 40})
    assert ours["agreement"]["test"] == expected["test"] and ours["agreement"]["greedy_probe"]["requests"] == 4
    # the hosts' probes summed still say the server accepts greedily: the collapse is the engine's limitation
    assert ours["agreement"]["limitation"] is not None and ours["agreement"]["within_tolerance"] is None
    assert ours["outputs"]["match_reference"] is None and ours["total"]["rounds"] == 12 * 16
