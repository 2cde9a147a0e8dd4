"""The draws of a run at T > 0: each chosen prompt evaluated on K continuations sampled from the target.

Draw j (0..K-1) of the prompt at index i of the prompt set becomes one evaluated sample: its own prompt entry
with index ``i·K + j`` (so every stage that keys, orders or merges samples by index keeps working, and a later
turn of a multi-turn row follows the same draw of the turn before: ``follows·K + j``) and id ``ID#j``. Its seed
(``inputs.sampling.draw_seed``) is known once its prompt tokens are: for a later turn they hold the draw's own
earlier answers. All draws of a prompt are on one host (sharding happens before the expansion), and they are
the cluster the CIs resample together (``metrics/sampled.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from remote_payload.inputs.prompts import Prompt

SEPARATOR = "#"  # between a prompt's id and its draw number


@dataclass
class Draw:
    prompt_index: int  # the prompt's index in the prompt set
    prompt_id: str
    number: int  # j, 0..K-1
    seed: int | None = None  # set by the reference stage (it depends on the rendered prompt tokens)

    def entry(self) -> dict:
        """The sample line's fields (samples.jsonl) that say which draw it is."""
        return {"prompt_index": self.prompt_index, "prompt_id": self.prompt_id, "draw": self.number,
                "seed": self.seed}


def expand(prompts: list[Prompt], per_prompt: int) -> tuple[list[Prompt], list[Draw]]:
    """Every prompt ``per_prompt`` times, prompt by prompt, and what each entry is a draw of."""
    K = per_prompt
    out: list[Prompt] = []
    draws: list[Draw] = []
    for p in prompts:
        for j in range(K):
            out.append(replace(p, index=p.index * K + j, id=f"{p.id}{SEPARATOR}{j}",
                               follows=None if p.follows is None else p.follows * K + j))
            draws.append(Draw(p.index, p.id, j))
    return out, draws
