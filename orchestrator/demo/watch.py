"""`dfo demo --watch`: a fake training run on kpro6 and `dfo watch` following it to the τ-over-steps plot.

The sandbox hosts, payload, venvs and fixtures are set up as for `dfo demo`; then a fake trainer on kpro6
(orchestrator/testing/fake_trainer.py, run as a detached job) writes step_100.pt … step_700.pt into
``checkpoints/run7/``, each file slowly: up to step_400 each a less noisy copy of the trained fixture drafter,
from step_500 on a noisier one each (a run that breaks), while the proxy it logs in ``run7/tb/`` (train/acc_0,
TensorBoard) climbs throughout. The watcher evaluates each checkpoint as it settles, reads the proxy beside
its τ and raises the proxy alert on the broken stretch (the checkpoint after the alert runs with --diagnose).
z-lab's and a random drafter are fixed baselines; the evals go through a resident eval worker on ct129
(``resident=False``: one eval job per checkpoint, as before), and τ goes as TensorBoard scalars into the series
folder's ``tensorboard/`` and into the fake trainer's logdir on kpro6.

Every demo makes a new sandbox (its paths are new), so its series ``demo-run7`` starts afresh each time: a
series an earlier demo left is kept under ``demo-run7-<when it was created>``.
"""

from __future__ import annotations

import posixpath
import re
import time
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.events import Events
from orchestrator.core.inventory import load_inventory
from orchestrator.demo.operation import FIXTURES_ON, _build_fixtures, remove_temporary_root
from orchestrator.deploy.manifest import default_payload_root
from orchestrator.deploy.operation import deploy
from orchestrator.evaluation.operation import raise_failures
from orchestrator.evaluation.plan import DrafterRef, EvalRequest
from orchestrator.jobs.operation import cancel_job, launch_job
from orchestrator.provision.operation import provision_hosts
from orchestrator.testing.sandbox import Sandbox
from orchestrator.transport import Connector
from orchestrator.watch import series as series_state
from orchestrator.watch.config import WatchConfig
from orchestrator.watch.loop import Watcher
from orchestrator.watch.proxy_step import ProxyOptions
from orchestrator.watch.selection import Options
from remote_payload.scratch import private_dir

TRAINER = Path(__file__).resolve().parents[1] / "testing" / "fake_trainer.py"
STEPS = (100, 200, 300, 400, 500, 600, 700)
WORSE_FROM = 500  # from here the fake trainer's checkpoints get worse while its logged proxy still climbs
SERIES = "demo-run7"
# The demo's fixtures less the DFlash2 drafter, which the watch story does not evaluate (half a minute of training
# on the host saved).
WATCH_FIXTURES = {host: ",".join(i for i in items.split(",") if i != "dflash2-drafter")
                  for host, items in FIXTURES_ON.items()}


@dataclass
class WatchDemoOutcome:
    series: dict
    folder: Path
    sandbox_root: Path
    seconds: float
    kept: bool
    tensorboard: Path | None = None
    set_aside: Path | None = None  # an earlier demo's series, kept under another name


