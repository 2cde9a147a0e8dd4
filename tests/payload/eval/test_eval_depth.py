"""Issue 6 through the real eval on the tiny fixtures: tree metrics, the drafter comparison, server references.

The eval runs in-process where only its results are examined, and as ``python -m remote_payload eval``
where the command line is the point (the endpoint path, as the controller runs it).
"""

from __future__ import annotations

import pytest
from openai_server import MODEL_NAME, Faults, OpenAIServer, load_model
from payload_helpers import MAX_NEW, drafter_copy, json_lines, prompts_file, read_results

from remote_payload.eval.offline import draft_sample, replay
from remote_payload.eval.pipeline import run_eval
from remote_payload.eval.settings import EvalSettings
from remote_payload.metrics.sample_rounds import entry_from_rounds
from remote_payload.metrics.tree import build_budgeted_tree, sample_tree_rounds, topk_depth_accepted
from remote_payload.models.checkpoint import load_drafter

# Short, varied answers; on the three math ones the sharpened drafter meets every condition of tree.py.
TREE_PROMPTS = ["code-reverse-string", "math-multiply", "math-divisors", "math-linear", "chat-sleep"]
K_TOP = BUDGET = 8  # K = budget = k: the budgeted tree is exact DDTree and can never beat top-k at an anchor


@pytest.fixture(scope="module")
def depth_run(fixture_dir, eval_cache, tmp_path_factory):
    """One eval of three drafters: the trained one, the same weights with 30× sharper logits (same top-k ids,
    a confident budgeted tree), and the random one."""
    work = tmp_path_factory.mktemp("depth")
    paths = {"ours": fixture_dir / "zlab-drafter",
             "sharp": drafter_copy(fixture_dir / "zlab-drafter", work / "sharp",
                                   config=lambda c: c["dflash_config"].update(output_multiplier=30.0)),
             "rand": fixture_dir / "random-drafter"}
    settings = EvalSettings(target=str(fixture_dir / "target"), drafters=[(n, str(p)) for n, p in paths.items()],
                            prompts=str(prompts_file(work / "prompts.jsonl", TREE_PROMPTS)), max_new_tokens=MAX_NEW,
                            dtype="float32", cache_dir=str(eval_cache), out=str(work / "run"),
                            tree_k=K_TOP, tree_budget=BUDGET)
    results = run_eval(settings)
    _, lines = read_results(work / "run")
    return results, lines, paths


def _recompute(target, name, ref, ld, feats):
    from remote_payload.models.drafter import DrafterRuntime

    rt = DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings())
    return draft_sample(rt, feats.layers, ref.tokens, len(ref.prompt_ids), topk=K_TOP)


def _per_anchor(drafts):
    """Accepted drafts at every anchor for the three replay rules, and the reach a + τ_round(a)."""
    ids, lps = drafts.topk_ids.tolist(), drafts.topk_logprobs.tolist()
    last = len(drafts.tokens) - 1
    acc = {"chain": {}, "budgeted": {}, "topk": {}}
    for i, a in enumerate(drafts.anchors):
        truth = drafts.tokens[a + 1:]
        acc["chain"][a] = topk_depth_accepted(ids[i], truth, 1)
        acc["budgeted"][a] = build_budgeted_tree(ids[i], lps[i], BUDGET, BUDGET).walk(truth)
        acc["topk"][a] = topk_depth_accepted(ids[i], truth, K_TOP)
    reach = {w: {a: a + min(n + 1, last - a) for a, n in v.items()} for w, v in acc.items()}
    return acc, reach


