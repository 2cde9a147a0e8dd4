"""The engine sweep in the controller's outputs, from results.json alone: the speedup-vs-concurrency table and
plot, the per-step and counter-check notes in report.md, and the merge of the hosts' tables."""

from __future__ import annotations

from orchestrator.evaluation.engine_merge import merge_engine
from orchestrator.evaluation.engine_report import PLOT, engine_markdown, engine_plot, engine_text
from remote_payload.engines.run import level_summary, speedup_table
from remote_payload.metrics import engine_agreement

POSITIONS = 7


def _rec(sid: str, tokens: int, seconds: float, per_step: list[int] | None = None, ok: bool = True) -> dict:
    rec = {"id": sid, "continuation": list(range(tokens)), "finish_reason": "stop", "seconds": seconds,
           "tokens": tokens, "tokens_per_s": tokens / seconds, "tpot_ms": 1000 * seconds / tokens,
           "matches_reference": ok, "first_difference": None if ok else 0}
    if per_step is not None:
        hist = [per_step.count(j) for j in range(POSITIONS + 1)]
        rec["spec"] = {"rounds": len(per_step), "drafts_proposed": POSITIONS * len(per_step),
                       "drafts_accepted": sum(per_step), "histogram": hist, "per_step": per_step,
                       "per_position_counts": [sum(hist[k:]) for k in range(1, POSITIONS + 1)]}
    return rec


def _table(plain_s: tuple[float, float], dflash_s: tuple[float, float], miss_at_4: bool = False) -> list[dict]:
    steps = [[3, 0, 7, 1], [2, 2, 5]]
    plain = [level_summary(c, [_rec("a", 40, s / 2), _rec("b", 40, s / 2)], s, 0)
             for c, s in zip((1, 4), plain_s, strict=True)]
    dflash = [level_summary(1, [_rec("a", 40, dflash_s[0] / 2, steps[0]), _rec("b", 40, dflash_s[0] / 2, steps[1])],
                            dflash_s[0], POSITIONS),
              level_summary(4, [_rec("a", 40, dflash_s[1] / 2, steps[0], ok=not miss_at_4),
                                _rec("b", 40, dflash_s[1] / 2, steps[1])], dflash_s[1], POSITIONS)]
    return speedup_table(plain, dflash)


def _results(table: list[dict], offline: list[list[int]]) -> dict:
    steps = [[3, 0, 7, 1], [2, 2, 5]]
    engine = [engine_agreement.sample_counts(r, POSITIONS) for r in steps]
    ag = engine_agreement.compare(["a", "b"], engine, offline, POSITIONS)
    ag["per_step"] = engine_agreement.per_step_differences(["a", "b"], steps, offline)
    check = {"concurrency": 1, "requests": 2, "counters": {"rounds": 7, "drafts_accepted": 20}, "per_request": {},
             "differ": [], "ok": True}
    return {"engine": {"name": "vllm", "version": "0.32.0", "concurrency": [1, 4]},
            "drafters": {"ours": {"engine": {"engine": "vllm", "agreement": ag, "concurrency": table,
                                             "counter_check": check, "outputs": {"samples": 2, "match_reference": 2},
                                             "tokens_per_s": {"plain": table[0]["plain_tokens_per_s"],
                                                              "dflash": table[0]["dflash_tokens_per_s"],
                                                              "speedup": table[0]["speedup"]}}}}}


def test_the_table_gives_speedup_acceptance_and_tpot_per_level():
    table = _table((2.0, 0.8), (1.0, 0.64))
    assert [r["concurrency"] for r in table] == [1, 4]
    assert [r["speedup"] for r in table] == [2.0, 1.25]  # 80 tokens: 40 vs 80 tok/s at 1, 100 vs 125 at 4
    assert table[0]["mean_acceptance_length"] == 1 + 20 / 7 and table[0]["equal_plain"] is True
    assert table[1]["tpot_ms"] == {"plain": 10.0, "dflash": 8.0}


