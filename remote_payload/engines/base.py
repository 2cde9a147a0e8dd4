"""The engine seam: what dfo needs from a serving engine, and the shapes it gets back.

An engine (vLLM, SGLang) is one module with one object that follows ``Engine``: how to launch its
OpenAI-style server (argv, environment, private files such as a key file), where it answers readiness,
which distributions carry its version, how to ask for one greedy completion of a token-id prompt and how to
read the reply: the generated ids, the finish reason and the request's own speculative acceptance
(``Acceptance``). ``registry.py`` names the engines; ``server.py`` runs any of them (start, readiness with
the per-server key, the listening-socket check, stop by PID); nothing outside the engine's module knows its
flags or reply fields.

Stdlib only: the payload talks to the engine process over loopback HTTP, never imports it.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..errors import PayloadError

SERVED_NAME = "dfo-target"


class EngineError(PayloadError):
    """The engine could not be started, died, or answered something unusable."""


@dataclass(frozen=True)
class ServerConfig:
    """What one server serves and how. ``drafter`` None: plain decoding (no speculation)."""
    python: str  # the engine venv's python
    target: str  # target folder (HF format, tokenizer inside)
    engine: str = "vllm"  # a name in registry.ENGINES
    drafter: str | None = None  # z-lab DFlash drafter folder
    num_speculative_tokens: int | None = None  # None: the drafter's block_size - 1
    dtype: str = "float32"  # CPU: float32 or bfloat16 (hybrid Qwen3.5 targets need bfloat16)
    max_model_len: int = 2048
    kv_cache_gib: int = 1  # the CPU KV cache (engines that pre-allocate it on CPU)
    threads: int = 1
    eager: bool = True
    served_name: str = SERVED_NAME
    extra_args: tuple[str, ...] = ()  # --engine-arg, verbatim (e.g. --tensor-parallel-size 2): appended last
    extra_env: dict = field(default_factory=dict)
    # The engine's synthetic acceptance sampler (vLLM): drafts accepted at random with these marginal rates
    # (position i: the first i + 1 drafts all accepted), whatever the drafts are. None: the real verification.
    synthetic_acceptance_rates: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Launch:
    """How to start one server: argv (readable by every local user: no secret), environment, and files only
    the server's user may read (``path -> text``, written 0600 before the start, removed once it is ready)."""
    argv: list[str]
    env: dict[str, str]
    private_files: dict[Path, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Acceptance:
    """One request's speculative decoding as the engine counted it (the ``vllm`` convention: a round is one
    verify step, its accepted drafts exclude the bonus token)."""
    rounds: int
    drafted: int
    accepted: int
    histogram: tuple[int, ...]  # index j: rounds that accepted exactly j drafts
    per_step: tuple[int, ...] | None = None  # accepted drafts of each round, in order (when the engine says)

    def per_position(self, positions: int) -> list[int]:
        """c_k for k = 1..positions: rounds accepting >= k drafts."""
        h = list(self.histogram) + [0] * max(0, positions + 1 - len(self.histogram))
        return [sum(h[k:]) for k in range(1, positions + 1)]

    def as_dict(self, positions: int) -> dict:
        out: dict[str, Any] = {"rounds": self.rounds, "drafts_proposed": self.drafted,
                               "drafts_accepted": self.accepted, "histogram": list(self.histogram),
                               "per_position_counts": self.per_position(positions),
                               "tau": 1 + self.accepted / self.rounds if self.rounds else None}
        if self.per_step is not None:
            out["per_step"] = list(self.per_step)
        return out


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    acceptance: Acceptance | None  # None: the engine reported none (no drafter, or not asked for)


class Engine(Protocol):
    name: str  # the registry key, as the user types it ("vllm")
    title: str  # as the report writes it ("vLLM")
    distributions: tuple[str, ...]  # whose installed version is the engine's (first found)
    counters_prefix: str | None  # Prometheus prefix of its spec-decode counters on /metrics (None: not read)
    ready_path: str  # GET with the key: 200 and the served name once ready, 401 with a wrong key
    # The rule its DFlash speculation verifies by at T > 0 (metrics/sampled_rule.py): "greedy" (drafts are the
    # argmax, no draft probabilities), "sampled", or None when dfo does not know it. Where an engine offers a
    # choice, its launch reads ServerConfig.draft_rule; the engines here offer none.
    draft_rule: str | None
    synthetic_sampler: bool  # can replay a profile's marginal rates (ServerConfig.synthetic_acceptance_rates)

    def launch(self, cfg: ServerConfig, port: int, api_key: str, private_dir: Path) -> Launch: ...

    def completion_request(self, cfg: ServerConfig, prompt_ids: Sequence[int], max_tokens: int,
                           stop_ids: Sequence[int], sampled: dict | None = None) -> tuple[str, dict]: ...
    # sampled (T > 0): {"temperature", "top_p", "top_k" (-1: off), "seed"} in place of greedy

    def parse_completion(self, obj: Any, stop_ids: Sequence[int]) -> Completion: ...


# ------------------------------------------------------------------------------ shared by the engines


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


def speculative_tokens(cfg: ServerConfig) -> int:
    """Drafts per round: the configured number, else the drafter's block_size - 1."""
    assert cfg.drafter is not None
    return cfg.num_speculative_tokens or drafter_block_size(cfg.drafter) - 1


def base_env(cfg: ServerConfig) -> dict[str, str]:
    """The caller's environment without the payload's own Python paths, offline, loopback never proxied."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", "VIRTUAL_ENV"):  # the payload's own: must not leak into the engine venv
        env.pop(key, None)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
                "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": str(cfg.threads)})
    env.update({str(k): str(v) for k, v in cfg.extra_env.items()})
    return env


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def acceptance(rounds: Any, drafted: Any, accepted: Any, histogram: Any, per_step: Any = None,
               where: str = "the engine's acceptance") -> Acceptance:
    """An ``Acceptance`` from an engine's reply fields, checked to be one request's rounds: the histogram sums
    to the rounds and its accepted drafts to ``accepted``, the per-step list (when given) has one entry per
    round and the same histogram. Raises EngineError naming the field that does not add up."""
    for name, value in (("rounds", rounds), ("drafted", drafted), ("accepted", accepted)):
        if not _whole(value):
            raise EngineError(f"{where}: {name} {_short(value)} is not a whole number")
    if not (isinstance(histogram, list) and all(_whole(h) for h in histogram)):
        raise EngineError(f"{where}: the histogram {_short(histogram)} is not a list of whole numbers")
    if sum(histogram) != rounds:
        raise EngineError(f"{where}: the histogram {_short(histogram)} counts {sum(histogram)} rounds, not {rounds}")
    if sum(j * c for j, c in enumerate(histogram)) != accepted:
        raise EngineError(f"{where}: the histogram {_short(histogram)} accepts "
                          f"{sum(j * c for j, c in enumerate(histogram))} drafts, not {accepted}")
    if accepted > drafted:
        raise EngineError(f"{where}: {accepted} drafts accepted of {drafted} drafted")
    steps = None
    if per_step is not None:
        if not (isinstance(per_step, list) and all(_whole(a) for a in per_step)):
            raise EngineError(f"{where}: the per-step list {_short(per_step)} is not a list of whole numbers")
        counts = Counter(per_step)
        if len(per_step) != rounds or any(counts.get(j, 0) != c for j, c in enumerate(histogram)) \
                or any(a >= len(histogram) for a in per_step):
            raise EngineError(f"{where}: the per-step list ({len(per_step)} rounds) does not match the histogram "
                              f"{_short(histogram)}")
        steps = tuple(per_step)
    return Acceptance(rounds, drafted, accepted, tuple(histogram), steps)


def _short(value: Any, limit: int = 80) -> str:
    """repr of a value from the engine's reply for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
