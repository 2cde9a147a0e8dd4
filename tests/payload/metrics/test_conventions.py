"""τ conventions (remote_payload/metrics/conventions.py): hand-built rounds, zlab-2604 == an online loop of z-lab's
April 2026 rules, zlab == committed (z-lab's loop since August 2026), and old results read under the dated name.

The online loop here is written independently of the offline path: the target re-runs over the whole
committed sequence every round (no cache, no rollback), verifies the drafted block, accepts the longest
agreeing prefix, and follows z-lab's April 2026 loop rules (``while anchor < prompt + max_new``; stop after a
round that committed an end token; every accepted draft counted). Its rounds must equal the ``zlab-2604``
convention computed offline from one target pass and one batched draft pass, round by round.
"""

from __future__ import annotations

import pytest

from remote_payload.metrics import conventions as cv
from remote_payload.metrics import migrate

# ------------------------------------------------------------------------------------------ hand-built


def _sample(tokens, prompt_len, kept, max_new, drafts, stops=(0,)):
    return cv.SampleEnd(tokens=tokens, prompt_len=prompt_len, kept=kept, max_new=max_new,
                        stop_ids=frozenset(stops), drafts_at=lambda a: drafts[a])


# B = 4 (3 drafts per round). S1 stops on the end token 0; its round accepts one draft past it.
S1 = _sample([9, 9, 1, 2, 0, 5, 6, 7], 2, 5, 10, {2: [2, 0, 5], 3: [0, 5, 6], 4: [5, 6, 7]})
# S2 stops at max_new = 3; z-lab runs one more round anchored at the last kept token.
S2 = _sample([9, 1, 2, 3, 4, 5, 6], 1, 4, 3, {1: [2, 8, 8], 2: [3, 4, 5], 3: [4, 5, 8]})


def test_rounds_per_convention():
    assert [(r.anchor, r.accepted, r.produced) for r in cv.committed_rounds(S1)] == [(2, 2, 2)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.vllm_rounds(S1, 4)] == [(2, 3, 4)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_2604_rounds(S1, 4)] == [(2, 3, 4)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.committed_rounds(S2)] == [(1, 1, 2)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.vllm_rounds(S2, 4)] == [(1, 1, 2)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_2604_rounds(S2, 4)] == [(1, 1, 2), (3, 2, 3)]


def test_summaries_per_convention():
    got = cv.conventions([S1, S2], 4)
    c, z, v = got["committed"], got["zlab-2604"], got["vllm"]
    assert (c["tau_macro"], c["tau_micro"], c["rounds"]) == (2.0, 2.0, 2)
    assert (z["tau_macro"], z["tau_micro"], z["rounds"]) == ((4 + 2.5) / 2, 3.0, 3)
    assert (v["tau_macro"], v["tau_micro"], v["rounds"]) == (3.0, 3.0, 2)
    assert [(p["accepted_ge_k"], p["eligible"]) for p in c["per_position"]] == [(2, 2), (1, 2), (0, 0)]
    assert c["per_position"][2]["p"] is None  # no round had 3 tokens left to verify
    assert [(p["accepted_ge_k"], p["eligible"]) for p in v["per_position"]] == [(2, 2), (1, 2), (1, 2)]
    assert [(p["accepted_ge_k"], p["eligible"]) for p in z["per_position"]] == [(3, 3), (2, 3), (1, 3)]
    assert all(got[n]["definition"] for n in cv.NAMES)
    assert got["zlab"] == {"alias_of": "committed", "definition": cv.DEFINITIONS["zlab"]}  # not a second count


