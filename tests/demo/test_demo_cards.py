"""`dfo demo`'s cards without hosts: the figures' eval and the two card evals are planned from the demo's own request
(the payload would accept them: the card fixes what the request leaves at its default and clashes with nothing),
the card files carry the published run's figures as measured, and the lines show the reproduced verdict, the gap
and the knob that explains it. (The full demo is run by hand, ./scripts/demo.sh; its output is in docs/demo.md.)"""

from __future__ import annotations

from orchestrator.core.inventory import parse_inventory
from orchestrator.demo.card_story import (
    CARD_ROWS,
    CARDS,
    card_request,
    card_story_lines,
    card_texts,
    published_request,
)
from orchestrator.demo.engine_story import demo_plan
from orchestrator.evaluation.plan import EvalRequest, plan_eval
from remote_payload.cards.schema import load_card
from remote_payload.cli import build_parser
from remote_payload.eval.settings import settings_from_values

INV = parse_inventory("hosts:\n  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}\n"
                      "  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k}\n", "inventory.yaml")
PUBLISHED = {"drafters": {"zlab": {"metrics": {"by_thinking": {
    "off": {"tau_macro": {"value": 4.123456789, "ci": [3.9, 4.3]}},
    "on": {"tau_macro": {"value": 1.2987654321, "ci": [1.2, 1.4]}}}}}}}


def _request() -> EvalRequest:
    plan = demo_plan("/m", "/c")  # the default story's drafters, as run_demo builds its request
    return EvalRequest(hosts=["ct129"], target=plan.target, drafters=plan.drafters,
                       datasets=["builtin", "humaneval@6"], max_new_tokens=96, dtype="float32", threads=1)


def _settings(req: EvalRequest):
    (job,) = plan_eval(req, INV).jobs
    return settings_from_values(vars(build_parser().parse_args(job.args)))


def test_the_figures_are_measured_under_both_thinking_modes_on_the_card_drafter():
    s = _settings(published_request(_request()))
    assert [n for n, _ in s.drafters] == ["zlab"] and s.dataset_specs == [] and s.prompts == "builtin"
    assert (s.samples, s.enable_thinking, s.max_new_tokens, s.temperature) == (CARD_ROWS, "both", 96, 0.0)


def test_the_card_files_carry_the_measured_figures_and_the_evals_apply_them(tmp_path):
    texts = card_texts(PUBLISHED, 96, "20261207-012042-ct129-cff5")
    assert list(texts) == list(CARDS)
    for name, text in texts.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    off, unknown = (load_card(str(tmp_path / f"{name}.yaml")) for name in CARDS)
    assert (off.figure.tau, off.protocol.thinking) == (4.123456789, False)  # full precision, not retyped
    assert (unknown.figure.tau, unknown.protocol.thinking) == (1.2987654321, "unknown")
    assert off.protocol.n == unknown.protocol.n == CARD_ROWS and off.protocol.max_new_tokens == 96
    assert off.source == "dfo demo run 20261207-012042-ct129-cff5, --enable-thinking both" == unknown.source
    reproduced = _settings(card_request(_request(), tmp_path / f"{CARDS[0]}.yaml", explain=False))
    explained = _settings(card_request(_request(), tmp_path / f"{CARDS[1]}.yaml", explain=True))
    for s in (reproduced, explained):
        assert [n for n, _ in s.drafters] == ["zlab"] and (s.samples, s.max_new_tokens) == (CARD_ROWS, 96)
        assert s.enable_thinking is False  # the card's off; for unknown, the run's own
    assert not reproduced.explain and (explained.explain, explained.explain_prompts) == (True, CARD_ROWS)


def _card_results(name, tau, verdict, explain=None, explanation=None, assumed=None):
    block = {"name": name, "source": "dfo demo", "count": "committed", "aggregation": "per_request",
             "drafter": "zlab", "verdict": verdict, "measured": {"value": 4.12, "ci": [3.9, 4.3]},
             "published": {"tau": tau, "ci": None}, "difference": {"value": 4.12 - tau, "ci": [3.9 - tau, 4.3 - tau]},
             "run_values": assumed or {}, "not_applied": []}
    if explain is not None:
        block.update(explain=explain, explanation=explanation)
    return {"card": block}


def test_the_lines_show_the_reproduced_card_and_the_knob_that_explains_the_gap(tmp_path):
    explain = [{"knob": "thinking", "setting": "on", "tau": 1.3, "ci": [1.2, 1.4], "tau_base": 4.12, "rows": 6,
                "from": "a rerun of the first rows", "gap_closed": 1.0, "explains": True},
               {"knob": "dtype", "setting": "bfloat16", "tau": 4.1, "ci": [3.9, 4.3], "tau_base": 4.12, "rows": 6,
                "from": "a rerun of the first rows", "gap_closed": 0.01, "explains": False}]
    lines = card_story_lines(tmp_path, _card_results(CARDS[0], 4.12, "reproduced"),
                             _card_results(CARDS[1], 1.3, "above", explain, "thinking explains the gap: …",
                                           {"thinking": "off"}))
    assert lines[0] == f"cards (figures measured with --enable-thinking both; card files in {tmp_path}):"
    assert lines[1].startswith(f"  card {CARDS[0]}: τ 4.12 [3.90, 4.30]") and ": reproduced, Δ +0.00" in lines[1]
    assert lines[2].startswith(f"  card {CARDS[1]}: τ 4.12") and ": above, Δ +2.82" in lines[2]
    assert lines[3] == "    the card leaves unknown, measured as the run set it: thinking off"
    assert lines[4].startswith("    thinking on: τ 1.30 [1.20, 1.40] vs 4.12 on 6 prompt(s)") and \
        lines[4].endswith("gap closed 100 %")
    assert lines[5:] == ["    thinking explains the gap: …"]  # the top knob only, then the sentence
