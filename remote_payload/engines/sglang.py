"""SGLang behind the engine seam, for GPU hosts: DFlash speculative decoding (``--speculative-algorithm
DFLASH``) and the per-request acceptance SGLang puts in each reply's ``meta_info``.

Not run on this project's machines: SGLang's DFlash worker needs CUDA (there is no CPU build of it). What
is tested here is what dfo sends and how it reads replies in SGLang's documented shape
(tests/engine/test_sglang_engine.py, recorded replies written from that shape).

- Start: ``python -m sglang.launch_server --model-path TARGET --served-model-name NAME --host 127.0.0.1
  --port P --dtype D --context-length N --random-seed 0 --disable-radix-cache`` (no prefix cache: a hit would
  make per-request timings depend on the order of the prompts), plus with a drafter
  ``--speculative-algorithm DFLASH --speculative-draft-model-path FOLDER --speculative-num-draft-tokens
  BLOCK`` (SGLang counts the verified token with the drafts: block_size = drafts + 1). ``--engine-arg``
  values (``--tp-size 2``, ``--attention-backend …``, ``--mem-fraction-static …``) are appended unchanged.
- The API key: SGLang takes it as ``--api-key`` (argv: readable by every local user) or in a ``--config``
  YAML file, which it merges with the command line. dfo writes ``api-key:`` into a 0600 file in a private
  folder that the server start removes once the server answers.
- The request: the native ``POST /generate`` with ``input_ids`` and greedy ``sampling_params`` (temperature
  0, ``max_new_tokens``, the target's end tokens as ``stop_token_ids``): its reply carries ``output_ids``
  and ``meta_info`` (``finish_reason`` {type, matched}, ``completion_tokens``, the spec fields), which the
  OpenAI routes do not.
- Acceptance from ``meta_info``: ``spec_verify_ct`` (verify steps = rounds), the histogram
  ``spec_correct_drafts_histogram`` (older releases: ``spec_accept_histogram``; index j = steps that
  accepted exactly j drafts), accepted drafts ``spec_num_correct_drafts`` (``spec_accepted_drafts``,
  ``spec_accept_token_num``) and proposed ones ``spec_num_proposed_drafts`` (``spec_proposed_drafts``,
  ``spec_draft_token_num``). Where a release sends a name and its alias both, they must agree.
  ``spec_accept_length`` (completion tokens / verify steps, the prefill token included) is not the
  ``vllm`` convention's τ and is not used. SGLang has no per-step list: the per-step comparison with the
  offline rounds is vLLM's only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .base import Completion, EngineError, Launch, ServerConfig, acceptance, base_env, speculative_tokens

ENTRYPOINT = "sglang.launch_server"
CONFIG_FILE = "sglang-server.yaml"
# (the name current releases use, older aliases): the first present is read, every present one must agree
ROUNDS = ("spec_verify_ct",)
HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")
ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")


# The server options dfo sets itself (server_argv, and the API key in its --config file): refused as --engine-arg.
OWNED_FLAGS = ("--model-path", "--model", "--served-model-name", "--host", "--port", "--dtype", "--context-length",
               "--random-seed", "--disable-radix-cache", "--config", "--speculative-algorithm",
               "--speculative-draft-model-path", "--speculative-num-draft-tokens", "--api-key")


def server_argv(cfg: ServerConfig, port: int, config_file: Path) -> list[str]:
    argv = [cfg.python, "-m", ENTRYPOINT, "--model-path", str(cfg.target), "--served-model-name", cfg.served_name,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", cfg.dtype,
            "--context-length", str(cfg.max_model_len), "--random-seed", "0", "--disable-radix-cache",
            "--config", str(config_file)]
    if cfg.synthetic_acceptance_rates is not None:
        raise EngineError("SGLang has no synthetic acceptance sampler (--engine-check synthetic is vLLM's)")
    if cfg.drafter is not None:
        argv += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(cfg.drafter),
                 "--speculative-num-draft-tokens", str(speculative_tokens(cfg) + 1)]
    return argv + list(cfg.extra_args)


def config_text(api_key: str) -> str:
    """The --config YAML: only the key (a JSON string is a YAML string)."""
    return f"api-key: {json.dumps(api_key)}\n"


def _field(meta: dict, names: Sequence[str]) -> Any:
    """The first of ``names`` in ``meta``; raises EngineError when two present ones disagree."""
    present = [(n, meta[n]) for n in names if n in meta]
    for name, value in present[1:]:
        if value != present[0][1]:
            raise EngineError(f"SGLang meta_info: {present[0][0]} {present[0][1]!r} and its alias {name} "
                              f"{value!r} differ")
    return present[0][1] if present else None


def meta_acceptance(meta: dict):
    """The request's Acceptance from ``meta_info``; None when it carries no spec fields (no drafter)."""
    rounds = _field(meta, ROUNDS)
    if rounds is None:
        return None
    histogram = _field(meta, HISTOGRAM)
    if histogram is None and rounds == 0:
        histogram = []  # SGLang leaves an empty histogram out (a reply that ended in the prefill)
    accepted = _field(meta, ACCEPTED)
    if accepted is None and isinstance(histogram, list):
        accepted = sum(j * c for j, c in enumerate(histogram) if isinstance(c, int))
    return acceptance(rounds, _field(meta, PROPOSED), accepted, histogram, where="SGLang meta_info")


