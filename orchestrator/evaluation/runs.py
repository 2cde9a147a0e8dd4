"""Local run folders: `runs/<timestamp>-<host>-<short id>/`, one per `dfo eval`.

A run folder holds ``run.json`` (what was asked, which remote jobs, the state), then — once the jobs
are pulled — ``results.json``, ``samples.jsonl``, ``logs/<host>.log``, ``report.md`` and the plots.
``results.json`` appears last and only when complete, so its presence means the run is usable. Both are read
in the current layout: a run of an older results schema is migrated on read, never rewritten
(``remote_payload/metrics/migrate.py``: the τ convention ``zlab`` of ``dfo.results/1`` is ``zlab-2604`` now).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.atomic_file import write_text_atomic
from orchestrator.core.errors import InputError
from orchestrator.core.host_text import decode_json
from remote_payload.metrics import migrate

RUN_RECORD = "run.json"
STATES = ("planned", "running", "detached", "pulling", "succeeded", "failed")


def runs_root(value: str | os.PathLike | None = None) -> Path:
    return Path(value or os.environ.get("DFO_RUNS_DIR") or "runs")


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


@dataclass
class Run:
    path: Path
    record: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        return self.record.get("status", "?")

    @property
    def results_path(self) -> Path:
        return self.path / "results.json"

    def has_results(self) -> bool:
        return self.results_path.is_file()

    def results(self) -> dict:
        try:
            results = decode_json(self.results_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputError(f"run {self.name} has no results yet (status: {self.status})",
                             hint=f"dfo runs pull {self.name}") from None
        except ValueError as exc:
            raise InputError(f"{self.results_path} is not valid JSON: {exc}",
                             hint=f"pull the results again: dfo runs pull {self.name}") from None
        if not isinstance(results, dict):
            raise InputError(f"{self.results_path}: not a JSON object (got {type(results).__name__})",
                             hint=f"pull the results again: dfo runs pull {self.name}")
        if not isinstance(results.get("drafters"), dict):
            got = "missing" if "drafters" not in results else type(results["drafters"]).__name__
            raise InputError(f"{self.results_path}: no 'drafters' object ({got}): not the results of a dfo eval, or "
                             "of another results schema", hint=f"pull the results again: dfo runs pull {self.name}")
        return migrate.results(results)

    def samples(self, required: bool = False) -> list[dict]:
        """The per-sample lines; REQUIRED: a missing file is an error (a comparison pairs them)."""
        path = self.path / "samples.jsonl"
        if not path.exists():
            if required:
                raise InputError(f"{path}: missing: run {self.name} has no per-sample lines to pair",
                                 hint=f"pull the run again: dfo runs pull {self.name}")
            return []
        samples = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                sample = decode_json(line)
            except ValueError as exc:
                raise InputError(f"{path}:{number}: not valid JSON: {exc}") from None
            if not isinstance(sample, dict):
                raise InputError(f"{path}:{number}: not a JSON object (got {type(sample).__name__})")
            samples.append(migrate.sample_line(sample))
        return samples

    def save(self) -> None:
        self.record["updated"] = _now()
        write_json_atomic(self.path / RUN_RECORD, self.record)

    def set(self, **fields: Any) -> None:
        self.record.update(fields)
        self.save()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_run(root: Path, hosts: list[str], record: dict) -> Run:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    label = hosts[0] if len(hosts) == 1 else f"{hosts[0]}+{len(hosts) - 1}"
    path = root / f"{stamp}-{label}-{secrets.token_hex(2)}"
    path.mkdir(parents=True)
    run = Run(path, {"run": path.name, "created": _now(), "status": "planned", "hosts": hosts, **record})
    run.save()
    return run


def load_run(path: Path) -> Run:
    try:
        record = decode_json((path / RUN_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} is not a dfo run folder (no {RUN_RECORD})") from None
    except ValueError as exc:
        raise InputError(f"{path / RUN_RECORD} is not valid JSON: {exc}") from None
    if not isinstance(record, dict):
        raise InputError(f"{path / RUN_RECORD}: not a JSON object (got {type(record).__name__})")
    return Run(path, record)


def scan_runs(root: Path) -> tuple[list[Run], list[tuple[Path, str]]]:
    """The run folders under ROOT, oldest first, and those whose run.json cannot be read (with what is wrong)."""
    runs, unreadable = [], []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if child.is_dir() and (child / RUN_RECORD).is_file():
            try:
                runs.append(load_run(child))
            except InputError as exc:
                unreadable.append((child, exc.message))
    return runs, unreadable


def list_runs(root: Path) -> list[Run]:
    return scan_runs(root)[0]


def find_run(root: Path, ref: str) -> Run:
    """A run by folder path, exact name, unique prefix/substring, or ``last``."""
    for direct in (Path(ref), root / ref):  # named exactly: a damaged run.json is reported, not passed over
        if (direct / RUN_RECORD).is_file():
            return load_run(direct)
    runs = list_runs(root)
    if not runs:
        raise InputError(f"no runs in {root}/", hint="run `dfo eval` first, or set DFO_RUNS_DIR")
    if ref == "last":
        return runs[-1]
    exact = [r for r in runs if r.name == ref]
    if exact:
        return exact[0]
    matches = [r for r in runs if r.name.startswith(ref)] or [r for r in runs if ref in r.name]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise InputError(f"no run matches {ref!r} in {root}/",
                         hint="known runs: " + ", ".join(r.name for r in runs[-8:]))
    raise InputError(f"{ref!r} matches {len(matches)} runs: " + ", ".join(r.name for r in matches[:8]),
                     hint="give more of the name")
