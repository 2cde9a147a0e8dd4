"""Host programs type-check as they are sent: each feature's host_script.py behind the prelude (the relay's with
its wire protocol and stream processes), assembled by the code that sends it, under pyproject.toml's mypy settings.

`mypy orchestrator` leaves those files out: alone, they use the prelude's names, which are defined only once the
program is assembled. Here each whole program is one module, so a misspelt prelude name, a call with the wrong
arguments or an Optional used unchecked is an error with the part's own file and line."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from mypy import api as mypy_api

from orchestrator.relay.operation import HOST_SCRIPT as RELAY_PARTS
from orchestrator.relay.processes import host_source
from orchestrator.transport.hostcall import PRELUDE, program_source

ROOT = Path(__file__).resolve().parents[2]
ORCHESTRATOR = ROOT / "orchestrator"
PYPROJECT = ROOT / "pyproject.toml"
# A feature whose host program has more parts than its host_script.py: the parts it sends behind the prelude.
MORE_PARTS = {"relay": RELAY_PARTS}
# Host programs beside a feature's host_script.py (sent by hostcall the same way): name -> parts.
OTHER_PROGRAMS = {"watch_proxies": (ORCHESTRATOR / "watch" / "proxy_host_script.py",)}
_ERROR = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): (?P<rest>(error|note): .*)$")


def host_programs() -> dict[str, tuple[Path, ...]]:
    """Feature folder -> the parts its host program is assembled from, after the prelude."""
    programs = {s.parent.name: tuple(MORE_PARTS.get(s.parent.name, (s,)))
                for s in sorted(ORCHESTRATOR.glob("*/host_script.py"))}
    return {**programs, **OTHER_PROGRAMS}


def _where(parts: tuple[Path, ...], line: int) -> str:
    """FILE:LINE in the repository for LINE of program_source(parts) (its parts joined by a blank line)."""
    start = 1
    for path in (PRELUDE, *parts):
        lines = path.read_text(encoding="utf-8").count("\n") + 2
        if line < start + lines:
            return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{line - start + 1}"
        start += lines
    return f"?:{line}"


def _mypy(programs: dict[str, tuple[Path, ...]], tmp: Path) -> list[str]:
    """mypy's findings for each assembled program (one module each), with their lines in the parts."""
    files = {}
    for name, parts in programs.items():
        path = tmp / f"{name}_host_program.py"
        path.write_text(program_source(parts), encoding="utf-8")
        files[str(path)] = parts
    out, err, _code = mypy_api.run(["--config-file", str(PYPROJECT), "--cache-dir", str(tmp / "mypy-cache"),
                                    "--no-error-summary", "--show-error-codes", *files])
    assert not err.strip(), err
    findings = []
    for line in out.splitlines():
        m = _ERROR.match(line)
        assert m and m["file"] in files, f"unexpected mypy output: {line}"
        findings.append(f"{_where(files[m['file']], int(m['line']))}: {m['rest']}")
    return findings


def test_every_host_program_type_checks_as_assembled(tmp_path):
    findings = _mypy(host_programs(), tmp_path)
    assert not findings, "\n".join(findings)


def test_a_wrong_call_or_a_misspelt_prelude_name_in_a_host_program_is_found(tmp_path):
    script = tmp_path / "host_script.py"
    script.write_text("def f(root):\n    return _confine(root)\n\n\ndef g(path):\n    return _sha265(path)\n")
    findings = _mypy({"broken": (script,)}, tmp_path)
    assert any(f.startswith(f"{script}:2: error:") and "[call-arg]" in f for f in findings), findings
    assert any(f.startswith(f"{script}:6: error:") and "[name-defined]" in f for f in findings), findings


def test_the_relay_streams_run_the_program_that_is_checked():
    # The relay's bulk streams send processes.host_source(); its one-shot calls go through hostcall.
    assert host_source().decode("utf-8") == program_source(RELAY_PARTS)


def test_what_mypy_leaves_out_is_a_part_of_a_checked_host_program():
    excluded = [re.compile(p) for p in tomllib.loads(PYPROJECT.read_text())["tool"]["mypy"]["exclude"]]
    left_out = {p for p in ORCHESTRATOR.rglob("*.py") if any(x.search(p.relative_to(ROOT).as_posix())
                                                             for x in excluded)}
    checked = {PRELUDE, *(part for parts in host_programs().values() for part in parts)}
    assert left_out, "pyproject.toml's mypy exclude matches no file: is the pattern out of date?"
    assert left_out <= checked, f"left out of mypy and of this check: {sorted(map(str, left_out - checked))}"
