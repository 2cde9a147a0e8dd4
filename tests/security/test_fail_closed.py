"""Issue 30, "fail closed at the edges": one test per finding, each failing before its fix."""

from __future__ import annotations

import http.server
import threading

import pytest

from remote_payload.inputs import openai_client


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/v1"):
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/stolen")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def test_reference_client_follows_no_redirect_with_the_key():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/models"
        with pytest.raises(openai_client.RequestFailed, match="not followed") as info:
            openai_client.http_json("GET", url, None, 5.0, "k-secret-30")
    finally:
        server.shutdown()
    assert not info.value.retryable
    assert [path for path, _ in _Recorder.seen] == ["/v1/models"]  # /stolen never asked, the key never sent there
    assert "k-secret-30" not in str(info.value)


NESTED = "[" * 200_000 + "]" * 200_000


def test_deeply_nested_json_from_a_host_is_a_clear_error(tmp_path):
    from orchestrator.core.errors import InputError, OperationError
    from orchestrator.evaluation.merge import merge_host_results
    from orchestrator.evaluation.runs import Run
    from orchestrator.ui.progress_view import parse_line
    from orchestrator.watch.series import load_series

    assert parse_line('{"dfo": "progress", "x": ' + NESTED + "}") is None  # job-log progress line
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(NESTED)
    (run / "samples.jsonl").write_text(NESTED + "\n")
    with pytest.raises(InputError, match="nested too deeply"):
        Run(run, {"run": "run"}).results()
    with pytest.raises(InputError, match="nested too deeply"):
        Run(run, {"run": "run"}).samples()
    with pytest.raises(OperationError, match="nested too deeply"):
        merge_host_results({"ct129": run}, {"ct129": {}})
    (tmp_path / "series.json").write_text(NESTED)
    with pytest.raises(InputError, match="nested too deeply"):
        load_series(tmp_path)


def test_a_checkpoint_step_beyond_int64_is_no_step():
    from orchestrator.watch.discovery import parse_listing

    now = 1_000_000.0
    entries = [{"name": "step_9223372036854775808.pt", "is_dir": False, "size": 1, "mtime": now - 3600},
               {"name": "step_" + "9" * 5000 + ".pt", "is_dir": False, "size": 1, "mtime": now - 3600},
               {"name": "huge", "is_dir": True, "size": 1, "mtime": now - 3600, "has_weights": True,
                "meta": {"file": "trainer_state.json", "step": 2**64}},
               {"name": "step_9223372036854775807.pt", "is_dir": False, "size": 1, "mtime": now - 3600}]
    found = parse_listing({"now": now, "entries": entries}, host="kpro6", folder="/data/run7")
    assert [c.step for c in found.checkpoints] == [2**63 - 1]
    assert sorted(name for name, _ in found.ignored) == sorted(e["name"] for e in entries[:3])


def test_tensorboard_write_follows_no_planted_link_and_names_a_planted_folder(tmp_path):
    from orchestrator.core.errors import OperationError
    from orchestrator.watch.tensorboard import write_local

    logdir, victim = tmp_path / "shared-logdir", tmp_path / "victim.txt"
    logdir.mkdir()
    victim.write_text("the planter's target\n")
    name = "events.out.tfevents.1.dfo-s7"
    (logdir / f".{name}.tmp").symlink_to(victim)  # the name the writer used to pick
    written = write_local(logdir, name, b"EVENTS")
    assert written.read_bytes() == b"EVENTS" and not written.is_symlink()
    assert victim.read_text() == "the planter's target\n"
    (logdir / "planted").mkdir()
    with pytest.raises(OperationError, match="cannot write the TensorBoard event file") as info:
        write_local(logdir, "planted", b"EVENTS")
    assert "planted" in str(info.value)
    assert sorted(p.name for p in logdir.iterdir()) == sorted([f".{name}.tmp", name, "planted"])  # no tmp left


def test_an_engine_logging_its_api_key_leaves_only_a_placeholder_in_a_private_log(tmp_path):
    import stat

    from remote_payload.engines import server as vs

    fake = tmp_path / "fake-python"  # logs its merged arguments as SGLang does, api_key included
    fake.write_text("#!/bin/sh\necho \"server_args=ServerArgs(port=1, api_key='$VLLM_API_KEY')\"\n"
                    "echo \"key again: $VLLM_API_KEY\" >&2\nexit 3\n")
    fake.chmod(0o755)
    log = tmp_path / "results" / "engine.log"
    srv = vs.EngineServer(vs.ServerConfig(python=str(fake), target=str(tmp_path)), log)
    with pytest.raises(vs.EngineError) as info:
        srv.start(timeout_s=30)
    srv.stop()
    text = log.read_text()
    assert srv.api_key not in text and srv.api_key not in str(info.value)
    assert "api_key='<dfo-api-key>'" in text and "key again: <dfo-api-key>" in text
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


@pytest.mark.parametrize("text", ["# owned", "## dataset", "- item", "= underline"])
def test_host_text_starting_a_line_renders_as_text_not_a_heading_or_list(text):
    from orchestrator.core.host_text import md_text

    assert md_text(text) == "\\" + text
