"""Writing drafters: a z-lab folder from a spec and weights, and ``strip-checkpoint`` (training checkpoint ->
model.safetensors + config.json + dfo-source.json)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.models.checkpoint import (
    IGNORED_BUFFERS,
    TRAINING_BLOCK,
    file_sha256,
    float_dtypes,
    read_training_checkpoint,
    set_aside_copies,
    training_metadata,
    training_spec,
    weight_shapes,
)
from remote_payload.models.spec import DFLASH2_FIELDS, SLIDING, DrafterSpec, _arch, from_training
from remote_payload.models.validation import validate_weights


def spec_to_zlab_config(spec: DrafterSpec, vocab_size: int | None = None) -> dict:
    """A z-lab (new schema) config.json that this payload reads back to the same spec, and vLLM loads.

    ``vocab_size``: the target's vocabulary (z-lab's published configs carry it; vLLM otherwise assumes
    Qwen3's default 151936 and fails at the first draft). Sliding-window layers also get
    ``dflash_config.use_swa`` and ``swa_window_size``, the keys vLLM's DFlash model reads the window from.
    """
    types = [a.kind for a in spec.attn]
    default_rule = all(a.causal == (a.kind == SLIDING) for a in spec.attn)
    window = next((a.window for a in spec.attn if a.window), None)
    cfg: dict[str, Any] = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": spec.hidden_size, "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads, "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size, "rms_norm_eps": spec.rms_norm_eps,
        "hidden_act": spec.hidden_act, "attention_bias": spec.attention_bias,
        "max_position_embeddings": spec.max_position_embeddings, "rope_parameters": dict(spec.rope),
        "layer_types": types, "sliding_window": window,
        "dflash_config": {"block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
                          "target_layer_ids": list(spec.fc_layer_ids)},
    }
    if vocab_size is not None:
        cfg["vocab_size"] = int(vocab_size)
    if SLIDING in types and window:
        cfg["dflash_config"].update(use_swa=True, swa_window_size=window)
    if spec.reserved_layer_ids:
        cfg["dflash_config"]["reserved_target_layer_ids"] = list(spec.reserved_layer_ids)
    if not default_rule:
        flags = {a.causal for a in spec.attn}
        if len(flags) != 1:
            raise PayloadError("this drafter's per-layer causality cannot be written as a z-lab config")
        cfg["is_causal"] = flags.pop()
    if spec.input_embedding_scale != 1.0:
        cfg["dflash_config"]["input_embedding_scale"] = spec.input_embedding_scale
    if spec.output_multiplier != 1.0:
        cfg["dflash_config"]["output_multiplier"] = spec.output_multiplier
    if spec.logit_softcap:
        cfg["dflash_config"]["final_logit_softcapping"] = spec.logit_softcap
    if spec.dflash2 is not None:  # z-lab's DFlash2 schema: the architecture's name and the four fields
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["dflash_config"].update({k: getattr(spec.dflash2, k) for k in DFLASH2_FIELDS})
        if vocab_size is None and spec.dflash2.vocab_rows is not None:
            cfg["vocab_size"] = spec.dflash2.vocab_rows
    return cfg


def write_zlab_folder(out_dir: Path, spec: DrafterSpec, weights: dict, extra_files: dict | None = None,
                      vocab_size: int | None = None) -> None:
    write_folder(out_dir, spec_to_zlab_config(spec, vocab_size), weights, extra_files)


def write_folder(out_dir: Path, config: dict, weights: dict, extra_files: dict | None = None) -> None:
    """Write model.safetensors + config.json (+ extra JSON files) into out_dir atomically (temp dir, rename)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name, obj in (extra_files or {}).items():
            (tmp / name).write_text(json.dumps(obj, indent=2) + "\n")
        _replace_dir(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace_dir(new: Path, target: Path) -> None:
    """Put the folder NEW at TARGET. An existing TARGET is swapped out atomically (renameat2 with
    RENAME_EXCHANGE: readers see the old folder or the new one, never none or half of one), then removed;
    where the kernel lacks the call, it is renamed aside first and restored if the second rename fails."""
    if not target.exists():
        os.replace(new, target)
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        if libc.renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(target), rename_exchange) == 0:
            shutil.rmtree(new, ignore_errors=True)  # NEW now holds the old folder
            return
    except (OSError, AttributeError):
        pass
    aside = target.with_name(f".{target.name}.old-{os.getpid()}-{os.urandom(4).hex()}")
    os.rename(target, aside)
    try:
        os.replace(new, target)
    except OSError:
        os.rename(aside, target)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _vocab_size(spec_dict: dict, weights: dict) -> int | None:
    """The target vocabulary a stripped drafter's config.json should carry: the training spec's, else the rows
    of an embedding or lm_head copy in the checkpoint; None when neither says."""
    for key in ("vocab_size", "target_vocab_size"):
        if isinstance(spec_dict.get(key), int):
            return spec_dict[key]
    for name, tensor in weights.items():
        if name.endswith(("embed_tokens.weight", "lm_head.weight")) and getattr(tensor, "ndim", 0) == 2:
            return int(tensor.shape[0])
    return None


