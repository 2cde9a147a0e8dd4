"""The ``longctx`` dataset: prompts built to a chosen depth exactly, in the fixture target's tokens, under either
thinking mode, deterministically."""

from __future__ import annotations

import json

import pytest

from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets.load import load_one
from remote_payload.inputs.datasets.longctx import fit
from remote_payload.inputs.datasets.registry import parse_spec
from remote_payload.models.target import render_prompt


def test_longctx_prompts_reach_each_depth_exactly_in_both_modes(target):
    tok = target.tokenizer
    prompts, record = load_one(parse_spec("longctx:300,1k,3000@2"), None)
    assert record["depths"] == [300, 1024, 3000] and len(prompts) == 6
    assert [p.category for p in prompts[::2]] == ["300", "1k", "3000"]
    for p in prompts:
        for mode in (False, True):
            built = fit(p, lambda m, mode=mode: render_prompt(tok, m, mode))
            ids = render_prompt(tok, built.message_dicts(), mode)
            assert len(ids) == p.depth, (p.id, mode)
            assert built.messages[-1][1].endswith(p.messages[-1][1])  # the row's question comes last
    assert fit(prompts[-1], lambda m: render_prompt(tok, m, False)) == fit(
        prompts[-1], lambda m: render_prompt(tok, m, False))  # deterministic


def test_a_users_file_and_a_depth_below_the_question_are_handled(target, tmp_path):
    src = tmp_path / "long.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": f"Question number {i}: what is {i} plus {i}?"})
                             for i in range(4)) + "\n")
    (p,), _ = load_one(parse_spec("longctx:600@1"), str(src))
    built = fit(p, lambda m: render_prompt(target.tokenizer, m, False))
    assert len(render_prompt(target.tokenizer, built.message_dicts(), False)) == 600
    (short,), _ = load_one(parse_spec("longctx:16@1"), str(src))
    with pytest.raises(PayloadError, match="longer than the depth 16"):
        fit(short, lambda m: render_prompt(target.tokenizer, m, False))


def test_depth_values_are_checked():
    with pytest.raises(PayloadError, match="not a token count"):
        parse_spec("longctx:4q")
    with pytest.raises(PayloadError, match="given twice"):
        parse_spec("longctx:4k,4096")
    assert parse_spec("longctx@4k,16k").depths == (4096, 16384) and parse_spec("longctx@4").count == 4


def test_humanevals_rows_from_the_datasets_extra_make_a_longctx_source(target):
    from remote_payload.inputs.datasets.registry import ADAPTERS, package_source

    path, _ = package_source(ADAPTERS["humaneval"])
    prompts, record = load_one(parse_spec("longctx:2k@2"), str(path))
    assert [p.id.split("@")[0] for p in prompts] == [f"longctx/{r}" for r in record["row_ids"]]
    for p in prompts:
        built = fit(p, lambda m: render_prompt(target.tokenizer, m, True))
        assert len(render_prompt(target.tokenizer, built.message_dicts(), True)) == 2048
        assert "def " in built.messages[-1][1]  # the context is code from the other problems
