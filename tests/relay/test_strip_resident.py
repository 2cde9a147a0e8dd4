"""`--strip-optimizer` through a resident strip worker (``RelayOptions.stripper``, orchestrator/relay/strip.py) on the
sandbox hosts: a real `strip-worker` job on kpro6 strips the checkpoint the relay then moves, and where the
worker is absent the relay falls back to the one-shot strip-checkpoint, with the same result."""

from __future__ import annotations

import json
import posixpath
import sys
from pathlib import Path

import pytest
from test_relay import _fake_training_checkpoint, _inventory_with_torch_on_kpro6, paths, sha  # noqa: F401
from waiting import wait_for

from orchestrator.core.inventory import load_inventory
from orchestrator.jobs.operation import cancel_job, job_status, launch_job
from orchestrator.relay.operation import RelayOptions, relay
from orchestrator.relay.strip import STRIP_DIR, strip_key
from orchestrator.transport import Connector

pytestmark = [pytest.mark.sshd]


class Worker:
    """The watcher's side of a strip worker, reduced to what the relay asks of it (orchestrator/watch/resident.py
    ResidentStrip is the real one): which worker folder takes a strip, and being told it is gone."""

    def __init__(self, worker_dir: str):
        self.host, self.worker_dir, self.gone_why = "kpro6", worker_dir, ""

    def worker_for(self, path: str) -> tuple[str, str] | None:
        return sys.executable, self.worker_dir

    def gone(self, why: str) -> None:
        self.gone_why = why


def _strip_relay(connector: Connector, src: Path, dst: Path, worker: Worker):
    return relay(connector, f"kpro6:{src}", f"ct129:{dst}/", RelayOptions(strip_optimizer=True, stripper=worker))


def test_a_strip_worker_strips_what_the_relay_moves_and_an_absent_one_falls_back(sandbox, paths, tmp_path):  # noqa: F811
    src, dst = paths
    ckpt = src / "step_7.pt"
    _fake_training_checkpoint(ckpt)
    workdir = str(sandbox.hosts["kpro6"].workdir)
    with Connector(load_inventory(_inventory_with_torch_on_kpro6(sandbox, tmp_path))) as connector:
        absent = Worker(posixpath.join(workdir, "jobs", "no-such-job", "worker"))
        first = _strip_relay(connector, ckpt, dst / "a", absent)
        assert "no resident strip worker took" in absent.gone_why  # then the one-shot strip did it
        assert first.stripped_from and first.stripped_from["sha256"] == sha(ckpt)

        handle = launch_job(connector, "kpro6", [sys.executable, "-m", "remote_payload", "strip-worker",
                                                 "--worker-dir", "{job_dir}/worker", "--source-root", str(src),
                                                 "--strip-root", posixpath.join(workdir, STRIP_DIR),
                                                 "--idle-exit", "120"],
                            cwd=posixpath.join(workdir, "payload"), lock=None, job_name="test strip worker")
        try:
            worker = Worker(posixpath.join(handle.job_dir, "worker"))
            second = _strip_relay(connector, ckpt, dst / "b", worker)
            state = json.loads((Path(handle.job_dir) / "worker" / "worker.json").read_text())
            assert state["served"] == 1 and state["last"]["ok"] and not worker.gone_why, state
            assert second.stripped_from == first.stripped_from  # the same record as the one-shot strip's
            assert (dst / "b" / "step_7-weights" / "model.safetensors").read_bytes() == \
                (dst / "a" / "step_7-weights" / "model.safetensors").read_bytes()
            st = ckpt.stat()  # this checkpoint's stripped copy is removed once verified (other tests keep theirs)
            assert not (sandbox.hosts["kpro6"].workdir / STRIP_DIR / strip_key(str(ckpt), st.st_size,
                                                                              st.st_mtime_ns)).exists()
        finally:
            cancel_job(connector, "kpro6", handle.job_id)
        wait_for(lambda: job_status(connector, "kpro6", handle.job_id, tail=0).state not in ("starting", "running"),
                 "the strip worker's job to end", timeout=60)