def test_zlab_is_committed_and_zlab_2604_counts_past_the_end_token():
    """S1, a short response whose end token falls mid-block: z-lab's current loop (zlab) records what the round
    produced, cut after the end token (2 tokens: τ 2), which is committed; its April loop (zlab-2604) counted
    the round's drafts accepted past the end token too (τ 4). Twice the figure on a one-round response."""
    got = cv.conventions([S1], 4)
    assert cv.resolve(got, "zlab") is got["committed"] and cv.resolve(got, "zlab")["tau_macro"] == 2.0
    assert got["zlab-2604"]["tau_macro"] == 4.0
    assert "since August 2026" in cv.DEFINITIONS["zlab"] and "April 2026" in cv.DEFINITIONS["zlab-2604"]


def test_an_old_results_block_reads_the_april_count_under_its_dated_name():
    """dfo.results/1 wrote the April count as ``zlab`` (per drafter, per sample, per dataset, sampled figures and
    the online check): read on, each is under ``zlab-2604`` and ``zlab`` is the alias; new files pass unchanged."""
    old_block = {"committed": {"tau_macro": 2.0}, "zlab": {"tau_macro": 4.0, "definition": "z-lab's loop"},
                 "vllm": {"tau_macro": 3.0}}
    results = {"schema": "dfo.results/1", "drafters": {"d": {
        "metrics": {"conventions": old_block, "sampled": {"zlab_tau_macro": {"value": 4.0}},
                    "by_dataset": {"gsm8k": {"zlab_tau_macro": {"value": 4.0},
                                             "by_category": {"algebra": {"zlab_tau_macro": {"value": 4.5}}}}}},
        "online_check": {"agreement": {"committed": {}, "zlab": {"agree": True}}}}}}
    got = migrate.results(results)
    m = got["drafters"]["d"]["metrics"]
    assert m["conventions"]["zlab-2604"]["tau_macro"] == 4.0
    assert cv.resolve(m["conventions"], "zlab")["tau_macro"] == 2.0
    assert m["conventions"]["zlab-2604"]["definition"] == cv.DEFINITIONS["zlab-2604"]
    assert m["sampled"] == {"zlab_2604_tau_macro": {"value": 4.0}}
    assert m["by_dataset"]["gsm8k"]["zlab_2604_tau_macro"]["value"] == 4.0
    assert m["by_dataset"]["gsm8k"]["by_category"]["algebra"] == {"zlab_2604_tau_macro": {"value": 4.5}}
    assert set(got["drafters"]["d"]["online_check"]["agreement"]) == {"committed", "zlab-2604"}
    assert (got["schema"], got["migrated_from"]) == ("dfo.results/2", "dfo.results/1")
    line = migrate.sample_line({"drafters": {"d": {"conventions": {"zlab": {"produced": [4]}, "vllm": {}},
                                                   "online": {"tau": 2.0, "zlab_tau": 4.0}}}})
    assert line["drafters"]["d"] == {"conventions": {"zlab-2604": {"produced": [4]}, "vllm": {}},
                                     "online": {"tau": 2.0, "zlab_2604_tau": 4.0}}
    new = {"schema": "dfo.results/2", "drafters": {"d": {"metrics": {"conventions": cv.conventions([S1], 4)}}}}
    assert migrate.results(json_copy(new)) == new  # the current layout is left as it is


def test_end_token_first_and_mid_output():
    # The first token is the end token: no committed round, but z-lab's loop runs one before checking.
    first = _sample([9, 0, 3, 4, 5], 1, 2, 8, {1: [3, 4, 7]})
    assert cv.committed_rounds(first) == [] and cv.vllm_rounds(first, 4) == []
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_2604_rounds(first, 4)] == [(1, 2, 3)]
    assert cv.conventions([first], 4)["committed"]["tau_macro"] is None
    # Rounds before the last agree in every convention; a round ending exactly on the end token too.
    exact = _sample([9, 1, 2, 3, 0, 6, 6], 1, 5, 8, {1: [2, 7, 7], 3: [0, 6, 6]})
    assert [(r.accepted, r.produced) for r in cv.committed_rounds(exact)] == [(1, 2), (1, 1)]
    assert [(r.accepted, r.produced) for r in cv.zlab_2604_rounds(exact, 4)] == [(1, 2), (3, 4)]
    assert [(r.accepted, r.produced) for r in cv.vllm_rounds(exact, 4)] == [(1, 2), (3, 4)]


