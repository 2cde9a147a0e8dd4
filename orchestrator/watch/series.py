"""The series: one folder per watched training run, ``runs/series/<name>/``, holding the watcher's state.

The state is ``series.json`` (schema ``dfo.series/2``, a snapshot) plus ``series.journal`` (one JSON line per
change since that snapshot: a checkpoint's whole entry, or the baselines). A change appends one line, so an
update costs the same at the 1,000th checkpoint as at the first; every ``COMPACT_EVERY`` lines the journal is
folded into a new snapshot (temp name, fsync, rename; then the journal is emptied: replaying it on the new
snapshot changes nothing, each line being a whole entry). ``load_series`` reads both; a series.json of an
older dfo (no journal) reads as before. A ``dfo.series/1`` series (and its journal) is read in the current layout:
its points' τ convention ``zlab`` (z-lab's April 2026 loop) is ``zlab-2604`` (``remote_payload/metrics/migrate.py``);
the next snapshot is written as ``dfo.series/2``. A last line cut short by a crash is ignored; any other bad line is
an error naming the file and the line. Per checkpoint name, one entry moves through

    relaying → evaluating → done | failed

``relaying``: the attempt started, nothing on the eval host is trusted yet (a restart redoes it);
``evaluating``: the detached eval job runs (a restart reattaches to it and completes it). A checkpoint
is counted once: only ``done`` entries become points, one per name. ``failed`` entries keep the reason
and what the file looked like; a checkpoint the trainer rewrites afterwards (new size or mtime) is tried
again. The functions here only change the dict; ``record`` appends a change, ``save`` writes a snapshot.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import re
from pathlib import Path

from orchestrator.core.errors import InputError, OperationError
from orchestrator.core.host_text import decode_json
from orchestrator.evaluation.runs import write_json_atomic
from orchestrator.watch.discovery import Checkpoint
from orchestrator.watch.measures import VERDICTS
from remote_payload.metrics import migrate

SCHEMA = "dfo.series/2"  # /2: the τ conventions named by whose rule they are (zlab-2604 for the April count)
OLD_SCHEMAS = ("dfo.series/1",)  # read and migrated (``_migrate``)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
STATUSES = ("relaying", "evaluating", "done", "failed")
JOURNAL = "series.journal"
COMPACT_EVERY = 256  # journal lines folded into a new series.json (a rare O(N) write)


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
    """The series in FOLDER: series.json with series.journal replayed on it (None when it has no series.json);
    a file dfo cannot read is an InputError naming the file and the field (or the journal's line), so no
    command meets a missing key or a wrong type later."""
    path = folder / "series.json"
    if not path.exists():
        return None
    try:
        doc = decode_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path}: not readable JSON ({exc})", hint=_DAMAGED_HINT) from None
    if not isinstance(doc, dict) or doc.get("schema") not in (SCHEMA, *OLD_SCHEMAS):
        raise InputError(f"{path}: schema {doc.get('schema') if isinstance(doc, dict) else None!r}, "
                         f"expected {SCHEMA!r}", hint=_DAMAGED_HINT)
    if isinstance(doc.get("checkpoints"), dict):
        doc["journal_lines"] = _replay(folder / JOURNAL, doc)
    if doc["schema"] in OLD_SCHEMAS:
        _migrate(doc)
    problem = series_problem(doc)
    if problem:
        where = f"{path} (with {folder / JOURNAL})" if doc.get("journal_lines") else str(path)
        raise InputError(f"{where}: {problem}", hint=_DAMAGED_HINT)
    doc["steps"] = points(doc)
    return doc


def _migrate(doc: dict) -> None:
    """An old series (snapshot and journal replayed) in the current layout. Idempotent: a journal line appended by
    this dfo to a snapshot still marked /1 holds no ``zlab`` convention, so it is left as it is."""
    for e in (doc.get("checkpoints") or {}).values():
        if isinstance(e, dict):
            migrate.series_measures(e.get("measures"))
    baselines = doc.get("baselines")
    for measures in ((baselines.get("drafters") or {}) if isinstance(baselines, dict) else {}).values():
        migrate.series_measures(measures)
    doc["migrated_from"], doc["schema"] = doc["schema"], SCHEMA


def public(series: dict) -> dict:
    """The series as `series show --json` prints it (the journal's bookkeeping left out)."""
    return {k: v for k, v in series.items() if k != "journal_lines"}


def _replay(journal: Path, doc: dict) -> int:
    """Apply each line of JOURNAL to DOC; returns the lines applied."""
    try:
        raw = journal.read_bytes()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise InputError(f"{journal}: cannot read it ({exc})", hint=_DAMAGED_HINT) from None
    lines = raw.split(b"\n")[:-1]  # past the last newline: nothing, or a line a crash cut short (never acted on)
    for number, line in enumerate(lines, 1):
        try:
            change = decode_json(line)
        except (UnicodeDecodeError, ValueError):
            change = None
        t = change.get("t") if isinstance(change, dict) else None
        if isinstance(change, dict) and isinstance(change.get("entry"), dict) and \
                isinstance(change["entry"].get("name"), str):
            doc["checkpoints"][change["entry"]["name"]] = change["entry"]
        elif isinstance(change, dict) and "baselines" in change:
            doc["baselines"] = change["baselines"]
        elif isinstance(change, dict) and isinstance(change.get("removed"), str):
            doc["checkpoints"].pop(change["removed"], None)
        else:
            raise InputError(f"{journal} line {number}: expected {{\"entry\": {{…}}}}, {{\"baselines\": …}} or "
                             "{\"removed\": NAME}",
                             hint=_DAMAGED_HINT)
        if isinstance(t, str):
            doc["updated_utc"] = t
    return len(lines)


_DAMAGED_HINT = "restore it or move the folder away; the run folders it points to are intact"


def series_problem(doc: dict) -> str | None:
    """What makes DOC unusable as a series ('checkpoints.step_7.pt.step: expected an integer, got str'), or None.

    Checks the fields the commands read; a verdict may be missing (shown as '–'), extra keys are kept."""
    for key in ("name", "source", "eval_host", "updated_utc"):
        if not isinstance(doc.get(key), str):
            return _expected(key, "a string", doc.get(key))
    for key in ("settings", "checkpoints"):
        if not isinstance(doc.get(key), dict):
            return _expected(key, "an object", doc.get(key))
    for name, e in doc["checkpoints"].items():
        problem = _entry_problem(e)
        if problem:
            return f"checkpoints.{name}{problem}"
    base = doc.get("baselines")
    if base is not None:
        if not isinstance(base, dict) or not isinstance(base.get("drafters"), dict):
            return _expected("baselines.drafters", "an object", base)
        for name, m in base["drafters"].items():
            problem = _measures_problem(m)
            if problem:
                return f"baselines.drafters.{name}{problem}"
    return None


def _entry_problem(e: object) -> str | None:
    if not isinstance(e, dict):
        return _expected("", "an object", e)
    if not isinstance(e.get("name"), str):
        return _expected(".name", "a string", e.get("name"))
    if not _is_int(e.get("step")):
        return _expected(".step", "an integer", e.get("step"))
    if e.get("status") not in STATUSES:
        return _expected(".status", " or ".join(STATUSES), e.get("status"))
    if e["status"] != "done":
        return None
    if not isinstance(e.get("run"), str):
        return _expected(".run", "the run folder's name", e.get("run"))
    problem = _measures_problem(e.get("measures"))
    if problem:
        return f".measures{problem}"
    v = e.get("verdict")
    if v is not None and not (isinstance(v, dict) and v.get("verdict") in VERDICTS):
        return _expected(".verdict", "an object with verdict " + "/".join(VERDICTS), v)
    if v and v.get("verdict") != "first" and not (_is_stat_ci(v.get("ci")) and _is_number(v.get("delta"))):
        return _expected(".verdict", "delta and ci as numbers (or null)", v)
    return _proxy_problem(e)


def _proxy_problem(e: dict) -> str | None:
    """The optional fields of `dfo watch --proxy-logdir` (a series written without them reads as before)."""
    proxy = e.get("proxy")
    if proxy is not None and not (isinstance(proxy, dict) and isinstance(proxy.get("name"), str)
                                  and _is_number(proxy.get("value")) and proxy.get("value") is not None
                                  and _is_int(proxy.get("logged_step"))):
        return _expected(".proxy", "{name, value, logged_step, source, logdir}", proxy)
    alert = e.get("proxy_alert")
    if alert is not None and not (isinstance(alert, dict) and isinstance(alert.get("text"), str)
                                  and _is_int(alert.get("since"))):
        return _expected(".proxy_alert", "{kind, since, text, …}", alert)
    return None


def _measures_problem(m: object) -> str | None:
    if not isinstance(m, dict):
        return _expected("", "an object", m)
    for key in ("tau_macro", "tau_micro", "ddtree"):
        if not _is_stat(m.get(key)):
            return _expected(f".{key}", "{value, ci} with numbers (or null)", m.get(key))
    if not isinstance(m.get("p"), list) or not all(_is_stat(p) and _is_int(p.get("k")) for p in m["p"]):
        return _expected(".p", "a list of {k, value, ci}", m.get("p"))
    by_dataset = m.get("by_dataset", {})  # runs on benchmark datasets only
    if not isinstance(by_dataset, dict) or not all(isinstance(d, dict) and _is_stat(d.get("tau_macro"))
                                                   for d in by_dataset.values()):
        return _expected(".by_dataset", "{dataset: {tau_macro: {value, ci}}}", by_dataset)
    return None


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return x is None or (isinstance(x, (int, float)) and not isinstance(x, bool))


def _is_stat_ci(ci: object) -> bool:
    return ci is None or (isinstance(ci, list) and len(ci) == 2 and all(_is_number(c) and c is not None for c in ci))


def _is_stat(stat: object) -> bool:
    return isinstance(stat, dict) and _is_number(stat.get("value")) and _is_stat_ci(stat.get("ci"))


def _expected(field: str, what: str, got: object) -> str:
    shown = "null" if got is None else type(got).__name__
    return f"{field}: expected {what}, got {shown}"


def save(folder: Path, series: dict) -> None:
    """A new snapshot: series.json written whole (temp name, fsync, rename), then the journal emptied."""
    series["updated_utc"] = _now()
    series["steps"] = points(series)
    series.pop("journal_lines", None)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / "series.json", series)
    journal = folder / JOURNAL
    if journal.exists():
        journal.unlink()  # its lines are in the snapshot now (replaying them again would change nothing)
    series["journal_lines"] = 0


def record(folder: Path, series: dict, *, entry: dict | None = None, baselines: bool = False,
           removed: str | None = None) -> None:
    """One change: ENTRY (a checkpoint's whole entry), the series' baselines, or the entry named REMOVED gone,
    appended to the journal as one line (one write(2) of a few KB, fsync'd); every COMPACT_EVERY lines, a new
    snapshot instead."""
    if not (folder / "series.json").exists() or series.get("journal_lines", 0) + 1 >= COMPACT_EVERY:
        save(folder, series)
        return
    series["updated_utc"] = _now()
    change: dict = {"t": series["updated_utc"]}
    if entry is not None:
        change["entry"] = entry
    if baselines:
        change["baselines"] = series.get("baselines")
    if removed is not None:
        change["removed"] = removed
    line = (json.dumps(change, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(folder / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        _append_whole(fd, line, folder / JOURNAL)
        os.fsync(fd)
    finally:
        os.close(fd)
    series["journal_lines"] = series.get("journal_lines", 0) + 1


def _append_whole(fd: int, line: bytes, path: Path) -> None:
    """LINE appended whole: a short write(2) (a signal, a nearly full disk) goes on with the rest; one that
    cannot finish is cut back off, so the next line does not join a fragment into one that reads as damage."""
    start = os.fstat(fd).st_size
    done = 0
    try:
        while done < len(line):
            n = os.write(fd, line[done:])
            if n <= 0:
                raise OSError(f"write(2) wrote nothing of the last {len(line) - done} bytes")
            done += n
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)
        raise OperationError(f"{path}: could not append the change ({exc}); the series is as before it",
                             hint="free space on that disk and run the watcher again") from None


def draft_rule_of(settings: dict) -> str | None:
    """The rule a series' figures follow at T > 0: its --draft-rule, the payload's default (sampled) when not
    given, and greedy for a series started before the option existed (the rule every run had then); None at
    T = 0, where the rule does not apply."""
    temperature = settings.get("temperature")
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        return None
    if "draft_rule" not in settings:
        return "greedy"
    return settings["draft_rule"] or "sampled"


def check_same_settings(series: dict, source: str, eval_host: str, settings: dict,
                        defaults: dict | None = None) -> None:
    """A series compares like with like: the same source folder, eval host and eval settings throughout.

    ``defaults``: each option's value when not given. A series started before an option existed lacks its key;
    that is no difference while the option keeps its default (a new option must not orphan every series).
    ``drafter_spec`` (watch's --drafter-spec) may change while no checkpoint of the series was evaluated: the
    error of a checkpoint without a spec asks for it."""
    defaults = defaults or {}
    diffs = []
    if series["source"] != source:
        diffs.append(f"source {series['source']} → {source}")
    if series["eval_host"] != eval_host:
        diffs.append(f"eval host {series['eval_host']} → {eval_host}")
    for key in sorted(set(series["settings"]) | set(settings)):
        if key == "draft_rule":
            old, new = draft_rule_of(series["settings"]), draft_rule_of(settings)
            if old != new:
                diffs.append(f"draft rule {old!r} → {new!r} (pass --draft-rule {old} to continue the series)")
            continue
        if key not in series["settings"] and key in defaults and settings.get(key) == defaults[key]:
            continue
        if series["settings"].get(key) != settings.get(key):
            if key == "drafter_spec" and not any(e.get("status") == "done" for e in
                                                 (series.get("checkpoints") or {}).values()):
                continue  # nothing evaluated yet to compare with: the spec the failed checkpoints lacked may come now
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
                    "verdict": (e.get("verdict") or {}).get("verdict"),
                    **({"proxy": e["proxy"]} if e.get("proxy") else {}),
                    **({"proxy_alert": e["proxy_alert"]} if e.get("proxy_alert") else {})})
    return out


def failures(series: dict) -> list[dict]:
    return sorted((e for e in series["checkpoints"].values() if e["status"] == "failed"), key=lambda e: e["step"])
