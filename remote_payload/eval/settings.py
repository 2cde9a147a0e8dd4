"""Settings of one `eval` run: the dataclass the CLI fills, its defaults, and the checks on it.

Nothing here imports torch: the CLI parses and checks settings before any heavy import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.errors import PayloadError

DEFAULT_MAX_NEW_TOKENS = 512
DEFAULT_TOPK = 8
DEFAULT_TREE_K = 8  # headline "DDTree-8" = top-8 depth acceptance
DEFAULT_TREE_BUDGET = 16
DEFAULT_DIAGNOSE_SAMPLES = 2
DEFAULT_DIAGNOSE_ROUNDS = 4
ENGINES = ("vllm",)
REFERENCE_API_KEY_ENV = "DFO_REFERENCE_API_KEY"
# Test-only planted faults (never set in production): the eval misbehaves on purpose so tests can check
# that --diagnose flags it. The results record it in settings.test_fault and in a warning.
TEST_FAULT_ENV = "DFO_PAYLOAD_TEST_FAULT"
TEST_FAULTS = {"slot0-mask": "blocks built with the mask token in slot 0 instead of the committed token (pitfall 2)"}


@dataclass
class EvalSettings:
    target: str
    drafters: list  # [(name, path)]
    drafter_specs: dict = field(default_factory=dict)  # name -> spec file
    prompts: str = "builtin"
    samples: int | None = None
    shard: tuple = (0, 1)
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    enable_thinking: bool = False
    device: str = "auto"
    dtype: str = "bfloat16"
    allow_fp16: bool = False
    cache_dir: str | None = None
    out: str = "dfo-eval"
    online_check: bool = False
    seed: int = 0
    topk: int = DEFAULT_TOPK
    kernel: str = "auto"
    tree_k: int = DEFAULT_TREE_K
    tree_budget: int = DEFAULT_TREE_BUDGET
    reference_url: str | None = None  # OpenAI-compatible endpoint; None: the target's own greedy decoding
    reference_model: str | None = None
    reference_timeout: float = 900.0
    reference_concurrency: int = 4
    reference_retries: int = 2  # extra attempts after a connection failure or HTTP 5xx
    reference_prompt_format: str = "ids"
    reference_strict_roundtrip: bool = False
    diagnose: bool = False
    diagnose_samples: int = DEFAULT_DIAGNOSE_SAMPLES
    diagnose_rounds: int = DEFAULT_DIAGNOSE_ROUNDS
    expect_p1: dict = field(default_factory=dict)  # drafter name (or "*" for all) -> expected position-1 acceptance
    threads: int | None = None  # CPU threads (torch here; the engine's OpenMP threads too)
    engine: str | None = None  # "vllm": every drafter also served by a real engine after the offline eval
    reference_engine: str | None = None  # "vllm": references from an engine server this run starts itself
    engine_python: str | None = None  # the engine venv's interpreter (vLLM has its own venv)
    engine_args: list = field(default_factory=list)  # extra engine server arguments, verbatim
    engine_start_timeout: float = 900.0

    @property
    def tree_K(self) -> int:  # the K of the DDTree paper
        # K >= budget makes the budgeted tree exact DDTree (ranks >= budget never enter a tree of budget nodes).
        return self.tree_budget

    @property
    def draft_topk(self) -> int:
        """Per-depth candidates the draft pass keeps: enough for the chain, top-k acceptance and the tree."""
        return max(self.topk, self.tree_k, self.tree_K)

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


def default_cache_dir() -> Path:
    return Path(os.environ.get("DFO_PAYLOAD_CACHE", Path.home() / ".cache" / "dfo-payload"))


def parse_named(values: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values or []:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise PayloadError(f"{flag} expects NAME=PATH, got {v!r}")
        if not all(c.isalnum() or c in "-_." for c in name):
            raise PayloadError(f"{flag} {v!r}: NAME may hold letters, digits, '-', '_' and '.' only")
        out.append((name, path))
    names = [n for n, _ in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PayloadError(f"{flag}: name(s) given twice: {', '.join(dupes)}")
    return out


def parse_expect_p1(values: list[str] | None) -> dict:
    """``--expect-p1 X`` (every drafter) or ``--expect-p1 NAME=X`` (repeatable) -> {name or "*": X}."""
    out: dict = {}
    for v in values or []:
        name, sep, num = v.rpartition("=")
        key = name if sep else "*"
        if sep and not name:
            raise PayloadError(f"--expect-p1 {v!r}: expected X or NAME=X")
        try:
            x = float(num)
        except ValueError:
            raise PayloadError(f"--expect-p1 {v!r}: {num!r} is not a number (expected X or NAME=X, X in (0, 1])") \
                from None
        if not 0 < x <= 1:
            raise PayloadError(f"--expect-p1 {v!r}: the expected position-1 acceptance must be in (0, 1]")
        if key in out:
            raise PayloadError(f"--expect-p1: {'every drafter' if key == '*' else repr(key)} given twice")
        out[key] = x
    return out


def check_settings(s: EvalSettings) -> None:
    if s.max_new_tokens < 1:
        raise PayloadError("--max-new-tokens must be >= 1")
    if s.samples is not None and s.samples < 1:
        raise PayloadError("--samples must be >= 1")
    if s.topk < 1:
        raise PayloadError("--topk must be >= 1")
    if s.tree_k < 1:
        raise PayloadError("--tree-k must be >= 1")
    if s.tree_budget < 1:
        raise PayloadError("--tree-budget must be >= 1")
    if s.diagnose_samples < 1 or s.diagnose_rounds < 1:
        raise PayloadError("--diagnose-samples and --diagnose-rounds must be >= 1")
    if not s.drafters:
        raise PayloadError("give at least one --drafter NAME=PATH")
    names = {n for n, _ in s.drafters}
    unknown_specs = sorted(set(s.drafter_specs) - names)
    if unknown_specs:
        raise PayloadError(f"--drafter-spec for unknown drafter name(s): {', '.join(unknown_specs)}")
    unknown_p1 = sorted(set(s.expect_p1) - names - {"*"})
    if unknown_p1:
        raise PayloadError(f"--expect-p1 for unknown drafter name(s): {', '.join(unknown_p1)}")
    check_engine_settings(s)
    if s.reference_url is not None or s.reference_engine:
        if s.reference_concurrency < 1:
            raise PayloadError("--reference-concurrency must be >= 1")
        if s.reference_retries < 0:
            raise PayloadError("--reference-retries must be >= 0")
        if s.reference_timeout <= 0:
            raise PayloadError("--reference-timeout must be > 0 seconds")
        if s.reference_prompt_format not in ("ids", "text"):
            raise PayloadError(f"--reference-prompt-format must be ids or text, not {s.reference_prompt_format!r}")


def check_engine_settings(s: EvalSettings) -> None:
    """``--engine`` / ``--reference vllm``: a known engine, its interpreter, and no second reference source."""
    for flag, value in (("--engine", s.engine), ("--reference", s.reference_engine)):
        if value is not None and value not in ENGINES:
            raise PayloadError(f"{flag} {value!r}: unknown engine (known: {', '.join(ENGINES)})")
    if (s.engine or s.reference_engine) and not s.engine_python:
        what = "--engine vllm" if s.engine else "--reference vllm"
        raise PayloadError(f"{what} needs --engine-python PATH (the python of the vLLM engine venv, made by "
                           "`dfo provision --engine vllm`)")
    if s.engine_python and not Path(s.engine_python).is_file():
        raise PayloadError(f"--engine-python {s.engine_python}: no such file (is the engine venv provisioned? "
                           "`dfo provision --host HOST --engine vllm`)")
    if s.reference_engine and s.reference_url:
        raise PayloadError("--reference takes one source: an engine name (vllm) or a URL, not both")
    if s.engine_start_timeout <= 0:
        raise PayloadError("--engine-start-timeout must be > 0 seconds")


def planted_fault() -> str | None:
    """The test-only fault named by ``$DFO_PAYLOAD_TEST_FAULT`` (None in production)."""
    fault = os.environ.get(TEST_FAULT_ENV) or None
    if fault is not None and fault not in TEST_FAULTS:
        raise PayloadError(f"${TEST_FAULT_ENV}={fault!r}: unknown test fault (known: {', '.join(TEST_FAULTS)}); "
                           "unset it — it exists only for the payload's tests")
    return fault