def test_zlab_2604_equals_committed_when_nothing_is_accepted_past_the_end():
    s = _sample([9, 1, 2, 0, 8, 8, 8], 1, 4, 10, {1: [2, 0, 7], 2: [0, 7, 7], 3: [7, 7, 7]})
    assert [(r.accepted, r.produced) for r in cv.zlab_2604_rounds(s, 4)] == [(2, 3)]
    assert [(r.accepted, r.produced) for r in cv.committed_rounds(s)] == [(2, 2)]  # capped: 2 tokens left


def json_copy(doc: dict) -> dict:
    import json
    return json.loads(json.dumps(doc))


# ------------------------------------------------------------------------------------------ fixtures

# The demo's settings: its six prompts, 96 new tokens; three answers stop on their end token, three at max_new.
ZLAB_SAMPLES, ZLAB_MAX_NEW = 6, 96


@pytest.mark.slow
def test_zlab_2604_convention_equals_online_april_loop(fixture_dir, eval_cache, tmp_path, target, loaded, runtime_for):
    """On the payload fixtures (fp32): the eval's ``zlab-2604`` rounds == z-lab's April loop run online, round by
    round.

    The eval's own stages produce the references with their tails, the features and the per-sample records;
    the online loop (``online_generate(rule="zlab-2604")``) drafts and verifies for real with the same drafter.
    """
    from remote_payload.eval import stages
    from remote_payload.eval.context import EvalContext
    from remote_payload.eval.drafters import evaluate_drafter
    from remote_payload.eval.online import online_generate
    from remote_payload.eval.settings import EvalSettings
    from remote_payload.inputs.prompts import load_prompts

    settings = EvalSettings(target=str(fixture_dir / "target"), drafters=[("d", str(fixture_dir / "zlab-drafter"))],
                            max_new_tokens=ZLAB_MAX_NEW, device="cpu", dtype="float32", cache_dir=str(eval_cache),
                            out=str(tmp_path / "out"))
    ctx = EvalContext(settings=settings)
    stages.start(ctx)
    ctx.target, ctx.tokenizer, ctx.target_config = target, target.tokenizer, target.config
    ctx.drafters = {"d": loaded["zlab"]}
    ctx.prompts = load_prompts("builtin")[0][:ZLAB_SAMPLES]
    stages.local_references(ctx)
    stages.extract_features(ctx)
    run = evaluate_drafter(ctx, "d")
    rt = runtime_for(loaded["zlab"])
    B = rt.block_size
    assert all(len(ref.tail) == B - 1 for ref in ctx.references.refs)
    assert {ref.stop_reason for ref in ctx.references.refs} == {"eos", "max_new_tokens"}
    past_end = 0
    for p, ref, rec in zip(ctx.prompts, ctx.references.refs, run.conventions, strict=True):
        online = online_generate(target, rt, ref.prompt_ids, ZLAB_MAX_NEW, rule="zlab-2604")
        assert online.continuation == ref.continuation, p.id  # the online loop reproduces greedy decoding
        assert rec["zlab-2604"] == {"accepted": [r.accepted for r in online.rounds],
                               "produced": [r.produced for r in online.rounds]}, p.id
        past_end += 1 + sum(r.produced for r in online.rounds) > len(ref.continuation)  # z-lab counted past it
    z, c = run.summary["metrics"]["conventions"]["zlab-2604"], run.summary["metrics"]["conventions"]["committed"]
    assert z["exact"] is True and z["rounds"] >= c["rounds"] and z["tau_micro"] >= c["tau_micro"]
    assert c["tau_macro"] == run.summary["metrics"]["tau_macro"]  # committed is the chain figure
    zlab = cv.resolve(run.summary["metrics"]["conventions"], "zlab")
    assert zlab is c and zlab["tau_macro"] == run.summary["metrics"]["tau_macro"]  # a new run's zlab is committed
    assert past_end > 0  # the fixtures do reach past the stop, so the check is not vacuous


