"""Loading the target model: any HF causal LM, text-only, decoder layers found via get_decoder().

Qwen3.5/3.6 vision-language folders load through AutoModelForCausalLM as the text model only.
bf16 by default; CUDA when present (device_map over all GPUs for large targets), else CPU.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_payload.errors import PayloadError
from remote_payload.models import kernels
from remote_payload.progress import SILENT, Progress

DTYPES = ("bfloat16", "float32")
FULL_DIGEST_LIMIT = 2 * 2**30  # hash whole weight files up to this total size, sample larger ones
SAMPLE_BYTES = 2**20


def resolve_device(device: str) -> str:
    import torch

    if device not in ("auto", "cuda", "cpu"):
        raise PayloadError(f"--device must be auto, cuda or cpu, not {device!r}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PayloadError("--device cuda requested but torch sees no CUDA device on this host")
    return device


def resolve_dtype(name: str, allow_fp16: bool = False):
    import torch

    if name in ("float16", "fp16", "half"):
        if not allow_fp16:
            raise PayloadError(
                "dtype float16 refused: DFlash drafters and Qwen3.x targets are trained in bfloat16; fp16's narrow "
                "range gives near-0% acceptance (pitfall 5). Use bfloat16, or pass --allow-fp16 to "
                "force it")
        return torch.float16
    if name not in DTYPES:
        raise PayloadError(f"--dtype must be one of {', '.join(DTYPES)}, not {name!r}")
    return getattr(torch, name)


def read_json(path: Path, what: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise PayloadError(f"{what}: {path} not found") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"{what}: {path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise PayloadError(f"{what}: {path} must hold a JSON object, found {type(data).__name__}")
    return data


def weights_digest(folder: Path) -> dict:
    """A digest of the weight files, cheap enough to compute on every run.

    Small targets (fixtures, up to 2 GiB) get a full sha256 over all weight files; larger ones a
    sampled sha256 (file names, sizes, first and last MiB of each file), which changes whenever a
    file is replaced, re-saved or resized. The algorithm is recorded next to the value.
    """
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file())
    if not files:
        raise PayloadError(f"target {folder}: no weight files (*.safetensors / *.bin) in the folder")
    total = sum(p.stat().st_size for p in files)
    full = total <= FULL_DIGEST_LIMIT
    h = hashlib.sha256()
    for p in files:
        size = p.stat().st_size
        h.update(f"{p.name}\0{size}\0".encode())
        with open(p, "rb") as fh:
            if full:
                for chunk in iter(lambda: fh.read(1 << 22), b""):
                    h.update(chunk)
            else:
                h.update(fh.read(SAMPLE_BYTES))
                fh.seek(max(0, size - SAMPLE_BYTES))
                h.update(fh.read(SAMPLE_BYTES))
    return {"algorithm": "sha256" if full else "sha256-sampled", "value": h.hexdigest(), "bytes": total}


@dataclass
class TargetConfig:
    """What the eval needs to know about the target before loading weights (checked early)."""
    path: Path
    name: str
    model_type: str
    architectures: list[str]
    num_layers: int
    hidden_size: int
    vocab_size: int
    layer_types: list[str]
    rope: dict

    @property
    def has_linear_attention(self) -> bool:
        return "linear_attention" in self.layer_types


def read_target_config(path: str | os.PathLike) -> TargetConfig:
    folder = Path(path)
    if not folder.is_dir():
        raise PayloadError(f"target path {folder} does not exist or is not a folder")
    raw = read_json(folder / "config.json", f"target {folder}")
    nested = raw.get("text_config")
    text = nested if isinstance(nested, dict) else raw
    missing = [k for k in ("num_hidden_layers", "hidden_size", "vocab_size") if k not in text]
    if missing:
        raise PayloadError(f"target {folder}/config.json: missing field(s) {', '.join(missing)}"
                           + (" in text_config" if text is not raw else ""))
    layer_types = list(text.get("layer_types") or ["full_attention"] * int(text["num_hidden_layers"]))
    rope = dict(text.get("rope_parameters") or {})
    if not rope and "rope_theta" in text:
        rope = {"rope_theta": text["rope_theta"], **(text.get("rope_scaling") or {})}
    return TargetConfig(path=folder, name=folder.name, model_type=str(raw.get("model_type", "")),
                        architectures=list(raw.get("architectures") or []),
                        num_layers=int(text["num_hidden_layers"]), hidden_size=int(text["hidden_size"]),
                        vocab_size=int(text["vocab_size"]), layer_types=layer_types, rope=rope)


def load_tokenizer(path: str | os.PathLike):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any tokenizer load failure is an input problem here
        raise PayloadError(f"target {path}: cannot load its tokenizer ({type(exc).__name__}: {exc})") from None
    if not getattr(tok, "chat_template", None):
        raise PayloadError(f"target {path}: the tokenizer has no chat template; the eval applies the chat template "
                           "explicitly (drafters are trained on templated text)")
    return tok


def render_prompt(tokenizer, messages: list[dict], enable_thinking: bool) -> list[int]:
    """Chat template applied explicitly, generation prompt added, thinking flag passed through."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=enable_thinking)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(folder: Path, tokenizer) -> list[int]:
    ids: set[int] = set()
    gen = folder / "generation_config.json"
    if gen.exists():
        eos = read_json(gen, f"target {folder}").get("eos_token_id")
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, list):
            ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return sorted(ids)


