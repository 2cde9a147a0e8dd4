"""Host locks: names validated, stale locks cleared by exactly one launcher, foreign *.lock files never
deleted (the host side runs here, as the same stdlib program the host receives)."""

from __future__ import annotations

import json
import multiprocessing
import os
import time

import pytest

from orchestrator.core.errors import InputError
from orchestrator.jobs.operation import HOST_SCRIPT, check_lock_name
from orchestrator.transport.hostcall import program_source


def _host_side() -> dict:
    scope: dict = {"__name__": "dfo_host"}
    exec(compile(program_source(HOST_SCRIPT), str(HOST_SCRIPT), "exec"), scope)
    return scope


def _job(workdir: str, job_id: str, created: float) -> str:
    job_dir = os.path.join(workdir, "jobs", job_id)
    os.makedirs(job_dir)
    with open(os.path.join(job_dir, "job.json"), "w") as fh:
        json.dump({"job_id": job_id, "created": created, "argv": ["true"]}, fh)
    return job_dir


def _contender(workdir: str, job_id: str, barrier, out) -> None:
    host = _host_side()
    real_holder = host["_lock_holder"]

    def slow_holder(*args):  # widen the window between "it is stale" and "clear it"
        found = real_holder(*args)
        time.sleep(0.3)
        return found

    host["_lock_holder"] = slow_holder
    job_dir = os.path.join(workdir, "jobs", job_id)
    barrier.wait()
    ok, notices, _holder = host["_take_lock"](workdir, "gpu", job_id, job_dir, False)
    out.put((job_id, ok))


def test_two_launchers_cannot_both_clear_a_stale_lock(tmp_path):
    workdir = str(tmp_path)
    stale_dir = _job(workdir, "old", created=time.time() - 3600)  # never started: "lost"
    os.makedirs(os.path.join(workdir, "locks"))
    with open(os.path.join(workdir, "locks", "gpu.lock"), "w") as fh:
        json.dump({"job_id": "old", "job_dir": stale_dir}, fh)
    for name in ("a", "b", "c"):
        _job(workdir, name, created=time.time())  # fresh: "starting", i.e. live
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(workdir, n, barrier, out)) for n in ("a", "b", "c")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    results = dict(out.get(timeout=5) for _ in procs)
    assert sum(results.values()) == 1, results
    holder = json.load(open(os.path.join(workdir, "locks", "gpu.lock")))
    assert results[holder["job_id"]] is True


def test_a_foreign_lock_file_is_never_cleared(tmp_path):
    host = _host_side()
    workdir = str(tmp_path)
    os.makedirs(os.path.join(workdir, "locks"))
    foreign = os.path.join(workdir, "locks", "backup.lock")
    with open(foreign, "w") as fh:
        json.dump({"owner": "someone else's tool"}, fh)
    job_dir = _job(workdir, "j1", created=time.time())
    with pytest.raises(RuntimeError, match="not a dfo job lock"):
        host["_take_lock"](workdir, "backup", "j1", job_dir, False)
    assert json.load(open(foreign)) == {"owner": "someone else's tool"}


@pytest.mark.parametrize("name", ["../../x", "a/b", "", ".hidden", "x" * 65, "-rf"])
def test_lock_names_are_one_plain_component(tmp_path, name):
    with pytest.raises(InputError, match="--lock"):
        check_lock_name(name)
    with pytest.raises(RuntimeError, match="bad lock name"):
        _host_side()["_lock_path"](str(tmp_path), name)
