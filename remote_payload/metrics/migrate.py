"""Reading results written before the τ conventions were named by whose rule they are.

Until results schema ``dfo.results/1`` the convention ``zlab`` was z-lab's April 2026 loop (every accepted draft
of the last round counted, past the end token too). Since ``dfo.results/2`` that count is ``zlab-2604`` and
``zlab`` is an alias of ``committed`` (z-lab's loop since August 2026, ``conventions.ALIASES``). Old files are
renamed on read, never rewritten, so an old run and a new one compare like with like:

- results.json (keyed on its ``schema``): per drafter, ``metrics.conventions.zlab`` → ``zlab-2604`` (and the alias
  added), ``metrics.sampled.zlab_tau_macro`` and ``metrics.by_dataset[...]`` (categories too) ``zlab_tau_macro``
  → ``zlab_2604_tau_macro``, ``online_check.agreement.zlab`` → ``zlab-2604``;
- a samples.jsonl line (keyed on its content: a new line never holds a ``zlab`` record, the alias having none):
  per drafter, ``conventions.zlab`` → ``zlab-2604``, ``online.zlab_tau`` → ``zlab_2604_tau``;
- a watch series' point (``measures.conventions``, the τ macro per convention): ``zlab`` → ``zlab-2604``.

Pure stdlib; each function changes its argument in place and returns it.
"""

from __future__ import annotations

from remote_payload import RESULTS_SCHEMA

from . import conventions as conv

RESULTS_SCHEMA_BEFORE = "dfo.results/1"  # the last schema whose ``zlab`` was the April loop's count
OLD, NEW = "zlab", "zlab-2604"
OLD_FIGURE, NEW_FIGURE = "zlab_tau_macro", "zlab_2604_tau_macro"


def _rename(d: object, old: str, new: str) -> None:
    if isinstance(d, dict) and old in d and new not in d:
        d[new] = d.pop(old)


def _dict(x: object) -> dict:
    return x if isinstance(x, dict) else {}


def conventions_block(block: object) -> None:
    """A ``metrics.conventions`` block of the old layout: the April count renamed, its definition and the alias
    as a new block has them."""
    if not isinstance(block, dict) or isinstance(_dict(block.get(OLD)).get("alias_of"), str):
        return
    _rename(block, OLD, NEW)
    if isinstance(block.get(NEW), dict):
        block[NEW]["definition"] = conv.DEFINITIONS[NEW]
    if "committed" in block:
        for alias, name in conv.ALIASES.items():
            block.setdefault(alias, {"alias_of": name, "definition": conv.DEFINITIONS[alias]})
    order = [*conv.NAMES, *conv.ALIASES]  # the order a new block has (tables list them so)
    ordered = {k: block[k] for k in order if k in block} | {k: v for k, v in block.items() if k not in order}
    block.clear()
    block.update(ordered)


def _by_dataset(block: object) -> None:
    for figures in _dict(block).values():
        _rename(figures, OLD_FIGURE, NEW_FIGURE)
        for category in _dict(_dict(figures).get("by_category")).values():
            _rename(category, OLD_FIGURE, NEW_FIGURE)


def results(doc: dict) -> dict:
    """A results.json (or a shard's part) of schema ``dfo.results/1`` read as the current layout (its schema then
    the current one, ``migrated_from`` the file's); others as they are."""
    if not isinstance(doc, dict) or doc.get("schema") != RESULTS_SCHEMA_BEFORE:
        return doc
    for d in _dict(doc.get("drafters")).values():
        metrics = _dict(_dict(d).get("metrics"))
        conventions_block(metrics.get("conventions"))
        _rename(metrics.get("sampled"), OLD_FIGURE, NEW_FIGURE)
        _by_dataset(metrics.get("by_dataset"))
        _rename(_dict(_dict(d).get("online_check")).get("agreement"), OLD, NEW)
    doc["schema"], doc["migrated_from"] = RESULTS_SCHEMA, RESULTS_SCHEMA_BEFORE
    return doc


def sample_line(line: dict) -> dict:
    """A samples.jsonl line: an old per-sample ``zlab`` record (the April count) under its dated name."""
    for entry in _dict(_dict(line).get("drafters")).values():
        _rename(_dict(entry).get("conventions"), OLD, NEW)
        _rename(_dict(entry).get("online"), "zlab_tau", "zlab_2604_tau")
    return line


def series_measures(measures: object) -> None:
    """A watch series' measures (a point or a baseline): ``conventions.zlab`` of an old series → ``zlab-2604``
    (a new series never stores the alias: its value is ``tau_macro``)."""
    _rename(_dict(measures).get("conventions"), OLD, NEW)
