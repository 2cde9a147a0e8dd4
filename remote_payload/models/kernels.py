"""Which linear-attention kernels transformers binds, and keeping fla/triton away from CPU runs.

transformers' Qwen3.5 modelling module decides at *import time* whether its gated-delta-rule and
causal-conv1d functions use the fla / causal_conv1d packages or its own torch code: it tries
``import fla`` and keeps whatever resolves. With triton installed on a CPU-only host, that binds fla's
Triton kernels and every forward fails ("0 active drivers"). So before transformers' modelling modules
are imported for a CPU run, we make those packages unimportable in this process. The kernel path in
use is read back from the bound functions and recorded with every cache and result, because fla and
torch paths give numerically different hidden states (docs/troubleshooting.md, pitfall 7).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Iterator

from remote_payload.errors import PayloadError

# Packages transformers may bind for linear-attention layers; all need a GPU.
GPU_KERNEL_PACKAGES = ("fla", "causal_conv1d")
KERNEL_CHOICES = ("auto", "fla", "torch")


def installed(name: str) -> bool:
    """Whether a top-level package is installed, without importing it."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _modelling_modules_imported() -> list[str]:
    return [name for name, mod in sys.modules.items()
            if mod is not None and name.startswith("transformers.models.") and ".modeling_" in name]


def triton_interpreter() -> bool:
    """Whether Triton runs kernels with its CPU interpreter (TRITON_INTERPRET=1).

    Only the test suite does this (tests/fla_cpu, which also patches the interpreter so fla's kernels run):
    it is how the fla path is exercised without a GPU. Far too slow for real use.
    """
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def apply_policy(device_type: str, kernel: str = "auto") -> str:
    """Decide the linear-attention path before transformers' modelling code is imported.

    Returns the requested path ("fla" or "torch"). On CPU, or when ``kernel == "torch"``, fla and
    causal_conv1d are made unimportable in this process so transformers binds its torch fallback.
    """
    if kernel not in KERNEL_CHOICES:
        raise PayloadError(f"--kernel must be one of {', '.join(KERNEL_CHOICES)}, not {kernel!r}")
    if device_type != "cuda" and kernel == "fla" and not triton_interpreter():
        raise PayloadError("--kernel fla needs a CUDA device: fla's Triton kernels cannot run on CPU")
    want = "torch" if kernel == "torch" or (kernel == "auto" and device_type != "cuda") else "fla"
    if want == "torch":
        for name in GPU_KERNEL_PACKAGES:
            if sys.modules.get(name) is None:
                # A None entry makes `import name` raise ImportError: transformers falls back to torch.
                sys.modules[name] = None  # type: ignore[assignment]
    return want


def _binding(func: object) -> dict | None:
    """For a function wrapped by transformers' kernel-fallback decorator, what it is bound to."""
    code = getattr(func, "__code__", None)
    closure = getattr(func, "__closure__", None)
    if code is None or not closure:
        return None
    cells = dict(zip(code.co_freevars, closure, strict=False))
    if not {"implementation", "torch_function", "package"} <= cells.keys():
        return None
    impl = cells["implementation"].cell_contents
    torch_fn = cells["torch_function"].cell_contents
    return {"package": cells["package"].cell_contents, "bound": "torch" if impl is torch_fn else
            getattr(impl, "__module__", "external"), "torch_function": torch_fn}


def bound_kernels(module: ModuleType) -> dict[str, str]:
    """Map of kernel-fallback functions in a modelling module to "torch" or the binding module."""
    found = {}
    for name, value in vars(module).items():
        b = _binding(value)
        if b is not None:
            found[name] = b["bound"] if b["bound"] == "torch" else f"{b['package']}:{b['bound']}"
    return found


def kernel_path(model: object) -> tuple[str, dict[str, str]]:
    """("fla" | "torch" | "none", details) for a loaded model.

    "none" means the model has no linear-attention layers, so no kernel choice exists.
    """
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else config
    layer_types = list(getattr(text_config, "layer_types", None) or [])
    if "linear_attention" not in layer_types:
        return "none", {}
    details: dict[str, str] = {}
    for cls in type(model).__mro__:
        mod = sys.modules.get(cls.__module__)
        if mod is not None and cls.__module__.startswith("transformers.models."):
            details.update(bound_kernels(mod))
            break
    # The linear-attention layers may live in a different module than the wrapper class.
    if not details:
        for name in _modelling_modules_imported():
            details.update(bound_kernels(sys.modules[name]))
    delta = [v for k, v in details.items() if "gated_delta_rule" in k]
    if not delta:
        return "unknown", details
    return ("torch" if all(v == "torch" for v in delta) else "fla"), details


@contextlib.contextmanager
def torch_linear_attention(model: object) -> Iterator[None]:
    """Temporarily route a model's linear-attention functions to transformers' torch code.

    The modelling module looks these functions up as module globals at call time, so swapping the
    globals switches the path for an already loaded model (used by the GPU check to compare paths).
    """
    mods = {sys.modules[cls.__module__] for cls in type(model).__mro__
            if cls.__module__.startswith("transformers.models.") and cls.__module__ in sys.modules}
    saved: list[tuple[ModuleType, str, object]] = []
    try:
        for mod in mods:
            for name, value in list(vars(mod).items()):
                b = _binding(value)
                if b is not None and b["bound"] != "torch":
                    saved.append((mod, name, value))
                    setattr(mod, name, b["torch_function"])
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def environment() -> dict:
    """What `info` reports about kernels, without importing fla/triton or binding anything."""
    cuda = False
    gpus: list[dict] = []
    torch_version = None
    try:
        import torch  # noqa: PLC0415 - optional, info must work without torch

        torch_version = torch.__version__
        cuda = bool(torch.cuda.is_available())
        if cuda:
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                gpus.append({"index": i, "name": props.name,
                             "memory_gib": round(props.total_memory / 2**30, 1)})
    except ImportError:
        pass
    fla = installed("fla")
    triton = installed("triton")
    if not cuda:
        path = "torch"
        reason = "no CUDA device: the payload blocks fla/causal_conv1d so transformers uses its torch code"
        if triton and fla:
            reason += (" (fla and triton are installed: importing transformers' Qwen3.5 code outside the payload "
                       "would break CPU forwards)")
    elif fla and triton:
        path, reason = "fla", "CUDA device with fla and triton installed"
    else:
        missing = [n for n, ok in (("flash-linear-attention", fla), ("triton", triton)) if not ok]
        path, reason = "torch", f"CUDA device but {' and '.join(missing)} not installed"
    return {
        "torch": torch_version,
        "cuda_available": cuda,
        "gpus": gpus,
        "fla_installed": fla,
        "triton_installed": triton,
        "causal_conv1d_installed": installed("causal_conv1d"),
        "linear_attention_kernel": path,
        "linear_attention_reason": reason,
    }
