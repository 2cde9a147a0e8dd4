"""Issue 42, finding 1 (and 5): a cluster host's job folders on a shared filesystem another lab member can write.

The login node's side (cluster/host_script.py) runs here as a module: a job folder is created 0700 and
exclusively (never one that exists), under a jobs root that is this user's and private, in a folder no one else
can write; task records are read only from such folders, never through a link or from a FIFO; and the batch
script refuses a task folder that is not private and writes its records without following a planted link.
"Another user" is uid 65534 (nobody): the folders it owns are made with chown, which needs root.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from orchestrator.cluster import host_script as hs
from orchestrator.cluster.eval_run import eval_request
from orchestrator.cluster.plan import BatchRequest, batch_spec, job_folder, jobs_root, task_dir
from orchestrator.core.slurm_section import SlurmSection

NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="another user's folder is made with chown (root only)")


def _spec(workdir: Path, name: str = "dfo-eval-r1", tasks=(0,), command=("true",)) -> dict:
    section = SlurmSection(shared=str(workdir.parent))
    _, job_dir = job_folder(str(workdir), name)
    return batch_spec(section, BatchRequest(name, job_dir, tuple(tasks), tuple(command)))


def _submit(spec: dict, resume: bool = False):
    """host_script.submit with sbatch absent from PATH (its answer: 127), so only the folder checks decide."""
    folders = [task_dir(spec["job_dir"], t) for t in (0,)]
    path = os.environ["PATH"]
    os.environ["PATH"] = "/nonexistent"
    try:
        return hs.submit(spec, folders, f"{spec['job_dir']}/batch-{os.urandom(4).hex()}.sh", resume=resume)
    finally:
        os.environ["PATH"] = path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab").chmod(0o755)
    wd = tmp_path / "lab" / "dfo"
    wd.mkdir(mode=0o755)
    return wd


def test_job_folders_are_made_private_and_an_existing_one_is_never_reused(workdir):
    spec = _spec(workdir)
    assert _submit(spec)[0] == 127  # the folders made; sbatch (absent here) answered
    job_dir = Path(spec["job_dir"])
    assert job_dir.parent == Path(jobs_root(str(workdir)))
    for folder in (job_dir.parent, job_dir, job_dir / "tasks", job_dir / "tasks" / "0"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    with pytest.raises(RuntimeError, match="exists already: a cluster job folder is never reused"):
        _submit(spec)
    assert _submit(spec, resume=True)[0] == 127  # --resume submits this job's own missing tasks again


@root_only
@pytest.mark.parametrize("planted", ["root", "job"])
def test_a_jobs_root_or_job_folder_another_user_made_first_is_refused(workdir, planted):
    spec = _spec(workdir)
    job_dir = Path(spec["job_dir"])
    target = job_dir.parent if planted == "root" else job_dir
    job_dir.parent.mkdir(mode=0o700)
    target.mkdir(mode=0o700, exist_ok=True)
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(RuntimeError, match=f"{target} belongs to uid {NOBODY}.*dfo refuses"):
        _submit(spec, resume=True)
    assert not list(job_dir.parent.glob("*/batch-*.sh"))


def test_a_jobs_root_that_is_a_link_or_open_to_others_is_refused(workdir, tmp_path):
    spec = _spec(workdir)
    root = Path(spec["job_dir"]).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    root.symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match="is not a folder .a link or a file is never followed"):
        _submit(spec)
    root.unlink()
    root.mkdir(mode=0o700)
    root.chmod(0o777)
    with pytest.raises(RuntimeError, match="mode 0777"):
        _submit(spec)
    assert list(elsewhere.iterdir()) == [] and list(root.iterdir()) == []


def test_a_workdir_others_can_write_is_refused_as_the_jobs_roots_parent(workdir):
    workdir.chmod(0o777)  # a lab member could rename slurm-jobs away and put their own in its place
    with pytest.raises(RuntimeError, match="can be written by another user"):
        _submit(_spec(workdir))
    workdir.chmod(0o1777)  # sticky: only the owner renames what is theirs
    assert _submit(_spec(workdir))[0] == 127


@root_only
def test_records_in_a_folder_another_user_owns_are_never_read(workdir):
    """Finding 1a: a forged finished.json (exit 0) would be merged as complete."""
    spec = _spec(workdir)
    _submit(spec)
    task = Path(task_dir(spec["job_dir"], 0))
    (task / "finished.json").write_text('{"exit_code": 0, "finished": 1.0}\n')
    assert hs.records(spec["job_dir"], [0])["0"]["finished"].startswith('{"exit_code": 0')
    os.chown(task, NOBODY, NOBODY)
    with pytest.raises(RuntimeError, match=f"belongs to uid {NOBODY}"):
        hs.records(spec["job_dir"], [0])
    os.chown(task, 0, 0)
    task.chmod(0o777)
    with pytest.raises(RuntimeError, match="mode 0777"):
        hs.records(spec["job_dir"], [0])


@root_only
def test_find_array_skips_folders_another_user_owns_and_refuses_an_open_root(workdir):
    """Finding 1d: started.json records planted to steer `jobs status`."""
    spec = _spec(workdir)
    _submit(spec)
    record = '{"job_id": "77", "array_job_id": "70", "task": 0, "node": "n", "started": 1.0}\n'
    Path(task_dir(spec["job_dir"], 0), "started.json").write_text(record)
    root = jobs_root(str(workdir))
    assert [entry[1] for entry in hs.find_array(root, "70")] == [0]
    os.chown(spec["job_dir"], NOBODY, NOBODY)
    assert hs.find_array(root, "70") == []
    os.chmod(root, 0o777)
    with pytest.raises(RuntimeError, match="mode 0777"):
        hs.find_array(root, "70")


def test_a_fifo_planted_as_started_json_does_not_hang_the_reader(workdir):
    """Finding 5: an open() without O_NONBLOCK of a FIFO waits for a writer forever."""
    spec = _spec(workdir)
    _submit(spec)
    fifo = Path(task_dir(spec["job_dir"], 0), "started.json")
    os.mkfifo(fifo)
    answer: list = []
    reader = threading.Thread(target=lambda: answer.append(hs.records(spec["job_dir"], [0])), daemon=True)
    reader.start()
    reader.join(10)
    hung = reader.is_alive()
    if hung:  # release the old reader (a writer that opens and closes)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert not hung, "records() blocked on a FIFO"
    assert answer == [{"0": {"started": "", "finished": ""}}]


def _run_batch_script(spec: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="0", SLURM_JOB_ID="11", SLURM_ARRAY_JOB_ID="10")
    script = hs.batch_script_text(**spec)
    return subprocess.run(["bash"], input=script, env=env, capture_output=True, text=True, timeout=30)


def test_the_batch_script_writes_its_records_without_following_a_planted_link(workdir, tmp_path):
    """Finding 1b: a link at tasks/N/.started.json.tmp made the task's own `>` overwrite the link's target."""
    spec = _spec(workdir, command=("touch", "{task_dir}/ran"))
    _submit(spec)
    task = Path(task_dir(spec["job_dir"], 0))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (task / ".started.json.tmp").symlink_to(victim)
    (task / ".finished.json.tmp").symlink_to(victim)
    done = _run_batch_script(spec)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious\n"
    assert not (task / "started.json").is_symlink() and '"job_id": "11"' in (task / "started.json").read_text()
    assert '"exit_code": 0' in (task / "finished.json").read_text() and (task / "ran").exists()


def test_the_batch_script_refuses_a_task_folder_others_can_write(workdir):
    spec = _spec(workdir, command=("touch", "{task_dir}/ran"))
    _submit(spec)
    task = Path(task_dir(spec["job_dir"], 0))
    task.chmod(0o777)
    done = _run_batch_script(spec)
    assert done.returncode == 97 and "is not a private folder of this user" in done.stderr
    assert not (task / "ran").exists() and not (task / "started.json").exists()


def test_job_folders_of_two_runs_sharing_their_first_64_characters_differ():
    """Not counted in the issue: a name cut at 64 characters let two runs started in the same second on a long
    host name share one job folder."""
    host = "a-very-long-cluster-login-node-name-of-the-lab"
    a = eval_request("/shared/dfo", f"20261206-101500-{host}-1a2b", ["eval"], "/shared/dfo/payload", 1)
    b = eval_request("/shared/dfo", f"20261206-101500-{host}-9f8e", ["eval"], "/shared/dfo/payload", 1)
    assert a.job_dir != b.job_dir
    for request in (a, b):
        assert request.job_dir.startswith("/shared/dfo/slurm-jobs/") and len(request.name) <= 64
        assert len(Path(request.job_dir).name) <= 64


def test_a_cluster_pull_is_listed_and_checked_as_an_ssh_pull_is(workdir, tmp_path):
    """Not counted in the issue: cluster pulls had no size limit or checksum. The login node now lists each
    regular file of a task's results with its sha256 and size (links and FIFOs left out), and the controller
    checks that list as an SSH job's (jobs/operation.py) before and after each download."""
    import hashlib

    from orchestrator.cluster.operation import HOST_SCRIPT
    from orchestrator.core.errors import HostError
    from orchestrator.jobs.operation import MAX_RESULTS_BYTES, checked_manifest
    from orchestrator.transport.hostcall import program_source

    spec = _spec(workdir)
    _submit(spec)
    results = Path(task_dir(spec["job_dir"], 0), "results")
    (results / "engine").mkdir(parents=True)
    (results / "results.json").write_text("{}\n")
    (results / "engine" / "vllm-1.log").write_text("log\n")
    (results / "samples.jsonl").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(results / "engine" / "pipe.log")
    script: dict = {}
    exec(compile(program_source(HOST_SCRIPT), str(HOST_SCRIPT), "exec"), script)  # the host prelude with it
    manifest = checked_manifest("hpc", script["task_results"](spec["job_dir"], 0))
    assert manifest == {"results.json": {"sha256": hashlib.sha256(b"{}\n").hexdigest(), "size": 3},
                        "engine/vllm-1.log": {"sha256": hashlib.sha256(b"log\n").hexdigest(), "size": 4}}
    claimed = {"results.json": {"sha256": "0" * 64, "size": MAX_RESULTS_BYTES + 1}}
    with pytest.raises(HostError, match="more than the [0-9,]+ dfo pulls: nothing was downloaded"):
        checked_manifest("hpc", claimed)
    with pytest.raises(HostError, match="not a plain name|refused|results file name"):
        checked_manifest("hpc", {"../x": {"sha256": "0" * 64, "size": 1}})


