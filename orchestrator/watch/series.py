"""The series: one folder per watched training run, ``runs/series/<name>/``, holding the watcher's state.

``series.json`` (schema ``dfo.series/1``) is both the record a person reads and the state a restarted
watcher resumes from. Per checkpoint name, one entry moves through

    relaying → evaluating → done | failed

``relaying``: the attempt started, nothing on the eval host is trusted yet (a restart redoes it);
``evaluating``: the detached eval job runs (a restart reattaches to it and completes it). A checkpoint
is counted once: only ``done`` entries become points, one per name. ``failed`` entries keep the reason
and what the file looked like; a checkpoint the trainer rewrites afterwards (new size or mtime) is tried
again. The functions here only change the dict; ``save`` writes it atomically.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.evaluation.runs import write_json_atomic
from orchestrator.watch.discovery import Checkpoint

SCHEMA = "dfo.series/1"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
STATUSES = ("relaying", "evaluating", "done", "failed")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def series_root(runs_dir: Path) -> Path:
    return runs_dir / "series"


def series_dir(runs_dir: Path, name: str) -> Path:
    if not NAME_RE.match(name):
        raise InputError(f"series name {name!r}: use letters, digits, '.', '_' or '-' (at most 64)")
    return series_root(runs_dir) / name


def new_series(name: str, *, source: str, eval_host: str, settings: dict) -> dict:
    return {"schema": SCHEMA, "name": name, "created_utc": _now(), "updated_utc": _now(), "source": source,
            "eval_host": eval_host, "settings": settings, "baselines": None, "checkpoints": {}, "steps": []}


def load_series(folder: Path) -> dict | None:
    path = folder / "series.json"
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})",
                         hint="restore it or move the folder away; the run folders it points to are intact") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise InputError(f"{path}: schema {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                         f"expected {SCHEMA!r}")
    return doc


def save(folder: Path, series: dict) -> None:
    series["updated_utc"] = _now()
    series["steps"] = points(series)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "series.json", series)


def check_same_settings(series: dict, source: str, eval_host: str, settings: dict) -> None:
    """A series compares like with like: the same source folder, eval host and eval settings throughout."""
    diffs = []
    if series["source"] != source:
        diffs.append(f"source {series['source']} → {source}")
    if series["eval_host"] != eval_host:
        diffs.append(f"eval host {series['eval_host']} → {eval_host}")
    for key in sorted(set(series["settings"]) | set(settings)):
        if series["settings"].get(key) != settings.get(key):
            diffs.append(f"{key} {series['settings'].get(key)!r} → {settings.get(key)!r}")
    if diffs:
        raise InputError(f"series {series['name']!r} was started with other settings: " + "; ".join(diffs),
                         hint="use the same options, or start a new series with --series NAME")


# ------------------------------------------------------------------------------ entries


def entry(series: dict, name: str) -> dict | None:
    return series["checkpoints"].get(name)


def begin_attempt(series: dict, ckpt: Checkpoint) -> dict:
    old = series["checkpoints"].get(ckpt.name) or {}
    superseded = list(old.get("superseded_runs", []))
    if old.get("run") and old.get("status") != "done":
        superseded.append(old["run"])  # an abandoned attempt's run folder: never counted
    e: dict = {"name": ckpt.name, "path": ckpt.path, "step": ckpt.step, "step_source": ckpt.step_source,
         "status": "relaying", "attempts": int(old.get("attempts", 0)) + 1, "observed": ckpt.observed,
         "started_utc": _now(), "run": None, "superseded_runs": superseded}
    if old.get("error"):
        e["previous_error"] = old["error"]
    series["checkpoints"][ckpt.name] = e
    return e


def mark(series: dict, name: str, status: str, **fields) -> dict:
    if status not in STATUSES:
        raise ValueError(status)
    e = series["checkpoints"][name]
    e.update(fields, status=status)
    if status in ("done", "failed"):
        e["finished_utc"] = _now()
    return e


def done_entries(series: dict) -> list[dict]:
    """Evaluated checkpoints, ordered by step."""
    return sorted((e for e in series["checkpoints"].values() if e["status"] == "done"), key=lambda e: e["step"])


def best_before(series: dict, step: int) -> dict | None:
    """The highest-τ-macro done checkpoint at an earlier step (ties: the earlier one)."""
    best = None
    for e in done_entries(series):
        if e["step"] >= step:
            break
        tau = e["measures"]["tau_macro"]["value"]
        if tau is not None and (best is None or tau > best["measures"]["tau_macro"]["value"]):
            best = e
    return best


def recent_verdicts(series: dict, step: int) -> list[str]:
    return [e["verdict"]["verdict"] for e in done_entries(series) if e["step"] < step and e.get("verdict")]


def points(series: dict) -> list[dict]:
    """step → run and numbers, one per evaluated checkpoint (the part of series.json plots are made of)."""
    out = []
    for e in done_entries(series):
        m = e["measures"]
        out.append({"step": e["step"], "checkpoint": e["name"], "run": e["run"], "tau_macro": m["tau_macro"],
                    "tau_micro": m["tau_micro"], "ddtree": m["ddtree"], "p": m["p"],
                    "verdict": (e.get("verdict") or {}).get("verdict")})
    return out


def failures(series: dict) -> list[dict]:
    return sorted((e for e in series["checkpoints"].values() if e["status"] == "failed"), key=lambda e: e["step"])
