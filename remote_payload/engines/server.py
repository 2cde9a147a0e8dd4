"""An engine's OpenAI-style server on this host's loopback: start, wait until it answers as the server dfo
started, check before each request, stop by PID, keep the log. Engine-specific argv, environment and reply
fields come from the engine's module (base.Engine, registry.py); this module is the same for all of them.

- The process runs in its own session (process group): engines fork workers (vLLM's engine core, SGLang's
  scheduler and detokenizer), and stopping the group by the PID we started stops them all, never anything
  else. The log starts with the exact command line (it holds no secret: keys never go in argv).

Authenticated (the port is in the engine's argv, which any local user can read, and is free for seconds
before the engine binds it, so anyone may bind it first and answer in its place):
- A random API key per server, handed over the way the engine's ``launch`` says (vLLM: ``$VLLM_API_KEY`` in
  its environment; SGLang: a 0600 config file in a private folder, removed once the server is ready; argv is
  readable by all), sent as ``Authorization: Bearer`` on every request dfo makes. The engine then refuses
  ``/v1/*`` without it (HTTP 401); ``/health`` and ``/metrics`` it does not guard, so readiness is the
  engine's ``ready_path`` (``GET /v1/models``) with the key, not ``/health``.
- Before any request, the socket listening on the port must belong to the process dfo started or one of its
  children (``listener.check_port``, Linux); another listener is refused at once, nothing sent to it.
- Readiness first asks with a wrong key: a server that does not answer 401 is not the one given the key
  (an impostor, or an engine that ignores the key), and is refused before the real key is sent.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from remote_payload.scratch import private_dir

from .base import EngineError, ServerConfig
from .listener import check_port
from .registry import get as engine_named

LOG_TAIL_LINES = 40
PROBE_TIMEOUT_S = 5.0

__all__ = ["EngineError", "EngineServer", "ServerConfig", "free_port", "get_status", "log_tail", "served_models"]


def free_port() -> int:
    """A loopback port free right now (the engine binds it seconds later; whoever holds it then is checked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KEY_PLACEHOLDER = b"<dfo-api-key>"


def _copy_filtered(source: IO[bytes], log: IO[bytes], secret: str) -> None:
    """The engine's output, line by line, into LOG with SECRET replaced: no engine output reaches a log
    unfiltered. Ends (and closes LOG) when the engine and its children closed their output."""
    key = secret.encode()
    with log, source:
        for line in iter(source.readline, b""):
            log.write(line.replace(key, KEY_PLACEHOLDER))
            log.flush()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = text.splitlines()[-lines:]
    return "\n".join(kept) if kept else "(empty log)"


def get_status(url: str, api_key: str, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, bytes] | None:
    """HTTP status and body of ``GET url`` with the key as Bearer; None: no answer (not serving yet)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except (urllib.error.URLError, OSError):
        return None


def served_models(body: bytes) -> list[str]:
    """The ids of a ``/v1/models`` answer ([] when it is not one)."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return []
    return [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)] \
        if isinstance(data, list) else []


