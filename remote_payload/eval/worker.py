"""A resident eval worker (`eval-worker`) and its per-drafter handover (`eval-handover`), for `dfo watch`.

``eval-worker`` takes the options of ``eval`` without a drafter, runs the run-wide stages once (settings,
target config and tokenizer, the target's weights, references, run checks) and then serves one drafter at a
time from ``WORKER_DIR/inbox/``: each request names a relayed drafter folder and the client job whose
results folder gets the outputs. Per drafter it checks the request (the drafter inside ``--drafter-root``,
every file's sha256 as the relay verified it, the outputs inside a job folder under ``--jobs-root``), loads
and validates the drafter, extracts the features its layers need unless the last drafter's layers were the
same (the payload's feature cache serves them), evaluates it (the ``eval:NAME`` stage) and writes
``samples.jsonl`` and ``results.json`` as ``eval`` does. Its progress lines go to the client job's log, so
the controller follows a handover like any eval job. It exits after ``--idle-exit`` seconds without a
request.

``eval-handover`` is the client: a detached job per drafter that imports nothing heavy. It puts the request
in the inbox (temporary name, then rename), waits for the worker's status file and exits 0 (done), 2 (the
worker's one-line error, as ``eval`` would print it) or ``WORKER_GONE`` when the worker stopped first (the
controller then runs a job of its own for that drafter).

The worker's folder, its loop and the client's wait are remote_payload/resident.py's (shared with the
resident strip worker).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.resident import (
    NAME_RE,
    SLURM_JOB_RE,
    ResidentLoop,
    SlurmLook,
    gone,
    hand_over,
    inside,
    read_json,
    test_exit,
    write_json,
)

STATUS_FILE = "worker-status.json"  # in the client job's folder
SHA_RE = re.compile(r"^[0-9a-f]{64}\Z")
INSTEAD = "the controller runs an eval job of its own"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ the request


def checked_request(doc: object, *, drafter_root: Path, jobs_root: Path) -> dict:
    """A request as the worker acts on it: every field checked and every path confined (a request is written
    by the client job, whose arguments came from the controller; the worker trusts neither blindly)."""
    if not isinstance(doc, dict):
        raise PayloadError("request: expected an object")
    name, path, digests = doc.get("name"), doc.get("path"), doc.get("sha256")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise PayloadError(f"request: drafter name {name!r:.80} is not a plain name")
    if not isinstance(path, str):
        raise PayloadError("request: the drafter path is missing")
    drafter = inside(path, drafter_root)
    if not isinstance(digests, dict) or not digests:
        raise PayloadError("request: no sha256 of the relayed files")
    for rel, digest in digests.items():
        if not (isinstance(rel, str) and isinstance(digest, str) and SHA_RE.match(digest)):
            raise PayloadError(f"request: sha256 entry {rel!r:.80}")
        if rel and (rel.startswith("/") or ".." in rel.split("/")):
            raise PayloadError(f"request: relayed file {rel!r:.80} leaves the drafter folder")
    job_dir = doc.get("job_dir")
    if not isinstance(job_dir, str):
        raise PayloadError("request: the client job folder is missing")
    job = inside(job_dir, jobs_root)
    if job.parent != Path(os.path.realpath(jobs_root)):
        raise PayloadError(f"request: {job_dir} is not a job folder of {jobs_root}")
    spec = doc.get("spec")  # the drafter's spec sidecar (`eval --drafter-spec NAME=FILE`), read as eval reads it
    if spec is not None and (not isinstance(spec, str) or not spec.startswith("/") or "\x00" in spec):
        raise PayloadError(f"request: drafter spec {spec!r:.80} is not an absolute path")
    return {"name": name, "path": drafter, "sha256": digests, "job_dir": job, "out": job / "results",
            "spec": spec}


def verify_relayed(drafter: Path, digests: dict[str, str]) -> None:
    """Every relayed file is the one the relay verified (a rename or rewrite on this host since is refused)."""
    for rel, digest in sorted(digests.items()):
        path = drafter / rel if rel else drafter
        if not path.is_file():
            raise PayloadError(f"relayed file {rel or drafter.name} is missing from {drafter}")
        if _sha256(path) != digest:
            raise PayloadError(f"relayed file {path} no longer has the sha256 the relay verified")


# ------------------------------------------------------------------------------------------ the worker


class Worker(ResidentLoop):
    def __init__(self, settings, worker_dir: Path, drafter_root: Path, jobs_root: Path, idle_exit: float,
                 progress):
        super().__init__(worker_dir, idle_exit, progress, what="worker")
        self.settings, self.drafter_root, self.jobs_root = settings, drafter_root, jobs_root

    def serve(self) -> int:
        return self.run(self._load, self._handle)

    def _load(self):
        """The run-wide stages, once: everything but the drafters."""
        from remote_payload.eval import stages
        from remote_payload.eval.context import EvalContext

        s = self.settings
        ctx = EvalContext(settings=replace(s, drafters=[("worker", "-")]), progress=self.progress)
        stages.start(ctx)  # the settings' checks want a drafter: a stand-in, never loaded
        ctx.settings = replace(s, drafters=[])
        stages.check_inputs(ctx)
        stages.load_target(ctx)
        ctx.timings["load_s"] = self.progress.stage_done("load")
        if s.reference_url:
            stages.server_references(ctx)
        else:
            stages.local_references(ctx)
        stages.run_checks(ctx)
        self.base: dict[str, Any] = {"warnings": list(ctx.warnings), "findings": list(ctx.findings),
                                     "timings": dict(ctx.timings)}
        self.layers: tuple | None = None
        return ctx

    def _handle(self, ctx, path: Path, taken: Path) -> None:
        test_exit("worker-take")  # tests only: a worker that dies under a handover
        doc = read_json(taken)
        job_dir = None
        try:
            request = checked_request(doc, drafter_root=self.drafter_root, jobs_root=self.jobs_root)
            job_dir = request["job_dir"]
            with open(job_dir / "log", "a", encoding="utf-8") as log:
                self._evaluate(ctx, request, log)
            outcome: dict = {"ok": True}
        except PayloadError as exc:
            outcome = {"ok": False, "error": " ".join(str(exc).split())}
        except Exception as exc:  # noqa: BLE001 - one bad drafter must not stop the worker
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.publish(last=outcome, served=self.state["served"] + 1)
        if job_dir is None and isinstance(doc, dict) and isinstance(doc.get("job_dir"), str):
            try:  # the request itself was refused: tell its client, when its folder is a job folder
                job_dir = inside(doc["job_dir"], self.jobs_root)
            except PayloadError:
                job_dir = None
        if job_dir is not None:
            write_json(job_dir / STATUS_FILE, outcome)
        self.progress.text(f"request {path.stem}: " + ("done" if outcome["ok"] else f"failed: {outcome['error']}"))

    def _evaluate(self, ctx, request: dict, log) -> None:
        from remote_payload.diagnose.findings import drafter_checks
        from remote_payload.eval import stages
        from remote_payload.eval.drafters import evaluate_drafter
        from remote_payload.eval.report import comparison, results_document, sample_lines
        from remote_payload.models import checkpoint
        from remote_payload.models.validation import validate_against_target
        from remote_payload.progress import Progress
        from remote_payload.results import write_outputs

        name, drafter = request["name"], request["path"]
        progress = Progress(stream=log)
        started = time.perf_counter()
        verify_relayed(drafter, request["sha256"])
        specs = {**self.settings.drafter_specs, **({name: request["spec"]} if request["spec"] else {})}
        s = replace(self.settings, drafters=[(name, str(drafter))], out=str(request["out"]), drafter_specs=specs)
        ctx.settings, ctx.progress, ctx.started = s, progress, started
        ctx.warnings, ctx.findings = list(self.base["warnings"]), list(self.base["findings"])
        ctx.timings, ctx.results = dict(self.base["timings"]), {}
        progress.stage_start("load", message=f"resident worker {os.getpid()}: drafter {name}")
        try:
            ld = checkpoint.load_drafter(str(drafter), s.drafter_specs.get(name), allow_fp16=s.allow_fp16)
            validate_against_target(ld.spec, ctx.target_config, ctx.tokenizer, ctx.stop_ids, str(drafter), ld.extras)
        except PayloadError as exc:
            raise PayloadError(f"drafter '{name}': {exc}") from None
        ctx.drafters = {name: ld}
        drafter_load_s = progress.stage_done("load")
        ctx.add_findings(drafter_checks(name, ld.spec, ld.source.get("training_metadata"), ctx.run_facts),
                         warn_all=True)
        layers = tuple(sorted(ld.spec.fc_layer_ids))
        if layers != self.layers:  # another layer set: its features (from the payload's cache after the first)
            stages.extract_features(ctx)
            self.layers = layers
            self.base["timings"]["extract_s"] = ctx.timings["extract_s"]
        evaluate_drafter(ctx, name)
        lines = sample_lines(ctx)
        results = results_document(ctx, lines, comparison(ctx, lines), None)
        # load_s, reference_s and extract_s are the worker's, spent once: this drafter's own costs are here.
        results["resident_worker"] = {"pid": os.getpid(), "served_before": self.state["served"],
                                      "startup_s": self.state.get("startup_s"),
                                      "drafter_load_s": round(drafter_load_s, 3),
                                      "seconds": round(time.perf_counter() - started, 3)}
        paths = write_outputs(request["out"], results, lines)
        progress.result(**paths, drafters={n: r.summary["metrics"]["tau_macro"] for n, r in ctx.results.items()})


def serve(args) -> int:
    """`eval-worker`: the parsed arguments (eval's options, drafters optional, and the worker's own)."""
    from remote_payload.eval.settings import settings_from_values
    from remote_payload.progress import Progress

    values = {k: v for k, v in vars(args).items() if k not in ("func", "command", "worker_dir", "drafter_root",
                                                                  "jobs_root", "idle_exit")}
    values["drafters"] = values.get("drafters") or []
    settings = settings_from_values(values)
    if settings.engine or settings.reference_engine:
        raise PayloadError("eval-worker: --engine and --reference ENGINE run in one-off eval jobs only")
    if settings.threads:
        import torch

        torch.set_num_threads(settings.threads)
    worker = Worker(settings, Path(args.worker_dir), Path(args.drafter_root), Path(args.jobs_root),
                    args.idle_exit, Progress())
    return worker.serve()


# ------------------------------------------------------------------------------------------ the client


def handover(args) -> int:
    """`eval-handover`: hand one drafter to the worker in WORKER_DIR and wait for its outcome."""
    worker_dir, job_dir = Path(args.worker_dir), Path(os.environ.get("DFO_JOB_DIR") or ".")
    name, _, path = (args.drafter or "").partition("=")
    digests = dict(d.partition("=")[::2] for d in args.sha256 or [])
    request = worker_dir / "inbox" / f"{job_dir.name}.json"
    if args.slurm_job is not None and not SLURM_JOB_RE.match(args.slurm_job):
        raise PayloadError(f"--slurm-job {args.slurm_job!r:.40}: expected a Slurm job id such as 1234 or 1234_0")
    where = f" (Slurm job {args.slurm_job})" if args.slurm_job else ""
    print(f"handing drafter {name} to the resident worker{where} ({request})", flush=True)
    doc = {"name": name, "path": path, "sha256": digests, "job_dir": str(job_dir), "spec": args.drafter_spec}
    outcome = hand_over(worker_dir, request, doc, job_dir / STATUS_FILE,
                        slurm=SlurmLook(args.slurm_job) if args.slurm_job else None)
    if outcome is None:
        return gone(f"no resident worker took drafter {name} ({worker_dir})", INSTEAD)
    if outcome.get("ok"):
        return 0
    print(f"dfo-payload error: {outcome.get('error') or 'the resident worker failed'}", file=sys.stderr, flush=True)
    return 2


# ------------------------------------------------------------------------------------------ the parsers


def add_parsers(sub, option_spec) -> None:
    """The two subcommands; ``option_spec(option)``: add_argument's keywords for a declared eval option."""
    from remote_payload.eval.options import payload_options

    w = sub.add_parser("eval-worker", help="resident eval worker for `dfo watch`: the target loaded once, "
                       "each drafter handed over through WORKER_DIR/inbox")
    for option in payload_options():
        spec = option_spec(option)
        if option.field == "drafters":
            spec.pop("required", None)  # the drafters come one at a time, through the inbox
            spec["default"] = None
        w.add_argument(option.flag, **spec)
    w.add_argument("--worker-dir", required=True, help="the worker's folder (inbox/, worker.json)")
    w.add_argument("--drafter-root", required=True, help="drafters are read only from inside this folder")
    w.add_argument("--jobs-root", required=True, help="outputs go only to job folders directly inside this one")
    w.add_argument("--idle-exit", type=float, default=900.0, help="stop after this many seconds without a request")
    w.set_defaults(func=serve)
    h = sub.add_parser("eval-handover", help="hand one drafter to the resident worker and wait for its results")
    h.add_argument("--worker-dir", required=True)
    h.add_argument("--drafter", required=True, metavar="NAME=PATH")
    h.add_argument("--sha256", action="append", metavar="REL=HEX", help="a relayed file's digest (repeatable)")
    h.add_argument("--drafter-spec", metavar="SPECFILE", help="the drafter's spec sidecar, when it carries none")
    h.add_argument("--slurm-job", metavar="JOBID", help="the worker runs as this Slurm job (ARRAYID_TASK) on a "
                   "compute node: judged by Slurm's state of it and its heartbeat, not by its pid")
    h.set_defaults(func=handover)
