"""A compromised eval host lies about job ids and result file names: `dfo jobs pull` and `dfo runs pull`
write nothing outside their folders, and say which host answered what."""

from __future__ import annotations

import json

import pytest
from cli_runner import dfo
from hostile import HostileHost, tree
from waiting import wait_for

from orchestrator.core.inventory import load_inventory
from orchestrator.jobs.operation import HOST_SCRIPT, job_status, launch_job
from orchestrator.transport import Connector, hostcall

pytestmark = pytest.mark.sshd
HOST = "ct129"


def _finished_job(box, argv: list[str]) -> tuple[str, str, dict]:
    """(job id, job dir, the host's honest `results` reply) of a small job run to its end."""
    with Connector(load_inventory(box.inventory_path)) as conn:
        handle = launch_job(conn, HOST, argv, lock=None)
        wait_for(lambda: job_status(conn, HOST, handle.job_id).done, "the job to finish")
        workdir = conn.inventory.hosts[HOST].workdir
        honest = hostcall.call(conn.session(HOST), HOST_SCRIPT, "results", python=conn.inventory.hosts[HOST].python,
                               workdir=workdir, job_id=handle.job_id)
    return handle.job_id, handle.job_dir, honest


def _hook(replies: dict) -> str:
    """A tamper hook that answers REPLIES[func] (already-decoded 'ok' values) instead of the truth."""
    return f"import json\nFAKE = json.loads({json.dumps(json.dumps(replies))})\n" \
           "def tamper(func, reply):\n    return {'ok': FAKE[func]} if func in FAKE else reply\n"


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


@pytest.mark.parametrize("evil_id", ["../../../escaped", "{tmp}/abs-evil", "..", "ok/../../../escaped"])
def test_jobs_pull_refuses_a_job_id_that_leaves_runs(sandbox, tmp_path, evil_id):
    evil_id = evil_id.format(tmp=tmp_path)
    job_id, _, honest = _finished_job(sandbox, ["sh", "-c", "echo hi > \"$DFO_RESULTS_DIR/r.txt\""])
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    # The host answers an escaping id for `last`, then the real job's results for whatever id is asked.
    evil.tamper(_hook({"resolve": evil_id, "results": honest}))
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    before = tree(tmp_path)
    proc = dfo("jobs", "pull", f"{HOST}:last", inventory=evil.inventory, cwd=work)
    assert "resolve" in evil.called()
    assert proc.returncode != 0, proc.stdout
    _no_traceback(proc)
    assert f"{HOST}: refused job id {evil_id!r}" in proc.stderr
    assert tree(tmp_path) - before <= {"hostile/tamper.py.log"}, "something was written"


@pytest.mark.parametrize("files", [
    {"a\x00b": "nul"}, {"/etc/evil": "abs"}, {"../evil": "up"}, {"ok": "size-not-int"}, "not-a-mapping",
])
def test_jobs_pull_refuses_a_malformed_manifest(sandbox, tmp_path, files):
    job_id, _, honest = _finished_job(sandbox, ["sh", "-c", "echo hi > \"$DFO_RESULTS_DIR/r.txt\""])
    real = honest["files"]["r.txt"]
    if isinstance(files, dict):
        files = {rel: ({"sha256": real["sha256"], "size": "2"} if why == "size-not-int" else real)
                 for rel, why in files.items()}
    evil = HostileHost(sandbox, HOST, tmp_path / "hostile")
    evil.tamper(_hook({"results": {**honest, "files": files}}))
    work = tmp_path / "work"
    work.mkdir()
    proc = dfo("jobs", "pull", f"{HOST}:{job_id}", inventory=evil.inventory, cwd=work)
    assert proc.returncode != 0
    _no_traceback(proc)
    assert f"{HOST}: " in proc.stderr and ("refused results file name" in proc.stderr or "malformed" in proc.stderr)
    assert tree(work) == set(), "nothing may be left in the work folder"


def test_runs_pull_refuses_sample_lines_that_are_not_objects(sandbox, tmp_path):
    script = ('printf \'{"drafters": {}}\\n\' > "$DFO_RESULTS_DIR/results.json"; '
              'printf \'5\\n["x"]\\n\' > "$DFO_RESULTS_DIR/samples.jsonl"')
    job_id, job_dir, _ = _finished_job(sandbox, ["sh", "-c", script])
    runs = tmp_path / "runs"
    run = runs / "20260101-000000-ct129-abcd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run": run.name, "status": "running", "hosts": [HOST],
                                              "jobs": {HOST: {"job_id": job_id, "job_dir": job_dir}}}))
    proc = dfo(sandbox, "runs", "pull", run.name, runs=runs)
    assert proc.returncode != 0
    _no_traceback(proc)
    assert "samples.jsonl" in proc.stderr and "not a JSON object" in proc.stderr, proc.stderr
    assert not (run / "results.json").exists()
