"""`dfo jobs run --dry-run` and `dfo jobs cancel --dry-run`: what would run or be signalled, and nothing changes.

A run's dry run is planned from the inventory alone (it connects to no host: the unreachable inventory below
proves it); a cancel's asks the job's host what it would signal (the sandbox hosts) and signals nothing."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
from cli_runner import dfo
from security.hostile import HostileHost  # the hostile-host kit (tests/security/hostile.py)
from waiting import wait_for

from orchestrator.jobs.operation import cancel_job, follow_job, job_status, launch_job

# Every host is unreachable (port 1): a command that connected would fail (exit 1).
UNREACHABLE = """hosts:
  ct129:
    address: 127.0.0.1
    port: 1
    workdir: /tmp/dfo-c
    env: {HF_HUB_OFFLINE: "1", HF_TOKEN: "${DRY_RUN_TEST_TOKEN}"}
"""


def _one_line(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def unreachable(tmp_path) -> Path:
    inv = tmp_path / "inventory.yaml"
    inv.write_text(UNREACHABLE)
    return inv


# ------------------------------------------------------------------------------------------ run


def test_run_dry_run_prints_the_plan_and_connects_to_no_host(unreachable):
    args = ["jobs", "run", "-H", "ct129", "--name", "probe", "--env", "MY_SECRET=s3cr3t-value", "--cwd", "/srv/x"]
    command = ["--", "python3", "-c", "print('hi there')", "--out={results}/a.json", "{job_id}"]
    env = {"DRY_RUN_TEST_TOKEN": "hf_token_value"}
    proc = dfo(*args, "--dry-run", *command, inventory=unreachable, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = _one_line(proc.stdout)
    assert "dry run: would start on ct129; nothing started, no host contacted" in out
    job_id = out.split("job ct129:")[1].split()[0]
    job_dir = f"/tmp/dfo-c/jobs/{job_id}"
    expected = shlex.join(["python3", "-c", "print('hi there')", f"--out={job_dir}/results/a.json", job_id])
    assert f"command {expected}" in out
    assert f"directory {job_dir}" in out and "cwd /srv/x" in out and "name probe" in out
    assert "lock gpu (a live job holding it on the host refuses the launch)" in out
    for key in ("DFO_JOB_DIR", "DFO_JOB_ID", "DFO_RESULTS_DIR", "HF_HUB_OFFLINE", "HF_TOKEN", "MY_SECRET"):
        assert key in out
    assert "s3cr3t-value" not in proc.stdout + proc.stderr and "hf_token_value" not in proc.stdout + proc.stderr

    # --json: the same plan as one document; values of the environment stay out of it too.
    proc = dfo(*args, "--dry-run", "--json", "--lock", "", *command, inventory=unreachable, env=env)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["dry_run"] is True and plan["host"] == "ct129" and plan["lock"] is None and plan["cwd"] == "/srv/x"
    assert plan["argv"][3] == f"--out=/tmp/dfo-c/jobs/{plan['job_id']}/results/a.json"
    assert "MY_SECRET" in plan["env_keys"] and "s3cr3t-value" not in proc.stdout

    # The same command without --dry-run does try the host: the exit 0 above was not a lucky connection.
    real = dfo(*args, *command, inventory=unreachable, env=env)
    assert real.returncode == 1 and "Traceback" not in real.stderr, real.stderr


BAD_RUN = [  # (case, arguments after `jobs run`, environment, a phrase of the message)
    ("unknown host", ["-H", "zz", "--", "true"], {}, "unknown host 'zz'"),
    ("bad lock name", ["-H", "ct129", "--lock", "../x", "--", "true"], {}, "--lock '../x': expected a name"),
    ("bad --env", ["-H", "ct129", "--env", "NOVALUE", "--", "true"], {}, "--env expects KEY=VALUE, got 'NOVALUE'"),
    ("unset ${VAR}", ["-H", "ct129", "--", "true"], {"DRY_RUN_TEST_TOKEN": None},
     "ct129: env HF_TOKEN refers to ${DRY_RUN_TEST_TOKEN}, which is not set"),
]


@pytest.mark.parametrize("case, args, env, phrase", BAD_RUN, ids=[c[0] for c in BAD_RUN])
def test_run_dry_run_refuses_bad_input_as_the_launch_does(unreachable, monkeypatch, case, args, env, phrase):
    monkeypatch.setenv("DRY_RUN_TEST_TOKEN", "set")
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key)
    for dry in (["--dry-run"], []):
        proc = dfo("jobs", "run", *args[:-2], *dry, *args[-2:], inventory=unreachable)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert phrase in _one_line(proc.stderr) and "Traceback" not in proc.stderr, proc.stderr


def test_run_dry_run_on_a_host_starts_nothing_and_plans_what_the_launch_runs(sandbox, connector):
    jobs_dir = Path(sandbox.hosts["kpro6"].workdir) / "jobs"
    before = set(os.listdir(jobs_dir)) if jobs_dir.exists() else set()
    args = ["jobs", "run", "-H", "kpro6", "--lock", "", "--", "sh", "-c", "echo {job_id} > {results}/id"]
    proc = dfo(sandbox, *args[:-4], "--dry-run", "--json", *args[-4:])
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert (set(os.listdir(jobs_dir)) if jobs_dir.exists() else set()) == before  # nothing was created

    ref = dfo(sandbox, *args).stdout.strip()  # the real launch of the same command
    job_id = ref.split(":", 1)[1]
    st = follow_job(connector, "kpro6", job_id)
    assert st.ok
    # What the host recorded is what the dry run said, but for the id, which is new at each launch.
    assert st.argv == [a.replace(plan["job_id"], job_id) for a in plan["argv"]]
    assert st.cwd == plan["cwd"] and st.job_dir == plan["job_dir"].replace(plan["job_id"], job_id)
    assert set(plan["env_keys"]) <= set(st.env_keys)


# --------------------------------------------------------------------------------------- cancel


def test_cancel_dry_run_lists_the_processes_it_would_signal_and_signals_none(sandbox, connector):
    script = "sleep 301 & echo $! > {results}/child.pid; sleep 302"
    handle = launch_job(connector, "ct129", ["sh", "-c", script], lock="dry-run-test")
    try:
        pid_file = Path(handle.results_dir) / "child.pid"
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the child's pid"))
        supervisor = job_status(connector, "ct129", handle.job_id).pid
        assert supervisor is not None
        lock_file = Path(sandbox.hosts["ct129"].workdir) / "locks" / "dry-run-test.lock"
        assert lock_file.exists()

        proc = dfo(sandbox, "jobs", "cancel", "--dry-run", "--grace", "2", handle.ref)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out = _one_line(proc.stdout)
        assert (f"dry run: {handle.ref}: running; a cancel would send SIGTERM to process group {supervisor}, then "
                f"SIGKILL after 2 s, and release lock 'dry-run-test'; nothing signalled") in out
        assert f"{child} sleep 301" in out and "sleep 302" in out and f"{supervisor} " in out
        assert "supervisor.py supervise" in out

        proc = dfo(sandbox, "jobs", "cancel", "--dry-run", "--json", handle.ref)
        plan = json.loads(proc.stdout)
        pids = {p["pid"] for p in plan["processes"]}
        assert plan["would_signal"] and plan["pgid"] == supervisor and {supervisor, child} <= pids

        # Nothing changed: the job runs on, every process lives, no cancel was recorded, the lock is held.
        assert job_status(connector, "ct129", handle.job_id).state == "running"
        assert all(_pid_alive(pid) for pid in pids)
        assert not (Path(handle.job_dir) / "cancel").exists() and lock_file.exists()
    finally:
        cancel_job(connector, "ct129", handle.job_id, grace=1)

    proc = dfo(sandbox, "jobs", "cancel", "--dry-run", handle.ref)
    assert proc.returncode == 0 and f"dry run: {handle.ref}: already cancelled" in _one_line(proc.stdout)
    assert "nothing to cancel" in proc.stdout


def test_cancel_dry_run_of_a_missing_job_is_bad_input(sandbox):
    proc = dfo(sandbox, "jobs", "cancel", "--dry-run", "ct129:20000101-000000-none")
    assert proc.returncode == 2 and "no job" in proc.stderr and "Traceback" not in proc.stderr
    assert "LookupError" not in proc.stderr and "jobs." not in proc.stderr  # the host script's internals stay in


@pytest.mark.parametrize("edit, what", [
    ("job['processes'] = 'all of them'", "the job's processes"),
    ("job['processes'] = [{'pid': -1, 'command': ['x']}]", "a process id"),
    ("job['processes'] = [{'pid': 7, 'command': 'rm -rf /'}]", "a process command"),
    ("job['pgid'] = 'everyone'", "the process group"),
    ("job['job'] = None", "a job's status"),
])
def test_cancel_dry_run_refuses_a_malformed_preview(sandbox, connector, tmp_path, edit, what):
    handle = launch_job(connector, "ct129", ["sleep", "120"], lock=None)
    host = HostileHost(sandbox, "ct129", tmp_path / "hostile")
    host.tamper("def tamper(func, reply):\n"
                "    if func == 'cancel_preview':\n"
                "        job = reply['ok']\n"
                f"        {edit}\n"
                "    return reply\n")
    try:
        proc = dfo("jobs", "cancel", "--dry-run", handle.ref, inventory=host.inventory)
        assert "cancel_preview" in host.called()
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stdout + proc.stderr
        assert f"ct129: malformed jobs reply from the host: {what}" in _one_line(proc.stderr), proc.stderr
        assert job_status(connector, "ct129", handle.job_id).state == "running"
    finally:
        cancel_job(connector, "ct129", handle.job_id, grace=1)


def test_cancel_dry_run_shows_a_host_chosen_command_as_text(sandbox, connector, tmp_path):
    handle = launch_job(connector, "ct129", ["sleep", "120"], lock=None)
    host = HostileHost(sandbox, "ct129", tmp_path / "hostile")
    host.tamper("def tamper(func, reply):\n"
                "    if func == 'cancel_preview':\n"
                "        evil = ['\\x1b]0;owned\\x07evil', '[red]x[/red]']\n"
                "        reply['ok']['processes'] = [{'pid': 9, 'command': evil}]\n"
                "    return reply\n")
    try:
        proc = dfo("jobs", "cancel", "--dry-run", handle.ref, inventory=host.inventory)
        assert proc.returncode == 0, proc.stderr
        assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
        assert "[red]x[/red]" in proc.stdout  # markup is shown as written, never interpreted
    finally:
        cancel_job(connector, "ct129", handle.job_id, grace=1)
