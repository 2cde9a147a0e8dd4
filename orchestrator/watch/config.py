"""A watch's settings and the checks before its first round: what `dfo watch` was asked (``WatchConfig``, and
the settings a series keeps fixed), the checks that need no connection (``check_config``) and those on the
hosts (``first_check``), and one look at the training folder (``scan_folder``). The loop itself is loop.py."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.inventory import Inventory
from orchestrator.evaluation.operation import preflight
from orchestrator.evaluation.plan import DrafterRef, EvalPlan, EvalRequest, hosts_used, plan_eval
from orchestrator.transport import Connector
from orchestrator.watch import series as series_state
from orchestrator.watch import tensorboard
from orchestrator.watch.checkpoint_spec import with_drafter_spec
from orchestrator.watch.discovery import STEP_FROM, Checkpoint, parse_listing
from orchestrator.watch.probe import list_folder
from orchestrator.watch.proxy_step import ProxyOptions
from orchestrator.watch.selection import Options, RoundPlan, plan_round
from remote_payload.eval.options import WATCH, request_options

STAND_IN = "checkpoint"  # the drafter name of the stand-in checkpoint the up-front checks plan with


@dataclass
class WatchConfig:
    series: str
    source_host: str
    folder: str
    request: EvalRequest           # hosts=[eval host], target and eval options; drafters = the fixed baselines
    runs_dir: Path
    options: Options = field(default_factory=Options)
    pattern: str | None = None
    step_from: str = "auto"
    prompts_file: Path | None = None
    prompts_digest: str | None = None
    prompt_count: int | None = None  # prompts in the set, when it was parsed here
    keep: bool = False
    once: bool = False
    interval: float = 60.0
    on_result: str | None = None
    tensorboard: Path | None = None        # event files on this machine
    tensorboard_logdir: str | None = None  # event files into the trainer's logdir on the training host
    plot_last: int | None = None           # tau_vs_step.png: the last N checkpoints only
    resident: bool = True                  # a resident eval worker when the eval allows it
    worker_idle: float | None = None       # seconds the worker waits for a checkpoint (default from --interval)
    shards: int | None = None              # a Slurm cluster eval host: array tasks per eval (cluster/watch_step.py)
    resident_job: bool = False             # there: the resident worker as one Slurm job (cluster/resident_job.py)
    drafter_spec: str | None = None        # spec sidecar on the eval host for checkpoints without one
    proxy: ProxyOptions | None = None      # the trainer's own numbers, checked against τ (proxy_step.py)

    @property
    def idle_exit(self) -> float:
        return self.worker_idle if self.worker_idle is not None else max(300.0, 3 * self.interval + 120)

    @property
    def eval_host(self) -> str:
        return self.request.hosts[0]

    @property
    def source(self) -> str:
        return f"{self.source_host}:{self.folder}"

    def settings(self) -> dict:
        """What makes two checkpoints' numbers comparable; a series keeps it fixed: every eval option `dfo watch`
        offers or the request holds that changes the figures (remote_payload/eval/options.py says which)."""
        r = self.request
        kept = {o.field: getattr(r, o.field) for o in request_options()
                if o.compared and (WATCH in o.commands or not o.commands)}
        return {**kept, "payload_args": list(r.payload_args), "prompts_sha256": self.prompts_digest,
                "pattern": self.pattern, "step_from": self.step_from, "drafter_spec": self.drafter_spec}

    def settings_defaults(self) -> dict:
        """The value each compared option has when not given (what a series started before it existed had)."""
        return {**{o.field: o.request_default for o in request_options()
                   if o.compared and (WATCH in o.commands or not o.commands)}, "drafter_spec": None}

    def checkpoint_request(self, name: str, path: str) -> EvalRequest:
        """The eval of one checkpoint (the baselines are evaluated apart, once)."""
        request = replace(self.request, drafters=[DrafterRef(name, self.source_host, path)])
        return with_drafter_spec(request, name, self.drafter_spec)


def check_config(cfg: WatchConfig, inventory: Inventory) -> EvalPlan:
    """Everything a watch can check before it connects: its own options, then the eval planner on the baselines
    and on a stand-in checkpoint of the folder. Returns the stand-in's plan (what each checkpoint will run)."""
    series_state.series_dir(cfg.runs_dir, cfg.series)  # the name
    if cfg.step_from not in STEP_FROM:
        raise InputError(f"--step-from {cfg.step_from!r}: expected one of {', '.join(STEP_FROM)}",
                         hint="auto: the step from the name, else from the checkpoint's metadata")
    if not cfg.interval > 0:
        raise InputError(f"--interval {cfg.interval:g}: expected more than 0 seconds")
    if cfg.plot_last is not None and cfg.plot_last < 2:
        raise InputError(f"--plot-last {cfg.plot_last}: expected at least 2 checkpoints")
    if cfg.worker_idle is not None and not cfg.worker_idle > 0:
        raise InputError(f"--worker-idle {cfg.worker_idle:g}: expected more than 0 seconds")
    tensorboard.check(str(cfg.tensorboard) if cfg.tensorboard else None, cfg.tensorboard_logdir)
    if cfg.request.drafters:
        plan_eval(cfg.request, inventory, prompts_digest=cfg.prompts_digest, prompt_count=cfg.prompt_count)
    stand_in = cfg.checkpoint_request(STAND_IN, posixpath.join(cfg.folder, f"{STAND_IN}.pt"))
    plan = plan_eval(stand_in, inventory, prompts_digest=cfg.prompts_digest, prompt_count=cfg.prompt_count)
    for name in hosts_used(stand_in):
        inventory.host_env(name)  # an unset ${VAR} is refused before the first look, not at the first eval
    return plan


