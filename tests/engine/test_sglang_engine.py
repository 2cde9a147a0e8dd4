"""SGLang behind the engine seam, without SGLang: its DFlash never runs on this project's CPU machines.

What is checked: the argv dfo gives ``sglang.launch_server`` (DFlash flags from the drafter folder, the
key in a 0600 ``--config`` file, never in argv; ``--engine-arg`` last), the greedy ``/generate`` request, and
the reading of replies in SGLang's documented shape. The replies in tests/engine/sglang_replies/ were
written by hand from that shape (the ``meta_info`` fields of SGLang's tokenizer manager, current names and the older
ones), not captured from a running SGLang. A stand-in server process (real HTTP, real key checks) serves
them through ``EngineServer`` and ``run_prompts`` as SGLang would.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from remote_payload.engines import registry, sglang
from remote_payload.engines.base import EngineError, ServerConfig
from remote_payload.engines.run import EnginePrompt, run_prompts
from remote_payload.engines.server import EngineServer

REPLIES = Path(__file__).with_name("sglang_replies")
END = 151645


def _reply(name: str) -> dict:
    return json.loads((REPLIES / f"{name}.json").read_text())


def _drafter(tmp_path: Path, block: int = 16) -> Path:
    folder = tmp_path / "drafter"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"dflash_config": {"block_size": block}}))
    return folder


def test_sglang_is_registered_and_its_launch_holds_dflash_and_no_key(tmp_path):
    engine = registry.get("sglang")
    assert engine is sglang.SGLANG and engine.title == "SGLang" and "sglang" in registry.NAMES
    cfg = ServerConfig(python="py", target="/t", engine="sglang", drafter=str(_drafter(tmp_path)),
                       max_model_len=900, extra_args=("--tp-size", "2"))
    launch = engine.launch(cfg, 4321, "the-key", tmp_path)
    argv = launch.argv
    assert argv[:3] == ["py", "-m", "sglang.launch_server"]
    assert {a for a in argv[3:-2] if a.startswith("--")} <= set(sglang.OWNED_FLAGS)  # refused as --engine-arg
    for flag, value in (("--model-path", "/t"), ("--host", "127.0.0.1"), ("--port", "4321"),
                        ("--context-length", "900"), ("--speculative-algorithm", "DFLASH"),
                        ("--speculative-draft-model-path", str(tmp_path / "drafter")),
                        ("--speculative-num-draft-tokens", "16"), ("--config", str(tmp_path / sglang.CONFIG_FILE))):
        assert argv[argv.index(flag) + 1] == value, flag
    assert "--disable-radix-cache" in argv and argv[-2:] == ["--tp-size", "2"]
    assert not any("the-key" in a for a in argv) and not any("the-key" in v for v in launch.env.values())
    assert launch.private_files == {tmp_path / sglang.CONFIG_FILE: 'api-key: "the-key"\n'}
    plain = engine.launch(ServerConfig(python="py", target="/t", engine="sglang"), 1, "k", tmp_path).argv
    assert "--speculative-algorithm" not in plain and "--speculative-num-draft-tokens" not in plain


def test_the_request_is_greedy_on_token_ids():
    path, body = sglang.SGLANG.completion_request(ServerConfig(python="py", target="/t", engine="sglang"),
                                                  [1, 2, 3], 64, [END, 0])
    assert path == "/generate" and body["input_ids"] == [1, 2, 3] and body["stream"] is False
    params = body["sampling_params"]
    assert params["temperature"] == 0.0 and params["max_new_tokens"] == 64 and params["stop_token_ids"] == [END, 0]
    assert params["no_stop_trim"] is True and params["skip_special_tokens"] is False


def test_recorded_replies_give_each_requests_acceptance():
    current = sglang.SGLANG.parse_completion(_reply("dflash-current"), [END])
    assert current.finish_reason == "stop" and current.token_ids[-1] == END and len(current.token_ids) == 7
    acc = current.acceptance
    assert (acc.rounds, acc.drafted, acc.accepted) == (3, 45, 3) and acc.per_step is None
    assert acc.per_position(15)[:3] == [2, 1, 0] and acc.as_dict(15)["tau"] == 2.0
    older = sglang.SGLANG.parse_completion(_reply("dflash-older"), [END])
    assert len(older.token_ids) == 12 and older.token_ids[-1] == END  # the matched end token, as references end
    assert (older.acceptance.rounds, older.acceptance.accepted, older.acceptance.drafted) == (4, 7, 28)
    assert older.acceptance.per_position(7) == [3, 3, 1, 0, 0, 0, 0]
    plain = sglang.SGLANG.parse_completion([_reply("plain")], [END])  # a batch of one
    assert plain.acceptance is None and plain.finish_reason == "length" and plain.token_ids == [59604, 374, 279, 6722]


@pytest.mark.parametrize("edit, phrase", [
    (lambda r: r["meta_info"].update(spec_verify_ct=4), "counts 3 rounds, not 4"),
    (lambda r: r["meta_info"].update(spec_accepted_drafts=2), "spec_num_correct_drafts 3 and its alias"),
    (lambda r: r["meta_info"].update(spec_num_correct_drafts=5, spec_accepted_drafts=5), "accepts 3 drafts, not 5"),
    (lambda r: r["meta_info"].update(spec_correct_drafts_histogram="many", spec_accept_histogram="many"),
     "is not a list of whole numbers"),
    (lambda r: r.pop("output_ids"), "output_ids missing"),
    (lambda r: r["meta_info"].update(finish_reason={"type": "abort", "message": "x"}), "finish_reason"),
    (lambda r: r.pop("meta_info"), "no meta_info"),
])
def test_replies_that_do_not_add_up_are_refused_by_name(edit, phrase):
    reply = _reply("dflash-current")
    edit(reply)
    with pytest.raises(EngineError, match="SGLang") as err:
        sglang.SGLANG.parse_completion(reply, [END])
    assert phrase in str(err.value)


STAND_IN = """#!{python}
import http.server, json, os, stat, sys
args = sys.argv[1:]
if args[:2] != ["-m", "sglang.launch_server"]:
    sys.exit(0)  # engine_version's `python -c ...`: no version