def test_tree_records_come_from_the_chain_draft_pass(depth_run, samples, target):
    results, lines, paths = depth_run
    assert results["settings"]["tree"] == {"k": K_TOP, "budget": BUDGET, "K": BUDGET}
    assert results["settings"]["draft_topk"] == K_TOP  # max(--topk, k, K)
    by_id = {p.id: (ref, feats) for p, ref, feats in samples}
    for name, path in paths.items():
        tree = results["drafters"][name]["metrics"]["tree"]
        assert tree["topk"]["k"] == K_TOP and "top-k depth acceptance" in tree["topk"]["definition"]
        assert (tree["budgeted"]["budget"], tree["budgeted"]["K"], tree["budgeted"]["exact"]) == (BUDGET, BUDGET, True)
        assert tree["topk"]["rounds"] == sum(len(line["drafters"][name]["tree"]["topk"]["produced"]) for line in lines)
        ld = load_drafter(path)
        for line in lines:
            ref, feats = by_id[line["id"]]
            drafts = _recompute(target, name, ref, ld, feats)
            expected = sample_tree_rounds(drafts, k=K_TOP, budget=BUDGET, K=BUDGET).entry()
            assert line["drafters"][name]["tree"] == expected, (name, line["id"])
            chain = {k: line["drafters"][name][k] for k in ("tau", "rounds", "anchors", "accepted", "produced")}
            assert chain == entry_from_rounds(replay(drafts)), (name, line["id"])


def test_chain_le_budgeted_le_topk_where_the_conditions_hold(depth_run, samples, target):
    """tree.py: at one anchor, chain ≤ top-k always and budgeted ≤ top-k since K ≤ k; per sample, W1 ≤ W2 in τ
    when W1 ≤ W2 at every anchor and one of the two reaches (a + τ_round(a)) never decreases in a."""
    _results, lines, paths = depth_run
    by_id = {p.id: (ref, feats) for p, ref, feats in samples}
    held = {("chain", "budgeted"): 0, ("budgeted", "topk"): 0, ("chain", "topk"): 0}
    for name, path in paths.items():
        ld = load_drafter(path)
        for line in lines:
            ref, feats = by_id[line["id"]]
            acc, reach = _per_anchor(_recompute(target, name, ref, ld, feats))
            anchors = sorted(acc["chain"])
            assert all(acc["chain"][a] <= acc["topk"][a] and acc["budgeted"][a] <= acc["topk"][a] for a in anchors)
            entry = line["drafters"][name]
            tau = {"chain": entry["tau"], "budgeted": entry["tree"]["budgeted"]["tau"],
                   "topk": entry["tree"]["topk"]["tau"]}
            monotone = {w: all(reach[w][a] <= reach[w][b] for a, b in zip(anchors, anchors[1:], strict=False))
                        for w in reach}
            for w1, w2 in held:
                dominated = all(acc[w1][a] <= acc[w2][a] for a in anchors)
                if dominated and (monotone[w1] or monotone[w2]):
                    held[(w1, w2)] += 1
                    assert tau[w1] <= tau[w2], (name, line["id"], w1, w2, tau)
    # every inequality was checked on real drafts at least once (chain ≤ budgeted: on the sharpened drafter,
    # confident enough that its budgeted tree holds the chain's drafts at every anchor)
    assert all(n >= 1 for n in held.values()), held


def test_tau_by_context_depth_equals_a_replay_restricted_to_each_bucket(depth_run, samples, target):
    """The zlab drafter's first layer slides over 64 positions and the samples run past it: per depth bucket, τ
    macro, τ micro and p1 equal a plain replay of the drafter's own drafts counting only the rounds anchored in the
    bucket, each with a bootstrap CI around it."""
    results, lines, paths = depth_run
    by_id = {p.id: (ref, feats) for p, ref, feats in samples}
    assert load_drafter(paths["ours"]).spec.attn[0].window == 64
    assert max(line["prompt_tokens"] + line["continuation_tokens"] for line in lines) > 64 + 32
    for name, path in paths.items():
        depth = results["drafters"][name]["metrics"]["by_context_depth"]
        assert depth["layout"] == "power-of-two"  # samples of tens to hundreds of tokens: finer than < 1k
        ld = load_drafter(path)
        replayed = []  # per sample: (anchor, accepted, produced) of a plain greedy replay
        for line in lines:
            ref, feats = by_id[line["id"]]
            acc, _ = _per_anchor(_recompute(target, name, ref, ld, feats))
            a, last, rounds = line["prompt_tokens"], len(ref.tokens) - 1, []
            while a < last:
                produced = min(acc["chain"][a] + 1, last - a)
                rounds.append((a, acc["chain"][a], produced))
                a += produced
            replayed.append(rounds)
        buckets = depth["buckets"]
        assert [b["lo"] for b in buckets[1:]] == [b["hi"] for b in buckets[:-1]]  # contiguous, every round binned
        assert sum(b["rounds"] for b in buckets) == results["drafters"][name]["metrics"]["rounds"]
        beyond_window = 0
        for b in buckets:
            inside = [[r for r in rs if b["lo"] <= r[0] < b["hi"]] for rs in replayed]
            inside = [rs for rs in inside if rs]
            assert b["samples"] == len(inside), (name, b["label"])
            if not inside:
                assert b["tau_macro"]["value"] is None
                continue
            flat = [r for rs in inside for r in rs]
            assert b["tau_macro"]["value"] == pytest.approx(sum(sum(r[2] for r in rs) / len(rs) for rs in inside)
                                                            / len(inside))
            assert b["tau_micro"]["value"] == pytest.approx(sum(r[2] for r in flat) / len(flat))
            assert b["p1"]["value"] == pytest.approx(sum(1 for r in flat if r[1] >= 1) / len(flat))
            if len(inside) >= 2:
                for key in ("tau_macro", "p1"):
                    lo, hi = b[key]["ci"]
                    assert lo <= b[key]["value"] <= hi, (name, b["label"], key)
            beyond_window += b["lo"] >= 64
        assert beyond_window >= 1, name  # buckets past the sliding window are reported


