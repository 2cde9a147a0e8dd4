"""`info`: what this host offers the payload. Imports torch only if installed; never imports fla/triton."""

from __future__ import annotations

import platform
import sys

from remote_payload import RESULTS_SCHEMA, __version__
from remote_payload.models.kernels import environment
from remote_payload.results import versions


def collect() -> dict:
    env = environment()
    v = versions()
    return {
        "dfo": "info",
        "payload_version": __version__,
        "results_schema": RESULTS_SCHEMA,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": env["torch"],
        "transformers": v.get("transformers"),
        "safetensors": v.get("safetensors"),
        "accelerate": v.get("accelerate"),
        "cuda_available": env["cuda_available"],
        "cuda_version": v.get("cuda"),
        "gpus": env["gpus"],
        "fla_installed": env["fla_installed"],
        "triton_installed": env["triton_installed"],
        "causal_conv1d_installed": env["causal_conv1d_installed"],
        "linear_attention_kernel": env["linear_attention_kernel"],
        "linear_attention_reason": env["linear_attention_reason"],
    }
