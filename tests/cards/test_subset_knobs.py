"""The subset knobs' choices (pure): which reruns --explain makes for a card and a run (the sampling values cards
publish at, the other dtype, the drafter's own template), what the plan says they cost, the drafter's template
and a quantized checkpoint read from their metadata, and a quantization fact in the ranking and the sentence."""

from __future__ import annotations

from orchestrator.evaluation.card_report import card_lines
from remote_payload.cards.explain import RunSide, alternatives, explain_cost, explanation, rank
from remote_payload.cards.facts import drafter_template, quantization, quantization_entry, template_sha256
from remote_payload.cards.schema import parse_card


def _card(**protocol):
    return parse_card({"card": "c", "source": "o/r#1", "target": {"name": "t"}, "drafter": {"name": "d"},
                       "figure": {"tau": 3.0, "ci": None, "n": 16}, "count": "committed",
                       "aggregation": "per_request",
                       "protocol": {"dataset": "builtin", "n": 16, "max_new_tokens": 256, **protocol}}, "test")


def _knobs(card, **run):
    return [(k, v) for k, v, _ in alternatives(card, RunSide(thinking=False, max_new_tokens=256, **run))]


def test_sampling_left_unknown_reruns_the_values_cards_use_other_than_the_runs():
    greedy = _knobs(_card())
    assert ("temperature", "1") in greedy and ("temperature", "0") not in greedy
    assert not any(k in ("top_p", "top_k") for k, _ in greedy)  # at T = 0 they do not enter the figure
    hot = _knobs(_card(), temperature=0.6, top_p=0.95, top_k=20)
    assert [s for k, s in hot if k == "temperature"] == ["0", "1"]
    assert ("top_p", "1") in hot and ("top_k", "0") in hot and ("top_p", "0.95") not in hot
    known = _knobs(_card(temperature=1.0, top_p=0.95, top_k=20), temperature=1.0, top_p=0.95, top_k=20)
    assert not any(k in ("temperature", "top_p", "top_k") for k, _ in known)


def test_the_dtype_knob_reruns_in_the_other_dtype():
    assert ("dtype", "bfloat16") in _knobs(_card(), dtype="float32")
    assert ("dtype", "float32") in _knobs(_card(), dtype="bfloat16")
    assert ("dtype", "bfloat16") in _knobs(_card(), dtype="float16")


def test_the_chat_template_is_rerun_only_with_a_template_to_render():
    assert "chat_template" not in dict(_knobs(_card()))
    (change,) = [c for k, _, c in alternatives(_card(), RunSide(False, 256, drafter_template="T")) if
                 k == "chat_template"]
    assert change == {"chat_template": "T"}
    assert ("chat_template", "drafter") in _knobs(_card(), template_unknown=True)  # the plan: maybe on the host


def test_the_plan_counts_each_rerun_and_the_draws_at_t_above_0():
    card = _card()
    line = explain_cost(card, RunSide(False, 256, dtype="float32"), 16, 64)
    # thinking on, temperature 1, dtype bfloat16, prompt_normalization: 4 decoded reruns of 16 of 64 rows
    assert "subset reruns of the first 16 row(s): thinking on, temperature 1, dtype bfloat16, prompt_normalization" \
        in line
    assert "at most ≈ 1× the run's reference decoding (4 rerun(s) of 16 of its 64 row(s)" in line
    assert "dtype bfloat16 loads the target once more in it" in line
    # at T = 1 with 4 draws a prompt: the T = 0 rerun decodes one continuation a row, the others four
    hot = explain_cost(card, RunSide(False, 256, temperature=1.0, samples_per_prompt=4), 16, 64)
    assert "temperature 0, top_p 0.95, top_k 20, dtype float32" in hot
    assert "at most ≈ 1.3× the run's reference decoding (6 rerun(s)" in hot  # (5 × 4 + 1) × 16 / (4 × 64)


def test_the_drafter_template_comes_from_its_files_checked_against_its_metadata():
    target, text = template_sha256("target's"), "{{ messages }}"
    assert drafter_template(None, text, "d/chat_template.jinja", target) == (text, "d/chat_template.jinja")
    assert drafter_template(template_sha256(text), text, "w", target) == (text, "w")
    none, why = drafter_template(None, None, "", target)
    assert none is None and why.startswith("the drafter names no chat template")
    _, why = drafter_template(target, None, "", target)
    assert "the target's own chat template" in why
    _, why = drafter_template("ab" * 32, None, "", target)
    assert "ships no template text" in why and "abababababab…" in why
    _, why = drafter_template("ab" * 32, text, "w", target)
    assert "is not the one its metadata says it was trained with" in why


def test_a_quantized_checkpoint_is_named_by_its_config_or_its_weights():
    assert quantization({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}, set()) \
        == "quantization_config (quant_method gptq, bits 4)"
    assert quantization({"text_config": {"quantization_config": {"quant_method": "fp8"}}}, set()) == \
        "quantization_config (quant_method fp8)"
    assert quantization({}, {"bfloat16", "int32"}) == "weights stored as int32"
    assert quantization({}, {"float8_e4m3fn"}) == "weights stored as float8_e4m3fn"
    assert quantization({"hidden_size": 64}, {"bfloat16", "float32"}) is None and quantization(None, set()) is None


def test_a_quantization_fact_ranks_after_the_measured_knobs_and_enters_the_sentence():
    fact = quantization_entry("drafter", "quantization_config (quant_method awq, bits 4)")
    measured = {"knob": "thinking", "setting": "on", "tau": 2.9, "ci": [2.8, 3.0], "tau_base": 2.5, "rows": 4,
                "from": "a rerun of the first rows"}
    ranked = rank([fact, measured], 2.5, 4.0)
    assert [e["knob"] for e in ranked] == ["thinking", "quantization"]
    assert ranked[1]["gap_closed"] is None and not ranked[1]["explains"]
    sentence = explanation(ranked)
    assert sentence.startswith("no knob explains the gap: the drafter itself is the suspect")
    assert sentence.endswith("closes 27% of it; the drafter quantized: quantization_config (quant_method awq, bits "
                             "4): a quantized drafter has lost most of its acceptance with no error anywhere (W4A16 "
                             "DFlash2: 3.7 → 1.0, sgl-project/sglang#39087): compare with its unquantized weights")
    closing = rank([fact, {**measured, "tau": 4.0, "ci": [3.9, 4.1]}], 2.5, 4.0)
    assert explanation(closing).startswith("thinking explains the gap")  # a knob that closes it: no fact added
    card = {"name": "c", "verdict": "below", "measured": {"value": 2.5}, "published": {"tau": 4.0},
            "difference": {"value": -1.5}, "explain": ranked, "explanation": sentence}
    assert "  quantization: the drafter quantized: quantization_config (quant_method awq, bits 4), not rerun " \
           "(nothing to switch off offline)" in card_lines({"card": card})


def test_knob_names_stay_the_fixed_words():
    from remote_payload.cards.explain import KNOBS

    assert set(KNOBS) == {"count", "aggregation", "draft_rule", "k", "end_rule", "thinking", "chat_template",
                          "max_new_tokens", "selection", "temperature", "top_p", "top_k", "prompt_normalization",
                          "dtype", "layer_offset", "quantization"}
    every = alternatives(_card(), RunSide(False, 256, selection="zlab-server", temperature=0.6, drafter_template="x",
                                          layer_offsets=(1,)))
    assert {k for k, _, _ in every} <= set(KNOBS)
