"""Server lifecycle and metrics parsing without vLLM: real processes standing in for the engine's python.

The stand-in "python" is an executable script given the exact argv vLLM would get. It either dies at once
(as vLLM does on a broken venv), never becomes healthy, or serves as vLLM does with ``$VLLM_API_KEY``
(/health open, /v1 behind the key) with a child process of its own (as vLLM's engine core is), so stop()
must end the whole process group. No engine venv needed, except for the last test, which checks on the
session's real vLLM server (tests/engine/conftest.py) what the stand-in assumes: the key it requires.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from remote_payload.engines import server as vs
from remote_payload.engines import vllm
from remote_payload.engines.base import drafter_block_size
from remote_payload.engines.spec_metrics import SpecCounters, parse_prometheus, read_counters

FAKE_SERVER = """
import http.server, json, os, subprocess, sys, time
args = sys.argv[1:]
port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["FAKE_CHILD_PID_FILE"], "w").write(str(child.pid))
print("engine core started", child.pid, flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/v1") and self.headers.get("Authorization") != "Bearer " + os.environ["VLLM_API_KEY"]:
            self.send_response(401); self.end_headers(); return
        if self.path == "/v1/models":
            body = json.dumps({"data": [{"id": name}]}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body); return
        self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")


def test_engine_that_dies_at_start_gives_the_log_tail(tmp_path):
    py = _fake_python(tmp_path, "#!/bin/sh\necho 'RuntimeError: operator torchvision::nms does not exist'\nexit 3\n")
    srv = vs.EngineServer(vs.ServerConfig(python=py, target=str(tmp_path)), tmp_path / "log" / "vllm.log")
    with pytest.raises(vs.EngineError) as err:
        srv.start(timeout_s=60)
    msg = str(err.value)
    assert "exited with status 3 before it was healthy" in msg and "torchvision::nms" in msg
    assert str(tmp_path / "log" / "vllm.log") in msg
    assert "--enforce-eager" in (tmp_path / "log" / "vllm.log").read_text()  # the command line is logged


def test_engine_never_healthy_times_out_and_is_stopped(tmp_path):
    py = _fake_python(tmp_path, "#!/bin/sh\necho loading weights\nexec sleep 600\n")
    srv = vs.EngineServer(vs.ServerConfig(python=py, target=str(tmp_path)), tmp_path / "vllm.log")
    started = time.monotonic()
    with pytest.raises(vs.EngineError, match=r"(?s)not healthy on 127\.0\.0\.1:\d+ within 2 s.*loading weights"):
        srv.start(timeout_s=2)
    assert time.monotonic() - started < 30
    assert srv.proc.poll() is not None  # not left running


def test_stop_ends_the_server_and_its_engine_core(tmp_path, monkeypatch):
    py = _fake_python(tmp_path, f"#!{sys.executable}\n{FAKE_SERVER}")
    pid_file = tmp_path / "child.pid"
    cfg = vs.ServerConfig(python=py, target=str(tmp_path), extra_env={"FAKE_CHILD_PID_FILE": str(pid_file)})
    with vs.EngineServer(cfg, tmp_path / "vllm.log") as srv:
        assert srv.start_seconds is not None and srv.url == f"http://127.0.0.1:{srv.port}/v1"
        child = int(pid_file.read_text())
        assert _alive(child)
    assert srv.proc.returncode is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_missing_engine_python(tmp_path):
    srv = vs.EngineServer(vs.ServerConfig(python=str(tmp_path / "nope" / "python"), target=str(tmp_path)),
                        tmp_path / "vllm.log")
    with pytest.raises(vs.EngineError, match="engine python .* not found"):
        srv.start()


def test_server_argv_and_env(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"dflash_config": {"block_size": 16}}))
    cfg = vs.ServerConfig(python="py", target="/t", drafter=str(drafter), threads=1,
                          extra_args=("--tensor-parallel-size", "2"))
    argv = vllm.server_argv(cfg, 1234)
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--no-enable-prefix-caching" in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15}
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "detailed"  # per-step acceptance
    assert argv[-2:] == ["--tensor-parallel-size", "2"]  # --engine-arg: last, unchanged
    # every flag dfo sets is one an --engine-arg may not name (the refusal's list follows the argv)
    assert {a for a in argv[3:-2] if a.startswith("--")} <= set(vllm.OWNED_FLAGS)
    (drafter / "config.json").write_text(json.dumps({"block_size": 8}))  # older z-lab configs: top level
    assert vllm.speculative_config(cfg)["num_speculative_tokens"] == 7 and drafter_block_size(drafter) == 8
    (drafter / "config.json").write_text(json.dumps({"dflash_config": {}}))
    with pytest.raises(vs.EngineError, match=r"config\.json: block_size .* found None"):
        vllm.server_argv(cfg, 1)
    env = vllm.server_env(cfg, "k")
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and "PYTHONPATH" not in env
    plain = vllm.server_argv(vs.ServerConfig(python="py", target="/t"), 1)
    assert "--speculative-config" not in plain and "--per-request-spec-decode-metrics" not in plain