def _incomplete_config(weights: dict) -> dict:
    """What the weights alone say, for a strip made without a spec (the eval then needs --drafter-spec)."""
    cfg = {"dfo_incomplete": "no drafter spec was available when stripping; give one at eval time with "
                             "--drafter-spec NAME=SPECFILE (dfo watch: --drafter-spec SPECFILE)"}
    shapes = weight_shapes(weights)
    try:
        arch = _arch({}, shapes, "weights")
        cfg.update({k: arch[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                          "num_key_value_heads", "head_dim", "intermediate_size")})
        cfg["fc_in_features"] = shapes.get("fc.weight", [None, None])[1]
    except PayloadError:
        pass
    return cfg


def strip_checkpoint(src: str | os.PathLike, out_dir: str | os.PathLike, spec_file=None) -> dict:
    """Training checkpoint -> OUT_DIR with model.safetensors, config.json (z-lab schema) and dfo-source.json.

    Without any spec (none given, none embedded, no sidecar beside the checkpoint) the weights are still
    written, with a config.json marked incomplete; the eval then asks for --drafter-spec.
    """
    src, out = Path(src), Path(out_dir)
    if not src.is_file():
        raise PayloadError(f"training checkpoint {src} not found")
    sha = file_sha256(src)
    if out.exists():
        try:
            previous = json.loads((out / "dfo-source.json").read_text())
        except (OSError, json.JSONDecodeError):
            previous = None
        if previous and previous.get("sha256") == sha and (out / "model.safetensors").exists():
            return {**previous, "out_dir": str(out), "status": "unchanged"}
        if out.is_dir() and any(out.iterdir()):
            raise PayloadError(f"strip-checkpoint: {out} exists and does not hold a strip of {src}; remove it first")
    started = time.time()
    ck = read_training_checkpoint(src)
    weights, extras = set_aside_copies(ck["weights"])
    extras.update(ck["extras"])
    for k in IGNORED_BUFFERS:
        weights.pop(k, None)
    spec_dict, where, used = training_spec(spec_file, ck["config"], src)
    if spec_dict is not None:
        spec = from_training(spec_dict, weight_shapes(weights), where)
        validate_weights(spec, weights, extras, str(src))
        config = spec_to_zlab_config(spec, _vocab_size(spec_dict, {**weights, **extras}))
        meta = training_metadata(spec_dict, where)
        if meta is not None:
            config[TRAINING_BLOCK] = meta
    else:
        spec, config = None, _incomplete_config(weights)
    record = {"format": "training", "source_path": str(src.resolve()), "sha256": sha, "bytes": src.stat().st_size,
              "top_keys": ck["top_keys"], "model_key": ck["model_key"], "dropped": ck["dropped"], "step": ck["step"],
              "extras_not_kept": sorted(extras), "spec_file": used, "spec": "complete" if spec else "missing",
              "stripped_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))}
    write_folder(out, config, weights, {"dfo-source.json": record})
    return {**record, "out_dir": str(out), "status": "written",
            "weights_bytes": (out / "model.safetensors").stat().st_size,
            "weights_dtype": ",".join(sorted(float_dtypes(weights))) or None}
