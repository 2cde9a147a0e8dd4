"""paramiko's ssh_config parser, without the cost of importing paramiko.

Resolving a host (``inventory.resolve_host``) reads ssh_config with paramiko's ``SSHConfig``, so both
SSH planes see the same file the same way. Importing ``paramiko`` for that costs ~0.3 s of CPU (its
transport, cryptography, and invoke, which paramiko's config module imports for ``Match exec``): every
start of a command that never opens a paramiko connection -- a relay over the system ssh -- paid it.
paramiko/config.py needs only the standard library and paramiko/ssh_exception.py, so it is loaded on
its own here, under a private package name (``paramiko`` itself stays unimported, and importing it
later is unaffected), and invoke is imported only when a ``Match exec`` line is evaluated. When
paramiko is already loaded, or its layout is not the expected one, its own class is used.
"""

from __future__ import annotations

import builtins
import importlib.util
import os
import sys
import threading
import types
from typing import Any

_PACKAGE = "_dfo_paramiko_config"
_lock = threading.Lock()


class _LazyInvoke:
    """Stands in for the ``invoke`` module inside the config module: imported on first use."""

    def __getattr__(self, name: str) -> Any:
        import invoke

        return getattr(invoke, name)


def _import_without_invoke(name: str, *args: Any, **kwargs: Any) -> Any:
    if name == "invoke":
        raise ImportError("invoke is imported when a Match exec line is evaluated")
    return builtins.__import__(name, *args, **kwargs)


def _load() -> Any:
    found = importlib.util.find_spec("paramiko")  # finds the package without running its __init__
    folders = list(found.submodule_search_locations or []) if found else []
    path = os.path.join(folders[0], "config.py") if folders else ""
    if not os.path.isfile(path):
        raise ImportError("paramiko/config.py not found")
    package = types.ModuleType(_PACKAGE)
    package.__path__ = folders  # its relative import (.ssh_exception) loads from paramiko's folder
    sys.modules[_PACKAGE] = package
    spec = importlib.util.spec_from_file_location(f"{_PACKAGE}.config", path)  # paramiko's cached bytecode
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    module.__builtins__ = dict(vars(builtins), __import__=_import_without_invoke)  # type: ignore[attr-defined]
    spec.loader.exec_module(module)
    module.invoke = _LazyInvoke()  # type: ignore[attr-defined]
    sys.modules[spec.name] = module
    return module


def ssh_config_class() -> Any:
    """paramiko's ``SSHConfig`` class (``SSHConfig()``, ``SSHConfig.from_path(path).lookup(host)``)."""
    loaded = sys.modules.get("paramiko")
    if loaded is not None and hasattr(loaded, "SSHConfig"):
        return loaded.SSHConfig
    with _lock:
        module = sys.modules.get(f"{_PACKAGE}.config")
        if module is None:
            try:
                module = _load()
            except Exception:  # noqa: BLE001 - an unexpected paramiko layout: the full import still works
                sys.modules.pop(_PACKAGE, None)
                import paramiko

                return paramiko.SSHConfig
        return module.SSHConfig
