"""The lows of issue 19, each shown as an attack and its refusal on the sandbox hosts: watch names and
hooks, malformed job replies, env values in `inventory show --json`, the prompts upload's temporary name.
(The host lock's holder record is tested in test_host_lock.py.)"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_runner import dfo
from hostile import HostileHost, tree
from waiting import wait_for

from orchestrator.core.events import QuietEvents
from orchestrator.core.inventory import load_inventory
from orchestrator.evaluation.operation import upload_prompts
from orchestrator.evaluation.plan import EvalRequest, HostJob, relay_dir
from orchestrator.jobs.operation import job_status, launch_job
from orchestrator.transport import Connector
from orchestrator.watch.config import WatchConfig
from orchestrator.watch.loop import Watcher
from orchestrator.watch.series import load_series, save

pytestmark = pytest.mark.sshd
TRAIN, EVAL = "kpro6", "ct129"


def _no_traceback(proc) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr


def _one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long messages


# ------------------------------------------------------------------------------------ dfo watch


@pytest.fixture
def training_folder(sandbox, tmp_path) -> Path:
    """A checkpoint folder on the training host holding one settled checkpoint, step_7.pt."""
    folder = sandbox.hosts[TRAIN].checkpoints / f"run-{tmp_path.name[-20:]}"
    folder.mkdir(parents=True)
    (folder / "step_7.pt").write_bytes(b"weights" * 100)
    os.utime(folder / "step_7.pt", (time.time() - 3600, time.time() - 3600))
    return folder


@pytest.fixture
def relay_folder(sandbox) -> Path:
    """The eval host's relay folder for the training host, with a checkpoint relayed earlier in it."""
    inv = load_inventory(sandbox.inventory_path)
    folder = Path(relay_dir(inv, EVAL, TRAIN))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "earlier.pt").write_bytes(b"an earlier relay")
    return folder


def _watch(folder: Path, series: str, *more: str) -> list[str]:
    # The target only has to exist on the eval host (the watch checks it before its first look; the sandbox
    # hosts share one filesystem): no eval starts in these tests.
    return ["watch", f"{TRAIN}:{folder}/", "--host", EVAL, "--target", str(folder), "--series", series,
            "--settle", "0", "--pattern", "step_*", "--once", *more]


@pytest.mark.parametrize("evil", ["step_7/", "step\x007.pt", "../step_7.pt"])
def test_watch_refuses_a_listed_name_that_is_no_folder_entry(sandbox, tmp_path, training_folder, relay_folder, evil):
    # The training host renames its one entry. `step_7/` made the relay land in the relay folder itself
    # (and the clean-up after the eval `rm -rf` it); a NUL crashed the --on-result hook on every restart.
    host = HostileHost(sandbox, TRAIN, tmp_path / "hostile")
    host.tamper("def tamper(func, reply):\n"
                "    if func == 'list_folder':\n"
                f"        reply['ok']['entries'][0]['name'] = {evil!r}\n"
                "    return reply\n")
    runs = tmp_path / "runs"
    eval_root = relay_folder.parent
    before = tree(eval_root)
    proc = dfo(*_watch(training_folder, "s1"), inventory=host.inventory, runs=runs)
    assert "list_folder" in host.called()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _no_traceback(proc)
    assert f"{TRAIN}: refused checkpoint name {evil!r} from the host" in _one_line(proc.stderr), proc.stderr
    assert tree(eval_root) == before, "nothing may be relayed or removed on the eval host"
    assert (relay_folder / "earlier.pt").read_bytes() == b"an earlier relay"
    state = load_series(runs / "series" / "s1")
    assert state is None or state["checkpoints"] == {}


def test_watch_never_removes_the_relay_folder_for_a_recorded_path_that_is_not_one_checkpoint(sandbox, tmp_path,
                                                                                             relay_folder):
    # What an older dfo recorded for `step_7/`: the relay folder itself (with its trailing '/').
    cfg = WatchConfig(series="s2", source_host=TRAIN, folder="/x",
                      request=EvalRequest(hosts=[EVAL], target="/x", drafters=[]), runs_dir=tmp_path / "runs")
    warnings: list[str] = []
    events = QuietEvents()
    events.warn = warnings.append  # type: ignore[method-assign]
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        watcher = Watcher(conn, cfg, events)
        for evil in (f"{relay_folder}/", f"{relay_folder}/.", f"{relay_folder}/x/../.."):
            assert watcher._cleanup({"relayed_to": evil}) is None
    assert (relay_folder / "earlier.pt").read_bytes() == b"an earlier relay"
    assert len(warnings) == 3 and all("not one checkpoint inside" in w for w in warnings), warnings


