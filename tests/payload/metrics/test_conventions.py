"""τ conventions (remote_payload/metrics/conventions.py): hand-built rounds, and zlab == an online z-lab loop.

The online loop here is written independently of the offline path: the target re-runs over the whole
committed sequence every round (no cache, no rollback), verifies the drafted block, accepts the longest
agreeing prefix, and follows z-lab's own loop rules (``while anchor < prompt + max_new``; stop after a
round that committed an end token; every accepted draft counted). Its rounds must equal the ``zlab``
convention computed offline from one target pass and one batched draft pass, round by round.
"""

from __future__ import annotations

import pytest

from remote_payload.metrics import conventions as cv

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
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_rounds(S1, 4)] == [(2, 3, 4)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.committed_rounds(S2)] == [(1, 1, 2)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.vllm_rounds(S2, 4)] == [(1, 1, 2)]
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_rounds(S2, 4)] == [(1, 1, 2), (3, 2, 3)]


def test_summaries_per_convention():
    got = cv.conventions([S1, S2], 4)
    c, z, v = got["committed"], got["zlab"], got["vllm"]
    assert (c["tau_macro"], c["tau_micro"], c["rounds"]) == (2.0, 2.0, 2)
    assert (z["tau_macro"], z["tau_micro"], z["rounds"]) == ((4 + 2.5) / 2, 3.0, 3)
    assert (v["tau_macro"], v["tau_micro"], v["rounds"]) == (3.0, 3.0, 2)
    assert [(p["accepted_ge_k"], p["eligible"]) for p in c["per_position"]] == [(2, 2), (1, 2), (0, 0)]
    assert c["per_position"][2]["p"] is None  # no round had 3 tokens left to verify
    assert [(p["accepted_ge_k"], p["eligible"]) for p in v["per_position"]] == [(2, 2), (1, 2), (1, 2)]
    assert [(p["accepted_ge_k"], p["eligible"]) for p in z["per_position"]] == [(3, 3), (2, 3), (1, 3)]
    assert all(got[n]["definition"] for n in cv.NAMES)


def test_end_token_first_and_mid_output():
    # The first token is the end token: no committed round, but z-lab's loop runs one before checking.
    first = _sample([9, 0, 3, 4, 5], 1, 2, 8, {1: [3, 4, 7]})
    assert cv.committed_rounds(first) == [] and cv.vllm_rounds(first, 4) == []
    assert [(r.anchor, r.accepted, r.produced) for r in cv.zlab_rounds(first, 4)] == [(1, 2, 3)]
    assert cv.conventions([first], 4)["committed"]["tau_macro"] is None
    # Rounds before the last agree in every convention; a round ending exactly on the end token too.
    exact = _sample([9, 1, 2, 3, 0, 6, 6], 1, 5, 8, {1: [2, 7, 7], 3: [0, 6, 6]})
    assert [(r.accepted, r.produced) for r in cv.committed_rounds(exact)] == [(1, 2), (1, 1)]
    assert [(r.accepted, r.produced) for r in cv.zlab_rounds(exact, 4)] == [(1, 2), (3, 4)]
    assert [(r.accepted, r.produced) for r in cv.vllm_rounds(exact, 4)] == [(1, 2), (3, 4)]


def test_zlab_equals_committed_when_nothing_is_accepted_past_the_end():
    s = _sample([9, 1, 2, 0, 8, 8, 8], 1, 4, 10, {1: [2, 0, 7], 2: [0, 7, 7], 3: [7, 7, 7]})
    assert [(r.accepted, r.produced) for r in cv.zlab_rounds(s, 4)] == [(2, 3)]
    assert [(r.accepted, r.produced) for r in cv.committed_rounds(s)] == [(2, 2)]  # capped: 2 tokens left


# ------------------------------------------------------------------------------------------ fixtures


def _greedy_ext(target, tokens, n):
    """n more greedy tokens of the target after ``tokens`` (end tokens ignored), full recompute."""
    import torch

    out = list(tokens)
    with torch.inference_mode():
        for _ in range(n):
            out.append(int(target.model(input_ids=torch.tensor([out])).logits[0, -1].argmax()))
    return out


def _online_zlab(target, runtime, layer_ids, prompt, max_new):
    """z-lab's dflash_generate rules, online: list of (anchor, accepted) and the kept output."""
    import torch

    from remote_payload.inputs.features import extract

    B, stops = runtime.block_size, set(target.stop_ids)
    seq = _greedy_ext(target, prompt, 1)  # prefill: the first token
    P, rounds = len(prompt), []
    with torch.inference_mode():
        while len(seq) - 1 < P + max_new:
            a = len(seq) - 1
            feats = extract(target, seq, layer_ids, P, with_argmax=False).layers
            drafts = runtime.draft(runtime.prepare(feats), seq, [a], topk=1)[0][0, :, 0].tolist()
            block = seq + drafts
            post = target.model(input_ids=torch.tensor([block])).logits[0, a:].argmax(-1).tolist()
            acc = 0
            while acc < B - 1 and drafts[acc] == post[acc]:
                acc += 1
            seq = seq + drafts[:acc] + [post[acc]]
            rounds.append((a, acc))
            if any(t in stops for t in seq[P:]):
                break
    kept = seq[P:P + max_new]
    end = next((i for i, t in enumerate(kept) if t in stops), None)
    return rounds, kept if end is None else kept[:end + 1]


@pytest.mark.slow
def test_zlab_convention_equals_online_zlab_loop(target, loaded, runtime_for, samples):
    """On the payload fixtures (fp32): offline ``zlab`` rounds == the online z-lab loop, round by round."""
    from remote_payload.eval.offline import draft_sample
    from remote_payload.inputs.features import extract

    rt = runtime_for(loaded["zlab"])
    B, layer_ids = rt.block_size, loaded["zlab"].spec.fc_layer_ids
    by_length = sorted(samples, key=lambda s: len(s[1].continuation))
    # the three shortest stop on their end token; two others are cut at max_new
    cases = [(s, len(s[1].continuation) + 8) for s in by_length[:3]] + [(s, 32) for s in by_length[-2:]]
    ends = set()
    for (p, ref, _), max_new in cases:
        prompt = ref.prompt_ids
        kept_cont = ref.continuation[:max_new]
        stop = "eos" if kept_cont and kept_cont[-1] in target.stop_ids else "max_new_tokens"
        ends.add(stop)
        kept = len(prompt) + len(kept_cont)
        tokens = _greedy_ext(target, prompt + kept_cont, B - 1)
        feats = extract(target, tokens, layer_ids, len(prompt), with_argmax=False).layers
        drafts = draft_sample(rt, feats, tokens, len(prompt))
        s = cv.SampleEnd(tokens, len(prompt), kept, max_new, frozenset(target.stop_ids), drafts.top1)
        offline = [(r.anchor, r.accepted) for r in cv.zlab_rounds(s, B)]
        online, output = _online_zlab(target, rt, layer_ids, prompt, max_new)
        assert output == kept_cont, p.id  # the online loop reproduces greedy decoding
        assert offline == online, p.id
    assert ends == {"eos", "max_new_tokens"}
