"""The watcher: look at the training folder, evaluate what settled, record it in the series, repeat.

Per checkpoint it runs the path `dfo eval` runs (strip on the training host → relay through the
controller → eval as a detached job on the eval host, which refuses to start while another job holds
the host's GPU lock → pull → report), then adds the run to the series, judges it against the previous
best, removes the relayed weights from the eval host (unless --keep) and calls --on-result. The
baselines are evaluated once per eval host/target/prompt set/settings and reused from a controller-side
cache; the target's features are reused by the payload's own feature cache on the eval host (the series
records each run's cache hits).

With a resident worker (``resident``, the default where the eval allows it) the eval host keeps the target
loaded for the whole session and each checkpoint is handed to it by a small job; without one (it cannot
start, or it stopped) each checkpoint runs its own eval job. Likewise a resident strip worker on the training
host strips each checkpoint without a Python + torch start (else one strip process per checkpoint). Each
evaluated checkpoint also becomes TensorBoard scalars (``tensorboard``) when asked.

Restart safety: the series entry is written before each side effect (see ``series``); a restarted
watcher reattaches to an eval job that was running and redoes an attempt that was still relaying (the
relay resumes from its verified chunks). One watcher per series (an flock on the series folder). The
stripped copy a relay left on the training host (an attempt killed or failed) is removed once the attempt
ended (unless --keep).

``DFO_WATCH_TEST_KILL_AT=POINT`` (tests only) SIGKILLs the watcher at a named point: ``launched`` (the eval
job runs, the series does not know it yet: an orphan), ``evaluating`` (recorded, job running) and
``recorded`` (the result is in the series, --on-result not yet run).
"""

from __future__ import annotations

import fcntl
import os
import posixpath
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from orchestrator.core import plotting
from orchestrator.core.atomic_file import write_text_atomic
from orchestrator.core.errors import DfoError, InputError
from orchestrator.core.events import Events
from orchestrator.core.host_text import decode_json
from orchestrator.evaluation.operation import follow_and_collect, start_eval, wait_and_collect
from orchestrator.evaluation.plan import plan_eval, relay_dir
from orchestrator.evaluation.runs import Run, list_runs, load_run, write_json_atomic
from orchestrator.executors import registry as executors
from orchestrator.jobs.operation import JobRefused
from orchestrator.lint.operation import lint_before_eval
from orchestrator.transport import Connector
from orchestrator.watch import series as series_state
from orchestrator.watch import tensorboard
from orchestrator.watch.config import WatchConfig, baselines_key, drafter_name, scan_folder
from orchestrator.watch.discovery import Checkpoint, is_entry_name
from orchestrator.watch.hooks import run_hook
from orchestrator.watch.measures import (
    dataset_taus,
    judge,
    judge_datasets,
    measure,
    per_sample_tau,
    recent_dataset_verdicts,
    verdict_text,
)
from orchestrator.watch.plot import write_plot
from orchestrator.watch.probe import remove_relayed, remove_stripped, strip_key
from orchestrator.watch.proxy_step import ProxyWatch, take_diagnosis
from orchestrator.watch.render import series_markdown
from orchestrator.watch.resident import ResidentStrip, worker_gone
from orchestrator.watch.selection import RoundPlan

KILL_AT_ENV = "DFO_WATCH_TEST_KILL_AT"


