"""Reading drafter checkpoints in the three formats (validation: ``validation.py``; writing: ``export.py``).

One reader per format, all ending in (DrafterSpec, drafter weights in z-lab naming, extra tensors).
The team's training checkpoint reader is shared by the eval and by ``strip-checkpoint``.

Training checkpoint layout (a ``torch.save`` file, loaded with ``weights_only=True``)::

    {
      "model": {param name: tensor},   # required (aliases: "model_state_dict", "state_dict")
      "optimizer": {...},              # optional, dropped
      "scheduler"/"lr_scheduler", "step", "epoch", "rng_state", ...   # optional, ignored
      "config": {...},                 # optional drafter spec (same keys as the --spec sidecar)
    }

Parameter names follow the z-lab layout (``layers.N.self_attn.q_proj.weight``, ``fc.weight``,
``hidden_norm.weight``, ``norm.weight``); ``module.`` (DDP) and ``_orig_mod.`` (torch.compile) prefixes
are removed, and when keys are under ``draft_model.`` only those are the drafter (other keys, e.g. the
frozen ``embed_tokens``/``lm_head`` copies of a training wrapper, are kept aside as extras).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.errors import PayloadError, first_line
from remote_payload.models.spec import DrafterSpec, from_speculators, from_training, from_zlab
from remote_payload.models.validation import validate_weights

MODEL_KEYS = ("model", "model_state_dict", "state_dict")
KNOWN_TOP_KEYS = set(MODEL_KEYS) | {"optimizer", "optimizer_state_dict", "scheduler", "lr_scheduler", "step",
                                     "global_step", "epoch", "rng_state", "config", "args", "scaler", "format"}
# Frozen copies of target tensors that checkpoints may carry; kept aside, never loaded into the drafter.
TARGET_COPIES = ("embed_tokens.weight", "lm_head.weight", "verifier_norm.weight", "verifier_lm_head.weight", "t2d")
IGNORED_BUFFERS = ("rotary_emb.inv_freq",)
# Optional facts about how the drafter was trained, read from a "training" block of its config.json (z-lab,
# speculators, stripped) or of its spec (sidecar / the checkpoint's "config"); the eval checks the run
# against them (README "Training metadata"). Unknown fields are kept and shown, never interpreted.
TRAINING_BLOCK = "training"
KERNEL_PATHS = ("fla", "torch")


@dataclass
class LoadedDrafter:
    spec: DrafterSpec
    weights: dict  # drafter parameters, z-lab names
    extras: dict = field(default_factory=dict)  # embed/lm_head copies, d2t, ...
    source: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# small readers


def read_spec_file(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise PayloadError(f"drafter spec {p} not found")
    text = p.read_text(encoding="utf-8")
    if p.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise PayloadError(f"drafter spec {p}: YAML needs PyYAML; give the spec as JSON") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PayloadError(f"drafter spec {p}: not valid YAML ({str(exc).splitlines()[0]})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PayloadError(f"drafter spec {p}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise PayloadError(f"drafter spec {p}: must hold a mapping of fields")
    return data


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def load_safetensors(path: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise PayloadError(f"{path}: unreadable safetensors ({str(exc).splitlines()[0]}); the file is truncated "
                           "or corrupt — re-copy it") from None


def _folder_weights(folder: Path) -> tuple[dict, list[Path]]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError):
            raise PayloadError(f"{index}: not a valid safetensors index (needs a weight_map)") from None
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise PayloadError(f"drafter {folder}: no *.safetensors weights in the folder")
    weights: dict = {}
    for f in files:
        if not f.exists():
            raise PayloadError(f"drafter {folder}: shard {f.name} listed in the index is missing")
        weights.update(load_safetensors(f))
    return weights, files


def weight_shapes(weights: dict) -> dict:
    return {k: list(v.shape) for k, v in weights.items()}


def float_dtypes(weights: dict) -> set[str]:
    return {str(t.dtype).replace("torch.", "") for t in weights.values() if t.is_floating_point()}


# ---------------------------------------------------------------------------------------------------
# training checkpoint


def _strip_prefixes(state: dict) -> tuple[dict, dict]:
    out = {}
    for k, v in state.items():
        for prefix in ("module.", "_orig_mod."):
            k = k.replace(prefix, "")
        out[k] = v
    if any(k.startswith("draft_model.") for k in out):
        drafter = {k[len("draft_model."):]: v for k, v in out.items() if k.startswith("draft_model.")}
        extras = {k: v for k, v in out.items() if not k.startswith("draft_model.")}
        return drafter, extras
    return out, {}


TORCH_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since PyTorch 1.6: a zip archive
PICKLE_PROTOCOL_2_UP = 0x80      # the legacy format: a pickle, whose protocol 2+ opcode comes first


def check_torch_file(p: Path) -> None:
    """A file torch.load can read starts as a zip archive or a pickle; anything else (a text file, an empty one,
    a safetensors file) is said to be what it is, not diagnosed from the unpickler's message."""
    with p.open("rb") as fh:
        head = fh.read(64)
    if head.startswith(TORCH_ZIP_MAGIC) or head[:1] == bytes([PICKLE_PROTOCOL_2_UP]):
        return
    if not head:
        what = "an empty file (0 bytes): the save was cut short, or it is still being written"
    elif len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < 100_000_000:
        what = "a safetensors file, not a torch.save file: give it as a drafter folder's model.safetensors"
    elif all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        what = f"a text file, not a torch.save file (it starts {head[:24].decode('ascii')!r})"
    else:
        what = "not a torch.save file (neither a zip archive nor a pickle)"
    raise PayloadError(f"training checkpoint {p}: {what}")


