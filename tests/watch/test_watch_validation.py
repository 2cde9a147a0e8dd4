"""`dfo watch` checks before it connects (bad values: exit 2, a clear message, no traceback), then makes its
first checks on the hosts; its dry run runs the eval planner on what it would evaluate."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from cli_runner import dfo

# Every host is unreachable (port 1): exit 2 with the phrase shows the value was refused before any connection.
INVENTORY = """hosts:
  kpro6: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-k, roles: [train], paths: {checkpoints: /tmp/ck}}
  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}
  ct130: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-d}
"""
TWO_EVAL_HOSTS = INVENTORY.replace("workdir: /tmp/dfo-d}", "workdir: /tmp/dfo-d, roles: [eval]}")
BASE = ["watch", "kpro6:/tmp/ck/run7/", "--target", "/m/t"]
OK = BASE[1:]  # the source and the options every case starts from

# (case, the arguments after `watch`, exit code, a phrase of the message)
BAD_WATCH = [
    ("unknown eval host", [*OK, "--host", "zz"], 2, "unknown host 'zz'"),
    ("unknown training host", ["kpro7:/tmp/ck/run7/", "--target", "/m/t"], 2, "unknown host 'kpro7'"),
    ("relative target", [*OK, "--target", "m/t"], 2, "--target 'm/t': expected an absolute path"),
    ("step-from guess", [*OK, "--step-from", "guess"], 2, "--step-from 'guess': expected one of auto, name, metadata"),
    ("tree-k 0", [*OK, "--tree-k", "0"], 2, "--tree-k 0: expected an integer of at least 1"),
    ("threads 0", [*OK, "--threads", "0"], 2, "--threads 0: expected an integer of at least 1"),
    ("samples 0", [*OK, "--samples", "0"], 2, "--samples 0: expected an integer of at least 1"),
    ("dtype fp32", [*OK, "--dtype", "fp32"], 2, "--dtype 'fp32': expected one of bfloat16, float32, float16"),
    ("dtype float16", [*OK, "--dtype", "float16"], 2, "--dtype float16 is refused"),
    ("payload-arg unknown", [*OK, "--payload-arg=--bogus"], 2, "`remote_payload eval` has no option --bogus"),
    ("interval 0", [*OK, "--interval", "0"], 2, "--interval 0: expected more than 0 seconds"),
    ("every 0", [*OK, "--every", "0"], 2, "--every must be at least 1"),
    ("series name", [*OK, "--series", "../x"], 2, "series name '../x'"),
    ("bad baseline", [*OK, "--drafter", "nothing"], 2, "expected NAME=[HOST:]PATH"),
    ("prompts bad line", [*OK, "--prompts", "{bad}"], 2, "bad.jsonl line 2: needs \"messages\""),
    ("relative proxy logdir", [*OK, "--proxy-logdir", "tb/run7"], 2, "--proxy-logdir 'tb/run7': expected an absolute"),
    ("empty proxy tag", [*OK, "--proxy", "-"], 2, "--proxy: proxy '-' is not a tag name"),
]


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    inv, two = tmp_path / "inventory.yaml", tmp_path / "two.yaml"
    inv.write_text(INVENTORY)
    two.write_text(TWO_EVAL_HOSTS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b"}\n')
    return {"inventory": inv, "two": two, "bad": bad}


@pytest.mark.parametrize("mode", [[], ["--dry-run"], ["--detach"], ["--once"]], ids=["watch", "dry-run", "detach",
                                                                                   "once"])
@pytest.mark.parametrize("case, extra, code, phrase", BAD_WATCH, ids=[c[0] for c in BAD_WATCH])
def test_bad_watch_input_is_refused_before_anything_connects(files, tmp_path, case, extra, code, phrase, mode):
    # --once and the plain watch would reach for the hosts next, --detach would leave: none of them gets there.
    args = [a.format(bad=files["bad"]) for a in extra]
    runs = tmp_path / "runs"
    proc = dfo("watch", *args, *mode, inventory=files["inventory"], runs=runs, timeout=120)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert phrase in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "detached" not in proc.stderr and not list(runs.rglob("supervisor.pid"))


@pytest.mark.parametrize("host", ["ct129", "kpro6"], ids=["eval host", "training host"])
def test_an_unset_env_reference_is_refused_before_anything_connects(files, tmp_path, host):
    unset = "DFO_TEST_SURELY_UNSET_WATCH_VAR"
    text = files["inventory"].read_text().replace(f"  {host}: {{", f"  {host}: {{env: {{TOKEN: '${{{unset}}}'}}, ")
    inventory = tmp_path / "env-inventory.yaml"
    inventory.write_text(text)
    proc = dfo("watch", *OK, "--detach", inventory=inventory, runs=tmp_path / "runs", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{host}: env TOKEN refers to ${{{unset}}}, which is not set" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr and "detached" not in proc.stderr


def test_the_eval_host_defaults_to_the_one_with_the_eval_role(files):
    # ct129 is the only eval host: it is the one the first check reaches for (and cannot reach).
    proc = dfo(*BASE, "--dry-run", inventory=files["inventory"])
    assert proc.returncode == 1 and "ct129: connection refused" in proc.stderr, proc.stderr
    two = dfo(*BASE, "--dry-run", inventory=files["two"])
    assert two.returncode == 2 and "Traceback" not in two.stderr
    assert "dfo watch evaluates on one eval host" in " ".join(two.stderr.split()) and "--host" in two.stderr


@pytest.fixture
def training_run(sandbox, tmp_path) -> Path:
    """A folder on the training host with one settled checkpoint (its content is never read: dry runs)."""
    folder = sandbox.hosts["kpro6"].checkpoints / f"dry-{tmp_path.name[-16:]}"
    folder.mkdir(parents=True)
    (folder / "step_40.pt").write_bytes(b"weights")
    os.utime(folder / "step_40.pt", (time.time() - 3600, time.time() - 3600))
    return folder


@pytest.mark.sshd
def test_the_dry_run_plans_each_checkpoints_eval_with_the_eval_planner(sandbox, tmp_path, training_run):
    target = str(sandbox.hosts["ct129"].models)  # only its existence is checked
    args = ["watch", f"kpro6:{training_run}/", "--target", target, "--settle", "1", "--samples", "2",
            "--tree-k", "4", "--threads", "1", "--payload-arg=--reference-timeout=30", "--dry-run"]
    proc = dfo(sandbox, *args, "--json", runs=tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    planned = json.loads(proc.stdout)
    assert [c["name"] for c in planned["evaluate"]] == ["step_40.pt"]
    eval_args = planned["eval_args"]["step_40.pt"]
    assert eval_args[:3] == ["eval", "--target", target]
    for flag, value in (("--samples", "2"), ("--tree-k", "4"), ("--threads", "1"), ("--max-new-tokens", "256")):
        assert eval_args[eval_args.index(flag) + 1] == value, flag
    assert eval_args[-1] == "--reference-timeout=30" and any(a.startswith("step_40=") for a in eval_args)
    text = dfo(sandbox, *args, runs=tmp_path / "runs")
    assert text.returncode == 0, text.stderr
    assert "evaluate step 40" in text.stdout and "python -m remote_payload eval --target" in text.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.sshd
def test_a_target_missing_on_the_eval_host_fails_the_first_check(sandbox, tmp_path, training_run):
    for mode in ("--dry-run", "--detach", "--once"):
        proc = dfo(sandbox, "watch", f"kpro6:{training_run}/", "--target", "/nonexistent/target", mode,
                   runs=tmp_path / "runs")
        assert proc.returncode == 2, proc.stderr
        assert "ct129: target /nonexistent/target does not exist" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and "detached" not in proc.stderr
    assert not list((tmp_path / "runs").rglob("supervisor.pid"))
