"""--card on the fixtures, in-process: a card measured under its own protocol is reproduced, and a card whose
figure was taken with a knob the card leaves unknown (thinking, the count, max new tokens, T) is below or above,
with --explain naming that knob first and closing the gap; the dtype and the drafter's own chat template are
measured, a quantized drafter reported. Every published figure here comes from an
independent run of the payload with explicit options (its τ macro, computed by metrics/chain.py and
conventions.py), never from the card code under test."""

from __future__ import annotations

import pytest
from payload_helpers import drafter_copy, read_results

from orchestrator.evaluation.card_report import card_lines
from remote_payload.cards.explain import merged_card
from remote_payload.cli import build_parser
from remote_payload.eval.card_stage import dtype_cache
from remote_payload.eval.pipeline import run_eval
from remote_payload.eval.settings import EvalSettings, settings_from_values

PROMPTS = 12  # the built-in set, on which the fixture drafter was trained with thinking off
MAX_NEW = 160  # every fixture answer ends before it
FEW = 4  # the rows of the cheaper cases (and their --explain-prompts)


def _card(path, tau, *, thinking="off", count="committed", max_new=MAX_NEW, n=PROMPTS, temperature=0.0):
    path.write_text(f"""card: fixture-card
source: tests/payload/eval/test_cards_eval.py
target: {{name: fixture-target}}
drafter: {{name: fixture-zlab-drafter}}
figure: {{tau: {tau}, ci: null, n: {n}}}
count: {count}
aggregation: per_request
protocol:
  dataset: builtin
  n: {n}
  thinking: {thinking}
  temperature: {temperature}
  max_new_tokens: {max_new}
""")
    return path


@pytest.fixture(scope="module")
def measured(fixture_dir, eval_cache, tmp_path_factory):
    """The published figures, each from an independent run with explicit options."""
    work = tmp_path_factory.mktemp("card-figures")

    def run(out, dtype="float32", **kw):
        # bf16 in the folder the dtype rerun caches in: the fp32 entries of the other cases stay as they are
        cache = eval_cache if dtype == "float32" else dtype_cache(eval_cache, dtype)
        s = EvalSettings(target=str(fixture_dir / "target"), drafters=[("z", str(fixture_dir / "zlab-drafter"))],
                         dtype=dtype, cache_dir=str(cache), out=str(work / out), **kw)
        return run_eval(s)["drafters"]["z"]["metrics"]

    # the first FEW rows in bf16 and at T = 1 (one seeded draw): what the dtype and temperature reruns measure
    return {"off": run("off", max_new_tokens=MAX_NEW)["tau_macro"],
            "on": run("on", max_new_tokens=MAX_NEW, enable_thinking=True)["tau_macro"],
            "zlab-2604@4": run("short", max_new_tokens=4)["conventions"]["zlab-2604"]["tau_macro"],
            "off@few": run("off-few", max_new_tokens=MAX_NEW, samples=FEW)["tau_macro"],
            "bf16@few": run("bf16", dtype="bfloat16", max_new_tokens=MAX_NEW, samples=FEW)["tau_macro"],
            "t1@few": run("t1", max_new_tokens=MAX_NEW, samples=FEW, temperature=1.0)["tau_macro"]}


@pytest.fixture
def card_run(fixture_dir, eval_cache, tmp_path):
    def run(card, *extra, drafter=None):
        args = ["eval", "--target", fixture_dir / "target", "--drafter", f"z={drafter or fixture_dir / 'zlab-drafter'}",
                "--dtype", "float32", "--cache-dir", eval_cache, "--out", tmp_path / "run", "--card", card, *extra]
        run.results = run_eval(settings_from_values(vars(build_parser().parse_args(list(map(str, args))))))
        return run.results["card"]

    return run


