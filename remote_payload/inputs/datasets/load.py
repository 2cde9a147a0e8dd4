"""The prompts of a run's datasets, and what the results record about them (name, split, file digest,
selection rule and seed, row ids), so a run can be repeated exactly and two runs known to share prompts."""

from __future__ import annotations

from pathlib import Path

from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets import longctx
from remote_payload.inputs.datasets.registry import DatasetSpec, package_source
from remote_payload.inputs.datasets.rows import read_rows
from remote_payload.inputs.datasets.selection import RULE, RULE_TEXTS, SEED, SERVER, first_turn_only, select_rows
from remote_payload.inputs.prompts import Prompt


def load_datasets(specs: list[DatasetSpec], files: dict[str, str], selection: str = RULE,
                  concurrency: int = 1) -> tuple[list[Prompt], list[dict]]:
    """Every selected row of every dataset as prompts (a multi-turn row: one per turn, or its first under the
    server selection), in order, and one record per dataset. ``files``: NAME -> the rows' file or folder (else
    the package the set ships in); ``selection``/``concurrency``: the rule (``selection.py``)."""
    unknown = sorted(set(files) - {s.name for s in specs})
    if unknown:
        raise PayloadError(f"--dataset-file for dataset(s) not evaluated: {', '.join(unknown)} (add --dataset NAME)")
    prompts: list[Prompt] = []
    records = []
    for spec in specs:
        part, record = load_one(spec, files.get(spec.name), start=len(prompts), selection=selection,
                                concurrency=concurrency)
        prompts += part
        records.append(record)
    return prompts, records


def load_one(spec: DatasetSpec, file: str | None, start: int = 0, selection: str = RULE,
             concurrency: int = 1) -> tuple[list[Prompt], dict]:
    adapter = spec.adapter
    package = None
    if file is None:
        path, version = package_source(adapter)  # refuses an adapter with neither a bundled file nor a package
        pkg = adapter.package
        package = {"distribution": "dfo payload", "version": version, "file": adapter.bundled, "licence": None} \
            if adapter.bundled or pkg is None else {"distribution": pkg.distribution, "version": version,
                                                    "file": pkg.path, "licence": pkg.licence}
    else:
        path = Path(file)
    try:
        source = read_rows(path, spec.split, adapter.config)
    except PayloadError as exc:
        raise PayloadError(f"dataset {spec.name}: {exc}") from None
    for i, row in enumerate(source.rows):
        adapter.check_row(row, f"dataset {spec.name} ({_short(source.files)}) row {i + 1}")
    if spec.count is not None and spec.count > len(source.rows) and selection != SERVER and not spec.from_suite:
        # z-lab's transformers rule takes every row then: a count the user gave is refused rather than run short
        # (a suite's count follows z-lab's rule; the server rule wraps and measures rows again, as z-lab's does)
        raise PayloadError(f"dataset {spec.text()}: {_short(source.files)} holds {len(source.rows)} row(s), so the "
                           f"eval would run {len(source.rows)}, not {spec.count}: give @{len(source.rows)} or less, "
                           f"or no @N for every row")
    chosen = select_rows(source.rows, spec.count, rule=selection, concurrency=concurrency)
    prompts: list[Prompt] = []
    row_ids: list[str] = []
    all_ids = [adapter.row_id(row, i) for i, row in enumerate(source.rows)]
    twice = sorted({r for r in all_ids if all_ids.count(r) > 1})
    if twice:
        raise PayloadError(f"dataset {spec.name} ({_short(source.files)}): row id(s) {', '.join(twice[:5])} occur "
                           "more than once (each row is one sample: ids must be unique)")
    seen: dict[int, int] = {}
    if spec.depths:  # longctx: each chosen row at each depth, built to it on the eval host (longctx.fit)
        prompts = longctx.prompts_of(source.rows, chosen, all_ids, spec.depths, start,
                                     lambda i: f"dataset {spec.name} ({_short(source.files)}) row {i + 1}")
        row_ids = [all_ids[pos] for pos in chosen]
        chosen = []
    for pos in chosen:
        row, rid = source.rows[pos], all_ids[pos]
        seen[pos] = seen.get(pos, 0) + 1
        repeat = f"/rep{seen[pos]}" if seen[pos] > 1 else ""  # the server rule wraps: a row measured again
        where = f"dataset {spec.name} ({_short(source.files)}) row {pos + 1} (id {rid})"
        try:
            turns = adapter.user_turns(row, where)
        except (KeyError, TypeError) as exc:
            raise PayloadError(f"{where}: {exc}") from None
        category = adapter.category(row)
        row_ids.append(rid)
        previous = None
        for k, text in enumerate(turns, start=1):
            index = start + len(prompts)
            multi = adapter.multi_turn
            prompts.append(Prompt(index=index, id=f"{spec.name}/{rid}{repeat}" + (f"/turn{k}" if multi else ""),
                                  messages=(("user", text),), category=category, dataset=spec.name, row_id=rid,
                                  turn=k if multi else None, follows=previous))
            previous = index
            if not multi or first_turn_only(selection):
                break  # a single-turn set's row is one user turn (z-lab: [format(row)]); the server path: turn 1
    record = {"name": spec.name, "split": spec.split, "hub_id": adapter.hub_id, "config": adapter.config,
              "formatting": "z-lab dflash/benchmark.py DATASETS[name]['format']",
              "source": {"files": source.files, "format": source.fmt, "sha256": source.sha256, "package": package},
              "rows": len(source.rows),
              "selection": {"rule": selection, "seed": None if selection == SERVER else SEED,
                            "requested": spec.count, "text": RULE_TEXTS[selection],
                            **({"concurrency": concurrency, "warmup_rows": [all_ids[i % len(all_ids)]
                                                                            for i in range(concurrency)]
                                if all_ids else []} if selection == SERVER else {})},
              "row_ids": row_ids, "samples": len(prompts), "multi_turn": adapter.multi_turn,
              **({"depths": list(spec.depths), "construction": longctx.CONSTRUCTION} if spec.depths else {})}
    return prompts, record


def _short(files: list[str]) -> str:
    return files[0] if len(files) == 1 else f"{files[0]} and {len(files) - 1} more"
