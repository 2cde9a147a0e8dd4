"""No module imports a private (`_name`) name from another feature folder.

A feature folder is `orchestrator/<feature>/` or `remote_payload/<feature>/` (a module directly under the
package is a feature of its own). What one feature needs of another is public there; a leading underscore
says "only this feature relies on it", which the check keeps true. Dunder names (`__version__`) are public.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "remote_payload")


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def feature(module: str) -> str:
    """orchestrator.watch.resident -> orchestrator.watch; remote_payload.cli -> remote_payload.cli."""
    return ".".join(module.split(".")[:2])


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_imports(source: str, importer: str, is_package: bool = False) -> list[str]:
    """`line: module.name` of every private name SOURCE (module IMPORTER) imports from another feature."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = absolute(node, importer, is_package)
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            module, names = "", [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            full = f"{module}.{name}" if module else name
            if not full.startswith(PACKAGES) or feature(full) == feature(importer):
                continue
            if any(private(part) for part in full.split(".")):
                bad.append(f"{node.lineno}: {full}")
    return bad


def test_no_feature_imports_another_features_private_names():
    bad = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            importer = module_name(path)
            found = private_imports(path.read_text(encoding="utf-8"), importer, path.name == "__init__.py")
            bad += [f"{path.relative_to(REPO)}:{line}" for line in found]
    assert bad == [], "private names imported across feature folders (make them public where they belong):\n" \
        + "\n".join(bad)


def test_the_check_catches_what_it_is_for():
    source = ("from orchestrator.evaluation.operation import _put_file, public\n"
              "from orchestrator.watch.series import _own\n"
              "from . import _sibling\n"
              "from ..evaluation import _other\n"
              "import orchestrator.jobs._private_module\n"
              "from remote_payload import __version__\n"
              "from os import _exit\n")
    assert private_imports(source, "orchestrator.watch.resident") == [
        "1: orchestrator.evaluation.operation._put_file",
        "4: orchestrator.evaluation._other",
        "5: orchestrator.jobs._private_module",
    ]
