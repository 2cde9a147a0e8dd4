"""The engine agreement rule (metrics.engine_agreement) on real rounds of the engine fixture, no engine needed.

The "engine" side is dfo's own offline replay, changed the two ways the rule must tell apart:

- near-tie flips of the real drafter: one draft of a round swapped (the round accepts one fewer, or one
  more where the next drafts are right), and the rest of that sample re-anchored on the drafter's own drafts,
  which is what a flip in the engine's implementation does. They must be accepted.
- real faults: the same drafter with its target layer ids off by one (one of them or all) or another mask
  token id. They must be rejected.

At the sizes the engine tests and the demo use (12 and 6 prompts x MAX_NEW tokens), and at issue 26's
(4 prompts x 64 tokens, ~45 rounds: the e2e eval's size then).
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
from conftest import MAX_NEW, TIMINGS

from remote_payload.metrics.chain import accepted_prefix
from remote_payload.metrics.engine_agreement import compare, sample_counts

SIZES = {"4x64": (4, 64), "demo 6x96": (6, MAX_NEW), "engine tests 12x96": (12, MAX_NEW)}


@pytest.fixture(scope="module")
def prompt_ids(target_model):
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.models.target import render_prompt

    return [render_prompt(target_model.tokenizer, p.message_dicts(), False) for p in load_prompts("builtin")[0]]


@pytest.fixture(scope="module")
def references(target_model, prompt_ids):
    from remote_payload.inputs.reference import greedy_decode

    return {size: [greedy_decode(target_model, ids, max_new) for ids in prompt_ids[:n]]
            for size, (n, max_new) in SIZES.items()}


@pytest.fixture(scope="module")
def drafts_for(engine_fixtures, target_model, prompt_ids, references):
    """(size, drafter folder, dtype) -> the drafter's drafts at every anchor of each reference (offline)."""
    import torch

    from remote_payload.eval.offline import draft_sample
    from remote_payload.inputs.features import extract
    from remote_payload.models.checkpoint import load_drafter
    from remote_payload.models.drafter import DrafterRuntime

    made: dict = {}

    def make(size, folder=None, dtype=torch.float32):
        key = (size, folder, dtype)
        if key not in made:
            made[key] = drafted(size, folder, dtype)
        return made[key]

    def drafted(size, folder, dtype):
        ld = load_drafter(folder or engine_fixtures / "zlab-drafter")
        rt = DrafterRuntime(ld, target_model.model.get_input_embeddings(),
                            target_model.model.get_output_embeddings(), dtype=dtype)
        out = []
        for ids, ref in zip(prompt_ids, references[size], strict=False):
            feats = extract(target_model, ref.tokens, ld.spec.fc_layer_ids, len(ids), with_argmax=False)
            out.append(draft_sample(rt, feats.layers, ref.tokens, len(ids)))
        return ld.spec.block_size - 1, out

    return make


@pytest.fixture(scope="module")
def faulted(engine_fixtures, tmp_path_factory):
    """The z-lab drafter folder with one thing in its dflash_config changed (name -> folder)."""
    def copy(name, edit):
        dst = tmp_path_factory.mktemp(name) / "drafter"
        shutil.copytree(engine_fixtures / "zlab-drafter", dst)
        cfg = json.loads((dst / "config.json").read_text())
        edit(cfg["dflash_config"])
        (dst / "config.json").write_text(json.dumps(cfg))
        return dst

    def shift(by):
        return lambda c: c.update(target_layer_ids=[i + by for i in c["target_layer_ids"]])

    return {
        "layer ids +1": copy("layers-plus-1", shift(1)),
        "layer ids -1": copy("layers-minus-1", shift(-1)),
        "last layer id +1": copy("last-layer-plus-1",
                                 lambda c: c.update(target_layer_ids=[*c["target_layer_ids"][:-1],
                                                                      c["target_layer_ids"][-1] + 1])),
        "mask id -1": copy("mask-minus-1", lambda c: c.update(mask_token_id=c["mask_token_id"] - 1)),
    }


