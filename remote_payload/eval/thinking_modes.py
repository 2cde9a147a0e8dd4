"""``--enable-thinking both``: every chosen prompt evaluated under both chat-template thinking modes in one run.

The prompt at index i of the set becomes two samples: off (index 2i) and on (index 2i + 1), ids ``ID~thinking-off``
and ``ID~thinking-on``, each remembering i (``Prompt.paired``) so the two are paired in the figures
(``metrics/aggregate.thinking_breakdown``); a later turn of a multi-turn row follows the same mode of the turn before.
The modes render different prompt tokens, so their references and features are cached apart (the caches are keyed
by the tokens). The expansion runs before the draws at T > 0 (``draws.py``), so both modes of a prompt, and all their
draws, are on one host.
"""

from __future__ import annotations

from dataclasses import replace

from remote_payload.inputs.prompts import Prompt

MODES = (False, True)  # off first: the paired difference is on − off
SEPARATOR = "~thinking-"


def mode_name(mode: bool) -> str:
    return "on" if mode else "off"


def expand(prompts: list[Prompt]) -> list[Prompt]:
    """Each prompt under each mode, prompt by prompt."""
    n = len(MODES)
    return [replace(p, index=p.index * n + m, id=f"{p.id}{SEPARATOR}{mode_name(mode)}", thinking=mode,
                    follows=None if p.follows is None else p.follows * n + m, paired=p.index)
            for p in prompts for m, mode in enumerate(MODES)]


def mode_of(prompt: Prompt, run_value) -> bool:
    """The thinking mode a prompt is rendered with: its own under ``both``, else the run's."""
    return prompt.thinking if prompt.thinking is not None else bool(run_value)