port = int(args[args.index("--port") + 1])
name = args[args.index("--served-model-name") + 1]
config = args[args.index("--config") + 1]
mode = stat.S_IMODE(os.stat(config).st_mode)
key = json.loads(open(config).read().split(":", 1)[1])
print("config mode", oct(mode), "speculative", "--speculative-algorithm" in args, flush=True)
reply = json.loads(open(os.environ["SGLANG_REPLY"]).read())
class H(http.server.BaseHTTPRequestHandler):
    def _authorized(self):
        if self.headers.get("Authorization") != "Bearer " + key:
            self.send_response(401); self.end_headers(); return False
        return True
    def do_GET(self):
        if self.path == "/v1/models" and self._authorized():
            body = json.dumps({{"data": [{{"id": name}}]}}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        if self.path == "/generate" and self._authorized():
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert req["sampling_params"]["temperature"] == 0.0, req
            body = json.dumps(reply).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_stand_in_sglang_serves_through_the_seam(tmp_path, monkeypatch):
    """Start, readiness (401 with a wrong key, the served name with the key from the 0600 config file), the
    request and the recorded reply's acceptance through run_prompts; the key file is gone once it is ready."""
    script = tmp_path / "engine-python"
    script.write_text(STAND_IN.format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("SGLANG_REPLY", str(REPLIES / "dflash-current.json"))
    cfg = ServerConfig(python=str(script), target=str(tmp_path), engine="sglang", drafter=str(_drafter(tmp_path)))
    reply = _reply("dflash-current")
    with EngineServer(cfg, tmp_path / "logs" / "sglang-ours.log") as srv:
        config = Path(srv.command[srv.command.index("--config") + 1])
        assert not config.exists() and not config.parent.exists()  # read at start-up, then removed
        run = run_prompts(srv, [EnginePrompt("a", [1, 2, 3], reply["output_ids"])], 16, [END], concurrency=2)
        cmdline = Path(f"/proc/{srv.pid}/cmdline").read_bytes()
        assert srv.api_key.encode() not in cmdline
    log = (tmp_path / "logs" / "sglang-ours.log").read_text()
    assert "config mode 0o600 speculative True" in log and srv.api_key not in log
    assert log.startswith("$ " + " ".join(srv.command))  # the exact command line first
    (rec,) = run["samples"]
    assert rec["matches_reference"] and rec["spec"]["rounds"] == 3 and rec["spec"]["per_position_counts"][:2] == [2, 1]
    assert run["spec"]["tau_micro"] == 2.0
