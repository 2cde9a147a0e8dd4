"""Issue 42, finding 1c, on the sandbox Slurm with two real users: a lab member (uid 65534, nobody, run with
setpriv) who can write the lab's shared folder plants the job folder dfo is about to use, with a
``tasks/0/slurm.log`` link to a file of the victim's (root, the sandbox's login user): slurmstepd would write
the task's output through it. dfo refuses the folder before sbatch sees the job; and the folder dfo makes
itself is private and used once."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from orchestrator.cluster.operation import follow, submit, task_records
from orchestrator.cluster.plan import BatchRequest, job_folder
from orchestrator.core.errors import HostError
from orchestrator.core.slurm_section import SlurmSection

NOBODY = 65534


def _as_nobody(line: str) -> None:
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "bash", "-c", line],
                   check=True, timeout=30)


@pytest.fixture
def lab():
    """A lab's shared folder every member can write (mode 0777), reachable by uid 65534 (not under pytest's
    0700 temporary folders)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("a second real user needs root and setpriv")
    folder = Path(tempfile.mkdtemp(prefix="dfo-lab-", dir="/tmp"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_job_folder_another_user_planted_is_refused_and_its_slurm_log_link_never_written(login, lab):
    victim = lab / "victim"
    victim.mkdir(mode=0o700)
    precious = victim / "notes.txt"
    precious.write_text("precious\n")
    section = SlurmSection(shared=str(lab), partition="debug", time_limit="1")
    workdir = lab / "alice"
    workdir.mkdir(mode=0o755)
    name, job_dir = job_folder(str(workdir), "dfo-eval-r1")
    # The lab member gets there first: the jobs root (in a workdir they can write) and the job folder are theirs.
    workdir.chmod(0o777)
    _as_nobody(f"mkdir -p {job_dir}/tasks/0 && chmod -R 0777 {Path(job_dir).parent} && "
               f"ln -s {precious} {job_dir}/tasks/0/slurm.log")
    request = BatchRequest(name, job_dir, (0,), ("echo", "overwritten"))
    with pytest.raises(HostError, match="can be written by another user"):
        submit(login, section, request)
    workdir.chmod(0o755)  # the workdir is the victim's again, but the jobs root inside it is still the member's
    with pytest.raises(HostError, match=f"belongs to uid {NOBODY}.*dfo refuses"):
        submit(login, section, request, resume=True)
    assert precious.read_text() == "precious\n" and not list(Path(job_dir).glob("batch-*.sh"))

    # The victim's own folder: made 0700 by dfo, the task's output in it, the job's records read back.
    shutil.rmtree(Path(job_dir).parent)
    submitted = submit(login, section, request)
    final = follow(login, submitted, poll=0.5, max_poll=1, timeout=60)
    assert final[0].state == "COMPLETED"
    assert (Path(job_dir) / "tasks" / "0" / "slurm.log").read_text() == "overwritten\n"
    assert task_records(login, job_dir, (0,))[0].exit_code == 0
    for folder in (Path(job_dir).parent, Path(job_dir), Path(job_dir) / "tasks", Path(job_dir) / "tasks" / "0"):
        assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == 0, folder
    with pytest.raises(HostError, match="never reused"):
        submit(login, section, request)
    assert precious.read_text() == "precious\n"
