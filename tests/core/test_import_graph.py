"""The import graph, read from the source with ast (nothing is imported): no circle across files, and no arrow
from a lower floor to a higher one.

The floors are written once, here (docs/architecture.md names this file): "imports go downwards only: cli →
features → transport → core", with the test and demo support on top of the features and the payload at the
bottom (it never imports ``orchestrator``). A room is a folder of ``orchestrator/`` (``orchestrator/cli``,
``orchestrator/evaluation``, ...) or ``remote_payload`` as a whole; rooms on one floor may import each other (a
feature may use another feature's operation), but no module may be part of a circle of imports. Every import
counts, the ones inside functions (loaded lazily) and under ``TYPE_CHECKING`` too: a circle that only closes
at run time is still one the reader has to hold in their head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "remote_payload")

# Top floor first. A new folder of orchestrator/ gets its floor here (the check names one that has none).
FLOORS: tuple[tuple[str, ...], ...] = (
    ("orchestrator.__main__",),
    ("orchestrator.cli",),
    ("orchestrator.ui",),  # the terminal's rendering: imported by the CLI alone
    ("orchestrator.demo",),
    ("orchestrator.testing",),
    ("orchestrator.watch", "orchestrator.evaluation", "orchestrator.lint", "orchestrator.executors",
     "orchestrator.cluster", "orchestrator.jobs", "orchestrator.relay", "orchestrator.deploy",
     "orchestrator.provision"),
    ("orchestrator.transport",),
    ("orchestrator.core",),
    ("remote_payload",),
)


def module_name(path: Path, root: Path = REPO) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, importer: str, is_package: bool, modules: set[str]) -> set[str]:
    """The project's modules SOURCE (module IMPORTER) imports: ``from P import N`` is an arrow to ``P.N`` when
    that is a module, else to ``P``; a name deeper than any module resolves to the module that holds it."""
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = importer.split(".") if is_package else importer.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                       for alias in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in PACKAGES and (hit := resolve(target)) is not None and hit != importer:
                found.add(hit)
    return found


def read_graph(root: Path = REPO) -> dict[str, set[str]]:
    paths = {module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}
    modules = set(paths)
    return {m: imports_of(p.read_text(encoding="utf-8"), m, p.name == "__init__.py", modules)
            for m, p in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected parts of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return found


def room(module: str) -> str:
    """orchestrator.evaluation.operation -> orchestrator.evaluation; remote_payload.eval.x -> remote_payload."""
    parts = module.split(".")
    return "remote_payload" if parts[0] == "remote_payload" else ".".join(parts[:2])


def floor_of() -> dict[str, int]:
    return {r: level for level, rooms in enumerate(FLOORS) for r in rooms}


def upward_arrows(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """``importer -> imported`` for every arrow to a higher floor (a smaller index), and every room without one."""
    bad = []
    for importer, imported in sorted(graph.items()):
        for target in sorted(imported):
            a, b = room(importer), room(target)
            if a == b:
                continue
            missing = [r for r in (a, b) if r not in floors]
            if missing:
                bad.append(f"{', '.join(missing)} has no floor in tests/core/test_import_graph.py FLOORS")
            elif floors[b] < floors[a]:
                bad.append(f"{importer} -> {target} ({a} is below {b})")
    return sorted(set(bad))


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return read_graph()


def test_no_circle_of_imports_across_files(graph):
    found = circles(graph)
    assert found == [], "modules that import each other (move what both need into a module both import):\n" \
        + "\n".join("  " + ", ".join(part) for part in found)


def test_imports_go_downwards_only(graph):
    bad = upward_arrows(graph, floor_of())
    assert bad == [], "imports from a lower floor to a higher one:\n" + "\n".join(f"  {b}" for b in bad)


# Where a job runs is decided behind one seam (orchestrator/executors/): the eval and the watch ask it, and never
# import a place to run themselves.
SEAM_USERS = ("orchestrator.evaluation", "orchestrator.watch")
PLACES = ("orchestrator.cluster",)


def test_eval_and_watch_reach_the_places_to_run_through_the_executor_seam_only(graph):
    bad = [f"{m} -> {t}" for m, ts in sorted(graph.items()) if room(m) in SEAM_USERS for t in sorted(ts)
           if room(t) in PLACES]
    assert bad == [], "call orchestrator.executors.registry instead:\n" + "\n".join(f"  {b}" for b in bad)


def test_the_payload_never_imports_the_controller(graph):
    bad = [f"{m} -> {t}" for m, ts in graph.items() if m.startswith("remote_payload") for t in ts
           if t.startswith("orchestrator")]
    assert bad == []


def test_the_checks_catch_what_they_are_for(tmp_path):
    """A circle through a lazy import and a package, an arrow up a floor and a folder with no floor are found;
    ``from P import N`` of a name (not a module) is an arrow to P."""
    files = {
        "orchestrator/__init__.py": "",
        "orchestrator/core/__init__.py": "",
        "orchestrator/core/a.py": "def f():\n    from orchestrator.evaluation import b\n",
        "orchestrator/evaluation/__init__.py": "from orchestrator.evaluation.b import thing\n",
        "orchestrator/evaluation/b.py": "from orchestrator.core.a import f\nthing = 1\n",
        "orchestrator/evaluation/c.py": "from orchestrator.evaluation import thing\nfrom . import b\n",
        "orchestrator/newroom/d.py": "from orchestrator.core import a\n",
        "remote_payload/__init__.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    g = read_graph(tmp_path)
    assert g["orchestrator.evaluation.c"] == {"orchestrator.evaluation", "orchestrator.evaluation.b"}
    assert circles(g) == [["orchestrator.core.a", "orchestrator.evaluation.b"]]
    assert upward_arrows(g, floor_of()) == [
        "orchestrator.core.a -> orchestrator.evaluation.b (orchestrator.core is below orchestrator.evaluation)",
        "orchestrator.newroom has no floor in tests/core/test_import_graph.py FLOORS"]
