"""τ as TensorBoard scalars at each checkpoint's training step: `--tensorboard DIR` on this machine,
`--tensorboard-logdir DIR` into the trainer's own logdir on the training host (so τ sits beside the loss).

Each evaluated checkpoint becomes one small event file (tensorboardX's record writer and protobufs, the
format TensorBoard reads), named so that files sort in the order they were written
(``events.out.tfevents.<10-digit time>.dfo-watch.<series>.<step>``): TensorBoard reads a run's files in name
order and never goes back to an earlier one. A file is written under a temporary name and renamed; on the
training host it is pushed with the eval's upload (exclusive temporary name, sha256 checked, rename) into
``DIR/dfo-<series>/``: a run of its own beside the trainer's (an event file dropped among the trainer's
own would stop TensorBoard reading them). Checkpoints evaluated before the option was given are written
once, in one file, when a watcher starts with it.

Scalars (``scalars``): ``dflash/tau_macro`` (committed convention), ``dflash/tau_micro``,
``dflash/tau_zlab-2604`` and ``dflash/tau_vllm`` (the other conventions, when the run had them),
``dflash/ddtree_<k>``, ``dflash/p1``..``p4``, ``dflash_dataset/<dataset>`` (τ macro per benchmark dataset),
``dflash_baseline/<name>`` (each baseline's τ macro, a flat line at every step) and, with --proxy-logdir,
``dflash_proxy/<tag>`` (the trainer's proxy at the checkpoint's step); a proxy alert is a text summary
``dflash/proxy_alert`` at the step where it fired.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import re
import struct
import tempfile
import time
from pathlib import Path

from orchestrator.core.errors import InputError, OperationError
from orchestrator.watch.measures import TREE_K_MAX

INSTALL = "pip install 'tensorboardX>=2.6' (or the tensorboard extra: pip install 'dfo[tensorboard]')"


def available() -> str | None:
    """None when tensorboardX can be imported, else what to install."""
    try:
        import tensorboardX.record_writer  # noqa: F401
    except ImportError:
        return INSTALL
    return None


def check(local: str | None, logdir: str | None) -> None:
    """The options, before anything connects."""
    if (local or logdir) and available():
        raise InputError("--tensorboard / --tensorboard-logdir: tensorboardX is not installed for this Python",
                         hint=INSTALL)
    if logdir is not None and not logdir.startswith("/"):
        raise InputError(f"--tensorboard-logdir {logdir!r}: expected an absolute path on the training host",
                         hint="the trainer's TensorBoard logdir, e.g. /data/tb/run7")


def _tag_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:64] or "_"


def scalars(entry: dict, baselines: dict | None = None) -> list[tuple[str, float]]:
    """(tag, value) of a done entry; values that are missing (None) are left out."""
    m = entry["measures"]
    out: list[tuple[str, object]] = [("dflash/tau_macro", m["tau_macro"]["value"]),
                                     ("dflash/tau_micro", m["tau_micro"]["value"])]
    for name, value in (m.get("conventions") or {}).items():
        out.append((f"dflash/tau_{_tag_part(name)}", value))
    k = m["ddtree"].get("k")  # validated where it was read (watch/measures.py); a series of an older dfo may not be
    if k is None or (isinstance(k, int) and not isinstance(k, bool) and 0 < k <= TREE_K_MAX):
        out.append((f"dflash/ddtree_{k or 8}", m["ddtree"]["value"]))
    out += [(f"dflash/p{p['k']}", p["value"]) for p in m["p"]]
    for name, d in sorted((m.get("by_dataset") or {}).items()):
        out.append((f"dflash_dataset/{_tag_part(name)}", (d.get("tau_macro") or {}).get("value")))
    for name, b in sorted(((baselines or {}).get("drafters") or {}).items()):
        out.append((f"dflash_baseline/{_tag_part(name)}", (b.get("tau_macro") or {}).get("value")))
    proxy = entry.get("proxy")
    if isinstance(proxy, dict):  # the trainer's proxy as it logged it, beside τ in dfo's own run
        out.append((f"dflash_proxy/{_tag_part(str(proxy.get('name', '')).lstrip('-'))}", proxy.get("value")))
    return [(tag, float(v)) for tag, v in out if isinstance(v, (int, float)) and not isinstance(v, bool)]


def file_name(series: str, step: int | str, now: float | None = None) -> str:
    return f"events.out.tfevents.{int(now if now is not None else time.time()):010d}.dfo-watch.{series}.{step}"


def event_bytes(entries: list[dict], baselines: dict | None = None, now: float | None = None) -> bytes:
    """An event file holding every scalar of ENTRIES (done entries), each at its checkpoint's step."""
    from tensorboardX.proto import event_pb2, summary_pb2

    wall = now if now is not None else time.time()
    events = [event_pb2.Event(wall_time=wall, file_version="brain.Event:2")]
    from tensorboardX.summary import text

    for e in entries:
        values = [summary_pb2.Summary.Value(tag=tag, simple_value=v) for tag, v in scalars(e, baselines)]
        alert = e.get("proxy_alert")
        if isinstance(alert, dict):  # TensorBoard's Text tab, at the step where the alert fired
            values += list(text("dflash/proxy_alert", str(alert.get("text"))).value)
        events.append(event_pb2.Event(wall_time=wall, step=int(e["step"]), summary=summary_pb2.Summary(value=values)))
    return b"".join(_record(ev.SerializeToString()) for ev in events)


def _record(data: bytes) -> bytes:
    """One TFRecord, framed as tensorboardX's RecordWriter.write frames it (length, masked CRC32C of each)."""
    from tensorboardX.record_writer import masked_crc32c

    header = struct.pack("Q", len(data))
    return header + struct.pack("I", masked_crc32c(header)) + data + struct.pack("I", masked_crc32c(data))


def write_local(folder: Path, name: str, data: bytes) -> Path:
    """FOLDER/NAME written whole: an exclusive, unpredictable temporary name (mkstemp: O_CREAT|O_EXCL, so a
    link planted in a shared logdir is never followed), fsync, rename over NAME (a link there is replaced,
    not followed). A folder in the way, or a logdir dfo cannot write, is an OperationError naming it."""
    tmp: str | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / name)
        tmp = None
    except OSError as exc:
        raise OperationError(f"cannot write the TensorBoard event file {folder / name}: "
                             f"{exc.strerror or exc}",
                             hint="remove what is in the way or choose another --tensorboard folder") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return folder / name


def push(connector, host: str, logdir: str, series: str, name: str, data: bytes) -> str:
    """NAME into LOGDIR/dfo-SERIES/ on HOST with the eval's safe upload; returns HOST:PATH."""
    from orchestrator.evaluation.prepare import put_file

    remote = posixpath.join(logdir, f"dfo-{series}", name)
    put_file(connector, host, data, hashlib.sha256(data).hexdigest(), remote, "the TensorBoard event file")
    return f"{host}:{remote}"
