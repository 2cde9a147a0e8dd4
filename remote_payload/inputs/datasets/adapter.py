"""What a benchmark dataset is to dfo: where its rows come from, how a row becomes the user turns, its id.

One ``Adapter`` per dataset (the modules beside this one). The user turn of each row is built exactly as
z-lab's ``dflash/benchmark.py`` builds it (its ``DATASETS[name]["format"]``), so a τ measured here is measured
on the prompts z-lab's published tables used. Pure stdlib: the controller imports it to check a file before
anything connects, the eval host to build the prompts.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable

from remote_payload.errors import PayloadError

# z-lab's suffix for the math sets (dflash/benchmark.py's gsm8k and math500 "format")
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."


@dataclass(frozen=True)
class PackageFile:
    """Rows that ship inside a registry package: read from its installed files, never imported."""

    distribution: str   # the package's distribution name (importlib.metadata)
    version: str        # the version the rows were checked against
    path: str           # the file inside the distribution
    licence: str
    no_deps: bool = False  # installed without its declared dependencies (heavy, and never imported here)

    def install_line(self, python: str) -> str:
        """The command that installs the package for PYTHON (the interpreter dfo runs in)."""
        return f"{shlex.quote(python)} -m pip install {'--no-deps ' if self.no_deps else ''}" \
               f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class Adapter:
    name: str                       # dfo's name (z-lab's key in dflash/benchmark.py's DATASETS)
    hub_id: str                     # the HF dataset z-lab loads
    config: str | None              # its config (load_dataset's second argument)
    split: str                      # z-lab's split
    splits: tuple[str, ...]         # the splits a user may name
    fields: tuple[str, ...]         # the row fields the turns and the id need (the source's real schema)
    turns: Callable[[dict], list[str]]   # the user turns of a row, z-lab's formatting applied
    row_id: Callable[[dict, int], str]   # a row's stable id (its field, else its position in the split)
    zlab_samples: int               # the paper's sample count for this set
    category: Callable[[dict], str | None] = lambda row: None  # the second level of the per-dataset results
    package: PackageFile | None = None   # where the rows ship without a hub (None: a file the user exports)
    alternatives: tuple[tuple[str, ...], ...] = ()  # other schemas of the same rows (field sets), e.g. FastChat's
    bundled: str | None = None           # rows that ship with the payload itself (a path under remote_payload/)

    @property
    def multi_turn(self) -> bool:
        return self.name == "mt-bench"

    @property
    def hub_name(self) -> str:
        return self.hub_id + (f" ({self.config})" if self.config else "")

    def check_row(self, row, where: str) -> None:
        """A row in the source's schema; raises PayloadError naming the row, the missing field, the schema."""
        if not isinstance(row, dict):
            raise PayloadError(f"{where}: expected an object with {', '.join(self.fields)}, found "
                               f"{type(row).__name__}")
        schemas = (self.fields, *self.alternatives)
        if not any(all(f in row for f in schema) for schema in schemas):
            missing = [f for f in self.fields if f not in row]
            raise PayloadError(f"{where}: no field(s) {', '.join(missing)} ({self.hub_name} rows have "
                               f"{', '.join(self.fields)}; found {', '.join(sorted(map(str, row))) or 'none'})")

    def user_turns(self, row: dict, where: str) -> list[str]:
        try:
            turns = self.turns(row)
        except PayloadError as exc:  # a field of the wrong type: named with the file and the row
            raise PayloadError(f"{where}: {exc}") from None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
            raise PayloadError(f"{where}: the user turn(s) must be non-empty strings")
        return turns


def text_field(row: dict, key: str) -> str:
    value = row[key]
    if not isinstance(value, str):
        raise PayloadError(f"field {key!r} must be a string, found {type(value).__name__}")
    return value