def test_point(name: str) -> None:
    """A named point where a test may kill the watcher (``DFO_WATCH_TEST_KILL_AT``; never set in production)."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class SeriesLock:
    """One watcher per series; the kernel drops the lock when the process dies (SIGKILL included)."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / ".watch.lock"
        while True:
            self.fh = open(self.path, "a+")
            try:
                fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.fh.seek(0)
                holder = self.fh.read().strip() or "?"
                self.fh.close()
                raise InputError(f"another `dfo watch` (pid {holder}) is watching series {folder.name}",
                                 hint=f"stop it first, or watch under another --series name ({self.path})") from None
            try:  # the file is removed on release: a lock taken on a file already removed is taken again
                if os.stat(self.path).st_ino == os.fstat(self.fh.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            self.fh.close()
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(str(os.getpid()))
        self.fh.flush()

    def release(self) -> None:
        """Removed while still held (so no file is left behind a finished watch), then let go."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.fh.close()


class Watcher:
    def __init__(self, connector: Connector, cfg: WatchConfig, events: Events,
                 idle: Callable[[str, float], None] | None = None):
        """``idle(status_text, seconds)`` waits between looks (the CLI shows the text as a status line)."""
        self.connector, self.cfg, self.events = connector, cfg, events
        self.idle = idle or (lambda text, seconds: time.sleep(seconds))
        self.folder = series_state.series_dir(cfg.runs_dir, cfg.series)
        self.series: dict = {}
        self._said_no_plots = False
        # Where the evals run (an SSH host's jobs, a cluster's arrays) decides the resident worker it offers.
        self.place = executors.for_host(connector.inventory.hosts.get(cfg.eval_host))
        self.resident = self.place.resident_worker(connector, cfg, self.folder, events)
        self.strip = ResidentStrip(connector, self.folder, events, host=cfg.source_host, source_root=cfg.folder,
                                   idle=cfg.idle_exit) if cfg.resident else None
        self.proxy = ProxyWatch(connector, cfg.source_host, cfg.proxy, events, self._publish) if cfg.proxy else None

    # -- the loop

    def run(self) -> dict:
        lock = SeriesLock(self.folder)
        try:
            self._open()
            while True:
                plan, ignored = scan_folder(self.connector, self.cfg, self.series["checkpoints"])
                self._round(plan, ignored)
                if self.cfg.once:
                    return self.series
                self._idle(plan)
        finally:
            self._fold_journal()
            lock.release()

    def _fold_journal(self) -> None:
        """A watcher that stops leaves series.json whole (its journal folded in), the file the docs point to."""
        if not self.series:
            return
        try:
            series_state.save(self.folder, self.series)
        except OSError:
            pass  # the journal still holds every change: the next start folds it in

    def stop_worker(self) -> None:
        """Stop the resident workers now (else they stop by themselves after --worker-idle)."""
        if self.resident is not None:
            self.resident.stop()
        if self.strip is not None:
            self.strip.stop()

    def _open(self) -> None:
        cfg = self.cfg
        found = series_state.load_series(self.folder)
        if found is None:
            self.series = series_state.new_series(cfg.series, source=cfg.source, eval_host=cfg.eval_host,
                                                  settings=cfg.settings())
        else:
            series_state.check_same_settings(found, cfg.source, cfg.eval_host, cfg.settings(),
                                         cfg.settings_defaults())
            found["settings"]["drafter_spec"] = cfg.drafter_spec  # the same, or given before any was evaluated
            self.series = found
        series_state.save(self.folder, self.series)  # once per start: the journal folded in
        self.place.open_watch(self.connector, cfg, self.folder, self.events)
        self._render()
        for e in list(self.series["checkpoints"].values()):
            if e.get("notify_pending"):  # recorded, then the watcher died before --on-result ran: at least once
                self._hook(e)
            if e["status"] in ("done", "failed") and e.get("strip_key") and not e.get("strip_removed"):
                self._remove_stripped(e)  # an attempt that ended while nobody cleaned up after it
        self._tensorboard([e for e in series_state.done_entries(self.series) if self._tb_missing(e)])

    def _round(self, plan: RoundPlan, ignored: list) -> None:
        for name, why in ignored:
            self.events.warn(f"ignored {name}: {why}")
        for e in plan.reattach:
            self._reattach(e)
        for c, why in plan.waiting:
            self.events.info(f"waiting for {c.name}: {why}")
        if plan.evaluate and self.strip is not None:
            try:  # started now, its torch import overlaps the baselines and the first checkpoint's relay set-up
                self.strip.ensure()
            except DfoError as exc:
                self.events.warn(f"no resident strip worker on {self.cfg.source_host}: {exc.message}")
        if plan.evaluate and self.cfg.request.drafters:
            self._baselines()
        for c in plan.evaluate:
            self._evaluate(c)

    def _idle(self, plan: RoundPlan) -> None:
        done, failed = len(series_state.done_entries(self.series)), len(series_state.failures(self.series))
        self.idle(f"watching {self.cfg.source}: {done} evaluated, {failed} failed, {len(plan.waiting)} settling; "
                  f"next look in {self.cfg.interval:g}s", self.cfg.interval)

    def _say(self, text: str) -> None:
        self.events.step(text, tag="watch")

    # -- baselines

    def _baselines(self) -> None:
        cfg = self.cfg
        key = baselines_key(cfg)
        if (self.series.get("baselines") or {}).get("key") == key:
            return
        if self.resident is not None and self.resident.holds_gpu_lock and self.resident.running():
            self.resident.stop()  # it holds the GPU lock the baselines' eval job needs
        cache = series_state.series_root(cfg.runs_dir) / ".baselines" / f"{key}.json"
        if cache.is_file():
            cached = decode_json(cache.read_text(encoding="utf-8"))
            self._say(f"baselines {', '.join(cached['drafters'])}: reusing run {cached['run']}")
        else:
            self._say("evaluating the baselines once: " + ", ".join(d.label() for d in cfg.request.drafters))
            plan = plan_eval(cfg.request, self.connector.inventory, prompts_digest=cfg.prompts_digest)
            run = start_eval(self.connector, plan, runs_dir=cfg.runs_dir, events=self.events,
                             prompts_file=cfg.prompts_file, shards=cfg.shards or 1)
            run = follow_and_collect(self.connector, run, events=self.events)
            results, samples = run.results(), run.samples()
            cached = {"key": key, "run": run.name, "labels": sorted(d.label() for d in cfg.request.drafters),
                      "drafters": {d.name: measure(results, samples, d.name) for d in cfg.request.drafters}}
            write_json_atomic(cache, cached)
        self.series["baselines"] = cached
        series_state.record(self.folder, self.series, baselines=True)
        self._render()

    # -- one checkpoint

    def _evaluate(self, ckpt: Checkpoint, *, resident: bool = True) -> None:
        cfg = self.cfg
        orphan = self._orphan_run(ckpt)
        if orphan is not None:  # killed between the job's launch and the series' record of it
            self._reattach(series_state.mark(self.series, ckpt.name, "evaluating", run=orphan.name))
            return
        previous = self.series["checkpoints"].get(ckpt.name)
        e = series_state.begin_attempt(self.series, ckpt)
        if ckpt.mtime_ns is not None and not ckpt.is_dir:
            e["strip_key"] = strip_key(ckpt.path, ckpt.size, ckpt.mtime_ns)
        self._publish(e)
        self._say(f"{ckpt.name} (step {ckpt.step}, from the {ckpt.step_source}; attempt {e['attempts']})")
        request = cfg.checkpoint_request(drafter_name(ckpt), ckpt.path)
        if self.proxy is not None and (alerted := take_diagnosis(self.series, ckpt.name, self._publish)):
            self._say(f"{ckpt.name} runs with --diagnose (after the proxy alert at step {alerted['step']})")
            request, resident = replace(request, diagnose=True), False  # a resident worker does not diagnose,
            if self.resident is not None and self.resident.holds_gpu_lock:  # and its GPU lock would refuse the job
                self.resident.stop()
        started = time.monotonic()
        try:
            plan = plan_eval(request, self.connector.inventory, prompts_digest=cfg.prompts_digest)
            worker = resident and self.resident is not None and self.resident.ensure(plan)
            if worker:
                assert self.resident is not None
                lint_before_eval(self.connector, plan, self.events)  # start_eval lints the one-off path itself
                run = self.resident.hand_over(plan, self.strip)
            else:
                run = start_eval(self.connector, plan, runs_dir=cfg.runs_dir, events=self.events,
                                 prompts_file=cfg.prompts_file, stripper=self.strip, shards=cfg.shards or 1)
        except JobRefused as exc:  # the GPU is busy: not the checkpoint's fault; look again later
            self.events.warn(f"{exc.message}; will try {ckpt.name} again")
            if previous is None:
                del self.series["checkpoints"][ckpt.name]
                series_state.record(self.folder, self.series, removed=ckpt.name)
            else:
                self.series["checkpoints"][ckpt.name] = previous
                self._publish(previous)
            return
        except DfoError as exc:
            self._failed(ckpt.name, f"relay/launch: {exc.message}")
            return
        test_point("launched")
        series_state.mark(self.series, ckpt.name, "evaluating", run=run.name, digests=_digests(run.record),
                          relayed_to=plan.relays[0].lands_at if plan.relays else None, resident=worker,
                          timings={"relay_launch_s": round(time.monotonic() - started, 1)})
        self._publish(e)
        test_point("evaluating")
        outcome = self._collect(e, lambda: follow_and_collect(self.connector, run, events=self.events), started)
        if outcome == "worker gone":
            self._evaluate(ckpt, resident=False)

    def _reattach(self, e: dict) -> None:
        self._say(f"reattaching to {e['name']}'s eval job (run {e['run']})")
        try:
            run = load_run(self.cfg.runs_dir / e["run"])
        except InputError:
            series_state.mark(self.series, e["name"], "relaying")  # its run folder is gone: the attempt is redone
            self._publish(e)
            return
        self._collect(e, lambda: wait_and_collect(self.connector, run, events=self.events), time.monotonic())

    def _collect(self, e: dict, finish: Callable[[], Run], started: float) -> str:
        """Follow the eval to its end and record it: "done", "failed", or "worker gone" (the resident worker
        stopped before it took the checkpoint: the attempt is given up, its run never counted)."""
        try:
            run = finish()
            results, samples = run.results(), run.samples()
            name = next(iter(results.get("drafters") or {}), "?")
            measures = measure(results, samples, name)
            taus = per_sample_tau(samples, name)
        except DfoError as exc:
            gone = load_run(self.cfg.runs_dir / e["run"]) if e.get("run") else None
            if gone is not None and worker_gone(gone):
                if self.resident is not None:
                    self.resident.fell_through(exc.message)
                series_state.mark(self.series, e["name"], "relaying",
                                  superseded_runs=[*e.get("superseded_runs", []), e["run"]])
                self._publish(e)
                return "worker gone"
            self._failed(e["name"], f"eval: {exc.message}")
            return "failed"
        best = series_state.best_before(self.series, e["step"])
        best_samples = load_run(self.cfg.runs_dir / best["run"]).samples() if best else None
        best_taus = per_sample_tau(best_samples, best["drafter"]) if best and best_samples is not None else None
        verdict = judge(taus, best_taus, best_name=best["name"] if best else None,
                        recent=series_state.recent_verdicts(self.series, e["step"]))
        by_dataset = dataset_taus(samples, name)
        if by_dataset:  # benchmark datasets: a verdict per dataset too, paired inside each
            earlier = [x for x in series_state.done_entries(self.series) if x["step"] < e["step"]]
            verdict["by_dataset"] = judge_datasets(
                by_dataset, dataset_taus(best_samples, best["drafter"]) if best and best_samples is not None else None,
                best_name=best["name"] if best else None, recent=recent_dataset_verdicts(earlier))
        timings = dict(e.get("timings") or {}, total_s=round(time.monotonic() - started, 1),
                       **_job_timings(results))
        series_state.mark(self.series, e["name"], "done", run=run.name, drafter=name, measures=measures,
                          verdict=verdict, timings=timings, reuse=_reuse(results),
                          metadata_step=_metadata_step(results, name), notify_pending=bool(self.cfg.on_result))
        removed = self._cleanup(e)
        self._remove_stripped(e)
        alert = self.proxy.after(self.series, e) if self.proxy is not None else None
        self._publish(e)
        self._render()
        tree = measures["ddtree"]
        self.events.success(f"{e['name']} step {e['step']}: τ macro {_fmt(measures['tau_macro']['value'])}, "
                            f"DDTree-{tree.get('k')} {_fmt(tree['value'] or 0)} → {verdict_text(verdict)}"
                            + (f"; removed {removed}" if removed else ""))
        if alert is not None:
            self.events.warn(f"step {e['step']}: {e['proxy_alert']['text']} (the next checkpoint runs with --diagnose)")
        self._tensorboard([e])
        test_point("recorded")
        self._hook(e)
        return "done"

    def _failed(self, name: str, reason: str) -> None:
        e = series_state.mark(self.series, name, "failed", error=reason, notify_pending=bool(self.cfg.on_result))
        self._remove_stripped(e)
        self._publish(e)
        self._render()
        self.events.warn(f"{name} failed: {reason} (recorded; the watcher goes on)")
        self._hook(e)

    def _remove_stripped(self, e: dict) -> None:
        """The stripped copy this checkpoint's relay made on the training host (a relay that completed removed
        it already; one that was killed or failed did not)."""
        if self.cfg.keep or not e.get("strip_key"):
            return
        try:
            remove_stripped(self.connector, self.cfg.source_host, [e["strip_key"]])
        except DfoError as exc:
            self.events.warn(f"could not remove the stripped copy of {e['name']} on {self.cfg.source_host}: "
                             f"{exc.message}")
            return
        e["strip_removed"] = True

    def _tb_missing(self, e: dict) -> bool:
        tb = e.get("tensorboard") or {}
        return bool((self.cfg.tensorboard and not tb.get("local")) or (self.cfg.tensorboard_logdir
                                                                       and not tb.get("pushed")))

    def _tensorboard(self, entries: list[dict]) -> None:
        """ENTRIES (done) as one event file, here and/or in the trainer's logdir; never stops the watcher."""
        cfg = self.cfg
        entries = [e for e in entries if self._tb_missing(e)]
        if not entries:
            return
        step = entries[0]["step"] if len(entries) == 1 else f"{entries[0]['step']}-{entries[-1]['step']}"
        name = tensorboard.file_name(cfg.series, step)
        data = tensorboard.event_bytes(entries, self.series.get("baselines"))
        done: dict[str, str] = {}
        if cfg.tensorboard:
            try:
                done["local"] = str(tensorboard.write_local(cfg.tensorboard, name, data))
            except DfoError as exc:
                self.events.warn(f"TensorBoard events not written: {exc.message} (tried again when the watcher "
                                 "restarts)")
        if cfg.tensorboard_logdir:
            try:
                done["pushed"] = tensorboard.push(self.connector, cfg.source_host, cfg.tensorboard_logdir,
                                                  cfg.series, name, data)
            except DfoError as exc:
                self.events.warn(f"TensorBoard events not written into {cfg.source_host}:{cfg.tensorboard_logdir}: "
                                 f"{exc.message} (tried again when the watcher restarts)")
        for e in entries:
            e["tensorboard"] = {**(e.get("tensorboard") or {}), **done}
            self._publish(e)

    def _cleanup(self, e: dict) -> str | None:
        """Remove the relayed (stripped) weights from the eval host; the series keeps their digests."""
        path = e.get("relayed_to")
        root = relay_dir(self.connector.inventory, self.cfg.eval_host, self.cfg.source_host)
        if self.cfg.keep or not isinstance(path, str):
            return None
        if not removable(path, root):
            self.events.warn(f"not removing {path!r} from {self.cfg.eval_host}: not one checkpoint inside {root}")
            return None
        try:
            remove_relayed(self.connector, self.cfg.eval_host, root, path[len(root.rstrip("/")) + 1:])
        except DfoError as exc:
            self.events.warn(f"could not remove {path}: {exc.message}")
            return None
        e["removed_from_eval_host"] = True
        return f"{self.cfg.eval_host}:{path}"

    def _orphan_run(self, ckpt: Checkpoint) -> Run | None:
        """A run launched for this checkpoint's current attempt that the series never recorded."""
        e = self.series["checkpoints"].get(ckpt.name)
        if not e or e["status"] != "relaying":
            return None
        for run in reversed(list_runs(self.cfg.runs_dir)):
            drafters = (run.record.get("request") or {}).get("drafters") or []
            if run.record.get("created", "") < e["started_utc"] or run.name in e.get("superseded_runs", []):
                continue
            if [d.get("path") for d in drafters] == [ckpt.path] and run.record.get("jobs"):
                return run
        return None

    def _hook(self, e: dict) -> None:
        if not self.cfg.on_result:
            return
        result = {"series": self.cfg.series, "series_dir": str(self.folder), "source": self.cfg.source,
                  "checkpoint": e["name"], "step": e["step"], "status": e["status"], "run": e.get("run"),
                  "measures": e.get("measures"), "verdict": e.get("verdict"), "error": e.get("error"),
                  "proxy": e.get("proxy"), "proxy_check": e.get("proxy_check"), "proxy_alert": e.get("proxy_alert"),
                  "baselines": (self.series.get("baselines") or {}).get("drafters")}
        outcome = run_hook(self.cfg.on_result, result)
        e["on_result"] = outcome
        e["notify_pending"] = False
        if not outcome["ok"]:
            self.events.warn(f"--on-result failed ({outcome['exit_code']}): {outcome['detail']}")
        self._publish(e)

    def _publish(self, e: dict) -> None:
        """One entry changed: one line appended to the series' journal (the same cost at any series length)."""
        series_state.record(self.folder, self.series, entry=e)

    def _render(self) -> None:
        """series.md and tau_vs_step.png, after a checkpoint's outcome (not at every step of an attempt)."""
        plotted = write_plot(self.folder, self.series, last=self.cfg.plot_last)
        if plotted is None and not self._said_no_plots and not plotting.available():
            self._said_no_plots = True  # once per watcher, not at every checkpoint
            self.events.warn(f"{plotting.MISSING}: series.md links no tau_vs_step.png; {plotting.install_line()}")
        write_text_atomic(self.folder / "series.md", series_markdown(self.series, plotted=plotted is not None))