def test_report_shows_the_sweep_the_per_step_samples_and_the_counter_check(tmp_path):
    lines = engine_markdown(_results(_table((2.0, 0.8), (1.0, 0.64), miss_at_4=True), [[3, 0, 7, 1], [2, 3, 4]]))
    text = "\n".join(lines)
    assert "| ours | 1 | 40.0 | 80.0 | 2.00× | 3.86 | 25.0 / 12.5 | all / all |" in text
    assert "| ours | 4 | 100.0 | 125.0 | 1.25× | 3.86 | 10.0 / 8.0 | all / 1 differ |" in text
    assert "per-step acceptance differs from the offline rounds in 1 of 2 samples: b (from round 1, 3 vs 3 rounds)" \
        in text
    assert "adds up to the server's counters exactly over the 2 requests at concurrency 1 (7 rounds" in text
    assert engine_text(_results(_table((2.0, 0.8), (1.0, 0.64)), [[3, 0, 7, 1], [2, 2, 5]]))[-1] == \
        "engine ours speedup: ×2.00 at 1 in flight, ×1.25 at 4 in flight"
    (plot,) = engine_plot(tmp_path, _results(_table((2.0, 0.8), (1.0, 0.64)), [[3, 0, 7, 1], [2, 2, 5]]))
    assert plot == tmp_path / PLOT and plot.stat().st_size > 1000
    assert engine_plot(tmp_path, {"drafters": {"ours": {"engine": {"agreement": {}}}}}) == []  # no sweep, no plot


def test_a_host_table_that_is_not_numbers_shows_as_question_marks_not_a_crash():
    results = _results(_table((2.0, 0.8), (1.0, 0.64)), [[3, 0, 7, 1], [2, 2, 5]])
    results["drafters"]["ours"]["engine"]["concurrency"] = [{"concurrency": "<b>x</b>", "speedup": "fast",
                                                             "tpot_ms": "no"}, "junk"]
    text = "\n".join(engine_markdown(results))
    assert "| ours | &lt;b&gt;x&lt;/b&gt; | – | – | ?× |" in text and "<b>" not in text


def test_hosts_tables_merge_per_level(tmp_path):
    a, b = _table((2.0, 0.8), (1.0, 0.64)), _table((4.0, 1.6), (2.0, 1.28))
    hosts = {}
    samples = []
    for host, table, ids in (("h1", a, ["a", "b"]), ("h2", b, ["c", "d"])):
        block = {"engine": "vllm", "num_speculative_tokens": POSITIONS, "concurrency": table,
                 "counter_check": {"ok": True, "requests": 2, "concurrency": 1,
                                   "counters": {"rounds": 7, "drafts_accepted": 20}},
                 "outputs": {"mismatches": [], "equal_plain": True}}
        hosts[host] = {"engine": {"name": "vllm", "plain": {"tokens": 80, "seconds": 2.0}},
                       "drafters": {"ours": {"engine": block}}}
        for sid, steps in zip(ids, ([3, 0, 7, 1], [2, 2, 5]), strict=True):
            entry = {**engine_agreement.sample_counts(steps, POSITIONS), "per_step": steps, "tokens": 40,
                     "seconds": 0.5, "matches_reference": True}
            samples.append({"id": sid, "drafters": {"ours": {"engine": entry,
                                                             "conventions": {"vllm": {"accepted": steps}}}}})
    _, drafters = merge_engine(hosts, samples)
    merged = drafters["ours"]
    assert [r["concurrency"] for r in merged["concurrency"]] == [1, 4]
    one = merged["concurrency"][0]
    assert one["plain_tokens_per_s"] == round(160 / 6.0, 2) and one["dflash_tokens_per_s"] == round(160 / 3.0, 2)
    assert one["samples"] == 4 and one["reference_mismatches"] == {"plain": [], "dflash": []}
    assert merged["counter_check"]["ok"] and merged["counter_check"]["requests"] == 4
    assert merged["agreement"]["per_step"] == {"available": True, "compared": 4, "equal": 4, "differ": []}