def test_a_pending_hook_that_cannot_run_is_recorded_as_failed_once(sandbox, tmp_path, training_folder):
    # series.json of an older dfo: a checkpoint name with a NUL, its --on-result hook still pending. The hook
    # raised ValueError (no environment carries a NUL) before it was marked done: a crash on every restart.
    (training_folder / "step_7.pt").unlink()
    runs = tmp_path / "runs"
    hook_log = tmp_path / "hook.log"
    hook = f"{sys.executable} -c \"import sys; open({str(hook_log)!r}, 'a').write(sys.stdin.read()[:20])\""
    first = dfo(sandbox, *_watch(training_folder, "s3"), runs=runs)
    assert first.returncode == 0, first.stderr
    folder = runs / "series" / "s3"
    series = load_series(folder)  # series.json with its journal replayed: the state as the watcher left it
    assert series is not None
    evil = "step\x007.pt"
    series["checkpoints"][evil] = {
        "name": evil, "path": f"{training_folder}/{evil}", "step": 7, "step_source": "name", "status": "failed",
        "attempts": 1, "observed": {"size": 700, "mtime": 1.0}, "started_utc": "2026-01-01T00:00:00Z", "run": None,
        "superseded_runs": [], "error": "relay/launch: x", "notify_pending": True,
        "finished_utc": "2026-01-01T00:01:00Z"}
    save(folder, series)
    runs_of_hook = []
    for _ in range(2):  # a restart must not fire it again
        proc = dfo(sandbox, *_watch(training_folder, "s3", "--on-result", hook), runs=runs)
        # the series' only checkpoint failed: --once says so with exit 1 (the hook's record is what is tested)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1 and "no checkpoint was evaluated, 1 failed" in proc.stderr, out
        _no_traceback(proc)
        runs_of_hook.append("--on-result failed" in proc.stderr)
        entry = (load_series(folder) or {})["checkpoints"][evil]
        assert entry["notify_pending"] is False
        assert entry["on_result"]["ok"] is False and "null byte" in entry["on_result"]["detail"]
    assert runs_of_hook == [True, False]
    assert not hook_log.exists()


def test_watch_refuses_a_malformed_listing_without_a_traceback(sandbox, tmp_path, training_folder):
    host = HostileHost(sandbox, TRAIN, tmp_path / "hostile")
    for reply, what in ((["not", "a", "listing"], "the answer"), ({"now": 1.0, "entries": "x"}, "the entries"),
                        ({"now": "soon", "entries": []}, "the host's clock"),
                        ({"now": 1.0, "entries": [{"name": "step_7.pt", "is_dir": False, "size": "9", "mtime": 1}]},
                         "the size")):
        host.tamper(f"import json\ndef tamper(func, reply):\n    return {{'ok': json.loads({json.dumps(reply)!r})}}\n")
        proc = dfo(*_watch(training_folder, "s4"), inventory=host.inventory, runs=tmp_path / "runs")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        _no_traceback(proc)
        assert f"{TRAIN}: malformed folder listing from the host: {what}" in _one_line(proc.stderr), proc.stderr


# ------------------------------------------------------------------------------------ dfo jobs


@pytest.fixture(scope="module")
def finished_job(sandbox) -> str:
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        handle = launch_job(conn, EVAL, ["true"], lock=None)
        wait_for(lambda: job_status(conn, EVAL, handle.job_id).done, "the job to finish")
    return handle.job_id


def _replace(func: str, edit: str) -> str:
    """A tamper hook that runs EDIT (Python on ``job``: the decoded 'ok' value) on FUNC's reply."""
    return ("def tamper(func, reply):\n"
            f"    if func == {func!r}:\n"
            "        job = reply['ok']\n"
            f"        {edit}\n"
            "        reply['ok'] = job\n"
            "    return reply\n")