def read_training_checkpoint(path: str | os.PathLike) -> dict:
    """Load the team's training checkpoint; returns model state, embedded config and what was dropped."""
    import pickle

    import torch

    p = Path(path)
    if not p.is_file():
        raise PayloadError(f"training checkpoint {p} not found")
    check_torch_file(p)
    try:
        try:
            obj = torch.load(str(p), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            obj = torch.load(str(p), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise PayloadError(f"training checkpoint {p}: holds Python objects beyond tensors and plain containers "
                           f"({first_line(exc)}); re-save it with plain dicts") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise PayloadError(f"training checkpoint {p}: unreadable torch file ({first_line(exc)}); "
                           "truncated or not a torch.save file") from None
    if not isinstance(obj, dict):
        raise PayloadError(f"training checkpoint {p}: expected a dict with a 'model' state dict, found "
                           f"{type(obj).__name__}")
    model_key = next((k for k in MODEL_KEYS if k in obj), None)
    if model_key is None:
        looks_flat = obj and all(isinstance(v, torch.Tensor) for v in obj.values())
        hint = " (it looks like a bare state dict; wrap it as {'model': state_dict})" if looks_flat else ""
        keys = ", ".join(sorted(map(str, obj))[:20]) or "none"
        raise PayloadError(f"training checkpoint {p}: unknown layout — no 'model' entry{hint}; top-level keys "
                           f"found: {keys}")
    state = obj[model_key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PayloadError(f"training checkpoint {p}: '{model_key}' must map parameter names to tensors")
    drafter, extras = _strip_prefixes(state)
    config = obj.get("config")
    if config is not None and not isinstance(config, dict):
        raise PayloadError(f"training checkpoint {p}: 'config' must be a mapping, found {type(config).__name__}")
    step = obj.get("step", obj.get("global_step"))
    return {"model_key": model_key, "weights": drafter, "extras": extras, "config": config,
            "top_keys": sorted(map(str, obj)), "dropped": sorted(str(k) for k in obj if k != model_key),
            "step": step if isinstance(step, int) else None}


def training_metadata(cfg: dict | None, where: str) -> dict | None:
    """The validated ``training`` block of a drafter config/spec, or None when there is none."""
    if not isinstance(cfg, dict) or cfg.get(TRAINING_BLOCK) is None:
        return None
    block = cfg[TRAINING_BLOCK]
    if not isinstance(block, dict):
        raise PayloadError(f"{where}: '{TRAINING_BLOCK}' must be a mapping of training facts (feature_kernel_path, "
                           f"enable_thinking, chat_template_sha256, expected_p1, ...), found {type(block).__name__}")
    kp = block.get("feature_kernel_path")
    if kp is not None and kp not in KERNEL_PATHS:
        raise PayloadError(f"{where}: {TRAINING_BLOCK}.feature_kernel_path must be one of {', '.join(KERNEL_PATHS)} "
                           f"(the linear-attention path that produced the training features), found {kp!r}")
    if "enable_thinking" in block and not isinstance(block["enable_thinking"], bool):
        raise PayloadError(f"{where}: {TRAINING_BLOCK}.enable_thinking must be true or false, found "
                           f"{block['enable_thinking']!r}")
    sha = block.get("chat_template_sha256")
    if sha is not None and not (isinstance(sha, str) and len(sha) == 64
                                and all(c in "0123456789abcdef" for c in sha.lower())):
        raise PayloadError(f"{where}: {TRAINING_BLOCK}.chat_template_sha256 must be 64 hex digits, found {sha!r}")
    p1 = block.get("expected_p1")
    if p1 is not None and (isinstance(p1, bool) or not isinstance(p1, (int, float)) or not 0 < p1 <= 1):
        raise PayloadError(f"{where}: {TRAINING_BLOCK}.expected_p1 must be a number in (0, 1] (position-1 "
                           f"acceptance expected from training metrics), found {p1!r}")
    return dict(block)


# ---------------------------------------------------------------------------------------------------
# format detection and loading


def detect_format(path: Path) -> str:
    if path.is_file():
        if path.suffix == ".safetensors":
            return detect_format(path.parent)
        return "training"
    if not path.is_dir():
        raise PayloadError(f"drafter path {path} does not exist")
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        pts = sorted(path.glob("*.pt")) + sorted(path.glob("*.pth"))
        hint = f" (for a training checkpoint pass the file, e.g. {pts[0]})" if pts else ""
        raise PayloadError(f"drafter {path}: no config.json{hint}")
    from remote_payload.models.target import read_json

    cfg = read_json(cfg_path, f"drafter {path}")
    record = path / "dfo-source.json"
    if record.exists() and read_json(record, f"drafter {path}").get("format") == "training":
        return "training-stripped"
    if "speculators_model_type" in cfg or "transformer_layer_config" in cfg or "speculators_config" in cfg:
        return "speculators"
    if "dflash_config" in cfg or "block_size" in cfg:
        return "zlab"
    raise PayloadError(f"drafter {cfg_path}: neither a z-lab config (dflash_config) nor a speculators config "
                       f"(speculators_model_type); keys found: {', '.join(sorted(cfg)[:15])}")


SIDECAR_NAMES = ("spec.json", "spec.yaml", "spec.yml")


def find_sidecar(checkpoint: Path) -> Path | None:
    """A spec sidecar next to a training checkpoint (spec.json / spec.yaml), used when none is given."""
    for name in SIDECAR_NAMES:
        cand = checkpoint.parent / name
        if cand.is_file():
            return cand
    return None


def training_spec(spec_file, embedded: dict | None, checkpoint: Path) -> tuple[dict | None, str, str | None]:
    """The training spec to use: explicit sidecar, else the checkpoint's 'config', else a sidecar beside it."""
    if spec_file:
        return read_spec_file(spec_file), f"drafter spec {spec_file}", str(spec_file)
    if embedded is not None:
        return embedded, f"training checkpoint {checkpoint} 'config'", None
    found = find_sidecar(checkpoint)
    if found is not None:
        return read_spec_file(found), f"drafter spec {found}", str(found)
    return None, "", None


NO_SPEC = ("has no drafter spec: no 'config' entry, no spec.json/spec.yaml beside it and none given; give a spec "
           "sidecar (JSON/YAML with block_size, mask_token_id, target_layer_ids, rope_theta), a file on the eval "
           "host: `dfo watch --drafter-spec FILE`, `dfo eval --payload-arg=--drafter-spec=NAME=FILE` (here: "
           "--drafter-spec NAME=FILE, or strip-checkpoint --spec FILE)")


def load_drafter(path: str | os.PathLike, spec_file: str | os.PathLike | None = None,
                 allow_fp16: bool = False) -> LoadedDrafter:
    p = Path(path)
    fmt = detect_format(p)
    if fmt == "training":
        spec, weights, extras, source, meta = _read_training(p, spec_file)
    else:
        spec, weights, extras, source, meta = _read_folder(p, fmt, spec_file)
    if meta is not None:
        source["training_metadata"] = meta
    for k in IGNORED_BUFFERS:
        weights.pop(k, None)
    dtypes = float_dtypes(weights)
    spec.weights_dtype = ",".join(sorted(dtypes)) or None
    if "float16" in dtypes and not allow_fp16:
        raise PayloadError(f"{p}: weights are float16; DFlash drafters are trained in bfloat16 and fp16's narrow "
                           "range gives near-0% acceptance (pitfall 5). Convert to bfloat16, or pass --allow-fp16")
    validate_weights(spec, weights, extras, str(p))
    return LoadedDrafter(spec=spec, weights=weights, extras=extras, source=source)


def _read_training(p: Path, spec_file) -> tuple:
    """A training checkpoint (torch file): (spec, weights, extras, source, training metadata)."""
    ck = read_training_checkpoint(p)
    weights, extras = set_aside_copies(ck["weights"])
    extras.update(ck["extras"])
    spec_dict, where, used = training_spec(spec_file, ck["config"], p)
    if spec_dict is None:
        raise PayloadError(f"training checkpoint {p} {NO_SPEC}")
    spec = from_training(spec_dict, weight_shapes(weights), where)
    meta = training_metadata(spec_dict, where)
    digest = {"algorithm": "sha256", "value": file_sha256(p)} if p.stat().st_size <= 2 * 2**30 else \
        weights_digest_file(p)
    source = {"path": str(p), "format": "training", "digest": digest, "spec_file": used,
              "top_keys": ck["top_keys"], "dropped": ck["dropped"], "step": ck["step"]}
    return spec, weights, extras, source, meta


def _read_folder(p: Path, fmt: str, spec_file) -> tuple:
    """A z-lab, speculators or stripped folder: (spec, weights, extras, source, training metadata)."""
    from remote_payload.models.target import read_json, weights_digest

    folder = p if p.is_dir() else p.parent
    cfg = read_json(folder / "config.json", f"drafter {folder}")
    weights, _files = _folder_weights(folder)
    where = f"drafter {folder}/config.json"
    source = {"path": str(folder), "format": fmt, "digest": weights_digest(folder)}
    if fmt == "training-stripped":
        weights, extras = set_aside_copies(weights)
        source["stripped_from"] = read_json(folder / "dfo-source.json", f"drafter {folder}")
        if spec_file:
            spec_dict = read_spec_file(spec_file)
            spec = from_training(spec_dict, weight_shapes(weights), f"drafter spec {spec_file}")
            meta = training_metadata(spec_dict, f"drafter spec {spec_file}")
            source["spec_file"] = str(spec_file)
        elif "dflash_config" in cfg:
            spec = from_zlab(cfg, weight_shapes(weights), where, fmt="training")
            meta = training_metadata(cfg, where)
        else:
            raise PayloadError(f"stripped training checkpoint {folder} {NO_SPEC}")
        spec.format = "training (stripped)"
    elif fmt == "speculators":
        if spec_file:
            cfg = _apply_overrides(cfg, read_spec_file(spec_file), fmt, spec_file)
        extras = {k: weights.pop(k) for k in ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d",
                                              "verifier_norm.weight", "verifier_lm_head.weight") if k in weights}
        spec = from_speculators(cfg, {**weight_shapes(weights), **weight_shapes(extras)}, where)
        meta = training_metadata(cfg, where)
    else:
        if spec_file:
            cfg = _apply_overrides(cfg, read_spec_file(spec_file), fmt, spec_file)
        weights, extras = set_aside_copies(weights)
        spec = from_zlab(cfg, weight_shapes(weights), where)
        meta = training_metadata(cfg, where)
    if spec_file and fmt != "training-stripped":
        spec.notes.append(f"fields overridden by {spec_file}")
    return spec, weights, extras, source, meta


def weights_digest_file(path: Path) -> dict:
    size = path.stat().st_size
    h = hashlib.sha256(f"{path.name}\0{size}\0".encode())
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        h.update(fh.read(1 << 20))
    return {"algorithm": "sha256-sampled", "value": h.hexdigest(), "bytes": size}


OVERRIDABLE = ("mask_token_id", "block_size", TRAINING_BLOCK)


def _apply_overrides(cfg: dict, overrides: dict, fmt: str, spec_file) -> dict:
    bad = sorted(set(overrides) - set(OVERRIDABLE))
    if bad:
        raise PayloadError(f"drafter spec {spec_file}: for a {fmt} checkpoint only {', '.join(OVERRIDABLE)} can be "
                           f"overridden; found {', '.join(bad)}")
    cfg = json.loads(json.dumps(cfg))
    overrides = dict(overrides)
    if TRAINING_BLOCK in overrides:  # metadata about the checkpoint, kept at the config's top level
        cfg[TRAINING_BLOCK] = overrides.pop(TRAINING_BLOCK)
    if fmt == "zlab":
        dcfg = cfg.setdefault("dflash_config", {})
        dcfg.update(overrides)
        if "block_size" in overrides:
            cfg.pop("block_size", None)
    else:
        cfg.update(overrides)
    return cfg


def set_aside_copies(weights: dict) -> tuple[dict, dict]:
    extras = {k: weights.pop(k) for k in TARGET_COPIES if k in weights}
    return weights, extras
