"""`dfo watch HOST:DIR`: evaluate each new training checkpoint as it lands; the series is in runs/series/."""

from __future__ import annotations

import posixpath
import shlex
import sys
from typing import Optional

import typer
from rich.text import Text

from orchestrator.cli.context import AppContext
from orchestrator.cli.eval_options import DECLARED, read_prompts, with_eval_options
from orchestrator.cli.main import app
from orchestrator.core.errors import InputError, OperationError
from orchestrator.core.local_checks import writable_folder
from orchestrator.evaluation.plan import EvalPlan, EvalRequest, eval_hosts, parse_drafter, plan_eval
from orchestrator.evaluation.runs import runs_root
from orchestrator.relay.plan import parse_endpoint
from orchestrator.watch import series as series_state
from orchestrator.watch import supervisor
from orchestrator.watch.checkpoint_spec import check_drafter_spec
from orchestrator.watch.config import WatchConfig, baselines_key, check_config, drafter_name, first_check
from orchestrator.watch.loop import Watcher
from orchestrator.watch.proxies import DEFAULT_PROXIES
from orchestrator.watch.proxy_step import proxy_options
from orchestrator.watch.selection import Options, RoundPlan
from remote_payload.eval.options import WATCH


# The command's own options here; the eval options are declared once (remote_payload/eval/options.py) and
# stand in at options=DECLARED.
@app.command("watch")
@with_eval_options(WATCH)
def watch_cmd(
    ctx: typer.Context,
    source: str = typer.Argument(..., metavar="HOST:DIR",
                                 help="The training run's checkpoint folder on the training host."),
    host: Optional[str] = typer.Option(None, "--host", "-H", metavar="HOST",
                                       help="Eval host. Default: the inventory's one host with the eval role "
                                       "(roles: [eval])."),
    drafter: list[str] = typer.Option([], "--drafter", "--baseline", "-d", metavar="NAME=[HOST:]PATH",
                                      help="Fixed baseline (repeatable): evaluated once per target/prompt set and "
                                      "drawn as a horizontal line."),
    series: Optional[str] = typer.Option(None, "--series", metavar="NAME",
                                         help="Series name (default: the folder's name)."),
    pattern: Optional[str] = typer.Option(None, "--pattern", metavar="GLOB",
                                          help="Checkpoint names, e.g. 'step_*.pt' (default: *.pt/*.pth/*.ckpt/*.bin/"
                                          "*.safetensors files and folders holding weights)."),
    step_from: str = typer.Option("auto", "--step-from", metavar="auto|name|metadata",
                                  help="Where the training step comes from (auto: the name, else the "
                                  "folder's metadata)."),
    every: Optional[int] = typer.Option(None, "--every", metavar="N", help="Only steps that are multiples of N."),
    newest: bool = typer.Option(False, "--newest", help="Only the newest settled checkpoint."),
    retry_failed: int = typer.Option(0, "--retry-failed", metavar="N",
                                     help="Try a checkpoint whose eval failed again on later looks, up to N more "
                                     "times (0: only once the trainer rewrites it)."),
    drafter_spec: Optional[str] = typer.Option(None, "--drafter-spec", metavar="FILE",
                                               help="Spec sidecar on the eval host (JSON/YAML: block_size, "
                                               "mask_token_id, target_layer_ids, rope_theta) for checkpoints that "
                                               "carry none; given to every checkpoint's eval."),
    settle: float = typer.Option(30.0, "--settle", metavar="SECONDS",
                                 help="Quiet time (size and mtime) before a checkpoint counts as written."),
    interval: float = typer.Option(60.0, "--interval", metavar="SECONDS", help="Time between looks at the folder."),
    once: bool = typer.Option(False, "--once", help="Evaluate what is new now, then exit (for cron)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check every option, look at the folder and the eval "
                                 "host's inputs, print what would be evaluated and each eval's plan; change nothing."),
    detach: bool = typer.Option(False, "--detach", help="Run the watcher under a supervisor in the background, "
                                "once the first checks passed (a failing one exits non-zero, nothing detaches)."),
    keep: bool = typer.Option(False, "--keep", help="Keep relayed checkpoints on the eval host after their eval."),
    on_result: Optional[str] = typer.Option(None, "--on-result", metavar="CMD",
                                            help="Run CMD (sh -c) after each checkpoint with the result JSON "
                                            "on stdin."),
    tensorboard_dir: Optional[str] = typer.Option(None, "--tensorboard", metavar="DIR",
                                                  help="Write τ, DDTree-8 and p1..p4 as TensorBoard scalars at each "
                                                  "checkpoint's step into DIR on this machine."),
    tensorboard_logdir: Optional[str] = typer.Option(None, "--tensorboard-logdir", metavar="DIR",
                                                     help="The same scalars into DIR/dfo-SERIES/ on the training "
                                                     "host (the trainer's logdir: τ beside the loss)."),
    plot_last: Optional[int] = typer.Option(None, "--plot-last", metavar="N",
                                            help="tau_vs_step.png shows the latest N checkpoints only."),
    resident: bool = typer.Option(True, "--resident/--no-resident",
                                  help="Keep one eval worker on the eval host with the target loaded (default); "
                                  "--no-resident: one eval job per checkpoint."),
    worker_idle: Optional[float] = typer.Option(None, "--worker-idle", metavar="SECONDS",
                                                help="The resident worker stops after this long without a "
                                                "checkpoint (default: 3 x --interval + 120, at least 300)."),
    shards: int = typer.Option(1, "--shards", metavar="N", help="On a Slurm cluster eval host (slurm: in the "
                               "inventory): each checkpoint's eval is one array job of N tasks (docs/clusters.md); "
                               "no resident worker there unless --resident-job."),
    resident_job: bool = typer.Option(False, "--resident-job", help="On a Slurm cluster eval host: keep the "
                                      "resident worker as one long-running Slurm job (target loaded once, each "
                                      "checkpoint handed to it). It holds its GPUs between checkpoints, until "
                                      "--worker-idle passes without one; off by default."),
    proxy_logdir: Optional[str] = typer.Option(None, "--proxy-logdir", metavar="DIR",
                                               help="The trainer's logdir on the training host: its TensorBoard "
                                               "event files, trainer_state.json and *.jsonl logs, read after each "
                                               "checkpoint; the proxy's value at the checkpoint's step is recorded "
                                               "beside τ and an alert is raised when τ stops following it."),
    proxy: list[str] = typer.Option([], "--proxy", metavar="TAG",
                                    help="A logged tag or key that counts as the trainer's proxy for τ (repeatable: "
                                    "the first one logged is used); '-TAG' where lower is better (a loss). Default: "
                                    + ", ".join(DEFAULT_PROXIES) + ". Alone it reads the checkpoint folder."),
    options: dict = DECLARED,
    json_out: bool = typer.Option(False, "--json", help="With --once/--dry-run: print the outcome as JSON."),
    runs_dir: Optional[str] = typer.Option(None, "--runs-dir", metavar="DIR", help="Where run folders and series go (default ./runs or $DFO_RUNS_DIR)."),
) -> None:
    """Evaluate every new checkpoint in HOST:DIR on the eval host and keep τ over training steps.

    Example: dfo watch kpro6:/data/checkpoints/run7/ --host ct129 --target /data/models/Qwen3.6-27B
    --drafter zlab=/data/models/Qwen3.6-27B-DFlash --pattern 'step_*.pt' --samples 64
    """
    app_ctx: AppContext = ctx.obj
    inv = app_ctx.inventory
    endpoint = parse_endpoint(source, inv, "HOST:DIR")
    folder = posixpath.normpath(endpoint.path)
    eval_host = _eval_host(host, inv)
    prompts = read_prompts(options["prompts"])
    request = EvalRequest(hosts=[eval_host], drafters=[parse_drafter(d, inv) for d in drafter],
                          **{**options, "prompts": prompts.spec})
    on_cluster = _cluster_shards(app_ctx, eval_host, shards, request, prompts.count, resident, resident_job)
    cfg = WatchConfig(series=series or posixpath.basename(folder) or "series", source_host=endpoint.host,
                      folder=folder, request=request, runs_dir=writable_folder(runs_root(runs_dir), "--runs-dir"),
                      options=Options(settle=settle, every=every, newest=newest, retry_failed=retry_failed),
                      pattern=pattern, drafter_spec=check_drafter_spec(drafter_spec),
                      step_from=step_from, prompts_file=prompts.file, prompts_digest=prompts.digest,
                      prompt_count=prompts.count, keep=keep, once=once, interval=interval, on_result=on_result,
                      tensorboard=writable_folder(tensorboard_dir, "--tensorboard") if tensorboard_dir else None,
                      tensorboard_logdir=tensorboard_logdir, plot_last=plot_last, resident=resident,
                      worker_idle=worker_idle, shards=on_cluster, resident_job=resident_job,
                      proxy=proxy_options(proxy_logdir, proxy, folder))
    stand_in = check_config(cfg, inv)  # before any connection: a bad value never reaches a host
    # Then the first checks on the hosts, in every mode: --detach leaves only once they passed.
    plan, ignored = first_check(app_ctx.connector, cfg, stand_in)
    if dry_run:
        _dry_run(app_ctx, cfg, plan, ignored, stand_in, json_out)
    elif detach:
        _detach(app_ctx, cfg)
    else:
        _foreground(app_ctx, cfg, json_out)