def set_aside_earlier(runs_dir: Path) -> Path | None:
    """An earlier demo's series folder renamed to demo-run7-<its creation time> (nothing is removed)."""
    folder = series_state.series_dir(runs_dir, SERIES)
    if not folder.exists():
        return None
    try:
        found = series_state.load_series(folder)
    except InputError:
        found = None  # damaged: kept all the same
    created = (found or {}).get("created_utc") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamp = re.sub(r"[^0-9]", "", str(created))[:14] or "earlier"
    target = folder.with_name(f"{SERIES}-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = folder.with_name(f"{SERIES}-{stamp}-{n}")
    folder.rename(target)
    return target


def _start_trainer(connector: Connector, box: Sandbox, python: str, folder: str, logdir: str) -> str:
    kpro6 = box.hosts["kpro6"]
    script = posixpath.join(str(kpro6.workdir), "fake_trainer.py")
    connector.session("kpro6").put(TRAINER, script)
    source = posixpath.join(str(kpro6.checkpoints), "trained-drafter", "checkpoint.pt")
    argv = [python, script, "--source", source, "--out", folder, "--steps", ",".join(map(str, STEPS)),
            "--chunks", "4", "--chunk-delay", "0.5", "--gap", "5", "--max-noise", "0.16",
            "--proxy-logdir", logdir, "--worse-from", str(WORSE_FROM), "--worse-noise", "0.5",
            "--log", posixpath.join(folder, "trainer.log")]
    return launch_job(connector, "kpro6", argv, lock=None, job_name="demo fake trainer").job_id


def run_watch_demo(*, events: Events, runs_dir: Path, root: Path | None = None, keep: bool = False,
                   samples: int | None = 6, max_new_tokens: int = 96, resident: bool = True) -> WatchDemoOutcome:
    started = time.monotonic()
    set_aside = set_aside_earlier(runs_dir)
    if set_aside is not None:
        events.info(f"  an earlier demo's series is kept as {set_aside.name}; this one starts {SERIES} afresh")
    made, root = root is None, root or private_dir("dfo-demo-")
    events.step(tag="demo", text=f"start sandbox hosts kpro6 and ct129 (real sshd) in {root}")
    box = Sandbox(root, keep=keep)
    box.start()
    try:
        with Connector(load_inventory(box.inventory_path)) as connector:
            events.step(tag="demo", text="deploy and provision both hosts; build the fixtures")
            raise_failures("deploy", deploy(connector, ["kpro6", "ct129"], root=default_payload_root(),
                                            events=events))
            prov = provision_hosts(connector, ["kpro6", "ct129"], events=events)
            raise_failures("provision", prov)
            pythons = {h: o.result.python for h, o in prov.items()}  # raise_failures: all ok
            models, ckpts = str(box.hosts["ct129"].models), str(box.hosts["kpro6"].checkpoints)
            for host, out in (("ct129", models), ("kpro6", ckpts)):
                _build_fixtures(connector, host, pythons[host], out, WATCH_FIXTURES[host], events)
            folder = posixpath.join(ckpts, "run7")
            logdir = posixpath.join(folder, "tb")
            events.step(tag="demo", text=f"start a fake trainer on kpro6 writing step_{STEPS[0]}.pt … "
                        f"step_{STEPS[-1]}.pt into {folder} and its train/acc_0 into {logdir}; from step "
                        f"{WORSE_FROM} its checkpoints get worse while train/acc_0 keeps climbing")
            trainer = _start_trainer(connector, box, pythons["kpro6"], folder, logdir)
            events.step(tag="demo", text=f"dfo watch kpro6:{folder}/ --host ct129 --target …/target "
                        "--drafter zlab=…/zlab-drafter --drafter random=…/random-drafter --pattern 'step_*.pt' "
                        f"--proxy-logdir {logdir}")
            request = EvalRequest(hosts=["ct129"], target=posixpath.join(models, "target"),
                                  drafters=[DrafterRef("zlab", None, posixpath.join(models, "zlab-drafter")),
                                            DrafterRef("random", None, posixpath.join(models, "random-drafter"))],
                                  samples=samples, max_new_tokens=max_new_tokens, dtype="float32", threads=1)
            tb_local = series_state.series_dir(runs_dir, SERIES) / "tensorboard"
            cfg = WatchConfig(series=SERIES, source_host="kpro6", folder=folder, request=request, runs_dir=runs_dir,
                              options=Options(settle=2), pattern="step_*.pt", once=True, resident=resident,
                              tensorboard=tb_local, tensorboard_logdir=logdir, proxy=ProxyOptions(logdir))
            watcher = Watcher(connector, cfg, events)
            try:
                while True:  # --once rounds, as cron would run them, until the trainer is through
                    series = watcher.run()
                    if len(series_state.done_entries(series)) + len(series_state.failures(series)) >= len(STEPS):
                        break
                    time.sleep(1)
            finally:
                watcher.stop_worker()
                cancel_job(connector, "kpro6", trainer)
    finally:
        box.stop()
        remove_temporary_root(root, made, keep)
    return WatchDemoOutcome(series=watcher.series, folder=watcher.folder, sandbox_root=root,
                            seconds=time.monotonic() - started, kept=keep, tensorboard=tb_local, set_aside=set_aside)