@dataclass
class Target:
    model: Any
    tokenizer: Any
    config: TargetConfig
    device: str
    dtype: Any
    input_device: Any
    layers: Any
    stop_ids: list[int]
    kernel_path: str
    kernel_details: dict = field(default_factory=dict)
    digest: dict = field(default_factory=dict)
    device_map: Any = None

    def info(self) -> dict:
        return {
            "name": self.config.name,
            "path": str(self.config.path),
            "architecture": type(self.model).__name__,
            "config_architectures": self.config.architectures,
            "model_type": self.config.model_type,
            "weights_digest": self.digest,
            "num_layers": self.config.num_layers,
            "hidden_size": self.config.hidden_size,
            "vocab_size": self.config.vocab_size,
            "linear_attention_layers": self.config.layer_types.count("linear_attention"),
            "kernel_path": self.kernel_path,
            "kernels": self.kernel_details,
            "dtype": str(self.dtype).replace("torch.", ""),
            "device": self.device,
            "device_map": self.device_map,
            "stop_token_ids": self.stop_ids,
        }


def decoder_layers(model) -> Any:
    """The decoder layer list via get_decoder(), never a hard-coded attribute path."""
    try:
        layers = model.get_decoder().layers
    except AttributeError:
        raise PayloadError(f"target model {type(model).__name__} exposes no get_decoder().layers; "
                           "only decoder-only causal LMs are supported") from None
    return layers


def cache_kwarg(model) -> str:
    """transformers 5.x renamed past_key_values= to cache=; use whichever this model accepts."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def load_target(path: str | os.PathLike, device: str = "auto", dtype: str = "bfloat16", allow_fp16: bool = False,
                kernel: str = "auto", progress: Progress = SILENT) -> Target:
    cfg = read_target_config(path)
    device = resolve_device(device)
    requested_kernel = kernels.apply_policy(device, kernel)  # before transformers' model code is imported
    torch_dtype = resolve_dtype(dtype, allow_fp16)

    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(cfg.path)
    device_map = None
    kwargs: dict = {"dtype": torch_dtype, "local_files_only": True}
    if device == "cuda":
        # accelerate spreads a large target over every visible GPU; a small one lands on GPU 0.
        device_map = "auto" if torch.cuda.device_count() > 1 else {"": 0}
        kwargs["device_map"] = device_map
    progress.progress("load", 0, 1, unit="model", message=f"loading {cfg.name} ({dtype}, {device})")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(cfg.path), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise PayloadError(f"target {cfg.path}: cannot load the model ({type(exc).__name__}: {exc})") from None
    model.eval()
    path_used, details = kernels.kernel_path(model)
    if device != "cuda" and path_used == "fla" and requested_kernel != "fla":
        raise PayloadError("fla kernels were bound although the run is on CPU (transformers' model code was imported "
                           "before the payload could block fla); run the payload in a fresh process")
    if requested_kernel == "torch" and path_used == "fla":
        raise PayloadError("--kernel torch requested but transformers already bound fla in this process")
    if requested_kernel == "fla" and path_used not in ("fla", "none"):
        raise PayloadError(f"--kernel fla requested but transformers bound the {path_used} path (is "
                           "flash-linear-attention importable with triton? `python -m remote_payload info`)")
    layers = decoder_layers(model)
    if len(layers) != cfg.num_layers:
        raise PayloadError(f"target {cfg.path}: config says {cfg.num_layers} layers, the model has {len(layers)}")
    input_device = model.get_input_embeddings().weight.device
    digest = weights_digest(cfg.path)
    progress.progress("load", 1, 1, unit="model", message=f"{type(model).__name__}, kernel path {path_used}")
    return Target(model=model, tokenizer=tokenizer, config=cfg, device=device, dtype=torch_dtype,
                  input_device=input_device, layers=layers, stop_ids=stop_token_ids(cfg.path, tokenizer),
                  kernel_path=path_used, kernel_details=details, digest=digest,
                  device_map=device_map if isinstance(device_map, str) else (None if device_map is None else "single"))
