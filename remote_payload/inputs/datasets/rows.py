"""A dataset's rows from a file on this machine: JSON lines (HF ``Dataset.to_json``'s format, also gzipped),
parquet or arrow (HF hub and ``datasets`` caches; read with pyarrow where it is installed), or a folder holding
the split's file(s) (an export folder, a hub cache ``datasets--OWNER--NAME`` folder, a snapshot in it).

Nothing is downloaded: the hosts run offline. The digest is the sha256 of the bytes read (the file names too
when a split is several shards), so two runs are known to have read the same rows.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from remote_payload.errors import PayloadError

JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz")
ARROW_SUFFIXES = (".parquet", ".arrow")
EXPORT_HINT = ("export the split once on a machine with hub access (docs/datasets.md: one python -c line "
               "writes a .jsonl), then give its path")


@dataclass
class SourceRows:
    rows: list
    files: list[str]  # the files read, in order
    sha256: str
    fmt: str          # "jsonl" | "parquet" | "arrow"


def read_rows(path: Path, split: str, config: str | None = None) -> SourceRows:
    """Every row of ``path`` (a file, or a folder holding ``split``'s files), in the file's order."""
    if path.is_dir():
        files = split_files(path, split, config)
        if not files:
            raise PayloadError(f"{path}: no file of split {split!r} in this folder ({split}*.jsonl / .parquet / "
                               f"*-{split}.arrow, also under {config or 'CONFIG'}/ and snapshots/*/); {EXPORT_HINT}")
    elif path.is_file():
        files = [path]
    else:
        raise PayloadError(f"{path}: no such file or folder; {EXPORT_HINT}")
    digest = hashlib.sha256()
    rows: list = []
    fmt = ""
    for f in files:
        data = f.read_bytes()
        if len(files) > 1:
            digest.update(f.name.encode() + b"\0")
        digest.update(data)
        fmt, part = _parse(f, data)
        rows += part
    if not rows:
        raise PayloadError(f"{path}: holds no rows")
    return SourceRows(rows, [str(f) for f in files], digest.hexdigest(), fmt)


def split_files(folder: Path, split: str, config: str | None) -> list[Path]:
    """The split's files in a folder: the folder itself, CONFIG/, and snapshots/*/[CONFIG/] (a hub cache)."""
    places = [folder, *([folder / config] if config else [])]
    for snap in sorted((folder / "snapshots").glob("*")) if (folder / "snapshots").is_dir() else []:
        places += [snap, *([snap / config] if config else [])]
    for place in places:
        found = sorted(p for p in place.glob("*") if p.is_file() and _of_split(p.name, split))
        if found:
            return found
    return []


def _of_split(name: str, split: str) -> bool:
    if not name.endswith(JSON_SUFFIXES + ARROW_SUFFIXES):
        return False
    stem = name.split(".", 1)[0]
    return stem == split or stem.startswith(split + "-") or stem.endswith("-" + split) or f"-{split}-" in stem


def _parse(path: Path, data: bytes) -> tuple[str, list]:
    name = path.name
    if name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise PayloadError(f"{path}: not a readable gzip file ({exc})") from None
        name = name[:-3]
    if name.endswith((".jsonl", ".json")):
        return "jsonl", _json_rows(path, data)
    if name.endswith(ARROW_SUFFIXES):
        return name.rsplit(".", 1)[1], _arrow_rows(path)
    raise PayloadError(f"{path}: expected a .jsonl, .json, .jsonl.gz, .parquet or .arrow file")


def _json_rows(path: Path, data: bytes) -> list:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PayloadError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array (to_json(lines=False))
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PayloadError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return rows if isinstance(rows, list) else [rows]
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise PayloadError(f"{path} line {lineno}: not valid JSON ({exc.msg})") from None
    return rows


def _arrow_rows(path: Path) -> list:
    try:
        import pyarrow.parquet as pq  # noqa: F401 - only for parquet/arrow sources
        from pyarrow import ipc
    except ImportError:
        raise PayloadError(f"{path}: reading parquet/arrow needs pyarrow, which this venv lacks; give the split as "
                           "JSON lines instead (docs/datasets.md: one command converts it)") from None
    try:
        if path.suffix == ".parquet":
            table = pq.read_table(str(path))
        else:
            with open(path, "rb") as fh:
                try:
                    table = ipc.open_stream(fh).read_all()  # the datasets cache writes IPC streams
                except Exception:  # noqa: BLE001 - the other IPC layout
                    fh.seek(0)
                    table = ipc.open_file(fh).read_all()
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors are many; any of them means an unreadable file
        raise PayloadError(f"{path}: not a readable {path.suffix[1:]} file ({type(exc).__name__}: {exc})") from None
    return table.to_pylist()