def chain(drafts, flips=frozenset()) -> list[int]:
    """Accepted drafts per round of the greedy chain replay; in the rounds numbered in ``flips`` one draft
    flips (even rounds lose their last accepted draft, odd ones gain the first rejected one; either way where
    possible), and every later round is anchored where that leaves it, on the drafter's own drafts."""
    out, anchor, last = [], drafts.prompt_len, len(drafts.tokens) - 1
    while anchor < last:
        remaining = last - anchor
        drafted, truth = list(drafts.top1(anchor)), drafts.tokens[anchor + 1:anchor + 1 + remaining]
        accepted = accepted_prefix(drafted, truth)
        if len(out) in flips:
            gain = len(out) % 2 == 1 and accepted < min(len(drafted), remaining - 1)
            if gain:  # the first rejected draft flips to the right token; DFlash drafts a block at once
                accepted += 1 + accepted_prefix(drafted[accepted + 1:], truth[accepted + 1:])
            elif accepted:
                accepted -= 1
        out.append(accepted)
        anchor += min(accepted + 1, remaining)
    return out


def _compare(engine_rounds, offline_rounds, positions) -> dict:
    return compare([str(i) for i in range(len(offline_rounds))], [sample_counts(r, positions) for r in engine_rounds],
                   offline_rounds, positions)


def _ratio(out: dict) -> float:
    """The largest |difference| / bound over the figures tested (on the differing rounds); 0 when none differ."""
    figs = [out["tau_micro"], *out["per_position"]]
    return max((abs(f["differing"]["diff"]) / f["differing"]["bound"] for f in figs if f["differing"]), default=0.0)


@pytest.mark.parametrize("size", SIZES)
def test_near_tie_flips_of_the_real_drafter_are_accepted(size, drafts_for):
    positions, drafts = drafts_for(size)
    base = [chain(d) for d in drafts]
    assert sum(sum(r) for r in base) > sum(map(len, base)) * 0.3, "the fixture drafter must really accept"
    worst = 0.0
    for s, rounds in enumerate(base):  # one flip, at every round of every sample
        for i in range(len(rounds)):
            out = _compare([chain(d, frozenset({i}) if j == s else frozenset()) for j, d in enumerate(drafts)],
                           base, positions)
            assert out["within_tolerance"], (s, i, out["problems"])
            worst = max(worst, _ratio(out))
    rng = random.Random(26)
    n_rounds = sum(map(len, base))
    for k in (2, 4, max(4, n_rounds // 8)):  # k flips anywhere, up to one round in eight
        for _ in range(40):
            flips: list[set[int]] = [set() for _ in base]
            for _ in range(k):
                s = rng.randrange(len(base))
                flips[s].add(rng.randrange(len(base[s])))
            out = _compare([chain(d, frozenset(f)) for d, f in zip(drafts, flips, strict=True)], base, positions)
            assert out["within_tolerance"], (k, out["problems"])
            worst = max(worst, _ratio(out))
    TIMINGS[f"flips {size} ({n_rounds} rounds): largest |diff|/bound"] = f"{worst:.2f}"


@pytest.mark.parametrize("size", SIZES)
def test_real_faults_are_rejected(size, drafts_for, faulted):
    positions, drafts = drafts_for(size)
    base = [chain(d) for d in drafts]
    seen = {}
    for name, folder in faulted.items():
        _, wrong = drafts_for(size, folder)
        out = _compare([chain(d) for d in wrong], base, positions)
        assert not out["within_tolerance"], (name, out["tau_micro"])
        assert any(p.startswith("τ micro ") for p in out["problems"]), (name, out["problems"])
        seen[name] = f"{out['engine']['tau_micro']:.2f} vs {out['offline']['tau_micro']:.2f} " \
                     f"±{out['tau_micro']['bound']:.2f}"
    TIMINGS[f"faults {size}: τ micro"] = json.dumps(seen, ensure_ascii=False)


@pytest.mark.parametrize("size", SIZES)
def test_the_same_drafter_in_bfloat16_agrees(size, drafts_for):
    """Another numeric path of the same drafter (what the engine's implementation is): within tolerance."""
    import torch

    positions, drafts = drafts_for(size)
    _, bf16 = drafts_for(size, dtype=torch.bfloat16)
    out = _compare([chain(d) for d in bf16], [chain(d) for d in drafts], positions)
    assert out["within_tolerance"], out["problems"]
    TIMINGS[f"bf16 drafter {size}: identical samples"] = f"{out['samples']['identical']}/{out['samples']['compared']}"