def test_a_card_measured_under_its_own_protocol_is_reproduced(measured, card_run, tmp_path):
    card = card_run(_card(tmp_path / "card.yaml", round(measured["off"], 4)))
    assert card["verdict"] == "reproduced"
    assert card["measured"]["value"] == pytest.approx(measured["off"])
    lo, hi = card["measured"]["ci"]
    assert lo < card["published"]["tau"] < hi and card["difference"]["ci"][0] < 0 < card["difference"]["ci"][1]
    assert "explain" not in card  # reproduced and not asked: no knobs
    # the controller's summary line, and the verdict recomputed over (here: one part's) merged samples
    _, lines = read_results(tmp_path / "run")
    (first, *_) = card_lines(card_run.results)
    assert first.startswith(f"card fixture-card: τ {measured['off']:.2f} [") and ": reproduced, Δ +0.00" in first
    again = merged_card({**card_run.results, "shards": []}, lines)
    assert {k: again[k] for k in ("verdict", "measured", "difference")} == \
        {k: card[k] for k in ("verdict", "measured", "difference")}


def test_thinking_left_unknown_is_the_knob_that_explains_the_gap(measured, card_run, tmp_path):
    assert measured["off"] - measured["on"] > 0.5  # the fixture's gap: the drafter was trained with thinking off
    card = card_run(_card(tmp_path / "card.yaml", round(measured["on"], 4), thinking="unknown"))
    assert card["verdict"] == "above" and card["run_values"]["thinking"] == "off"
    top = card["explain"][0]
    assert (top["knob"], top["setting"], top["explains"]) == ("thinking", "on", True)
    assert top["gap_closed"] == pytest.approx(1, abs=0.05) and top["rows"] == PROMPTS
    assert card["explanation"].startswith("thinking explains the gap: with thinking on τ is")
    # no built-in prompt has three newlines in a row: the normalisation changes nothing and is not rerun
    assert "prompt_normalization: no prompt of the first 16 row(s) has repeated newlines" in card["explain_skipped"]
    shown = card_lines(card_run.results)
    assert ": above, Δ +" in shown[0] and "thinking off" in shown[1]
    assert shown[1].startswith("  the card leaves unknown, measured as the run set it: ") and "top_p" not in shown[1]
    assert shown[2].startswith("  thinking on: τ ") and "gap closed 100 %" in shown[2]


def test_the_count_left_unknown_is_the_knob_that_explains_the_gap(measured, card_run, tmp_path):
    card = card_run(_card(tmp_path / "card.yaml", round(measured["zlab-2604@4"], 4), count="unknown", max_new=4),
                    "--explain-prompts", "4")  # the count is a free knob: the reruns' rows do not enter it
    assert card["verdict"] == "below" and card["count"] == "committed"  # an unknown count is read as dfo's
    top = card["explain"][0]
    assert top["knob"] == "count" and top["setting"] in ("zlab-2604", "vllm") and top["explains"]
    assert top["gap_closed"] == pytest.approx(1, abs=0.05) and top["from"] == "the run"


def test_max_new_tokens_left_unknown_is_the_knob_that_explains_the_gap(measured, card_run, tmp_path):
    card = card_run(_card(tmp_path / "card.yaml", round(measured["off"], 4), max_new="unknown"),
                    "--max-new-tokens", "16", "--explain-prompts", "4")
    assert card["verdict"] == "below" and card["run_values"]["max_new_tokens"] == 16
    top = card["explain"][0]
    assert top["knob"] == "max_new_tokens" and top["explains"] and top["rows"] == 4
    assert top["gap_closed"] == pytest.approx(1, abs=0.25)
    # every response of the 2048-token rerun ended by itself: the 4096 one would measure the same, not rerun
    assert any(note.startswith("max_new_tokens 4096: not rerun") for note in card["explain_skipped"])


def test_a_gap_no_knob_closes_names_the_drafter(measured, card_run, tmp_path):
    card = card_run(_card(tmp_path / "card.yaml", 9.5), "--explain-prompts", "4")
    assert card["verdict"] == "below"
    assert not any(e["explains"] for e in card["explain"])
    assert card["explanation"].startswith("no knob explains the gap: the drafter itself is the suspect")
    assert {e["knob"] for e in card["explain"]} >= {"count", "aggregation", "end_rule", "thinking"}


