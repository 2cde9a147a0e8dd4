"""What the engine loads for a drafter, found before any server starts (``engine_stage.run_engine`` checks every
drafter first, so that when none can be served the plain server is not started either).

A drafter folder the engines' DFlash model cannot read as it is (another format, a vocabulary or window
config.json does not carry) is exported to the z-lab folder it loads, under the cache dir (weights, never
pulled), keyed by the drafter's digest and the exported config. A DFlash2 drafter goes through
``engine_dflash2.before_start``: a refusal is dfo's error, named before any server starts.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from remote_payload.errors import PayloadError
from remote_payload.eval import engine_dflash2
from remote_payload.eval.context import EvalContext
from remote_payload.eval.engine_setup import EngineRun, _engine, server_config
from remote_payload.models.spec import SLIDING

EXPORT_DIR = "engine-drafters"  # under the cache dir: weights, never pulled
LOADABLE_FORMATS = ("zlab", "training-stripped")  # folders whose config.json the engines' DFlash model reads


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
