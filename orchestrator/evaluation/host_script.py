# Host side of `dfo eval`'s own calls (evaluation/operation.py), behind the shared prelude (stdlib only,
# Python >= 3.8): the input checks made before anything is uploaded or relayed, and the prompts upload's
# folder and digest.
import gzip
import os
import zlib

# What a dataset's rows may be stored as (remote_payload/inputs/datasets/rows.py reads them after the deploy).
ROW_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".parquet", ".arrow")


def input_facts(paths, workdir, list_gpus, rows=()):
    """Which of PATHS do not exist, which are files of 0 bytes, which of ROWS (dataset files or folders) hold no
    rows (a code for what was found); the free bytes at WORKDIR (when given); the GPUs `nvidia-smi -L` lists
    (when LIST_GPUS)."""
    found = {p: _no_rows(p) for p in rows if os.path.exists(p) and not _empty(p)}
    facts = {"missing": [p for p in paths if not os.path.exists(p)], "empty": [p for p in paths if _empty(p)],
             "no_rows": {p: what for p, what in found.items() if what}}  # type: dict
    if workdir is not None:
        facts["free_bytes"] = _free_bytes(workdir)
    if list_gpus:
        facts["gpus"] = _command_lines(["nvidia-smi", "-L"])
    return facts


def _empty(path):
    try:
        return os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return False


def _no_rows(path):
    """None when PATH may hold rows (or its format is read only after the deploy: parquet, arrow), else what it
    holds instead: "folder-empty" (no rows file in the folder, its config folder or a hub snapshot),
    "gzip-unreadable", "gzip-empty", "blank" (whitespace only), "empty-array" (a JSON []). Reads up to the first
    row only."""
    if os.path.isdir(path):
        return None if _rows_files(path) else "folder-empty"
    name = os.path.basename(path)
    if not name.endswith(ROW_SUFFIXES[:4]):
        return None
    try:
        with (gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")) as fh:
            lead = _leading(fh)
    except (OSError, EOFError, zlib.error):
        return "gzip-unreadable" if name.endswith(".gz") else None
    if not lead:
        return "gzip-empty" if name.endswith(".gz") else "blank"
    return "empty-array" if lead == b"[]" else None


def _leading(fh, n=2):
    """The first N bytes of FH that are not whitespace (fewer at its end)."""
    out = b""
    while len(out) < n:
        block = fh.read(1 << 16)
        if not block:
            break
        out += b"".join(block.split())[: n - len(out)]
    return out


def _rows_files(folder, depth=3):
    """Whether a rows file lies in FOLDER or its subfolders down to DEPTH (CONFIG/, snapshots/REV/CONFIG/)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return True  # not listable here: the eval's own read says why
    for e in entries:
        if e.is_file() and e.name.endswith(ROW_SUFFIXES):
            return True
    return depth > 1 and any(_rows_files(e.path, depth - 1) for e in entries if e.is_dir(follow_symlinks=False))


def make_folder(path):
    os.makedirs(path, exist_ok=True)
    return True


def file_sha256(path):
    return _sha256(path)