def test_a_drafter_reading_the_wrong_layers_is_explained_by_layer_offset(measured, card_run, fixture_dir, tmp_path):
    """Pitfall 1, planted: the same weights told to read target layers one below the ones they were trained on."""
    shifted = drafter_copy(fixture_dir / "zlab-drafter", tmp_path / "shifted",
                           config=lambda c: c["dflash_config"].update(target_layer_ids=[0, 2, 4]))
    card = card_run(_card(tmp_path / "card.yaml", round(measured["off"], 4)), "--explain-prompts", "4",
                    drafter=shifted)
    assert card["verdict"] == "below"
    top = card["explain"][0]
    assert (top["knob"], top["setting"], top["explains"]) == ("layer_offset", "+1", True)
    assert top["gap_closed"] == pytest.approx(1, abs=0.25) and top["rows"] == 4
    # −1 would read layer −1: not measured
    assert [e["setting"] for e in card["explain"] if e["knob"] == "layer_offset"] == ["+1"]


def test_a_temperature_left_unknown_is_the_knob_that_explains_the_gap(measured, card_run, tmp_path):
    """The figure taken at T = 1, the card silent on T: the run decodes greedily, the T = 1 rerun of the same rows
    (the same seeded draws as the figure's run) closes the whole gap; T = 0 itself is not rerun."""
    card = card_run(_card(tmp_path / "card.yaml", round(measured["t1@few"], 4), n=FEW, temperature="unknown"),
                    "--explain", "--explain-prompts", str(FEW))
    assert card["run_values"]["temperature"] == 0.0
    top = card["explain"][0]
    assert (top["knob"], top["setting"], top["explains"], top["rows"]) == ("temperature", "1", True, FEW)
    assert top["tau"] == pytest.approx(measured["t1@few"]) and top["tau_base"] == pytest.approx(measured["off@few"])
    assert top["gap_closed"] == pytest.approx(1, abs=1e-3)
    assert [e["setting"] for e in card["explain"] if e["knob"] == "temperature"] == ["1"]
    # at T = 0 top-p and top-k do not enter the figure: said, not rerun
    assert not {"top_p", "top_k"} & {e["knob"] for e in card["explain"]}
    assert any(note.startswith("top_p, top_k: the run decodes greedily") for note in card["explain_skipped"])


def test_dtype_chat_template_and_quantization_are_measured_or_reported(measured, card_run, fixture_dir, tmp_path):
    """A drafter copy that ships the template it was trained with (the fixture's, without the empty think block
    thinking off adds: as if trained with thinking on) and a quantization_config: the dtype rerun measures what an
    independent bf16 run of the rows does, the drafter's template renders the rows as thinking on does, and the
    quantization is a fact in the list (no τ: nothing to switch off offline)."""
    template = (fixture_dir / "target" / "chat_template.jinja").read_text()
    trained = template.replace("{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n"
                               "</think>\\n\\n' }}{% endif %}", "")
    assert trained != template
    copy = drafter_copy(fixture_dir / "zlab-drafter", tmp_path / "quantized", config=lambda c: c.update(
        quantization_config={"quant_method": "awq", "bits": 4}))
    (copy / "chat_template.jinja").write_text(trained)
    card = card_run(_card(tmp_path / "card.yaml", round(measured["off@few"], 4), n=FEW), "--explain",
                    "--explain-prompts", str(FEW), drafter=copy)
    knobs = {e["knob"]: e for e in card["explain"]}
    assert knobs["dtype"]["setting"] == "bfloat16" and knobs["dtype"]["rows"] == FEW
    assert knobs["dtype"]["tau"] == pytest.approx(measured["bf16@few"])
    assert knobs["dtype"]["tau_base"] == pytest.approx(measured["off@few"])
    assert knobs["chat_template"]["setting"] == "drafter" and knobs["chat_template"]["rows"] == FEW
    assert knobs["chat_template"]["tau"] == pytest.approx(knobs["thinking"]["tau"])  # the same rendering
    assert knobs["chat_template"]["tau"] < knobs["chat_template"]["tau_base"] - 0.5
    fact = knobs["quantization"]
    assert fact["setting"] == "drafter quantized: quantization_config (quant_method awq, bits 4)"
    assert fact["tau"] is None and fact["gap_closed"] is None and not fact["explains"]
    assert card["explain"].index(fact) == len(knobs) - 1  # after every measured knob's best setting
    shown = card_lines(card_run.results)
    assert "  quantization: the drafter quantized: quantization_config (quant_method awq, bits 4), not rerun " \
        "(nothing to switch off offline)" in shown
