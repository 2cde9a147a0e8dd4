"""The serving engines dfo can start on an eval host, by the name the user gives (``--engine NAME``).

Adding an engine: its module beside this one (an object following ``base.Engine``), one entry here, and its
venv's spec in orchestrator/provision/engine_venv.py (locks per flavour, import check, reported packages).
Every list of engine names (the eval options, provision, the demo) is read from ``ENGINES``.
"""

from __future__ import annotations

import re

from ..errors import PayloadError
from . import sglang, vllm
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


VERSION_FORM = re.compile(r"[0-9][0-9A-Za-z.+-]{0,39}")


def split_engine(value: str) -> tuple[str, str | None]:
    """``vllm@0.31.0`` -> ("vllm", "0.31.0"); ``vllm`` -> ("vllm", None). The name must be a known engine and
    the version a release's version string (it names a lock file and a venv folder on the host)."""
    name, at, version = str(value).partition("@")
    if name not in ENGINES:
        raise PayloadError(f"--engine {value!r}: expected one of {', '.join(NAMES)} (or NAME@VERSION)")
    if at and not VERSION_FORM.fullmatch(version):
        raise PayloadError(f"--engine {value!r}: expected NAME@VERSION with a release version such as "
                           f"{name}@0.31.0")
    return name, (version if at else None)


OWNED_FLAGS: dict[str, tuple[str, ...]] = {"vllm": vllm.OWNED_FLAGS, "sglang": sglang.OWNED_FLAGS}


def check_engine_args(name: str, args: list[str]) -> None:
    """--engine-arg values for engine NAME: none may name a server option dfo sets itself."""
    owned = OWNED_FLAGS.get(name, ())
    for arg in args:
        flag = arg.partition("=")[0].replace("_", "-")
        if flag in owned:
            raise PayloadError(f"--engine-arg {arg!r}: dfo sets {flag} of the {name} server itself (the port, the "
                               f"model, the speculative config and the API key are the run's own; it sets "
                               f"{', '.join(owned)})")