def first_check(connector: Connector, cfg: WatchConfig, stand_in: EvalPlan) -> tuple[RoundPlan, list]:
    """What a watch checks on the hosts before its first round (and before --detach leaves): the local series
    keeps its settings, the eval host has the target, the baselines and the engine venv, and the training
    folder can be listed. ``stand_in``: check_config's plan. Returns the round plan and the names ignored."""
    found = series_state.load_series(series_state.series_dir(cfg.runs_dir, cfg.series))
    if found is not None:
        series_state.check_same_settings(found, cfg.source, cfg.eval_host, cfg.settings(),
                                         cfg.settings_defaults())
    inputs = plan_eval(cfg.request, connector.inventory, prompts_digest=cfg.prompts_digest) \
        if cfg.request.drafters else stand_in
    stand_in_path = stand_in.request.drafters[0].path  # the one input that does not exist
    checks = {h: [p for p in paths if p != stand_in_path] for h, paths in inputs.checks.items()}
    checks.setdefault(cfg.eval_host, []).extend([cfg.drafter_spec] if cfg.drafter_spec else [])
    preflight(connector, replace(inputs, checks={h: paths for h, paths in checks.items() if paths}))
    return scan_folder(connector, cfg, (found or {}).get("checkpoints", {}))


def drafter_name(ckpt: Checkpoint) -> str:
    stem = re.sub(r"\.(pt|pth|ckpt|bin|safetensors)$", "", ckpt.name)
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:64]
    return name if name[:1].isalnum() else f"c{name}"[:64]


def scan_folder(connector: Connector, cfg: WatchConfig, entries: dict[str, dict]) -> tuple[RoundPlan, list]:
    """One look at the folder: the round plan and the names ignored (with why)."""
    listing = parse_listing(list_folder(connector, cfg.source_host, cfg.folder), host=cfg.source_host,
                            folder=cfg.folder, pattern=cfg.pattern, step_from=cfg.step_from)
    return plan_round(listing, entries, cfg.options), listing.ignored


def baselines_key(cfg: WatchConfig) -> str:
    labels = sorted(d.label() for d in cfg.request.drafters)
    settings = {k: v for k, v in cfg.settings().items() if k != "drafter_spec"}  # the checkpoints' spec only
    blob = json.dumps([cfg.eval_host, settings, labels], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
