"""Detached remote jobs on real sshd hosts: launch, reattach after the controller died, cancel, exit codes,
sha256-verified pulls, and the per-host lock. Jobs are small shell/Python commands (no torch)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_runner import dfo, dfo_argv, dfo_env
from waiting import wait_for

from orchestrator.core.errors import HostError, InputError
from orchestrator.core.inventory import load_inventory
from orchestrator.jobs.operation import (
    JobRefused,
    cancel_job,
    follow_job,
    job_status,
    launch_job,
    list_jobs,
    locate_job,
    new_job_id,
    parse_job_ref,
    pull_results,
    substitute,
)
from orchestrator.transport import Connector
from orchestrator.transport.control import HostSession

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sshd


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its reaper is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False




# ------------------------------------------------------------------------------- pure helpers


def test_job_ids_are_sortable_and_short():
    a, b = new_job_id(1_700_000_000), new_job_id(1_700_000_001)
    assert a < b and len(a) == len("20231114-221320-ab12")
    assert a.startswith("20231114-221320-")


def test_parse_job_ref():
    assert parse_job_ref("ct129:20261130-142501-ab12") == ("ct129", "20261130-142501-ab12")
    assert parse_job_ref("20261130", host="kpro6") == ("kpro6", "20261130")
    assert parse_job_ref("last") == (None, "last")
    with pytest.raises(InputError):
        parse_job_ref("ct129:x", host="kpro6")
    with pytest.raises(InputError):
        parse_job_ref("ct129:")


def test_substitute_placeholders_only():
    out = substitute(["run", "--out={results}/x.json", "{job_id}", "{not_ours}", "{}"],
                     {"results": "/w/jobs/1/results", "job_dir": "/w/jobs/1", "job_id": "1"})
    assert out == ["run", "--out=/w/jobs/1/results/x.json", "1", "{not_ours}", "{}"]


# ------------------------------------------------------------------------------- real hosts


def test_launch_returns_at_once_then_succeeds_with_env_results_and_heartbeat(sandbox, connector):
    script = ('echo "token=$DFO_TOKEN"; sleep 1; echo ok > "$DFO_RESULTS_DIR/a.txt"; '
              'mkdir -p {results}/sub && printf "%s" "$DFO_JOB_ID" > {results}/sub/id.txt')
    handle = launch_job(connector, "ct129", ["sh", "-c", script], env={"DFO_TOKEN": "s3cret"}, job_name="basic",
                        lock=None, heartbeat_s=0.2)
    assert handle.status.state in ("starting", "running")  # returned while the job runs
    job_dir = Path(handle.job_dir)
    hb = job_dir / "heartbeat"
    first = wait_for(lambda: hb.exists() and hb.stat().st_mtime_ns, "a heartbeat")
    wait_for(lambda: hb.stat().st_mtime_ns != first, "the heartbeat to be rewritten")

    st = follow_job(connector, "ct129", handle.job_id)
    assert st.state == "succeeded" and st.exit_code == 0 and st.results == 2
    assert (job_dir / "results" / "sub" / "id.txt").read_text() == handle.job_id
    assert "token=s3cret" in (job_dir / "log").read_text()
    # The environment's values are kept out of job.json (only keys) and in a file only the owner reads.
    assert "s3cret" not in (job_dir / "job.json").read_text() and "DFO_TOKEN" in st.env_keys
    assert (job_dir / "env.json").stat().st_mode & 0o077 == 0
    pid_info = json.loads((job_dir / "pid.json").read_text())
    assert pid_info["pid"] == pid_info["pgid"] == pid_info["sid"]  # leads its own session and group


def test_progress_lines_are_rendered_and_text_passes_through(sandbox, connector):
    from io import StringIO

    from rich.console import Console

    from orchestrator.ui.console_events import ConsoleEvents

    emit = ("import json, time\n"
            "for i in range(1, 6):\n"
            "    print(json.dumps({'dfo': 'progress', 'stage': 'generate', 'done': i, 'total': 5,"
            " 'unit': 'prompts'}))\n"
            "    print('plain line', i)\n"
            "    time.sleep(0.05)\n"
            "print(json.dumps({'dfo': 'warning', 'message': 'slow host'}))\n"
            "print('{not json')\n")
    handle = launch_job(connector, "kpro6", ["/usr/bin/python3", "-c", emit], lock=None)
    buf = StringIO()
    lines = []
    st = follow_job(connector, "kpro6", handle.job_id, events=ConsoleEvents(Console(file=buf, width=100)),
                    on_line=lines.append,
                    poll_interval=0.1)
    assert st.ok
    out = buf.getvalue()
    assert "plain line 5" in out and "{not json" in out
    assert "generate 5/5 prompts (100%)" in out and "warning: slow host" in out
    assert '"dfo": "progress"' not in out  # structured lines are rendered, not dumped
    assert len([ln for ln in lines if ln.startswith("plain line")]) == 5


def test_job_survives_controller_death_and_reattach_gets_logs_and_results(sandbox, connector, tmp_path):
    script = ('for i in $(seq 1 40); do echo "line $i"; sleep 0.1; done; '
              'echo finished > "$DFO_RESULTS_DIR/out.txt"')
    # A real controller process: the test kills it mid-job.
    ctl = subprocess.Popen(dfo_argv("jobs", "run", "-H", "ct129", "--lock", "", "--follow", "--", "sh", "-c", script),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=dfo_env(sandbox.inventory_path), cwd=ROOT)
    try:
        ref = ctl.stdout.readline().strip()
        assert ref.startswith("ct129:"), ref + ctl.stderr.read()
        wait_for(lambda: "line 3" in ctl.stdout.readline(), "the controller to stream log lines")
        ctl.kill()  # the controller dies: its SSH connection drops with it
        ctl.wait(10)
    finally:
        if ctl.poll() is None:
            ctl.kill()
    host, job_id = locate_job(connector, ref)
    assert job_status(connector, host, job_id).state == "running"  # detached: still going

    seen = []
    st = follow_job(connector, host, job_id, on_line=seen.append, poll_interval=0.1)  # reattach
    assert st.state == "succeeded"
    assert seen[0] == "line 1" and seen[-1] == "line 40"  # the whole log, from the start
    pulled = pull_results(connector, host, job_id, tmp_path / "run")
    assert (tmp_path / "run" / "out.txt").read_text() == "finished\n" and pulled.status == "pulled"


def test_cancel_kills_the_whole_process_group(sandbox, connector):
    script = 'sleep 300 & echo $! > {results}/child.pid; sleep 300'
    handle = launch_job(connector, "ct129", ["sh", "-c", script], lock=None)
    pid_file = Path(handle.results_dir) / "child.pid"
    child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the child's pid"))
    supervisor = job_status(connector, "ct129", handle.job_id).pid
    assert pid_alive(child) and pid_alive(supervisor)

    st = cancel_job(connector, "ct129", handle.job_id, grace=5)
    assert st.state == "cancelled"
    wait_for(lambda: not pid_alive(child) and not pid_alive(supervisor), "the job's processes to be gone", 10)


def test_cancel_escalates_to_sigkill_for_a_command_ignoring_sigterm(sandbox, connector):
    stubborn = ("import signal, time, pathlib, os\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "pathlib.Path(os.environ['DFO_RESULTS_DIR'], 'ready').write_text(str(os.getpid()))\n"
                "time.sleep(300)\n")
    handle = launch_job(connector, "ct129", ["/usr/bin/python3", "-c", stubborn], lock=None)
    ready = Path(handle.results_dir) / "ready"
    pid = int(wait_for(lambda: ready.exists() and ready.read_text(), "the command to start"))
    st = cancel_job(connector, "ct129", handle.job_id, grace=1)
    assert st.state == "cancelled"
    wait_for(lambda: not pid_alive(pid), "the stubborn command to be killed", 10)


def test_nonzero_exit_is_a_failure_with_the_last_log_lines(sandbox, connector):
    handle = launch_job(connector, "kpro6", ["sh", "-c", 'echo preparing; echo "boom: layer 61 missing" >&2; exit 3'],
                        lock=None)
    st = follow_job(connector, "kpro6", handle.job_id)
    assert st.state == "failed" and st.exit_code == 3 and not st.ok
    assert st.log_tail[-1] == "boom: layer 61 missing"

    # The CLI says so, with the last lines, and exits 1.
    proc = dfo(sandbox, "jobs", "logs", f"kpro6:{handle.job_id}", "-f")
    assert proc.returncode == 1
    assert "failed (exit 3)" in proc.stderr and "boom: layer 61 missing" in proc.stderr
    proc = dfo(sandbox, "jobs", "status", f"kpro6:{handle.job_id}", "--json")
    assert json.loads(proc.stdout)["state"] == "failed"


def test_unknown_command_is_a_failure_not_a_hang(sandbox, connector):
    handle = launch_job(connector, "kpro6", ["/no/such/program", "x"], lock=None)
    st = follow_job(connector, "kpro6", handle.job_id)
    assert st.state == "failed" and st.exit_code == 127
    assert any("cannot start /no/such/program" in ln for ln in st.log_tail)


def test_pull_verifies_hashes_is_atomic_and_idempotent(sandbox, connector, tmp_path, monkeypatch):
    script = ('head -c 1048576 /dev/urandom > {results}/blob.bin; mkdir -p {results}/plots; '
              'echo "{\\"tau\\": 3.2}" > {results}/summary.json; echo png > {results}/plots/a.png')
    handle = launch_job(connector, "kpro6", ["sh", "-c", script], lock=None)
    assert follow_job(connector, "kpro6", handle.job_id).ok
    dest = tmp_path / "runs" / "r1"
    res = pull_results(connector, "kpro6", handle.job_id, dest)
    assert res.status == "pulled" and res.files == 3 and res.bytes > 1_000_000
    remote = Path(handle.results_dir)
    for rel in ("blob.bin", "summary.json", "plots/a.png"):
        assert (dest / rel).read_bytes() == (remote / rel).read_bytes()
    assert pull_results(connector, "kpro6", handle.job_id, dest).status == "up-to-date"

    # Bytes damaged on the way are caught, and nothing half-done is left under the destination's name.
    real_get = HostSession.get

    def corrupting_get(self, remote_path, local, progress=None):
        real_get(self, remote_path, local, progress)
        if str(remote_path).endswith("blob.bin"):
            with open(local, "r+b") as fh:
                first = fh.read(1)
                fh.seek(0)
                fh.write(bytes([first[0] ^ 0xFF]))

    monkeypatch.setattr(HostSession, "get", corrupting_get)
    other = tmp_path / "runs" / "r2"
    with pytest.raises(HostError) as err:
        pull_results(connector, "kpro6", handle.job_id, other)
    assert "blob.bin failed verification" in err.value.message
    assert not other.exists() and not [p for p in other.parent.iterdir() if p.name.startswith(".r2.partial")]
    monkeypatch.undo()

    (dest / "summary.json").write_text("edited locally")
    with pytest.raises(InputError):
        pull_results(connector, "kpro6", handle.job_id, dest)  # differs: refused without force
    assert pull_results(connector, "kpro6", handle.job_id, dest, force=True).status == "pulled"
    assert (dest / "summary.json").read_bytes() == (remote / "summary.json").read_bytes()


def test_lock_refuses_a_second_job_unless_forced(sandbox, connector):
    first = launch_job(connector, "ct129", ["sleep", "60"], lock="gpu-test-1")
    try:
        with pytest.raises(JobRefused) as err:
            launch_job(connector, "ct129", ["true"], lock="gpu-test-1")
        assert first.job_id in err.value.message and "--force" in (err.value.hint or "")
        jobs_dir = Path(first.job_dir).parent
        before = set(os.listdir(jobs_dir))
        proc = dfo(sandbox, "jobs", "run", "-H", "ct129", "--lock", "gpu-test-1", "--", "true")
        assert proc.returncode == 1 and "held by running job" in proc.stderr
        assert set(os.listdir(jobs_dir)) == before  # a refused launch leaves nothing behind

        forced = launch_job(connector, "ct129", ["true"], lock="gpu-test-1", force=True)
        assert any("--force" in n for n in forced.notices)
        assert follow_job(connector, "ct129", forced.job_id).ok
    finally:
        cancel_job(connector, "ct129", first.job_id, grace=1)


def test_stale_lock_of_a_dead_supervisor_is_cleared_with_a_message(sandbox, connector):
    handle = launch_job(connector, "ct129", ["sh", "-c", "sleep 60"], lock="gpu-test-2")
    st = job_status(connector, "ct129", handle.job_id)
    pgid = st.pid
    os.kill(st.pid, signal.SIGKILL)  # the supervisor dies without releasing the lock (like a host crash)
    try:
        wait_for(lambda: job_status(connector, "ct129", handle.job_id).state == "lost", "the job to count as lost")
        nxt = launch_job(connector, "ct129", ["true"], lock="gpu-test-2")
        assert any("cleared stale lock" in n and handle.job_id in n for n in nxt.notices)
        assert follow_job(connector, "ct129", nxt.job_id).ok
    finally:
        try:
            os.killpg(pgid, signal.SIGKILL)  # the orphaned `sleep` of the killed job
        except ProcessLookupError:
            pass


def test_list_locate_last_and_cli(sandbox, connector):
    a = launch_job(connector, "kpro6", ["true"], job_name="first", lock=None)
    time.sleep(1.1)  # job ids have one-second resolution; the next one must sort after
    b = launch_job(connector, "kpro6", ["true"], job_name="second", lock=None)
    follow_job(connector, "kpro6", b.job_id)
    ids = [j.job_id for j in list_jobs(connector, "kpro6")]
    assert ids.index(b.job_id) < ids.index(a.job_id)  # newest first
    assert locate_job(connector, "kpro6:last") == ("kpro6", b.job_id)
    assert locate_job(connector, b.job_id) == ("kpro6", b.job_id)  # bare id: found by asking every host
    with pytest.raises(InputError):
        locate_job(connector, "ct129:" + b.job_id)

    proc = dfo(sandbox, "jobs", "list", "-H", "kpro6")
    assert proc.returncode == 0 and f"kpro6:{b.job_id}" in proc.stdout and "second" in proc.stdout
    proc = dfo(sandbox, "jobs", "status", "--host", "kpro6", b.job_id)
    assert proc.returncode == 0 and "succeeded" in proc.stdout
    proc = dfo(sandbox, "jobs", "status", "kpro6:nope")
    assert proc.returncode == 2 and "no job" in proc.stderr


def test_follow_reconnects_after_the_link_drops_and_loses_no_line(fresh_sandbox):
    import threading

    box = fresh_sandbox
    if not box.isolated:
        pytest.skip(f"link_down needs network namespaces ({box.reason})")
    with Connector(load_inventory(box.inventory_path), connect_timeout=2) as conn:
        handle = launch_job(conn, "ct129", ["sh", "-c", "for i in $(seq 1 50); do echo line $i; sleep 0.1; done"],
                            lock=None)
        from io import StringIO

        from rich.console import Console

        from orchestrator.ui.console_events import ConsoleEvents

        seen: list[str] = []
        outcome: dict = {}
        notes = StringIO()

        def follow():
            try:
                outcome["status"] = follow_job(conn, "ct129", handle.job_id, on_line=seen.append, poll_interval=0.1,
                                               poll_timeout=2, reconnect_timeout=60,
                                               events=ConsoleEvents(Console(file=notes, width=200)))
            except Exception as exc:  # reported by the assertion below
                outcome["error"] = exc

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        wait_for(lambda: len(seen) >= 3, "the first lines")
        box.link_down("ct129")
        time.sleep(3)  # keep the link down past a poll timeout, so the follower must reconnect
        box.link_up("ct129")
        follower.join(90)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["status"].ok
        assert seen == [f"line {i}" for i in range(1, 51)]  # resumed at the right offset: nothing lost or repeated
        assert "connection lost; reconnecting" in notes.getvalue() and "reconnected" in notes.getvalue()