@pytest.mark.parametrize("func,edit,what", [
    ("status", "job = ['not', 'a', 'status']", "a job's status"),                 # AttributeError before
    ("status", "job['started'] = 'yesterday'", "the start time"),                 # ValueError in the CLI before
    ("status", "job['heartbeat_age_s'] = 'soon'; job['state'] = 'running'", "the heartbeat age"),  # ValueError
    ("status", "job['argv'] = 42", "the job command"),                           # TypeError before
    ("status", "job['state'] = 'pwned'", "the job state"),
    ("status", "job['job_id'] = '../x'", "refused job id"),
    ("list_jobs", "job = {'jobs': 'x'}", "the job list"),                         # TypeError before
    ("list_jobs", "job['jobs'][0]['log_size'] = -5", "the log size"),
    ("list_jobs", "job['jobs'][0]['argv'] = [1, 2]", "the job command"),          # TypeError in the CLI before
])
def test_jobs_status_and_list_refuse_a_malformed_reply(sandbox, tmp_path, finished_job, func, edit, what):
    host = HostileHost(sandbox, EVAL, tmp_path / "hostile")
    host.tamper(_replace(func, edit))
    args = ["jobs", "status", f"{EVAL}:{finished_job}"] if func == "status" else ["jobs", "list", "-H", EVAL]
    for more in ([], ["--json"]):
        proc = dfo(*args, *more, inventory=host.inventory)
        assert func in host.called()
        assert proc.returncode == 1, proc.stdout + proc.stderr
        _no_traceback(proc)
        out = _one_line(proc.stdout + proc.stderr)
        assert f"{EVAL}: " in out and what in out, out


# ------------------------------------------------------------------------------- inventory show


def test_inventory_show_json_prints_env_keys_never_values(sandbox, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(sandbox.inventory_path.read_text())
    secret = "s3cr3t-value-7f2c"
    proc = dfo("inventory", "set", f"{EVAL}.env", f"{{HF_TOKEN: {secret}}}", inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    for args in (["inventory", "show", "--json"], ["inventory", "show"]):
        proc = dfo(*args, inventory=inventory)
        assert proc.returncode == 0, proc.stderr
        assert secret not in proc.stdout + proc.stderr
    shown = json.loads(dfo("inventory", "show", "--json", inventory=inventory).stdout)
    assert list(shown["hosts"][EVAL]["env"]) == ["HF_TOKEN"]  # the keys stay visible


# ------------------------------------------------------------------------------ prompts upload


def _upload(sandbox, remote: Path, data: bytes, tmp_path: Path) -> None:
    local = tmp_path / "prompts.jsonl"
    local.write_bytes(data)
    plan = SimpleNamespace(jobs=[HostJob(EVAL, (0, 1), {}, [], prompts_upload=str(remote))])
    with Connector(load_inventory(sandbox.inventory_path)) as conn:
        upload_prompts(conn, plan, local)  # type: ignore[arg-type]  # it reads only the plan's jobs


def test_the_prompts_upload_never_writes_through_a_planted_link(sandbox, tmp_path):
    # Someone who can write the run folder on the eval host plants links at the names the upload uses:
    # the predictable temporary name (`<remote>.dfo-tmp`) and the destination itself.
    run = sandbox.hosts[EVAL].workdir / "runs" / f"upload-{tmp_path.name[-20:]}"
    run.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"the victim's file")
    victim_dir = tmp_path / "victim-dir"
    victim_dir.mkdir()
    remote = run / "prompts.jsonl"
    Path(f"{remote}.dfo-tmp").symlink_to(victim)
    remote.symlink_to(victim_dir)
    data = b'{"prompt": "hello"}\n'
    _upload(sandbox, remote, data, tmp_path)
    assert victim.read_bytes() == b"the victim's file"
    assert tree(victim_dir) == set()
    assert not remote.is_symlink() and remote.read_bytes() == data  # the link was replaced, not written through
    assert sorted(os.listdir(run)) == ["prompts.jsonl", "prompts.jsonl.dfo-tmp"]  # no temporary name left
    assert posixpath.islink(f"{remote}.dfo-tmp")  # someone else's link: left alone