def _fmt(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def _field(obj: object, *keys: str) -> object:
    """obj[k1][k2]… where each level is an object, else None: the run's files came from the eval host."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _job_timings(results: dict) -> dict:
    """What the eval host spent on the checkpoint: the whole job, or the resident worker's part."""
    worker = _field(results, "resident_worker", "seconds")
    if isinstance(worker, (int, float)):
        return {"worker_eval_s": worker, "drafter_load_s": _field(results, "resident_worker", "drafter_load_s")}
    total = _field(results, "timings", "total_s")
    return {"job_eval_s": total} if isinstance(total, (int, float)) else {}


def _reuse(results: dict) -> dict:
    return {"features_cache_hits": _field(results, "extraction", "cache_hits"),
            "reference_cache_hits": _field(results, "reference", "cache_hits")}


def _metadata_step(results: dict, drafter: str) -> object:
    """The step the checkpoint's own metadata records, as the eval read it (kept in the series as is)."""
    step = _field(results, "drafters", drafter, "source", "step")
    return step if step is not None else _field(results, "drafters", drafter, "source", "stripped_from", "step")


def removable(path: str, root: str) -> bool:
    """PATH is one relayed checkpoint directly inside the relay folder ROOT (never ROOT itself, nothing above).

    The path was made from a name the training host listed and is read back from series.json, which an
    older dfo may have written with a name that is no plain entry (``step_7/`` made it ROOT itself)."""
    prefix = root.rstrip("/") + "/"
    return path.startswith(prefix) and is_entry_name(path[len(prefix):])


def _digests(record: dict) -> dict | None:
    """What a rerun needs to fetch the same weights again: the source checkpoint's and the relayed files'."""
    relays = record.get("relays") or []
    if not relays:
        return None
    r = relays[0]
    return {"source": r.get("stripped_from") or {"sha256": r.get("sha256")},
            "relayed": {f.get("rel") or posixpath.basename(f.get("final", "")): f.get("sha256")
                        for f in r.get("files", [])}}
