"""The serving engines dfo can start on an eval host, by the name the user gives (``--engine NAME``).

Adding an engine: its module beside this one (an object following ``base.Engine``), one entry here, and its
venv's spec in orchestrator/provision/engine_venv.py (locks per flavour, import check, reported packages).
Every list of engine names (the eval options, provision, the demo) is read from ``ENGINES``.
"""

from __future__ import annotations

from ..errors import PayloadError
from .base import Engine
from .sglang import SGLANG
from .vllm import VLLM

ENGINES: dict[str, Engine] = {e.name: e for e in (VLLM, SGLANG)}
NAMES: tuple[str, ...] = tuple(ENGINES)


def get(name: str) -> Engine:
    try:
        return ENGINES[name]
    except KeyError:
        raise PayloadError(f"unknown engine {name!r} (known: {', '.join(NAMES)})") from None
