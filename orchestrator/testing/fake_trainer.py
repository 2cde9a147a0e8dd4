"""A fake trainer for the watch tests and the watch demo: writes step_N.pt checkpoints slowly.

Run on the training host with the payload's venv (torch). From one trained drafter checkpoint (the
fixtures' ``trained-drafter/checkpoint.pt``) it makes checkpoints of increasing quality: step N gets the
trained weights plus Gaussian noise whose scale shrinks with N (the last step: the trained weights), in
the team's training format (model + optimizer state + step + config). Each file is written in chunks
with pauses, straight to its final name, as trainers do, so a watcher can find it half-written.
``--corrupt STEP`` writes that step as bytes that are no checkpoint (an injected failure); ``--slow STEP``
spreads that step's writing over ``--slow-seconds`` (a file a watcher is sure to find half-written); once the
``--hurry PATH`` exists, the rest of it goes at ``--chunk-delay`` (a test lets it finish once it has looked).
``--wait-for PATH`` (repeatable) holds the second, third, … file back until the first, second, … PATH
exists (tests sequence the trainer with it).
``--proxy-logdir DIR`` logs a proxy the way trainers do (``train/acc_0`` in a TensorBoard event file, at each
step before its checkpoint), one that keeps improving; with ``--worse-from STEP`` the checkpoints from STEP on
get noisier again (worse drafters) while that proxy still climbs: the run a proxy alert is for.
The log (one JSON line per event) says when each file started and was complete, with its sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import struct
import time
from pathlib import Path

# -- the trainer's own proxy, as a TensorBoard event file (stdlib: the training host has no tensorboard package)

def _crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def _masked(data: bytes) -> int:
    crc = _crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # a length-delimited protobuf field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def scalar_record(tag: str, step: int, value: float, wall: float) -> bytes:
    """One TFRecord holding an Event (wall_time, step, Summary{Value{tag, simple_value}}), as TensorBoard reads."""
    summary_value = _field(1, tag.encode()) + bytes([2 << 3 | 5]) + struct.pack("<f", value)
    event = bytes([1 << 3 | 1]) + struct.pack("<d", wall) + bytes([2 << 3]) + _varint(step) \
        + _field(5, _field(1, summary_value))
    header = struct.pack("<Q", len(event))
    return header + struct.pack("<I", _masked(header)) + event + struct.pack("<I", _masked(event))


def log_proxy(logdir: Path, tag: str, step: int, value: float) -> None:
    """Appends one scalar to the run's event file (a first record names the file version, as writers do)."""
    logdir.mkdir(parents=True, exist_ok=True)
    path = logdir / "events.out.tfevents.0000000001.fake-trainer"
    head = b"" if path.exists() else _version_record()
    with path.open("ab") as fh:
        fh.write(head + scalar_record(tag, step, value, time.time()))
        fh.flush()
        os.fsync(fh.fileno())


def _version_record() -> bytes:
    event = bytes([1 << 3 | 1]) + struct.pack("<d", time.time()) + _field(3, b"brain.Event:2")
    header = struct.pack("<Q", len(event))
    return header + struct.pack("<I", _masked(header)) + event + struct.pack("<I", _masked(event))


def _log(path: Path, **event) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps({"t": time.time(), **event}) + "\n")


def noisy_checkpoint(source: Path, step: int, scale: float, spec: dict | None) -> bytes:
    import torch

    ckpt = torch.load(str(source), map_location="cpu", weights_only=True)
    gen = torch.Generator().manual_seed(step)
    model = {}
    for name, w in ckpt["model"].items():
        if scale and w.is_floating_point() and w.numel() > 1:
            w = w + scale * w.float().std() * torch.randn(w.shape, generator=gen, dtype=w.dtype)
        model[name] = w
    out = {**ckpt, "model": model, "step": step}
    if spec is not None:
        out["config"] = spec
    buf = io.BytesIO()
    torch.save(out, buf)
    return buf.getvalue()


def write_slowly(path: Path, data: bytes, chunks: int, delay: float, hurry: Path | None = None,
                 hurried_delay: float = 0.0) -> None:
    """DATA into PATH in CHUNKS, DELAY seconds apart (HURRIED_DELAY once the file HURRY exists)."""
    size = -(-len(data) // chunks)
    with path.open("wb") as fh:
        for i in range(0, len(data), size):
            fh.write(data[i:i + size])
            fh.flush()
            os.fsync(fh.fileno())
            time.sleep(hurried_delay if hurry is not None and hurry.exists() else delay)


def noise_at(step: int, honest: list[int], good: list[int], args: argparse.Namespace) -> float:
    """Less noise step by step down to none (the trained weights) over the honest steps; after them, more noise
    at every step (a run that breaks)."""
    if step in honest:
        rank = honest.index(step)
        return args.max_noise * (1 - rank / (len(honest) - 1)) if len(honest) > 1 else 0.0
    return args.worse_noise * (good.index(step) - len(honest) + 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, type=Path, help="a trained drafter checkpoint.pt")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", default="100,200,300", help="comma-separated steps, in writing order")
    ap.add_argument("--max-noise", type=float, default=1.5, help="noise scale (× weight std) at the first step")
    ap.add_argument("--corrupt", type=int, action="append", default=[], help="write this step as garbage")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk-delay", type=float, default=0.5, help="seconds between chunks of one file")
    ap.add_argument("--slow", type=int, action="append", default=[], help="write this step slowly")
    ap.add_argument("--slow-seconds", type=float, default=60.0)
    ap.add_argument("--hurry", type=Path, help="once this path exists, a slow step's rest goes at --chunk-delay")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between files")
    ap.add_argument("--wait-for", type=Path, action="append", default=[],
                    help="before file i + 1, wait until the i-th --wait-for path exists")
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument("--proxy-logdir", type=Path, help="log the trainer's proxy (train/acc_0) into this TensorBoard "
                    "logdir, at each step before its checkpoint is written")
    ap.add_argument("--worse-from", type=int, help="from this step on the checkpoints get worse (noise grows by "
                    "--worse-noise a step) while the logged proxy keeps improving")
    ap.add_argument("--worse-noise", type=float, default=0.5)
    args = ap.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    good = [s for s in steps if s not in args.corrupt]
    honest = [s for s in good if args.worse_from is None or s < args.worse_from]
    spec_file = args.source.parent / "spec.json"
    spec = json.loads(spec_file.read_text()) if spec_file.exists() else None
    args.out.mkdir(parents=True, exist_ok=True)
    for i, step in enumerate(steps):
        if 0 < i <= len(args.wait_for):
            while not args.wait_for[i - 1].exists():
                time.sleep(0.2)
        if step in args.corrupt:
            data = hashlib.sha256(str(step).encode()).digest() * 4096
        else:
            data = noisy_checkpoint(args.source, step, noise_at(step, honest, good, args), spec)
        if args.proxy_logdir is not None:  # a saturating training curve: it never stops improving
            log_proxy(args.proxy_logdir, "train/acc_0", step, 0.3 + 0.4 * (1 - 0.5 ** (i + 1)))
        path = args.out / f"step_{step}.pt"
        _log(args.log, event="start", name=path.name, step=step, bytes=len(data))
        if step in args.slow:
            write_slowly(path, data, args.chunks, args.slow_seconds / args.chunks, args.hurry, args.chunk_delay)
        else:
            write_slowly(path, data, args.chunks, args.chunk_delay)
        _log(args.log, event="done", name=path.name, step=step, sha256=hashlib.sha256(data).hexdigest(),
             corrupt=step in args.corrupt)
        time.sleep(args.gap)
    _log(args.log, event="finished")


if __name__ == "__main__":
    main()
