"""Docstrings, comments and the docs name only files that exist.

A repository path (``orchestrator/...``, ``remote_payload/...``, ``tests/...``, ``scripts/...``,
``benchmarks/...``, ``docs/...``) named in a docstring or comment of a Python file, or in README.md,
SECURITY.md, remote_payload/README.md or docs/*.md, must exist. So must a file named by its tail alone
(``ui/relay_progress.py``, ``plan.py``): some tracked file's path ends with it. So a design note named by
its file name must be one this repository ships: a note it does not ship cannot be read by whoever reads
the reference. Placeholders (``FILE.jsonl``, ``WORKDIR/...``), files dfo writes (``report.md``) and other
projects' files (``paramiko/config.py``) are not checked.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("orchestrator", "remote_payload", "tests", "scripts", "benchmarks", "docs")
DOCS = ("README.md", "SECURITY.md", "remote_payload/README.md")
# A path: letters, digits, _ . - and /, ending in a letter or digit (sentence punctuation is not part of it).
PATH = re.compile(r"(?<![\w/<>-])(?:\./)?((?:[\w-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:py|md|sh|toml|lock|in|jsonl))"
                  r"(?![\w/<>*-])")
ROOTED = re.compile(rf"(?<![\w./-])(?:\./)?((?:{'|'.join(ROOTS)})/[\w./@-]*[\w/@])(?![\w./@<*{{-])")
# Files dfo writes (in run folders, on hosts) and other tools' files, not files of this repository.
NOT_OURS = {"report.md", "series.md", "samples.jsonl", "prompts.jsonl", "uv.toml",
            "sitecustomize.py",  # Python's start-up hook, named where a planted one is the threat
            "model.py"}  # quoted from vLLM's own log lines



def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return [p for p in out.splitlines() if (REPO / p).exists()]


def python_prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python source."""
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.append((first.lineno, first.value.value))
    return found


def prose() -> list[tuple[str, int, str]]:
    """(file, line, text) of every docstring and comment and of the docs."""
    out = []
    for rel in tracked():
        if rel.endswith(".py"):
            out += [(rel, line, text) for line, text in python_prose((REPO / rel).read_text(encoding="utf-8"))]
        elif rel in DOCS or (rel.startswith("docs/") and rel.endswith(".md")):
            out += [(rel, n, line) for n, line in enumerate((REPO / rel).read_text(encoding="utf-8").splitlines(), 1)]
    return out


def missing_paths(items: list[tuple[str, int, str]], files: list[str]) -> list[str]:
    dirs = {str(Path(f).parent) for f in files} | {p for f in files for p in map(str, Path(f).parents)}
    names = set(files) | dirs
    dirnames = {Path(d).name for d in dirs}
    bad = []
    for where, line, text in items:
        for path in {m.rstrip("/").removesuffix(".") for m in ROOTED.findall(text)}:
            if path not in names:
                bad.append(f"{where}:{line}: {path}")
        for name in set(PATH.findall(text)):
            first = name.split("/", 1)[0]
            if name in NOT_OURS or first in ROOTS or ("/" in name and first not in dirnames) \
                    or Path(name).stem.split(".")[0].isupper():
                continue
            if not any(f == name or f.endswith("/" + name) for f in files):
                bad.append(f"{where}:{line}: {name}")
    return bad


def test_every_path_the_docs_name_exists():
    files = tracked()
    bad = missing_paths(prose(), files)
    assert bad == [], "named but not in the repository:\n" + "\n".join(bad)


# How prose cites a note outside the repository ("design note section 2", "interfaces §1").
NOTE_CITATION = re.compile(r"\bdesign notes?\b|§", re.IGNORECASE)


def test_no_note_outside_the_repository_is_cited():
    cited = [f"{where}:{line}: {NOTE_CITATION.search(text).group(0)}" for where, line, text in prose()
             if where != "tests/core/test_docs_paths.py" and NOTE_CITATION.search(text)]
    assert cited == [], "cites a note the repository does not ship:\n" + "\n".join(cited)


def test_the_check_catches_what_it_is_for():
    files = ["orchestrator/jobs/operation.py", "orchestrator/ui/relay_progress.py", "docs/architecture.md",
             "orchestrator/watch/dfo-watch@.service", "remote_payload/requirements-cpu.lock"]
    items = [("x.py", 1, "see orchestrator/jobs.py and evaluate.py."), ("x.py", 2, "ml-stack.md, ui/nothing.py"),
             ("x.py", 3, "orchestrator/jobs/operation.py, ui/relay_progress.py, `./docs/architecture.md`, "
                         "orchestrator/jobs/, remote_payload/requirements-<flavour>.lock, report.md, "
                         "orchestrator/watch/dfo-watch@.service, FILE.jsonl, WORKDIR/locks/x.lock, paramiko/config.py")]
    assert sorted(missing_paths(items, files)) == ["x.py:1: evaluate.py", "x.py:1: orchestrator/jobs.py",
                                                   "x.py:2: ml-stack.md", "x.py:2: ui/nothing.py"]
