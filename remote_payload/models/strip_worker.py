"""A resident strip worker (`strip-worker`) and its per-checkpoint client (`strip-handover`), for `dfo watch`.

``strip-worker`` runs on the training host for a watch session with torch imported once and strips one
training checkpoint at a time from ``WORKER_DIR/inbox/`` (remote_payload/resident.py's folder and loop):
each request names the checkpoint and the folder to write. The worker checks both before it reads a byte:
the checkpoint must be a regular file inside ``--source-root`` (the folder the watcher watches; links are
resolved), and the output must be ``--strip-root``/KEY exactly, KEY being ``strip_key`` of the checkpoint's
path, size and mtime as they are now (the folder the controller named for that checkpoint; a rewritten
checkpoint gets another) and no link. The strip itself is ``strip-checkpoint``'s (the same folder, written
atomically, the same ``dfo-source.json``); the reply goes to ``WORKER_DIR/outbox/<request name>``, a path
the worker makes from the request's own file name.

``strip-handover`` is the client the controller runs over SSH per checkpoint (stdlib imports only): it puts
the request in the inbox, waits for the reply and exits 0 (stripped), 2 (the strip's one-line error, as
``strip-checkpoint`` prints it) or ``WORKER_GONE`` when no worker runs or it stopped first (the controller
then runs ``strip-checkpoint`` itself).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.resident import NAME_RE, ResidentLoop, gone, hand_over, inside, read_json, test_exit, write_json

INSTEAD = "the controller runs strip-checkpoint itself"


def strip_key(path: str, size: int, mtime_ns: int) -> str:
    """The name of PATH's stripped copy under <workdir>/relay-strip/ (a rewritten checkpoint gets another)."""
    return hashlib.sha256(f"{path}\0{size}\0{mtime_ns}".encode()).hexdigest()[:16]


def checked_strip(doc: object, *, source_root: Path, strip_root: Path) -> tuple[Path, Path]:
    """(checkpoint, output folder) of a request, both checked: the checkpoint a regular file inside SOURCE_ROOT,
    the output STRIP_ROOT/strip_key(checkpoint) and no link. A request is data, whoever wrote it."""
    if not isinstance(doc, dict):
        raise PayloadError("strip request: expected an object")
    src, out = doc.get("src"), doc.get("out")
    if not isinstance(src, str) or not src.startswith("/"):
        raise PayloadError(f"strip request: checkpoint {src!r:.120} is not an absolute path")
    if not isinstance(out, str):
        raise PayloadError("strip request: the output folder is missing")
    real = inside(src, source_root)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise PayloadError(f"strip request: checkpoint {src} cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise PayloadError(f"strip request: checkpoint {src} is not a regular file")
    want = Path(os.path.realpath(strip_root)) / strip_key(src, st.st_size, st.st_mtime_ns)
    if os.path.realpath(os.path.dirname(out)) != str(want.parent) or os.path.basename(out) != want.name:
        raise PayloadError(f"strip request: output {out!r:.200} is not {want}, the strip folder of {src} as it is now")
    if os.path.islink(want):
        raise PayloadError(f"strip request: {want} is a link")
    return real, want


class StripWorker(ResidentLoop):
    def __init__(self, worker_dir: Path, source_root: Path, strip_root: Path, idle_exit: float, progress: Any):
        super().__init__(worker_dir, idle_exit, progress, what="strip worker")
        self.source_root, self.strip_root = source_root, strip_root
        self.outbox = worker_dir / "outbox"

    def serve(self) -> int:
        self.outbox.mkdir(parents=True, exist_ok=True)
        return self.run(self._load, self._handle)

    def _load(self) -> None:
        """What a one-shot strip-checkpoint pays per checkpoint, paid once: torch, safetensors, the readers."""
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401

        from remote_payload.models import export  # noqa: F401

        self.strip_root.mkdir(parents=True, exist_ok=True)

    def _handle(self, _loaded: None, path: Path, taken: Path) -> None:
        from remote_payload.models.export import strip_checkpoint

        test_exit("strip-take")  # tests only: a worker that dies under a strip
        if not NAME_RE.match(path.stem):
            return  # no reply path can be made from this name; nobody waits for it under a plain name
        try:
            src, out = checked_strip(read_json(taken), source_root=self.source_root, strip_root=self.strip_root)
            done = strip_checkpoint(src, out)
            outcome: dict = {"ok": True, "status": done.get("status"), "out_dir": str(out)}
        except PayloadError as exc:
            outcome = {"ok": False, "error": " ".join(str(exc).split())}
        except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not stop the worker
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.publish(last=outcome, served=self.state["served"] + 1)
        write_json(self.outbox / f"{path.stem}.json", outcome)
        self.progress.text(f"strip {path.stem}: " + ("done" if outcome["ok"] else f"failed: {outcome['error']}"))


def serve(args: Any) -> int:
    """`strip-worker`."""
    from remote_payload.progress import Progress

    if not args.idle_exit > 0:
        raise PayloadError("strip-worker: --idle-exit must be more than 0 seconds")
    worker = StripWorker(Path(args.worker_dir), Path(args.source_root), Path(args.strip_root), args.idle_exit,
                         Progress())
    return worker.serve()


def handover(args: Any) -> int:
    """`strip-handover`: hand SRC → OUT to the worker in WORKER_DIR and wait for its reply."""
    worker_dir = Path(args.worker_dir)
    name = f"{os.getpid()}-{secrets.token_hex(6)}"
    reply = worker_dir / "outbox" / f"{name}.json"
    outcome = hand_over(worker_dir, worker_dir / "inbox" / f"{name}.json", {"src": args.src, "out": args.out_dir},
                        reply)
    reply.unlink(missing_ok=True)
    if outcome is None:
        return gone(f"no resident strip worker took {args.src} ({worker_dir})", INSTEAD)
    if outcome.get("ok"):
        print(f"stripped {args.src} into {args.out_dir} ({outcome.get('status')}) by the resident strip worker",
              flush=True)
        return 0
    print(f"dfo-payload error: {outcome.get('error') or 'the resident strip worker failed'}", file=sys.stderr,
          flush=True)
    return 2


def add_parsers(sub: Any) -> None:
    w = sub.add_parser("strip-worker", help="resident strip worker for `dfo watch`: torch imported once, each "
                       "checkpoint handed over through WORKER_DIR/inbox")
    w.add_argument("--worker-dir", required=True, help="the worker's folder (inbox/, outbox/, worker.json)")
    w.add_argument("--source-root", required=True, help="checkpoints are read only from inside this folder")
    w.add_argument("--strip-root", required=True, help="strips are written only to STRIP_ROOT/KEY")
    w.add_argument("--idle-exit", type=float, default=900.0, help="stop after this many seconds without a request")
    w.set_defaults(func=serve)
    h = sub.add_parser("strip-handover", help="hand one checkpoint to the resident strip worker and wait")
    h.add_argument("--worker-dir", required=True)
    h.add_argument("src", help="the training checkpoint")
    h.add_argument("out_dir", help="its strip folder (<workdir>/relay-strip/KEY)")
    h.set_defaults(func=handover)
