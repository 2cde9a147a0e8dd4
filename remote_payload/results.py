"""results.json / samples.jsonl assembly and atomic writing (schema "dfo.results/1", see README)."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from remote_payload import RESULTS_SCHEMA, __version__
from remote_payload.inputs.cache import atomic_write_bytes, atomic_write_json

PACKAGES = ("torch", "transformers", "safetensors", "accelerate", "tokenizers", "flash-linear-attention", "triton",
            "causal-conv1d")


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """Package versions from metadata (no imports of fla/triton), plus CUDA facts when torch is loaded."""
    out: dict[str, Any] = {"payload": __version__, "python": platform.python_version(),
                           **{name: _dist_version(name) for name in PACKAGES}}
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
        out["gpus"] = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                       if torch.cuda.is_available() else [])
    return out


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_outputs(out_dir: Path, results: dict, sample_lines: list[dict]) -> dict:
    """samples.jsonl first, results.json last: a results.json on disk means the run completed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in sample_lines)
    atomic_write_bytes(out_dir / "samples.jsonl", body.encode())
    results = {"schema": RESULTS_SCHEMA, **results}
    atomic_write_json(out_dir / "results.json", results)
    return {"results": str(out_dir / "results.json"), "samples": str(out_dir / "samples.jsonl")}
