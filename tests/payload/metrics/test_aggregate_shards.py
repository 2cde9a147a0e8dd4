"""Merging sharded eval results: metrics recomputed over all samples equal an unsharded run's; incompatible
parts are refused with a message naming the field; per-shard provenance is kept."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tree_helpers import chain_of, sample_line, synthetic_drafts

from remote_payload.errors import PayloadError
from remote_payload.metrics import conventions as conv
from remote_payload.metrics.aggregate import merge_shards
from remote_payload.metrics.chain import summarize
from remote_payload.metrics.compare import compare_drafters
from remote_payload.metrics.sample_rounds import rounds_from_entry
from remote_payload.metrics.tree import tree_summary

REPO = Path(__file__).resolve().parents[3]
B, K_TOP, BUDGET = 5, 3, 6
N_SAMPLES = 7


ENDS: dict = {}  # (sample index, drafter) -> the conventions.SampleEnd its records were computed from


def _add_conventions(line: dict, drafts: dict, rng: random.Random) -> None:
    """zlab-2604/vllm records as the eval writes them: odd samples end on an end token, even ones at max_new; the
    drafts past the kept tokens always match the tail, the others are the synthetic top-1."""
    name_drafts = next(iter(drafts.values()))
    tokens, P = name_drafts["tokens"], name_drafts["prompt_len"]
    tail = [2000 + rng.randint(0, 50) for _ in range(B - 1)]
    ext, kept = tokens + tail, len(tokens)
    eos = line["index"] % 2 == 1
    line["tail_tokens"] = len(tail)
    for name, d in drafts.items():
        top1 = {a: [c[0] for c in row] for a, row in zip(d["anchors"], d["topk_ids"], strict=True)}
        top1[kept - 1] = tail  # the end anchor (z-lab's extra round at max_new)

        def drafts_at(a, top1=top1):
            return [ext[a + k] if a + k >= kept else t for k, t in enumerate(top1[a], 1)]

        end = conv.SampleEnd(ext, P, kept, kept - P + (5 if eos else 0), frozenset({tokens[-1]} if eos else ()),
                             drafts_at)
        assert conv.committed_rounds(end) == chain_of(d)  # the chain record is the committed convention
        ENDS[(line["index"], name)] = end
        line["drafters"][name]["conventions"] = {"zlab-2604": conv.record(conv.zlab_2604_rounds(end, B)),
                                                 "vllm": conv.record(conv.vllm_rounds(end, B))}


def _all_lines():
    """Seven samples of two drafters (a weak, b strong), with tree and convention records, as the eval writes
    them."""
    rng = random.Random(11)
    lines = []
    for i in range(N_SAMPLES):
        tokens = list(range(1000, 1000 + rng.randint(4, 25)))
        drafts = {name: synthetic_drafts(tokens, 2, B, 3, lambda a, d, q=q: rng.choice([0] * q + [1, None]))
                  for name, q in (("a", 1), ("b", 6))}
        line, _ = sample_line(i, drafts, k=K_TOP, budget=BUDGET)
        _add_conventions(line, drafts, rng)
        line["drafters"]["a"]["online"] = {"output_equals_reference": i != 3, "rounds_identical": True,
                                           "tau": line["drafters"]["a"]["tau"], "seconds": 0.5,
                                           "target_forwards": 3}
        lines.append(line)
    return lines


def _run(lines, shard, *, seconds=10.0, device="cpu", kernel="torch", **extra):
    """results.json of one eval over ``lines``, built the way the eval builds it."""
    drafters = {}
    for n in ("a", "b"):
        chain = [rounds_from_entry(line["drafters"][n], line["prompt_tokens"], line["continuation_tokens"], "t")
                 for line in lines]
        topk = [rounds_from_entry(line["drafters"][n]["tree"]["topk"], line["prompt_tokens"],
                                  line["continuation_tokens"], "t") for line in lines]
        bud = [rounds_from_entry(line["drafters"][n]["tree"]["budgeted"], line["prompt_tokens"],
                                 line["continuation_tokens"], "t") for line in lines]
        metrics = summarize(chain, B)
        metrics["tree"] = tree_summary(topk, bud, block_size=B, k=K_TOP, budget=BUDGET, K=3)
        metrics["conventions"] = conv.summaries(
            chain, *([conv.rounds_from_record(line["drafters"][n]["conventions"][c], B, "t") for line in lines]
                     for c in ("zlab-2604", "vllm")), B, exact=all(line["tail_tokens"] >= B - 1 for line in lines))
        online = [line["drafters"][n].get("online") for line in lines]
        drafters[n] = {"spec": {"format": "zlab", "block_size": B, "mask_token_id": 9, "notes": [f"host {shard}"]},
                       "source": {"path": f"/host{shard[0]}/ckpt/{n}", "digest": f"digest-{n}"},
                       "metrics": metrics,
                       "online_check": ({"samples": len(lines)} if any(online) else None),
                       "timings": {"eval_s": seconds / 2, "draft_s": seconds / 4, "anchors": 100}}
    results = {
        "schema": "dfo.results/2", "status": "ok", "created_utc": "2025-01-01T00:00:00Z",
        "settings": {"enable_thinking": False, "max_new_tokens": 512, "samples_requested": None,
                     "prompts": {"source": "builtin", "path": f"/host{shard[0]}/payload/prompts.jsonl",
                                 "sha256": "abc", "count": N_SAMPLES},
                     "samples": len(lines), "sample_ids": [line["id"] for line in lines],
                     "shard": {"index": shard[0], "count": shard[1]}, "dtype": "bfloat16", "device": device,
                     "kernel_requested": "auto", "seed": 0, "draft_topk": 8, "online_check": True,
                     "cache_dir": f"/host{shard[0]}/cache"},
        "target": {"name": "tiny", "path": f"/host{shard[0]}/models/tiny", "weights_digest": "w" * 64,
                   "kernel_path": kernel},
        "versions": {"payload": "0.1.0", "torch": "2.13.0"},
        "reference": {"tokens_generated": 100 * len(lines), "tokens_per_s": 50.0, "cache_hits": 1,
                      "stop_reasons": {"eos": len(lines)}},
        "extraction": {"layers": [1, 2], "tokens": 200, "tokens_per_s": 400.0, "cache_hits": 0,
                       "kernel_path": kernel, "teacher_forced_mismatches": 1},
        "drafters": drafters,
        "timings": {"load_s": 1.0, "reference_s": seconds, "extract_s": 2.0, "total_s": seconds + 3},
        "samples": {"count": len(lines), "file": "samples.jsonl", "layout": "one line per sample"},
        "comparison": compare_drafters(lines, ["a", "b"], block_sizes={"a": B, "b": B}, resamples=300, seed=3),
        **extra,
    }
    return results


def _parts(lines=None):
    lines = lines if lines is not None else _all_lines()
    s0, s1 = [x for x in lines if x["index"] % 2 == 0], [x for x in lines if x["index"] % 2 == 1]
    return (_run(copy.deepcopy(s0), (0, 2), seconds=10.0), copy.deepcopy(s0)), \
        (_run(copy.deepcopy(s1), (1, 2), seconds=30.0, device="cuda"), copy.deepcopy(s1))


def test_merged_metrics_equal_an_unsharded_run():
    lines = _all_lines()
    full = _run(lines, (0, 1))
    p0, p1 = _parts(lines)
    merged, samples = merge_shards([p1, p0])  # order of parts does not matter
    assert [s["index"] for s in samples] == list(range(N_SAMPLES))
    assert samples == lines
    for n in ("a", "b"):
        assert merged["drafters"][n]["metrics"] == full["drafters"][n]["metrics"]
    assert merged["comparison"] == full["comparison"]
    # not an average of the shards' own figures (4 and 3 samples)
    shard_avg = (p0[0]["drafters"]["b"]["metrics"]["tau_macro"] + p1[0]["drafters"]["b"]["metrics"]["tau_macro"]) / 2
    assert merged["drafters"]["b"]["metrics"]["tau_macro"] != pytest.approx(shard_avg)
    assert merged["settings"]["samples"] == N_SAMPLES and merged["samples"]["count"] == N_SAMPLES
    assert merged["settings"]["sample_ids"] == [f"p{i}" for i in range(N_SAMPLES)]
    assert merged["settings"]["shard"] == {"count": 2, "merged": [0, 1]}
    assert "warnings" not in merged


def test_each_shards_decode_figures_are_kept():
    p0, p1 = _parts()
    assert "decode" not in merge_shards([p0, p1])[0]["reference"]  # a server's references: none
    p0[0]["reference"]["decode"] = {"batch": 32, "idle_share": 0.2}
    p1[0]["reference"]["decode"] = {"batch": 1, "idle_share": 0.0}
    merged, _ = merge_shards([p1, p0])
    assert merged["reference"]["decode"] == [{"batch": 32, "idle_share": 0.2}, {"batch": 1, "idle_share": 0.0}]


def test_provenance_timings_and_counts():
    p0, p1 = _parts()
    merged, _ = merge_shards([p0, p1])
    assert [s["shard"] for s in merged["shards"]] == [{"index": 0, "count": 2}, {"index": 1, "count": 2}]
    assert [s["device"] for s in merged["shards"]] == ["cpu", "cuda"]
    assert merged["shards"][1]["timings"] == p1[0]["timings"] and merged["shards"][0]["versions"] == p0[0]["versions"]
    assert merged["shards"][0]["drafters"]["a"]["source"]["path"] == "/host0/ckpt/a"
    assert merged["timings"]["reference_s"] == 30.0  # the slower host: they ran in parallel
    assert merged["drafters"]["a"]["timings"] == {"eval_s": 20.0, "draft_s": 10.0, "anchors": 200}
    assert merged["reference"]["tokens_generated"] == 700 and merged["reference"]["tokens_per_s"] == 50.0
    assert merged["reference"]["stop_reasons"] == {"eos": 7}
    assert merged["extraction"]["tokens"] == 400 and merged["extraction"]["teacher_forced_mismatches"] == 2
    oc = merged["drafters"]["a"]["online_check"]
    assert oc["samples"] == 7 and oc["mismatched_samples"] == ["p3"] and oc["all_outputs_equal_reference"] is False
    assert merged["drafters"]["b"]["online_check"] is None


def test_mixed_kernel_paths_incomplete_shards_and_differing_extras_are_reported():
    p0, p1 = _parts()
    p1[0]["extraction"]["kernel_path"] = "fla"
    p0[0]["diagnostics"] = {"x": 1, "text": "report 0", "findings": [{"code": "layer-shift", "drafter": "a"}]}
    p1[0]["diagnostics"] = {"x": 2, "text": "report 1", "findings": []}
    p0[0]["note"] = p1[0]["note"] = "same"
    p0[0]["extra"], p1[0]["extra"] = {"x": 1}, {"x": 2}
    merged, _ = merge_shards([p0, p1])
    assert merged["extraction"]["kernel_path"] == "mixed: torch, fla"
    assert any("different linear-attention kernel paths" in w for w in merged["warnings"])
    # diagnostics describe each part's own samples: kept per part, findings tagged, texts joined for the report
    diag = merged["diagnostics"]
    assert [d["x"] for d in diag["parts"]] == [1, 2] and "text" not in diag["parts"][0]
    assert diag["findings"] == [{"code": "layer-shift", "drafter": "a", "part": "part 1 (shard 0/2)"}]
    assert diag["text"].index("report 0") < diag["text"].index("=== part 2 (shard 1/2) ===") < \
        diag["text"].index("report 1")
    # any other key that differs between the parts moves to the per-shard records
    assert "extra" not in merged and [s["extra"] for s in merged["shards"]] == [{"x": 1}, {"x": 2}]
    assert merged["note"] == "same"
    merged, samples = merge_shards([p0])
    assert len(samples) == 4 and any("merged shards [0] of 2" in w for w in merged["warnings"])


def _mutate(path, value):
    def apply(parts):
        target = parts[1][0]
        *keys, last = path
        for k in keys:
            target = target[k]
        target[last] = value
    return apply


@pytest.mark.parametrize("mutate, message", [
    (_mutate(("target", "weights_digest"), "x" * 64), "evaluated different targets"),
    (_mutate(("settings", "max_new_tokens"), 256), r"other settings .*max_new_tokens = 256 vs 512"),
    (_mutate(("settings", "prompts", "sha256"), "other"), r"other settings .*prompts"),
    (_mutate(("drafters", "b", "spec", "block_size"), 16), r"drafter 'b' has another spec .*fields block_size"),
    (_mutate(("drafters", "a", "source", "digest"), "other"), r"drafter 'a' has checkpoint digest .*different weights"),
    (_mutate(("drafters", "a", "metrics", "tree", "topk", "k"), 8), r"drafter 'a' tree metrics used"),
    (_mutate(("settings", "shard", "index"), 0), "are the same shard"),
    (_mutate(("status",), "failed"), "status 'failed'"),
    (_mutate(("schema",), "dfo.results/3"), "results schema"),
    (_mutate(("samples", "count"), 5), "announces 5 samples but its samples.jsonl holds 3"),
])
def test_incompatible_parts_are_refused(mutate, message):
    parts = _parts()
    mutate(parts)
    with pytest.raises(PayloadError, match=message):
        merge_shards(list(parts))


def test_bad_sample_lines_are_refused():
    p0, p1 = _parts()
    p1[1][0]["index"] = 0
    with pytest.raises(PayloadError, match="prompt index 0 .* is in part 2"):
        merge_shards([p0, p1])
    p0, p1 = _parts()
    del p1[1][2]["drafters"]["b"]["tree"]
    with pytest.raises(PayloadError, match=r"sample p5, drafter 'b': the results hold tree metrics"):
        merge_shards([p0, p1])
    p0, p1 = _parts()
    p1[1][0]["drafters"]["a"]["anchors"][0] += 1
    with pytest.raises(PayloadError, match=r"sample p1, drafter 'a'.*round 0"):
        merge_shards([p0, p1])
    with pytest.raises(PayloadError, match="no parts"):
        merge_shards([])


def test_controller_merge_reads_pulled_parts(tmp_path):
    from orchestrator.evaluation.merge import merge_host_results

    lines = _all_lines()
    dirs = {}
    for host, (results, samples) in zip(("ct129", "ct130"), _parts(lines), strict=False):
        d = tmp_path / host
        d.mkdir()
        (d / "results.json").write_text(json.dumps(results))
        (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
        dirs[host] = d
    jobs = {"ct129": {"job_id": "j1", "shard": [0, 2]}, "ct130": {"job_id": "j2", "shard": [1, 2]}}
    results, samples = merge_host_results(dirs, jobs)
    assert [s["host"] for s in samples] == ["ct129", "ct130"] * 3 + ["ct129"]
    assert results["hosts"]["ct130"]["job_id"] == "j2"
    assert results["drafters"]["b"]["metrics"] == _run(lines, (0, 1))["drafters"]["b"]["metrics"]
    assert [s["hosts"] for s in results["shards"]] == [["ct129"], ["ct130"]]


def test_modules_the_controller_imports_stay_free_of_torch():
    code = ("import sys; import remote_payload.metrics.aggregate, remote_payload.metrics.compare, "
            "remote_payload.metrics.tree, remote_payload.metrics.stats; "
            "bad = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_server_reference_summaries_are_merged():
    p0, p1 = _parts()
    for (res, _lines), port, bad in ((p0, 30000, ["p0"]), (p1, 30001, [])):
        res["reference"].update(source="server", server={
            "source": "server", "url": f"http://127.0.0.1:{port}/v1", "model": "qwen", "prompt_format": "ids",
            "settings": {"max_tokens": 512}, "samples": 4, "requested": 3, "cache_hits": 1, "tokens_generated": 90,
            "roundtrip_mismatches": bad, "roundtrip_unchecked": 0, "ids_source": {"server": 4}})
    merged, _ = merge_shards([p0, p1])
    ref = merged["reference"]
    assert ref["source"] == "server" and ref["tokens_generated"] == 700
    srv = ref["server"]
    assert srv["urls"] == ["http://127.0.0.1:30000/v1", "http://127.0.0.1:30001/v1"] and srv["models"] == ["qwen"]
    assert (srv["samples"], srv["requested"], srv["cache_hits"], srv["tokens_generated"]) == (8, 6, 2, 180)
    assert srv["roundtrip_mismatches"] == ["p0"] and srv["ids_source"] == {"server": 8}
    p1[0]["reference"]["source"] = "local"
    assert merge_shards([p0, p1])[0]["reference"]["source"] == "mixed: server, local"


def test_conventions_are_recomputed_from_the_records():
    lines = _all_lines()
    merged, _ = merge_shards(list(_parts(lines)))
    for n in ("a", "b"):
        got = merged["drafters"][n]["metrics"]["conventions"]
        # the same figures as computed straight from the samples' ends, not from the parts' own figures
        direct = conv.conventions([ENDS[(line["index"], n)] for line in lines], B)
        assert got == direct and all(got[c]["exact"] is True for c in conv.NAMES)
        assert got["committed"]["tau_macro"] == merged["drafters"][n]["metrics"]["tau_macro"]
    assert merged["drafters"]["b"]["metrics"]["conventions"]["zlab-2604"]["rounds"] > \
        merged["drafters"]["b"]["metrics"]["conventions"]["committed"]["rounds"]  # max_new: z-lab's extra round

    p0, p1 = _parts(lines)  # a short tail in one part: its figures are a lower bound, the merge says so
    p1[1][0]["tail_tokens"] = 1
    assert merge_shards([p0, p1])[0]["drafters"]["a"]["metrics"]["conventions"]["zlab-2604"]["exact"] is False

    p0, p1 = _parts(lines)  # unavailable in one part: unavailable in the merge, with that part's reason
    for n in ("a", "b"):
        p1[0]["drafters"][n]["metrics"]["conventions"]["zlab-2604"] = {"available": False, "reason": "server said no"}
    got = merge_shards([p0, p1])[0]["drafters"]["a"]["metrics"]["conventions"]
    assert got["zlab-2604"] == {"available": False, "reason": "part 2 (shard 1/2): server said no",
                                "definition": conv.DEFINITIONS["zlab-2604"]}
    assert got["vllm"]["available"] is False and got["committed"]["rounds"] > 0


def test_parts_of_results_schema_1_merge_with_the_april_count_under_its_dated_name():
    """Parts written before dfo.results/2 (the April count as ``zlab``, per drafter and per sample) merge to the
    same figures as current parts, under ``zlab-2604``, with ``zlab`` the alias of committed."""
    lines = _all_lines()
    want, _ = merge_shards(list(_parts(lines)))
    old = _parts(lines)
    for results, samples in old:
        results["schema"] = "dfo.results/1"
        for d in results["drafters"].values():
            block = d["metrics"]["conventions"]
            block["zlab"] = block.pop("zlab-2604")
        for line in samples:
            for entry in line["drafters"].values():
                entry["conventions"]["zlab"] = entry["conventions"].pop("zlab-2604")
    got, merged_lines = merge_shards(list(old))
    assert got["schema"] == "dfo.results/2"
    for n in ("a", "b"):
        assert got["drafters"][n]["metrics"]["conventions"] == want["drafters"][n]["metrics"]["conventions"]
    assert all(set(line["drafters"]["a"]["conventions"]) == {"zlab-2604", "vllm"} for line in merged_lines)

    p0, p1 = _parts(lines)  # a record that is not a full round, or missing, is refused naming the sample
    p1[1][0]["drafters"]["a"]["conventions"]["vllm"]["produced"][0] += 1
    with pytest.raises(PayloadError, match=r"sample p1, drafter 'a', conventions.vllm: round 0"):
        merge_shards([p0, p1])
    p0, p1 = _parts(lines)
    del p1[1][1]["drafters"]["b"]["conventions"]
    with pytest.raises(PayloadError, match=r"sample p3, drafter 'b': .*no 'conventions' record"):
        merge_shards([p0, p1])


def test_depth_and_thinking_blocks_are_recomputed_over_all_parts():
    """metrics.by_context_depth (one layout from every part's samples) and metrics.by_thinking (pairs across the
    merged lines) come from the merged sample lines, not from the parts' own blocks."""
    from remote_payload.metrics.aggregate import thinking_breakdown
    from remote_payload.metrics.depth import by_context_depth

    lines = _all_lines()
    for line in lines:  # as --enable-thinking both writes them: prompt i//2 under mode i%2
        line.update(thinking=line["index"] % 2 == 1, thinking_pair=line["index"] // 2)
    parts = []
    for results, part_lines in _parts(lines):
        for n in ("a", "b"):
            results["drafters"][n]["metrics"]["by_context_depth"] = by_context_depth(part_lines, n)
        parts.append((results, part_lines))
    merged, _ = merge_shards(parts)
    for n in ("a", "b"):
        metrics = merged["drafters"][n]["metrics"]
        assert metrics["by_context_depth"] == by_context_depth(lines, n)
        assert metrics["by_thinking"] == thinking_breakdown(lines, n)
        assert metrics["by_thinking"]["paired"]["prompts"] == N_SAMPLES // 2
        assert sum(b["rounds"] for b in metrics["by_context_depth"]["buckets"]) == metrics["rounds"]
