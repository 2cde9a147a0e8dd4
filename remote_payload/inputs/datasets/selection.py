"""Which rows of a dataset a run evaluates: z-lab's rules (``--selection``), recorded in the results.

``zlab-transformers`` (the default; the published tables' path): ``dflash/benchmark.py``'s transformers backend
calls ``random.seed(0)``, then ``_limit_dataset`` keeps every row in the file's order when N is none or at least
the row count, else ``random.shuffle`` of the whole list and the first N.

``zlab-server`` (its vLLM/SGLang server path, which is what a current model card measures): no shuffle and no
seed. Request i, for i < N + concurrency, takes ``rows[i % len(rows)]`` (it wraps when N exceeds the set); the
first ``concurrency`` requests are a warm-up and not measured, and a multi-turn row sends its first turn only. The
measured rows are therefore rows[(concurrency + i) % len] for i < N, a row repeated when the set wraps.

(The paper-era code, ``datasets.shuffle(seed=0).select(n)``, selected yet another subset; dfo does not offer it.)
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")
SEED = 0
TRANSFORMERS, SERVER = "zlab-transformers", "zlab-server"
RULES = (TRANSFORMERS, SERVER)
RULE = TRANSFORMERS  # the default
RULE_TEXTS = {
    TRANSFORMERS: "z-lab dflash/benchmark.py, transformers backend: random.seed(0); random.shuffle(rows); rows[:N] "
                  "(every row in file order when N is none or at least the row count)",
    SERVER: "z-lab dflash/benchmark.py, server backends: rows in file order, request i < N + concurrency takes "
            "rows[i % len]; the first concurrency requests are the warm-up (not measured); first turn only",
}
RULE_TEXT = RULE_TEXTS[TRANSFORMERS]


def select_rows(rows: Sequence[T], n: int | None, seed: int = SEED, rule: str = TRANSFORMERS,
                concurrency: int = 1) -> list[int]:
    """The positions of the measured rows, in the order the run evaluates them (a position may repeat under the
    server rule when N exceeds the row count)."""
    if rule == SERVER:
        if not rows:
            return []
        count = len(rows) if n is None else n
        return [(concurrency + i) % len(rows) for i in range(count)]
    order = list(range(len(rows)))
    if n is None or len(order) <= n:
        return order
    random.Random(seed).shuffle(order)  # a fresh Random(seed) shuffles as random.seed(seed); random.shuffle does
    return order[:n]


def first_turn_only(rule: str) -> bool:
    return rule == SERVER
