"""A card's protocol as eval options: what ``--card`` fixes, the same way ``--protocol`` does (an option left at
its default takes the card's value, one given with another value is refused), and what dfo cannot apply. Stdlib
only (the controller fills its request with it before anything connects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remote_payload.cards.schema import INLINE, UNKNOWN, Card, is_prompts_file
from remote_payload.eval import protocols

SELECTION = {"transformers": "zlab-transformers", "server": "zlab-server"}


def fixed_values(card: Card) -> dict[str, Any]:
    """The eval settings (by field) the card fixes: every known protocol field dfo has an option for."""
    p = card.protocol
    out: dict[str, Any] = {"prompts": prompts_path(card), "samples": p.n} if is_prompts_file(card) else \
        {"datasets": [f"{p.dataset}@{p.n}"]}
    if p.selection in SELECTION:
        out["selection"] = SELECTION[p.selection]
        if p.selection == "server":
            out["selection_concurrency"] = p.selection_concurrency
    if p.thinking != UNKNOWN:
        out["enable_thinking"] = bool(p.thinking)
    for key in ("temperature", "top_p", "top_k", "max_new_tokens"):
        if getattr(p, key) != UNKNOWN:
            out[key] = getattr(p, key)
    sampled = p.temperature != UNKNOWN and p.temperature > 0
    if sampled and p.draft_rule != UNKNOWN:
        out["draft_rule"] = p.draft_rule
    return out


def prompts_path(card: Card) -> str:
    """A prompts-file card's set: builtin, or its file (a relative path is read from the card file's folder)."""
    dataset = card.protocol.dataset
    if dataset == "builtin" or Path(dataset).is_absolute() or not card.where or card.where == INLINE:
        return dataset
    return str(Path(card.where).resolve().parent / dataset)


def not_applied(card: Card) -> list[str]:
    """Known fields dfo measures otherwise, each with what it does instead (recorded beside the verdict)."""
    p = card.protocol
    out = []
    if p.reasoning_effort is not None:
        out.append(f"reasoning_effort {p.reasoning_effort}: dfo renders the chat template with enable_thinking only")
    if p.chat_template == "drafter":
        out.append("chat_template drafter: dfo renders prompts with the target's chat template")
    if p.engine not in ("offline", UNKNOWN):
        out.append(f"engine {p.engine}: dfo measures offline, in the card's count")
    return out


def fill(values: dict[str, Any], defaults: dict[str, Any], card: Card) -> dict[str, Any]:
    return protocols.fill_from(values, defaults, fixed_values(card))


def conflicts(values: dict[str, Any], card: Card) -> list[str]:
    return protocols.clashes(values, fixed_values(card), "the card")


def refusal(card: Card, clash: list[str]) -> str:
    return (f"--card {card.card} fixes what it measures, but {'; '.join(clash)}: drop those options, or drop "
            "--card")