def _cluster_shards(app_ctx: AppContext, eval_host: str, shards: int, request: EvalRequest, prompt_count: int | None,
                    resident: bool, resident_job: bool) -> int | None:
    """The array size of each checkpoint's eval when EVAL_HOST is a Slurm cluster (None: it is not), with the
    resident-worker options checked against it."""
    from orchestrator.cluster.resident_job import check_resident_job
    from orchestrator.cluster.watch_step import cluster_shards, resident_note

    inv = app_ctx.inventory
    on_cluster = cluster_shards(inv, eval_host, shards, request, prompt_count)
    if resident_job:
        check_resident_job(inv, eval_host, shards, resident)
    elif on_cluster is not None and resident:
        app_ctx.events.info(resident_note(eval_host))
    return on_cluster


def _eval_host(given: str | None, inventory) -> str:
    hosts = eval_hosts([given] if given else [], inventory)
    if len(hosts) > 1:
        raise InputError(f"dfo watch evaluates on one eval host, and {inventory.source} gives the eval role to "
                         f"{', '.join(hosts)}", hint="choose one with --host HOST")
    return hosts[0]


def _foreground(app_ctx: AppContext, cfg: WatchConfig, json_out: bool) -> None:
    err = app_ctx.err

    def idle(text: str, seconds: float) -> None:
        import time

        with err.status(Text(text)) if err.is_terminal else _Nothing():
            if not err.is_terminal:
                err.print(Text(text))
            time.sleep(seconds)

    watcher = Watcher(app_ctx.connector, cfg, app_ctx.events, idle=idle)
    result = watcher.run()
    done, failed = series_state.done_entries(result), series_state.failures(result)
    err.print(Text(f"series {cfg.series}: {len(done)} evaluated, {len(failed)} failed → "
                   f"{watcher.folder} (series.json, series.md, tau_vs_step.png)"))
    if json_out:
        failed_rows = [{"name": e["name"], "step": e["step"], "error": e.get("error")} for e in failed]
        app_ctx.print_json({"series": cfg.series, "path": str(watcher.folder), "steps": series_state.points(result),
                            "failed": failed_rows})
    if cfg.once and failed and not done:  # cron must see that the round gave nothing
        for e in failed:
            err.print(Text(f"failed: {e['name']} (step {e['step']}): {e.get('error') or 'no error recorded'}"))
        raise OperationError(f"series {cfg.series}: no checkpoint was evaluated, {len(failed)} failed",
                             hint=f"the errors are in {watcher.folder / 'series.json'}")


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _dry_run(app_ctx: AppContext, cfg: WatchConfig, plan: RoundPlan, ignored: list, stand_in: EvalPlan,
             json_out: bool) -> None:
    """The first checks passed (they read the folder listing, the eval host's inputs and the local series); prints
    the round and the eval each checkpoint would run. Changes nothing anywhere."""
    inv = app_ctx.inventory
    evals = {c.name: plan_eval(cfg.checkpoint_request(drafter_name(c), c.path), inv,
                               prompts_digest=cfg.prompts_digest, prompt_count=cfg.prompt_count)
             for c in plan.evaluate}
    cached = (series_state.series_root(cfg.runs_dir) / ".baselines" / f"{baselines_key(cfg)}.json").is_file()
    baselines = [d.label() for d in cfg.request.drafters]
    if json_out:
        app_ctx.print_json({"dry_run": True, "series": cfg.series, "source": cfg.source, **plan.as_dict(),
                            "ignored": [{"name": n, "why": w} for n, w in ignored],
                            "baselines": {"drafters": baselines, "cached": cached},
                            "proxy": {"logdir": cfg.proxy.logdir, "proxies": list(cfg.proxy.proxies)} if cfg.proxy
                            else None,
                            "eval_args": {name: p.jobs[0].args for name, p in evals.items()},
                            "resident_job": cfg.resident_job})
        return
    # Checkpoint names (and why one is waited for or ignored) come from the training host's listing: Text.
    out = app_ctx.out
    out.print(Text.assemble((f"dfo watch {cfg.source}", "bold"), f" (dry run: nothing is changed) → series {cfg.series}"))
    out.print(Text(f"already evaluated: {plan.done}"))
    for e in plan.reattach:
        out.print(Text(f"reattach to the eval job of {e['name']} (run {e['run']})"))
    if baselines:
        out.print(Text("baselines: " + ", ".join(baselines)
                       + (" (cached: reused)" if cached else " (evaluated once before the first checkpoint)")))
    if cfg.resident_job:
        out.print(Text(f"resident worker: one Slurm job on {cfg.eval_host} (submitted at the first checkpoint, "
                       f"or the one this series runs reused); each checkpoint handed to it; it ends after "
                       f"{cfg.idle_exit:g}s without one"))
    if cfg.proxy:
        out.print(Text(f"after each checkpoint: the trainer's proxy (the first logged of {', '.join(cfg.proxy.proxies)}) "
                       f"from {cfg.source_host}:{cfg.proxy.logdir}, checked against τ"))
    for c in plan.evaluate:
        out.print(Text(f"evaluate step {c.step} ({c.step_source}): {c.name} → drafter {drafter_name(c)}: "
                       f"strip on {cfg.source_host}, relay to {cfg.eval_host}, eval, pull"
                       + ("" if cfg.keep else f", remove from {cfg.eval_host}")))
        out.print(Text("    python -m remote_payload " + shlex.join(evals[c.name].jobs[0].args)))
    for c, why in plan.waiting:
        out.print(Text(f"wait     step {c.step}: {c.name}: {why}"))
    for c, why in plan.skipped:
        out.print(Text(f"skip     step {c.step}: {c.name}: {why}"))
    for name, why in ignored:
        out.print(Text(f"ignore   {name}: {why}"))
    if not (plan.evaluate or plan.waiting or plan.reattach):
        out.print("nothing new to evaluate")
        out.print(Text("each checkpoint will run: python -m remote_payload " + shlex.join(stand_in.jobs[0].args)))


def _detach(app_ctx: AppContext, cfg: WatchConfig) -> None:
    folder = series_state.series_dir(cfg.runs_dir, cfg.series)
    pid = supervisor.running_pid(folder)
    if pid is not None:
        raise InputError(f"series {cfg.series} is already watched by supervisor pid {pid}",
                         hint=f"stop it with `kill {pid}` first")
    args = sys.argv[sys.argv.index("watch"):] if "watch" in sys.argv else []
    if not args:
        raise InputError("--detach needs the dfo command line (run it from the `dfo` executable)")
    args = [a for a in args if a != "--detach"]
    head = ["--inventory", str(app_ctx.inventory_path.resolve()), "--connect-timeout", str(app_ctx.connect_timeout)]
    if app_ctx.trust_new_host_keys:
        head.append("--trust-new-host-keys")
    if "--runs-dir" not in args:
        args += ["--runs-dir", str(cfg.runs_dir)]
    pid = supervisor.start(folder, head + args)
    app_ctx.err.print(Text.assemble(("detached", "green"), f": supervisor pid {pid} watches {cfg.source}\n"
                                    f"  log {folder / 'watch.log'}; stop with `kill {pid}`; "
                                    f"`dfo series show {cfg.series}` shows the series"))
