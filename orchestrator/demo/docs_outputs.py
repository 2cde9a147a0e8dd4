"""Regenerate the sample outputs in README.md and docs/*.md from real runs on the sandbox hosts.

A page marks each generated block::

    <!-- docs-output: NAME -->
    ```
    ...
    ```
    <!-- /docs-output -->

``python -m orchestrator.demo.docs_outputs`` (or ``scripts/docs-outputs.sh``) runs ``dfo demo --keep`` on a
fresh sandbox, then a few commands against its hosts, cuts each NAME's text out of what they printed, and
rewrites every marked block of the pages; a block whose NAME nothing produced is named and left as it was
(exit 1). Everything runs as the CLI a user runs (subprocesses of this interpreter's ``dfo``), wide output.
``tests/core/test_docs_outputs.py`` checks, without running anything, that every marker names a block this
module produces.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from remote_payload.scratch import private_dir

REPO = Path(__file__).resolve().parents[2]
MARKED = re.compile(r"(<!-- docs-output: (?P<name>[\w-]+) -->\n)```[^\n]*\n.*?```\n(?=<!-- /docs-output -->)",
                    re.DOTALL)
WIDTH = "400"  # wide enough that no event line wraps; tables take only the width they need


def pages(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def marker_names(text: str) -> list[str]:
    return [m.group("name") for m in MARKED.finditer(text)]


def rewrite(text: str, outputs: dict[str, str]) -> tuple[str, list[str]]:
    """TEXT with every marked block whose name is in OUTPUTS replaced; and the names that were not."""
    missing: list[str] = []

    def block(match: re.Match) -> str:
        name = match.group("name")
        if name not in outputs:
            missing.append(name)
            return match.group(0)
        return f"{match.group(1)}```\n{outputs[name].rstrip()}\n```\n"

    return MARKED.sub(block, text), missing


# ------------------------------------------------------------------------------ cutting the outputs


def between(lines: list[str], start: Callable[[str], bool], end: Callable[[str], bool]) -> list[str]:
    """The lines from the first START line through the next END line (inclusive); [] when START never comes."""
    for i, line in enumerate(lines):
        if start(line):
            for j in range(i, len(lines)):
                if end(lines[j]):
                    return lines[i:j + 1]
            return lines[i:]
    return []


def demo_blocks(out: str) -> dict[str, str]:
    """The README tour's blocks from `dfo demo`'s output (stdout and stderr, in order)."""
    lines = [line.rstrip() for line in out.splitlines()]
    greedy = between(lines, lambda s: s.startswith("demo ▸ start"), lambda s: s.startswith("demo ▸ the same eval"))
    steps: list[str] = []
    for i, line in enumerate(greedy):
        if (line.startswith("demo ▸") and "the same eval" not in line) or line.startswith("  kpro6 → ct129"):
            steps.append(line)
        elif line.startswith(("▸ relay drafter", "▸ pull results")):
            steps += greedy[i:i + 2]
    table = between(lines, lambda s: re.match(r"run \d{8}-\d{6}-", s) is not None,
                    lambda s: s.startswith("run folder:"))
    temperature = between(lines, lambda s: s.startswith("τ at T=0 and at T="), lambda s: not s.strip())
    cards = between(lines, lambda s: s.startswith("cards (figures measured"), lambda s: not s.strip())
    blocks = {"demo-steps": steps, "demo-table": table, "demo-temperature": [s for s in temperature if s.strip()],
              "demo-cards": [s for s in cards if s.strip()]}
    return {name: "\n".join(text) for name, text in blocks.items() if text}


def report_benchmarks(report: str) -> str:
    """The Benchmarks section of a run's report.md, without its heading."""
    lines = report.splitlines()
    body = between(lines, lambda s: s.startswith("## Benchmarks"), lambda s: False)[1:]
    end = next((i for i, s in enumerate(body) if s.startswith("## ")), len(body))
    return "\n".join(body[:end]).strip()


# ------------------------------------------------------------------------------ running the commands

PRODUCED = ("demo-steps", "demo-table", "demo-temperature", "demo-cards", "demo-report-benchmarks",
            "inventory-check", "runs-list")


def dfo(cwd: Path, *args: str) -> str:
    """`dfo ARGS` as a user runs it in CWD; its stdout and stderr together, without the padding rich leaves at
    line ends. A failure stops the regeneration."""
    env = {**os.environ, "COLUMNS": WIDTH, "TERM": "dumb"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"docs-outputs: `dfo {' '.join(args)}` exited {done.returncode}:\n{done.stdout[-3000:]}")
    return "\n".join(line.rstrip() for line in done.stdout.splitlines()).strip("\n")


def collect() -> dict[str, str]:
    root = private_dir("dfo-docs-")
    runs = root / "runs"  # the commands run in ROOT and name it `runs`, as a user's ./runs
    try:
        outputs = demo_blocks(dfo(root, "demo", "--keep", "--root", str(root / "sandbox"), "--runs-dir", "runs"))
        inventory = str(root / "sandbox" / "inventory.yaml")
        outputs["inventory-check"] = dfo(root, "-i", inventory, "inventory", "check", "--connect")
        outputs["runs-list"] = dfo(root, "runs", "list", "--runs-dir", "runs")
        greedy = min(p for p in runs.iterdir() if (p / "report.md").exists())
        outputs["demo-report-benchmarks"] = report_benchmarks((greedy / "report.md").read_text(encoding="utf-8"))
    finally:
        subprocess.run([sys.executable, "-m", "orchestrator.testing.sandbox", "down", str(root / "sandbox")],
                       cwd=REPO, check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
    return outputs


def main() -> int:
    outputs = collect()
    missing: set[str] = set()
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new, absent = rewrite(text, outputs)
        missing |= set(absent)
        if new != text:
            page.write_text(new, encoding="utf-8")
            print(f"rewrote {page.relative_to(REPO)}: {', '.join(marker_names(text))}")
    if missing:
        print(f"docs-outputs: no output for {', '.join(sorted(missing))} (left as they were)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
