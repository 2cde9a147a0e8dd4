"""`dfo eval --dataset / --suite / --dataset-file`: checked on the controller before any connection (every host
is unreachable here, so a case that got past the checks would fail to connect, exit 1), and planned: the rows a
package ships read here and uploaded under a content name, exported files checked on the eval host."""

from __future__ import annotations

import hashlib
import json

import pytest
from cli_runner import dfo

from remote_payload.inputs.datasets.registry import ADAPTERS, package_source

INVENTORY = """hosts:
  ct129: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-c, roles: [eval]}
  ct130: {address: 127.0.0.1, port: 1, workdir: /tmp/dfo-d, roles: [eval]}
"""
BASE = ["eval", "--host", "ct129", "--target", "/m/t", "--drafter", "z=/m/d"]


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return path


BAD = [
    ("unknown dataset", ["--dataset", "squad"], "unknown dataset 'squad' (known: gsm8k, math500, humaneval"),
    ("bad split", ["--dataset", "humaneval:train"], "humaneval has no split 'train'"),
    ("zero count", ["--dataset", "humaneval@0"], "@N must be a whole number of at least 1"),
    ("twice", ["--dataset", "mbpp", "--dataset", "mbpp@2"], "mbpp given twice"),
    ("unknown suite", ["--suite", "helm"], "--suite 'helm': expected one of zlab"),
    ("no file for a hub-only set", ["--dataset", "gsm8k@8"], "gsm8k ships in no package: give its rows with "
     "--dataset-file gsm8k=PATH"),
    ("suite without files", ["--suite", "zlab"], "gsm8k ships in no package"),
    ("relative file", ["--dataset", "gsm8k", "--dataset-file", "gsm8k=data/g.jsonl"],
     "--dataset-file gsm8k=data/g.jsonl: expected an absolute path on the eval host"),
    ("file of no dataset", ["--dataset", "humaneval", "--dataset-file", "mbpp=/d/m.jsonl"],
     "--dataset-file for dataset(s) not evaluated: mbpp"),
    ("file without name", ["--dataset", "humaneval", "--dataset-file", "/d/m.jsonl"],
     "--dataset-file expects NAME=PATH"),
    ("samples beside", ["--dataset", "humaneval@4", "--samples", "2"], "with --dataset give the count as NAME@N"),
    ("fewer rows than hosts", ["--dataset", "humaneval@1", "--host", "ct130"], "is fewer than the 2 hosts"),
]


@pytest.mark.parametrize("case, extra, phrase", BAD, ids=[c[0] for c in BAD])
def test_bad_dataset_input_is_refused_before_anything_connects(inventory, tmp_path, case, extra, phrase):
    proc = dfo(*BASE, *extra, inventory=inventory, runs=tmp_path / "runs")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert phrase in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr and not (tmp_path / "runs").exists()


def test_a_prompts_file_beside_a_dataset_is_refused(inventory, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "x"}\n')
    proc = dfo(*BASE, "--dataset", "humaneval@2", "--prompts", str(prompts), inventory=inventory)
    assert proc.returncode == 2 and "--prompts FILE and --dataset/--suite both name what to evaluate" in \
        " ".join(proc.stderr.split()), proc.stderr


def _plan(inventory, *extra):
    proc = dfo(*BASE, *extra, "--dry-run", "--json", inventory=inventory)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["plan"]


def _value(args, flag):
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_package_rows_are_read_here_and_uploaded_under_a_content_name(inventory):
    (job,) = _plan(inventory, "--dataset", "humaneval@8", "--dataset", "mt-bench@2")["jobs"]
    local, _ = package_source(ADAPTERS["humaneval"])
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    remote = f"/tmp/dfo-c/inputs/datasets/humaneval-{digest[:16]}.jsonl.gz"
    assert _value(job["args"], "--dataset") == ["humaneval@8", "mt-bench@2"]
    files = _value(job["args"], "--dataset-file")
    assert files[0] == f"humaneval={remote}" and files[1].startswith("mt-bench=/tmp/dfo-c/inputs/datasets/mt-bench-")
    assert [u[1] for u in job["uploads"]] == [remote, files[1].split("=", 1)[1]]
    assert job["uploads"][0][0] == str(local)
    assert _value(job["args"], "--max-new-tokens") == ["256"]  # dfo's default: no suite


def test_the_suite_takes_zlabs_output_length_unless_one_is_given_and_exported_files_are_checked(inventory):
    files = [a for n in ("gsm8k", "math500", "mbpp") for a in ("--dataset-file", f"{n}=/data/{n}.jsonl")]
    plan = _plan(inventory, "--suite", "zlab", *files)
    (job,) = plan["jobs"]
    assert _value(job["args"], "--suite") == ["zlab"] and _value(job["args"], "--max-new-tokens") == ["2048"]
    assert {"/data/gsm8k.jsonl", "/data/math500.jsonl", "/data/mbpp.jsonl"} <= set(plan["checks"]["ct129"])
    assert sorted(u[1].rsplit("/", 1)[1].split("-")[0] for u in job["uploads"]) == ["humaneval", "mt"]
    (short,) = _plan(inventory, "--suite", "zlab", *files, "--max-new-tokens", "16")["jobs"]
    assert _value(short["args"], "--max-new-tokens") == ["16"]


def test_the_builtin_set_is_read_by_each_host_from_its_own_payload(inventory):
    (job,) = _plan(inventory, "--dataset", "builtin", "--dataset", "humaneval@2")["jobs"]
    assert _value(job["args"], "--dataset") == ["builtin", "humaneval@2"]
    assert [f.split("=")[0] for f in _value(job["args"], "--dataset-file")] == ["humaneval"]
    assert [u[1].rsplit("/", 1)[1].split("-")[0] for u in job["uploads"]] == ["humaneval"]