def test_synthetic_sampler_config_takes_the_profile_marginals(tmp_path):
    import dataclasses

    from remote_payload.engines import sglang

    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"block_size": 4}))
    cfg = vs.ServerConfig(python="py", target="/t", drafter=str(drafter), synthetic_acceptance_rates=(0.8, 0.5, 0.2))
    assert vllm.speculative_config(cfg) == {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 3,
                                            "rejection_sample_method": "synthetic",
                                            "synthetic_acceptance_rates": [0.8, 0.5, 0.2]}
    with pytest.raises(vs.EngineError, match="2 marginal rates for 3 speculative tokens"):
        vllm.speculative_config(dataclasses.replace(cfg, synthetic_acceptance_rates=(0.8, 0.5)))
    with pytest.raises(vs.EngineError, match="SGLang has no synthetic acceptance sampler"):
        sglang.server_argv(cfg, 1, tmp_path / "c.yaml")


def test_the_api_key_goes_in_the_environment_never_in_argv(monkeypatch):
    """argv is readable by every local user (ps); a process's environment only by its own user."""
    monkeypatch.setenv("VLLM_API_KEY", "the-callers-own")
    cfg = vs.ServerConfig(python="py", target="/t", extra_env={"VLLM_API_KEY": "from-extra-env"})
    one, two = vs.EngineServer(cfg, "/dev/null"), vs.EngineServer(cfg, "/dev/null")
    assert one.api_key != two.api_key and len(one.api_key) >= 40  # random per server (32 bytes)
    assert vllm.server_env(cfg, one.api_key)["VLLM_API_KEY"] == one.api_key  # neither the caller's nor extra_env
    assert not any(one.api_key in arg for arg in vllm.server_argv(cfg, one.port))


PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 105.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 14.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 7.0
vllm:generation_tokens_total{engine="0",model_name="m"} 47.0
vllm:generation_tokens_total{engine="0",model_name="other"} 1000.0
vllm:spec_decode_num_drafts_created 1.7e9
"""


def test_read_counters_sums_engines_and_filters_the_model():
    c = read_counters(PAGE, "vllm:", "m")
    assert (c.drafts, c.draft_tokens, c.accepted, c.generated) == (15, 105, 30, 47)
    assert c.per_position == [14, 9, 7] and c.spec_enabled
    assert read_counters(PAGE, "vllm:").generated == 1047
    assert not read_counters("vllm:generation_tokens_total 5\n", "vllm:").spec_enabled
    assert read_counters(PAGE, "sglang:").generated == 0  # another engine's prefix reads none of vLLM's
    assert parse_prometheus('x{a="q\\"uote"} 1 1700000000\nbad line\n') == [("x", {"a": 'q\\"uote'}, 1.0)]


def test_counter_differences_and_vllm_summary():
    before = SpecCounters(10, 70, 20, [8, 7, 5], 40, True)
    after = SpecCounters(14, 98, 29, [12, 9, 6, 2], 53, True)
    d = after - before
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position, d.generated) == (4, 28, 9, [4, 2, 1, 2], 13)
    s = (d + SpecCounters(1, 7, 0, [], 1, True)).summary()
    assert s["tau_micro"] == 1 + 9 / 5 and s["rounds"] == 5
    assert [p["p"] for p in s["per_position"]] == [4 / 5, 2 / 5, 1 / 5, 2 / 5]
    assert SpecCounters().summary()["tau_micro"] is None


def test_engine_run_cli_reports_a_dead_engine_and_bad_prompts(tmp_path, capsys):
    from remote_payload.engines import run as engine_run

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt_ids": [1, 2, 3], "reference": [4, 0]}) + "\n\n")
    assert engine_run.read_prompts(prompts) == [engine_run.EnginePrompt("a", [1, 2, 3], [4, 0])]
    py = _fake_python(tmp_path, "#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm'\nexit 1\n")
    args = ["--python", py, "--target", str(tmp_path), "--prompts", str(prompts), "--max-tokens", "8",
            "--stop-ids", "0", "--out", str(tmp_path / "out")]
    assert engine_run.main(args) == 2
    err = capsys.readouterr().err
    assert "exited with status 1 before it was healthy" in err and "No module named vllm" in err
    assert (tmp_path / "out" / "vllm-plain.log").exists()  # the log is kept for the controller to pull
    prompts.write_text(json.dumps({"id": "b", "prompt_ids": []}) + "\n")
    assert engine_run.main(args) == 2
    assert f"{prompts} line 1: prompt_ids must be a non-empty list" in capsys.readouterr().err


def test_first_difference():
    from remote_payload.engines.run import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_engine_failing_after_its_health_check_names_the_log(tmp_path):
    """Healthy, then unusable (vLLM does this for an unsupported CPU head size): the error carries the log."""
    from remote_payload.engines import run as engine_run

    py = _fake_python(tmp_path, f"#!{sys.executable}\n{FAKE_SERVER}")  # serves /health only
    cfg = vs.ServerConfig(python=py, target=str(tmp_path), extra_env={"FAKE_CHILD_PID_FILE": str(tmp_path / "c")})
    with pytest.raises(vs.EngineError) as err:
        engine_run._served(cfg, tmp_path / "vllm.log", [engine_run.EnginePrompt("a", [1, 2])], 4, [0], [1], 60)
    msg = str(err.value)
    assert "HTTP 501 from POST" in msg and "/v1/completions" in msg and "engine core started" in msg, msg
    assert "Bearer" not in msg and "VLLM_API_KEY=" not in (tmp_path / "vllm.log").read_text()
    child = int((tmp_path / "c").read_text())
    deadline = time.monotonic() + 10  # the group was signalled; a loaded machine may take a moment to reap it
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_real_vllm_requires_the_key_and_argv_does_not_hold_it(servers):
    """On the session's real vLLM: /v1 answers 401 without the key or with a wrong one, 200 with it; the key is
    in the process's environment, not in its argv (/proc/PID/cmdline) nor in the log dfo keeps."""
    srv = servers.get("plain")
    models = srv.root + "/v1/models"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as no_key:
        opener.open(models, timeout=30)
    assert no_key.value.code == 401
    assert vs.get_status(models, "not-" + srv.api_key, timeout=30)[0] == 401
    status, body = vs.get_status(models, srv.api_key, timeout=30)
    assert status == 200 and srv.cfg.served_name in vs.served_models(body)
    with opener.open(srv.root + "/health", timeout=30) as resp:  # why readiness is not /health: it is open
        assert resp.status == 200
    cmdline = Path(f"/proc/{srv.pid}/cmdline").read_bytes()
    assert b"vllm.entrypoints.openai.api_server" in cmdline and srv.api_key.encode() not in cmdline
    assert f"VLLM_API_KEY={srv.api_key}".encode() in Path(f"/proc/{srv.pid}/environ").read_bytes()
    assert srv.api_key not in srv.log_path.read_text(errors="replace")


def test_each_engine_venv_gets_its_own_vllm_cache_folder(monkeypatch, tmp_path):
    """vLLM names its model-info entries without its release: one cache folder shared by two releases made each
    start after the other release inspect every model class again. One folder per venv, under the caller's."""
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    root = {name: vllm.server_env(vs.ServerConfig(python=f"/opt/{name}/bin/python", target="/t"), "k")[
        "VLLM_CACHE_ROOT"] for name in ("vllm-0.31", "vllm-0.32")}
    assert root["vllm-0.31"] != root["vllm-0.32"]
    assert all(r.startswith(str(tmp_path / "cache") + "/dfo-venvs/") for r in root.values())
    again = vllm.server_env(vs.ServerConfig(python="/opt/vllm-0.31/bin/python", target="/t", threads=2), "other")
    assert again["VLLM_CACHE_ROOT"] == root["vllm-0.31"]  # the venv decides, not the server's settings
    # a venv reached through a link is the venv it points to; re-pointed at another release, that release's folder
    for name in ("vllm-0.31", "vllm-0.32"):
        (tmp_path / name / "bin").mkdir(parents=True)
    link = tmp_path / "current"
    via = {}
    for name in ("vllm-0.31", "vllm-0.32"):
        link.unlink(missing_ok=True)
        link.symlink_to(tmp_path / name, target_is_directory=True)
        via[name] = vllm.cache_root(str(link / "bin" / "python"), {"VLLM_CACHE_ROOT": "/c"})
        assert via[name] == vllm.cache_root(str(tmp_path / name / "bin" / "python"), {"VLLM_CACHE_ROOT": "/c"})
    assert via["vllm-0.31"] != via["vllm-0.32"]
    monkeypatch.delenv("VLLM_CACHE_ROOT")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert vllm.server_env(vs.ServerConfig(python="/opt/v/bin/python", target="/t"), "k")["VLLM_CACHE_ROOT"] \
        .startswith(str(tmp_path / "home" / ".cache" / "vllm" / "dfo-venvs"))
