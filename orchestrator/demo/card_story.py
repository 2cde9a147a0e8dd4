"""`dfo demo`'s cards: one card reproduced and one gap explained, on the fixtures.

The "published" figures are measured first, by an eval with an explicit option: the z-lab-format drafter on the
``CARD_ROWS`` built-in prompts under both thinking modes (``--enable-thinking both``). Two card files are
written from its figures into that run's folder: one with the thinking-off figure and thinking off (measured under
its own protocol, it is reproduced), one with the thinking-on figure and thinking left ``unknown``, as cards often
leave it. ``dfo eval --card FILE`` on each, the second with ``--explain``: that run measures with thinking off (the
run's own value of a field the card leaves unknown), lands above the figure, and its thinking rerun of the same
rows closes the gap. The fixture drafter was trained with thinking off: the seed's gap, in miniature.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.core.errors import OperationError
from orchestrator.core.events import Events
from orchestrator.evaluation.card_report import card_lines
from orchestrator.evaluation.operation import follow_and_collect, start_eval
from orchestrator.evaluation.plan import EvalRequest, plan_eval
from orchestrator.evaluation.report_values import json_object
from orchestrator.evaluation.runs import Run

CARD_DRAFTER = "zlab"  # the z-lab-format fixture drafter: a card is about a published checkpoint
# Built-in prompts each card measures: all 12 (the first six alone are all coding prompts, where the modes' gap,
# 3.71 vs 3.10 at 96 new tokens, stays inside the CI over six prompts: "reproduced"); --explain reruns all of them,
# so the rerun is the figure's own measurement and the share of the gap it closes is exact.
CARD_ROWS = 12
CARDS = ("demo-thinking-off", "demo-thinking-unknown")  # reproduced, explained


@dataclass
class CardRuns:
    published: Run   # the figures, measured with --enable-thinking both
    reproduced: Run  # --card demo-thinking-off
    explained: Run   # --card demo-thinking-unknown --explain

    def lines(self) -> list[str]:
        return card_story_lines(self.published.path / "cards", self.reproduced.results(), self.explained.results())


def published_request(request: EvalRequest) -> EvalRequest:
    """The figures' eval: the demo's request on the card drafter and the first CARD_ROWS built-in prompts, both
    thinking modes."""
    return replace(request, drafters=[_card_drafter(request)], datasets=[], prompts="builtin", samples=CARD_ROWS,
                   enable_thinking="both", temperature=None, samples_per_prompt=None)


def card_request(request: EvalRequest, card: Path, explain: bool) -> EvalRequest:
    """``dfo eval --card CARD`` on the card drafter: the card fixes the prompts, N, thinking (where it knows it), T
    and max new tokens; the rest is the demo's request."""
    return replace(request, drafters=[_card_drafter(request)], datasets=[], prompts="builtin", samples=None,
                   enable_thinking=False, temperature=None, samples_per_prompt=None, card=str(card), explain=explain,
                   explain_prompts=CARD_ROWS if explain else None)


def card_texts(published: dict, max_new_tokens: int, run_name: str) -> dict[str, str]:
    """The two card files (name → YAML) from the published run's results (run RUN_NAME, their source): each figure
    is a mode's τ macro there (``metrics.by_thinking``), at full precision."""
    by_mode = json_object(json_object(json_object(json_object(published.get("drafters")).get(CARD_DRAFTER))
                                      .get("metrics")).get("by_thinking"))
    taus: dict[str, float] = {}
    for mode in ("off", "on"):
        value = json_object(json_object(by_mode.get(mode)).get("tau_macro")).get("value")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise OperationError(f"the demo's card figures: drafter {CARD_DRAFTER} has no τ with thinking {mode} in "
                                 f"the published run (metrics.by_thinking.{mode}.tau_macro: {value!r})")
        taus[mode] = float(value)
    return {name: _card_yaml(name, f"dfo demo run {run_name}, --enable-thinking both", taus[mode], thinking,
                             max_new_tokens)
            for name, mode, thinking in ((CARDS[0], "off", "off"), (CARDS[1], "on", "unknown"))}


def card_story_lines(folder: Path, reproduced: dict, explained: dict) -> list[str]:
    """The reproduced card's verdict; the explained card's verdict, what it assumed, the top knob and the sentence."""
    shown = card_lines(explained)
    knob = [line for line in shown[1:] if not line.startswith(("  the card leaves unknown", "  not applied"))]
    assumed = [line for line in shown[1:2] if line.startswith("  the card leaves unknown")]
    return ([f"cards (figures measured with --enable-thinking both; card files in {folder}):"]
            + [f"  {line}" for line in card_lines(reproduced)[:1]]
            + [f"  {line}" for line in shown[:1] + assumed + (knob[:1] + knob[-1:] if len(knob) > 1 else knob)])


def card_evals(connector: Any, request: EvalRequest, inv: Any, runs_dir: Path, events: Events) -> CardRuns:
    """The published figures, the two card files beside them, and an eval against each card."""
    events.step(tag="demo", text=f"the published figures: dfo eval --drafter {CARD_DRAFTER}=… --samples {CARD_ROWS} "
                "--enable-thinking both (τ under each thinking mode)")
    published = start_eval(connector, plan_eval(published_request(request), inv), runs_dir=runs_dir, events=events)
    follow_and_collect(connector, published, events=events)
    folder = published.path / "cards"
    folder.mkdir(exist_ok=True)
    paths = []
    for name, text in card_texts(published.results(), request.max_new_tokens, published.name).items():
        paths.append(folder / f"{name}.yaml")
        paths[-1].write_text(text, encoding="utf-8")
    runs = []
    for path, explain in zip(paths, (False, True), strict=True):
        events.step(tag="demo", text=f"dfo eval --card {path}" + (f" --explain --explain-prompts {CARD_ROWS}"
                                                                  if explain else ""))
        run = start_eval(connector, plan_eval(card_request(request, path, explain), inv), runs_dir=runs_dir,
                         events=events)
        follow_and_collect(connector, run, events=events)
        runs.append(run)
    return CardRuns(published, *runs)


def _card_drafter(request: EvalRequest):
    found = [d for d in request.drafters if d.name == CARD_DRAFTER]
    if not found:
        raise OperationError(f"the demo's cards need drafter {CARD_DRAFTER}, the request has "
                             f"{', '.join(d.name for d in request.drafters)}")
    return found[0]


def _card_yaml(name: str, source: str, tau: float, thinking: str, max_new_tokens: int) -> str:
    return f"""card: {name}
source: {source}
target: {{name: fixture-target}}
drafter: {{name: fixture-zlab-drafter}}
figure: {{tau: {tau!r}, ci: null, n: {CARD_ROWS}}}
count: committed
aggregation: per_request
protocol:
  dataset: builtin
  n: {CARD_ROWS}
  selection: file
  thinking: {thinking}
  chat_template: target
  temperature: 0.0
  max_new_tokens: {max_new_tokens}
  engine: offline
"""