def test_reference_tail_is_cached_beside_an_old_entry(target, samples, tmp_path):
    """The tail past the stop: the target's greedy tokens, end tokens not stopped on; an existing reference
    cache entry without it is reused (continuation unchanged) and gains it; a shorter tail is its prefix."""
    import json

    from remote_payload.inputs.reference import _greedy, cached_reference

    _, ref, _ = min(samples, key=lambda s: len(s[1].continuation))
    prompt, max_new = ref.prompt_ids, 12  # cut at max_new: the tail continues the same greedy decoding
    old = cached_reference(target, prompt, max_new, tmp_path)
    (path,) = (tmp_path / "references").glob("*.json")
    assert old.tail is None and "tail" not in json.loads(path.read_text())
    again = cached_reference(target, prompt, max_new, tmp_path, tail=5)
    assert again.cached and again.continuation == old.continuation == ref.continuation[:max_new]
    assert again.tail == ref.continuation[max_new:max_new + 5]  # greedy decoding, just further
    assert json.loads(path.read_text())["tail"] == again.tail
    stamp = path.stat().st_mtime_ns
    assert cached_reference(target, prompt, max_new, tmp_path, tail=3).tail == again.tail[:3]
    assert path.stat().st_mtime_ns == stamp  # served from the cache, not decoded again
    # past an end token: the tail does not stop there (z-lab's loop verifies drafts past it)
    eos = cached_reference(target, prompt, 160, tmp_path, tail=6)
    assert eos.stop_reason == "eos" and len(eos.tail) == 6
    assert eos.tail == _greedy(target, eos.tokens, 6, set())


class _FixedDrafts:
    """A drafter stand-in for the draft pass: every block drafts the same tokens (no model needed)."""

    def prepare(self, features):
        return None

    def draft(self, ctx, tokens, anchors, topk=1):
        import torch

        ids = torch.tensor([[[3], [4], [7]] for _ in anchors], dtype=torch.long).reshape(len(anchors), 3, 1)
        return ids, torch.zeros(ids.shape)


@pytest.mark.parametrize("stop_reason", ["stop", "max_new_tokens"])
def test_an_answer_of_the_stop_token_alone_is_a_sample_in_every_convention(stop_reason):
    """The answer is the end token alone (a one-token continuation, e.g. a thinking-mode target that stops at
    once): the draft pass drafts from that token, the zlab-2604 round anchored there is counted, and committed
    and vllm have no round (the sample leaves their τ macro) — no convention fails after the references."""
    from remote_payload.eval.offline import draft_sample

    tokens, prompt_len = [9, 0], 1  # prompt [9], answer [0] (the end token)
    assert cv.anchors_at_last_token(len(tokens) - prompt_len, stop_reason)
    drafts = draft_sample(_FixedDrafts(), {}, tokens, prompt_len, topk=1,
                          end=cv.anchors_at_last_token(len(tokens) - prompt_len, stop_reason))
    end = cv.SampleEnd(tokens=tokens + [3, 4, 5], prompt_len=prompt_len, kept=len(tokens), max_new=8,
                       stop_ids=frozenset({0}), drafts_at=drafts.top1)
    assert cv.committed_rounds(end) == [] and cv.vllm_rounds(end, 4) == []
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_2604_rounds(end, 4)] == [(1, 2, 3)]
    got = cv.conventions([end, S1], 4)
    assert got["committed"]["tau_macro"] == 2.0 and got["zlab-2604"]["rounds"] == 2  # S1's one round, and this one
    assert cv.record(cv.vllm_rounds(end, 4)) is not None
    # a longer answer that ends on the end token needs no draft from it
    assert not cv.anchors_at_last_token(5, "stop")
