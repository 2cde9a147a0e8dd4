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