class EngineServer:
    """One server process of ``cfg.engine``; use as a context manager or call start()/stop()."""

    def __init__(self, cfg: ServerConfig, log_path: str | os.PathLike, port: int | None = None):
        self.cfg = cfg
        self.engine = engine_named(cfg.engine)
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self.command: list[str] = []  # the exact argv, as logged (no secret in it)
        self.api_key = secrets.token_urlsafe(32)  # this server's only: never in argv, logs or results
        self._private: Path | None = None
        self._log_copier: threading.Thread | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (what the --reference client takes)."""
        return self.root + "/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 600.0) -> "EngineServer":
        if not Path(self.cfg.python).exists():
            raise EngineError(f"engine python {self.cfg.python} not found (is the {self.engine.title} venv built? "
                              f"`dfo provision --host HOST --engine {self.engine.name}`)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._private = private_dir("dfo-engine-")  # 0700, outside the folder that is pulled
        launch = self.engine.launch(self.cfg, self.port, self.api_key, self._private)
        for path, text in launch.private_files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
        self.command = list(launch.argv)
        started = time.monotonic()
        # 0600 from creation: the log is pulled into the run folder, and other users of the host share /tmp-like
        # results folders. The engine's output goes through _copy_filtered: SGLang logs its merged server
        # arguments at start-up, api_key included.
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.fchmod(log_fd, 0o600)
        log = os.fdopen(log_fd, "ab")
        log.write(("$ " + " ".join(launch.argv) + "\n").encode())
        log.flush()
        self.proc = subprocess.Popen(launch.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=launch.env, start_new_session=True)
        self._log_copier = threading.Thread(target=_copy_filtered, args=(self.proc.stdout, log, self.api_key),
                                            name="engine-log", daemon=True)
        self._log_copier.start()
        try:
            self._wait_ready(started + timeout_s, timeout_s)
        except BaseException:
            self.stop()
            raise
        self._remove_private()  # read at start-up: the key lives on in the server's memory only
        self.start_seconds = time.monotonic() - started
        return self

    def _remove_private(self) -> None:
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None

    def _log_tail(self) -> str:
        if self._log_copier is not None and self.proc is not None and self.proc.poll() is not None:
            self._log_copier.join(timeout=5)  # an engine that exited: its last lines in the log first
        return log_tail(self.log_path)

    def _what(self) -> str:
        return f"{self.engine.title} server for {self.cfg.target}" + (
            f" with drafter {self.cfg.drafter}" if self.cfg.drafter else "")

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise EngineError(f"{self._what()} exited with status {code} before it was healthy; log "
                                  f"{self.log_path}, last lines:\n{self._log_tail()}")
            if self._port_is_ours() and self._answers_as_ours():
                return
            if time.monotonic() > deadline:
                raise EngineError(f"{self._what()} not healthy on 127.0.0.1:{self.port} within {timeout_s:g} s; "
                                  f"log {self.log_path}, last lines:\n{self._log_tail()}")
            time.sleep(0.5)

    def check_serving(self) -> None:
        """Before a request: the process dfo started is alive and no other process listens on its port."""
        code = self.proc.poll() if self.proc else None
        if self.proc is None or code is not None:
            raise EngineError(f"{self._what()} is not running (exit status {code}); log {self.log_path}, last "
                              f"lines:\n{self._log_tail()}")
        self._port_is_ours()

    def _port_is_ours(self) -> bool:
        """Raises when another process listens on the port; False while nothing does yet. Where /proc cannot
        tell: True (the API key checks are then all there is)."""
        assert self.proc is not None
        port = check_port(self.port, self.proc.pid)
        if port is None:
            return True
        if port.foreign:
            uids = ", ".join(sorted({str(lst.uid) for lst in port.foreign}))
            raise EngineError(f"127.0.0.1:{self.port} is held by another process (socket owner uid {uids}), not by "
                              f"the {self._what()} that dfo started (PID {self.proc.pid}); nothing was sent to it. "
                              "Another local user may be impersonating the engine: find the holder with `ss -ltnp "
                              f"'sport = :{self.port}'` (as root), then re-run (each run picks a new port)")
        return port.listening

    def _answers_as_ours(self) -> bool:
        """``GET /v1/models``: 401 with a wrong key, then the served model with this server's key."""
        models = self.root + self.engine.ready_path
        wrong = get_status(models, secrets.token_urlsafe(32))
        if wrong is None or wrong[0] >= 500:
            return False  # not serving yet
        if wrong[0] != 401:
            raise EngineError(f"127.0.0.1:{self.port} answered GET /v1/models with a wrong API key (HTTP {wrong[0]}, "
                              f"not 401): it is not the {self._what()} that dfo started with a key (an impostor, or "
                              f"an engine that ignores the key it was given); nothing else was sent to it")
        right = get_status(models, self.api_key)
        if right is None or right[0] >= 500:
            return False
        if right[0] != 200:
            raise EngineError(f"127.0.0.1:{self.port} refused the API key dfo gave the {self._what()} (HTTP "
                              f"{right[0]} from GET /v1/models); log {self.log_path}")
        if self.cfg.served_name not in served_models(right[1]):
            raise EngineError(f"127.0.0.1:{self.port} does not serve {self.cfg.served_name!r} (GET /v1/models: "
                              f"{', '.join(served_models(right[1])) or 'no models'}); log {self.log_path}")
        return True

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)  # the group we created (start_new_session): server + engine core
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL at once, as a crash would (tests of the client's resume path)."""
        if self.proc is not None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the group, SIGKILL after ``grace_s``; returns the server's exit status."""
        if self.proc is None:
            self._remove_private()
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # an engine core left behind by a parent that exited first
        self._remove_private()
        if self._log_copier is not None:
            self._log_copier.join(timeout=10)  # the rest of the output, filtered, in the log
        return self.proc.returncode

    def __enter__(self) -> "EngineServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