def test_every_call_to_the_login_node_has_a_timeout():
    """Finding 5: task_records and find_array called the login node with no timeout (a stuck host hung eval
    follow, `runs pull --resume`, `jobs status` and a cluster watch with no message)."""
    from orchestrator.cluster.jobs import recorded_job_ids
    from orchestrator.cluster.operation import task_records
    from orchestrator.transport.control import CommandResult
    from orchestrator.transport.hostcall import RESULT_MARKER

    class Login:  # records the timeout each call asks for; answers an empty result
        name, env, interpreter = "hpc", {}, "python3"
        timeouts: list = []

        @property
        def session(self):
            return self

        def python(self, script, *, python, check, timeout, **kwargs):
            self.timeouts.append(timeout)
            return CommandResult("hpc", "python3 -", 0, f"\n{RESULT_MARKER}{{\"ok\": []}}\n".encode(), b"")

    login = Login()
    task_records(login, "/shared/dfo/slurm-jobs/j", (0,))
    recorded_job_ids(login, "/shared/dfo/slurm-jobs", "12")
    assert len(login.timeouts) == 2 and all(t is not None and 0 < t <= 600 for t in login.timeouts)


def test_a_file_served_larger_than_listed_stops_the_download(tmp_path):
    """A pull (SSH or cluster) checks the host's list before and after each download, and a host that serves
    more bytes than it listed is stopped as the bytes come, not after it filled the disk."""
    from orchestrator.core.errors import HostError
    from orchestrator.jobs.operation import download_verified

    class Session:  # serves 10 MB in 1 MB chunks for a file listed at 3 bytes
        def get(self, remote, local, progress=None):
            with open(local, "wb") as fh:
                for i in range(1, 11):
                    fh.write(b"x" * (1 << 20))
                    progress(i << 20, 10 << 20)

    manifest = {"results.json": {"sha256": "0" * 64, "size": 3}}
    with pytest.raises(HostError, match="results file results.json is larger than the 3 bytes the host listed"):
        download_verified(Session(), "hpc", "/r", manifest, tmp_path)
    assert (tmp_path / "results.json").stat().st_size == 1 << 20  # stopped at the first chunk