class Sglang:
    name = "sglang"
    title = "SGLang"
    draft_rule: str | None = None  # not established for its DFlash path: recorded as unknown, never assumed
    synthetic_sampler = False
    distributions: tuple[str, ...] = ("sglang",)
    counters_prefix: str | None = None  # its /metrics names differ by release; the per-request fields are what is read
    ready_path = "/v1/models"

    def launch(self, cfg: ServerConfig, port: int, api_key: str, private_dir: Path) -> Launch:
        config = Path(private_dir) / CONFIG_FILE
        env = base_env(cfg)
        env.update({"SGLANG_DISABLE_REQUEST_LOGGING": "1"})
        env.update({str(k): str(v) for k, v in cfg.extra_env.items()})
        return Launch(server_argv(cfg, port, config), env, {config: config_text(api_key)})

    def completion_request(self, cfg: ServerConfig, prompt_ids: Sequence[int], max_tokens: int,
                           stop_ids: Sequence[int], sampled: dict | None = None) -> tuple[str, dict]:
        params = {"temperature": 0.0, "top_p": 1.0, "max_new_tokens": int(max_tokens),
                  "stop_token_ids": [int(i) for i in stop_ids], "ignore_eos": False, "skip_special_tokens": False,
                  "spaces_between_special_tokens": False, "no_stop_trim": True}
        if sampled:  # T > 0: temperature, top_p, top_k and the request's seed (SGLang's sampling_seed)
            seed = sampled.get("seed")
            params.update({k: v for k, v in sampled.items() if k != "seed"})
            if seed is not None:
                params["sampling_seed"] = int(seed)
        return "/generate", {"input_ids": [int(i) for i in prompt_ids], "sampling_params": params, "stream": False}

    def parse_completion(self, obj: Any, stop_ids: Sequence[int]) -> Completion:
        if isinstance(obj, list) and len(obj) == 1:
            obj = obj[0]  # a batch of one
        if not isinstance(obj, dict):
            raise EngineError(f"SGLang reply: expected a JSON object, got {type(obj).__name__}")
        if "error" in obj and "meta_info" not in obj:
            raise EngineError(f"SGLang answered with an error: {str(obj['error'])[:300]}")
        ids, meta = obj.get("output_ids"), obj.get("meta_info")
        if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                              for i in ids)):
            raise EngineError(f"SGLang reply: output_ids missing or not token ids (keys: {', '.join(sorted(obj))})")
        if not isinstance(meta, dict):
            raise EngineError("SGLang reply: no meta_info object")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        if kind not in ("stop", "length"):
            raise EngineError(f"SGLang reply: finish_reason {finish!r}, expected type \"stop\" or \"length\"")
        matched = finish.get("matched") if isinstance(finish, dict) else None
        ids = list(ids)
        # Releases differ in whether output_ids end with the matched end token; the references end with it.
        if kind == "stop" and isinstance(matched, int) and matched in stop_ids and ids[-1:] != [matched]:
            ids.append(matched)
        return Completion(ids, kind, meta_acceptance(meta))


SGLANG = Sglang()
