"""Which rows of a dataset a run evaluates: z-lab's rule, as its transformers backend applies it.

``dflash/benchmark.py``'s ``_limit_dataset``: with N at least the row count (or none), every row in the file's
order; else ``random.shuffle`` of the whole list and the first N. Its transformers backend calls
``random.seed(0)`` just before; its server and MLX backends shuffle with the import-time ``random.seed(42)``,
and the paper-era code (``datasets.shuffle(seed=0).select(n)``) selected yet another subset. The published
tables used the transformers backend, so that is the rule here, and the results record it.
"""

from __future__ import annotations

import random
from typing import Sequence, TypeVar

T = TypeVar("T")
SEED = 0
RULE = "zlab-transformers"
RULE_TEXT = ("z-lab dflash/benchmark.py, transformers backend: random.seed(0); random.shuffle(rows); rows[:N] "
             "(every row in file order when N is none or at least the row count)")


def select_rows(rows: Sequence[T], n: int | None, seed: int = SEED) -> list[int]:
    """The positions of the selected rows, in the order the run evaluates them."""
    order = list(range(len(rows)))
    if n is None or len(order) <= n:
        return order
    random.Random(seed).shuffle(order)  # a fresh Random(seed) shuffles as random.seed(seed); random.shuffle does
    return order[:n]