def test_comparison_block_with_two_fixture_drafters(depth_run):
    results, lines, _paths = depth_run
    comp = results["comparison"]
    assert comp["baseline"] == "ours" and comp["drafters"] == ["ours", "sharp", "rand"] and comp["confidence"] == 0.95
    pairs = {p["b"]: p for p in comp["pairs"]}
    rand = pairs["rand"]
    assert rand["samples"] == len(TREE_PROMPTS)
    # the trained drafter beats the random one, and the 95% bootstrap CI of the difference excludes 0
    assert rand["tau_macro"]["delta"] < -1.0 and rand["tau_macro"]["ci"][1] < 0
    assert rand["ddtree"]["k"] == K_TOP and rand["ddtree"]["ci"][1] < 0
    assert rand["tau_macro"]["a"] == pytest.approx(results["drafters"]["ours"]["metrics"]["tau_macro"])
    assert rand["verdict"].startswith("rand accepts less than ours")
    assert rand["per_position"][0]["delta"] < 0 and len(rand["per_position"]) == 7
    # sharper logits change no top-k id: chain and DDTree-8 identical, a zero difference with a zero-width CI
    sharp = pairs["sharp"]
    assert sharp["tau_macro"]["delta"] == 0 and sharp["tau_macro"]["ci"] == [0, 0]
    assert sharp["ddtree"]["delta"] == 0 and "no clear τ macro difference" in sharp["verdict"]
    for line in lines:  # per sample, every drafter has both tree records
        assert set(line["drafters"]) == {"ours", "sharp", "rand"}
        for entry in line["drafters"].values():
            assert entry["tree"]["topk"]["k"] == K_TOP and entry["tree"]["budgeted"]["budget"] == BUDGET
            assert sum(entry["tree"]["topk"]["produced"]) == line["continuation_tokens"] - 1


# ------------------------------------------------------------------------------------------ server references


@pytest.fixture(scope="module")
def served(fixture_dir):
    return load_model(fixture_dir / "target")


