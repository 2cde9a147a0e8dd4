"""Issue 30, finding 2 at the command line: a host answers JSON nested 200 000 deep.

json raises RecursionError on it (not a ValueError): `dfo jobs status` ended in a traceback, and the watcher
died at every start. Now the reply is a clear error naming the host, and a restarted watcher says the same.
"""

from __future__ import annotations

import os
import time

import pytest
from cli_runner import dfo
from hostile import RAW, HostileHost

from orchestrator.watch.series import load_series

pytestmark = pytest.mark.sshd
TRAIN, EVAL = "kpro6", "ct129"
NESTED = '{"ok": ' + "[" * 200_000 + "]" * 200_000 + "}"


def _nested_for(func: str, job_id: str | None = None) -> str:
    """A hook that answers FUNC with NESTED (and, with JOB_ID, resolves any job reference to it)."""
    resolve = f"    if func == 'resolve':\n        return {{'ok': {job_id!r}}}\n" if job_id else ""
    return f"def tamper(func, reply):\n{resolve}    return {RAW + NESTED!r} if func == {func!r} else reply\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long messages


def test_jobs_status_names_the_host_of_a_deeply_nested_reply(sandbox, tmp_path):
    evil = HostileHost(sandbox, EVAL, tmp_path / "hostile")
    evil.tamper(_nested_for("status", job_id="20260101-000000-abcd"))
    proc = dfo("jobs", "status", f"{EVAL}:20260101-000000-abcd", inventory=evil.inventory, cwd=tmp_path)
    assert "status" in evil.called()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and "RecursionError" not in proc.stderr
    assert f"{EVAL}: " in proc.stderr and "the host's reply is not valid JSON (JSON nested too deeply)" in \
        _one_line(proc.stderr), proc.stderr


def test_the_watcher_stops_cleanly_on_a_deeply_nested_listing_and_again_after_a_restart(sandbox, tmp_path):
    folder = sandbox.hosts[TRAIN].checkpoints / f"run-{tmp_path.name[-20:]}"
    folder.mkdir(parents=True)
    (folder / "step_7.pt").write_bytes(b"weights" * 100)
    os.utime(folder / "step_7.pt", (time.time() - 3600, time.time() - 3600))
    evil = HostileHost(sandbox, TRAIN, tmp_path / "hostile")
    evil.tamper(_nested_for("list_folder"))
    runs = tmp_path / "runs"
    argv = ["watch", f"{TRAIN}:{folder}/", "--host", EVAL, "--target", str(folder), "--series", "nested",
            "--settle", "0", "--pattern", "step_*", "--once"]
    for attempt in (1, 2):  # a restart meets the same reply: the same clear line, no crash loop
        proc = dfo(*argv, inventory=evil.inventory, runs=runs, cwd=tmp_path)
        assert proc.returncode == 1, f"attempt {attempt}: " + proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
        assert f"{TRAIN}: " in proc.stderr and "nested too deeply" in _one_line(proc.stderr), proc.stderr
    assert evil.called().count("list_folder") == 2
    state = load_series(runs / "series" / "nested")
    assert state is None or state["checkpoints"] == {}  # nothing recorded from the lie
