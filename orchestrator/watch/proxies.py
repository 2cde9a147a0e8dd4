"""The trainer's own numbers (its proxies for τ), read on the training host and matched to checkpoints.

The host side (proxy_host_script.py, stdlib only) reads TensorBoard event files, trainer_state.json's
log_history and JSONL metric logs under the run's logdir. Its answer is data from another machine:
``parse_proxies`` keeps only wanted tags, numbers within ±MAX_VALUE (a proxy is an accuracy, an acceptance
length or a loss: a value beyond that is no measurement, and one of 1e155 would overflow the statistics) and
integer steps inside bounds; ``parse_origins`` the file each value was read from. ``at_checkpoints``
matches each checkpoint step to the proxy value logged at that step, or the last one logged since the
previous checkpoint (trainers log every N steps and save every M).

A proxy is named by its tag; a leading ``-`` marks one where lower is better (a loss), which the
statistics (divergence.py) see negated so that "the proxy climbs" always means "the trainer thinks it
got better".
"""

from __future__ import annotations

import math
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.transport import Connector, hostcall

HOST_SCRIPT = Path(__file__).with_name("proxy_host_script.py")
MAX_BYTES = 64 * 1024 * 1024    # read at most this much of each log file
MAX_RECORDS = 100_000           # keep at most this many values per tag
MAX_STEP = 10 ** 12
MAX_VALUE = 1e9                 # |proxy value| kept at most (see the module's text)

# Looked for in this order; the first one the run logged is the proxy. SpecForge logs per-position accuracy
# and loss as train/acc_{i} and train/ploss_{i}; Hugging Face Trainer-based trainers write loss and eval_loss
# into trainer_state.json's log_history.
DEFAULT_PROXIES = ("train/acc_0", "eval/acc_0", "acc_0", "-eval_loss", "-train/ploss_0", "-train/loss", "-loss")


def tag_of(proxy: str) -> str:
    return proxy[1:] if proxy.startswith("-") else proxy


def check_proxy_names(proxies: list[str] | tuple[str, ...], where: str) -> list[str]:
    out = []
    for p in proxies:
        if not isinstance(p, str) or not tag_of(p).strip() or len(p) > 200:
            raise InputError(f"{where}: proxy {p!r:.60} is not a tag name (a TensorBoard tag or log key; "
                             "a leading '-' marks one where lower is better)")
        out.append(p)
    return out


def parse_proxies(doc: object, proxies: list[str] | tuple[str, ...], host: str) -> dict[str, list[tuple[int, float]]]:
    """{proxy: [(step, value), …]} from the host's answer, value negated for a lower-is-better proxy."""
    if not isinstance(doc, dict) or not isinstance(doc.get("series"), dict):
        raise InputError(f"{host}: the proxy reader's answer is not a mapping with 'series'")
    out: dict[str, list[tuple[int, float]]] = {}
    for proxy in proxies:
        rows = doc["series"].get(tag_of(proxy))
        if not isinstance(rows, list):
            continue
        sign = -1.0 if proxy.startswith("-") else 1.0
        good: dict[int, float] = {}
        for row in rows[-MAX_RECORDS:]:
            if not (isinstance(row, list) and len(row) in (2, 3)):
                continue
            step, value = row[0], row[1]
            if (isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP
                    and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and abs(value) <= MAX_VALUE):
                good[step] = sign * float(value)
        if good:
            out[proxy] = sorted(good.items())
    return out


def choose(series: dict[str, list[tuple[int, float]]], proxies: list[str] | tuple[str, ...]) -> str | None:
    """The first proxy in ``proxies`` the run logged."""
    return next((p for p in proxies if series.get(p)), None)


def at_checkpoints(values: list[tuple[int, float]], steps: list[int]) -> dict[int, tuple[int, float]]:
    """{checkpoint step: (logged step, value)}: the value at the step, else the last one logged after the
    previous checkpoint and not after this one; a checkpoint with none gets no entry."""
    out: dict[int, tuple[int, float]] = {}
    previous = -1
    for step in sorted(set(steps)):
        window = [(s, v) for s, v in values if previous < s <= step]
        if window:
            out[step] = window[-1]
        previous = step
    return out


SOURCES = {"tensorboard": "TensorBoard events", "trainer_state.json": "trainer_state.json", "jsonl": "JSONL log"}


def parse_sources(doc: object, series: dict[str, list[tuple[int, float]]]) -> dict[str, str]:
    """{proxy: kind of log it came from} for the proxies in SERIES (an unknown kind reads "log")."""
    sources = doc.get("sources") if isinstance(doc, dict) else None
    sources = sources if isinstance(sources, dict) else {}
    out = {}
    for p in series:
        kind = sources.get(tag_of(p))
        out[p] = kind if isinstance(kind, str) and kind in SOURCES else "log"
    return out


def parse_origins(doc: object, series: dict[str, list[tuple[int, float]]]) -> dict[str, dict[int, str]]:
    """{proxy: {step: the file (relative to the logdir, else absolute) its value was read from}} for the values
    in SERIES; a step whose row names no valid file index, or a file name that is no printable text of at most
    400 characters, has no entry (pure: the host's answer is data)."""
    files = doc.get("files") if isinstance(doc, dict) else None
    files = files if isinstance(files, list) else []
    answer = doc.get("series") if isinstance(doc, dict) else None
    out: dict[str, dict[int, str]] = {}
    for proxy, values in series.items():
        rows = answer.get(tag_of(proxy)) if isinstance(answer, dict) else None
        kept = {step for step, _ in values}
        mine: dict[int, str] = {}
        for row in rows[-MAX_RECORDS:] if isinstance(rows, list) else []:
            if not (isinstance(row, list) and len(row) == 3 and row[0] in kept):
                continue
            index = row[2]
            if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(files):
                name = files[index]
                if isinstance(name, str) and 0 < len(name) <= 400 and name.isprintable():
                    mine[row[0]] = name
        out[proxy] = mine
    return out


def fetch(connector: Connector, host: str, logdir: str, proxies: list[str] | tuple[str, ...],
          prefer: tuple[str, ...] = ()
          ) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str], dict[str, dict[int, str]]]:
    """The proxies' logged values under LOGDIR on HOST (validated; empty when none was logged), the kind of
    log each came from and the file of each value. PREFER: folders whose trainer_state.json is read before
    any other (the checkpoint's own folder)."""
    python = connector.inventory.hosts[host].python
    doc = hostcall.call(connector.session(host), HOST_SCRIPT, "read_proxies", python=python, timeout=120,
                        logdir=logdir, tags=sorted({tag_of(p) for p in proxies}), max_bytes=MAX_BYTES,
                        max_records=MAX_RECORDS, prefer=list(prefer))
    if isinstance(doc, dict) and "error" in doc:
        raise InputError(f"{host}: {str(doc['error'])[:300]}")
    series = parse_proxies(doc, proxies, host)
    return series, parse_sources(doc, series), parse_origins(doc, series)


def read_proxies(connector: Connector, host: str, logdir: str, proxies: list[str] | tuple[str, ...]
                 ) -> dict[str, list[tuple[int, float]]]:
    """The proxies' logged values under LOGDIR on HOST (validated; empty when none was logged)."""
    return fetch(connector, host, logdir, proxies)[0]