def test_eval_with_server_references_survives_a_dying_server(fixture_dir, served, samples, run_payload, tmp_path):
    """`eval --reference URL` against the loopback stand-in for SGLang: the server dies after two answers (one
    clear error, the two samples kept), a re-run against a restarted server asks only for the other two."""
    cache, out = tmp_path / "cache", tmp_path / "run"
    chosen = [p.id for p, _, _ in samples[:4]]
    args = ["eval", "--target", fixture_dir / "target", "--drafter", f"ours={fixture_dir / 'zlab-drafter'}",
            "--samples", "4", "--max-new-tokens", MAX_NEW, "--dtype", "float32", "--threads", "1",
            "--cache-dir", cache, "--out", out, "--reference-concurrency", "1", "--reference-retries", "0"]
    dying = OpenAIServer(*served, Faults(die_after=2)).start()
    try:
        first = run_payload(*args, "--reference", dying.url)
    finally:
        dying.stop()
    assert first.returncode == 2
    err = [ln for ln in first.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "Traceback" not in first.stderr, first.stderr
    assert err[0].startswith(f"dfo-payload error: reference server {dying.url}") and repr(chosen[2]) in err[0]
    assert "2 of 4 sample(s) done and cached" in err[0] and "re-run to resume" in err[0]
    assert not (out / "results.json").exists()
    stages = {r["stage"] for r in json_lines(first.stdout) if r["dfo"] == "stage"}
    assert "target" not in stages and "extract" not in stages  # failed before the target's weights loaded

    restarted = OpenAIServer(*served).start()
    try:
        second = run_payload(*args, "--reference", restarted.url)
    finally:
        restarted.stop()
    assert second.returncode == 0, second.stderr
    local = {p.id: ref for p, ref, _ in samples}
    assert restarted.answered[:2] == [local[chosen[2]].prompt_ids, local[chosen[3]].prompt_ids]
    # then one tail request per sample (prompt + continuation): the tokens past the stop, for zlab-2604/vllm τ
    assert restarted.answered[2:] == [local[i].tokens for i in chosen]
    records = json_lines(second.stdout)
    order = [r["stage"] for r in records if r["dfo"] == "stage" and r["status"] == "start"]
    assert order[:4] == ["load", "reference", "target", "extract"]  # references before the target's weights
    results, lines = read_results(out)
    ref = results["reference"]
    assert ref["source"] == "server" and results["settings"]["reference"]["source"] == "server"
    assert ref["cache_hits"] == 2 and ref["server"]["requested"] == 2 and ref["server"]["model"] == MODEL_NAME
    assert ref["server"]["url"] == restarted.url and ref["server"]["roundtrip_mismatches"] == []
    assert [line["reference"]["cached"] for line in lines] == [True, True, False, False]
    for line in lines:  # the server's greedy continuation is the target's own: the same tokens as local decoding
        assert line["reference"]["source"] == "server" and line["reference"]["roundtrip"]["ok"] is True
        want = local[line["id"]]
        assert (line["prompt_tokens"], line["continuation_tokens"]) == (len(want.prompt_ids), len(want.continuation))
        assert line["stop_reason"] == want.stop_reason and line["teacher_forced_mismatches"] == 0
    assert results["drafters"]["ours"]["metrics"]["tau_macro"] > 2
    conventions = results["drafters"]["ours"]["metrics"]["conventions"]
    assert conventions["zlab-2604"]["exact"] is True and conventions["vllm"]["tau_micro"] >= conventions["committed"][
        "tau_micro"]
    assert all(line["tail_tokens"] == 7 and set(line["drafters"]["ours"]["conventions"]) == {"zlab-2604", "vllm"}
               for line in lines)
    assert "warnings" not in results


def test_eval_with_a_server_that_cannot_continue_past_the_stop(fixture_dir, served, tmp_path):
    """A --reference server that refuses the tail request: the eval completes, zlab-2604/vllm say why they are
    unavailable (a warning too), committed τ is as always."""
    server = OpenAIServer(*served, Faults(reject_ignore_eos=True)).start()
    try:
        settings = EvalSettings(target=str(fixture_dir / "target"),
                                drafters=[("ours", str(fixture_dir / "zlab-drafter"))], samples=2,
                                max_new_tokens=MAX_NEW, dtype="float32", cache_dir=str(tmp_path / "cache"),
                                out=str(tmp_path / "run"), reference_url=server.url, reference_retries=0)
        results = run_eval(settings)
    finally:
        server.stop()
    conventions = results["drafters"]["ours"]["metrics"]["conventions"]
    for name in ("zlab-2604", "vllm"):
        assert conventions[name]["available"] is False and "ignore_eos" in conventions[name]["reason"]
    assert conventions["committed"]["tau_macro"] == results["drafters"]["ours"]["metrics"]["tau_macro"] > 2
    assert any(w.startswith("zlab-2604 and vllm τ conventions unavailable") for w in results["warnings"])
    _, lines = read_results(tmp_path / "run")
    assert all(line["tail_tokens"] is None and "conventions" not in line["drafters"]["ours"] for line in lines)
