"""Settings of one `eval` run: the dataclass the CLI fills, its defaults, and the checks on it.

The options behind them are declared in options.py; tests/evaluation/test_eval_options.py keeps the
dataclass's fields and defaults equal to that table.

Nothing here imports torch: the CLI parses and checks settings before any heavy import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from remote_payload.engines.registry import check_engine_args
from remote_payload.errors import PayloadError
from remote_payload.eval import protocols
from remote_payload.eval.options import (  # noqa: F401 - parse_named, parse_expect_p1: the settings' parsers
    ENGINES,
    FP16_REFUSED,
    THINKING_BOTH,
    at_payload_default,
    check_needs,
    check_value,
    parse_expect_p1,
    parse_named,
    payload_options,
    settings_values,
)
from remote_payload.inputs.datasets.registry import dataset_specs

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
    datasets: list = field(default_factory=list)  # --dataset values, NAME[:split][@N]
    suite: str | None = None  # "zlab": z-lab's sets and counts
    dataset_files: dict = field(default_factory=dict)  # dataset name -> its rows' file or folder here
    protocol: str | None = None  # a named card protocol (eval/protocols.py): its values are the settings'
    card: str | None = None  # a published card (cards/): its known protocol fields are the settings'
    explain: bool = False  # with a card: the knobs behind a gap, ranked (also when the verdict is not reproduced)
    explain_prompts: int = 16  # rows the subset reruns of --explain measure
    selection: str = "zlab-transformers"  # which rows of a dataset (inputs/datasets/selection.py)
    selection_concurrency: int = 1  # zlab-server: the warm-up rows before the measured ones
    shard: tuple = (0, 1)
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0: greedy references (one per prompt); > 0: sampled, samples_per_prompt each
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    samples_per_prompt: int = 1
    draft_rule: str = "sampled"  # at T > 0: "sampled" (z-lab's current rule) or "greedy" (April's, vLLM's)
    enable_thinking: bool | str = False  # or "both" (options.THINKING_BOTH): every prompt under each mode
    device: str = "auto"
    dtype: str = "bfloat16"
    allow_fp16: bool = False
    cache_dir: str | None = None
    cache_limit_gib: float = 200.0  # the cache folder's size limit (least recently used entries go first)
    out: str = "dfo-eval"
    online_check: bool = False
    seed: int = 0
    topk: int = 8
    kernel: str = "auto"
    tree_k: int = 8  # headline "DDTree-8" = top-8 depth acceptance
    tree_budget: int = 16
    reference_url: str | None = None  # OpenAI-compatible endpoint; None: the target's own greedy decoding
    reference_model: str | None = None
    reference_timeout: float = 900.0
    reference_concurrency: int = 4
    reference_retries: int = 2  # extra attempts after a connection failure or HTTP 5xx
    reference_prompt_format: str = "ids"
    reference_strict_roundtrip: bool = False
    diagnose: bool = False
    diagnose_samples: int = 2
    diagnose_rounds: int = 4
    expect_p1: dict = field(default_factory=dict)  # drafter name (or "*" for all) -> expected position-1 acceptance
    threads: int | None = None  # CPU threads (torch here; the engine's OpenMP threads too)
    decode_batch: int | str = "auto"  # rows per forward in the reference stage (N, or "auto": from free memory)
    engine: str | None = None  # "vllm": every drafter also served by a real engine after the offline eval
    engine_version: str | None = None  # --engine vllm@0.31.0: the release the engine venv must have
    reference_engine: str | None = None  # "vllm": references from an engine server this run starts itself
    engine_python: str | None = None  # the engine venv's interpreter (vLLM has its own venv)
    engine_args: list = field(default_factory=list)  # extra engine server arguments, verbatim
    engine_concurrency: tuple = (1,)  # requests in flight per level of the engine sweep, lowest first
    engine_k: tuple = ()  # extra draft counts K timed per drafter in the engine (one server each)
    engine_check: tuple = ()  # "synthetic": the engine's synthetic sampler replays each drafter's profile
    engine_start_timeout: float = 900.0

    @property
    def sampled(self) -> bool:
        """The references are drawn at T > 0 (τ is then an expectation over the draws)."""
        return self.temperature > 0

    @property
    def rule(self) -> str:
        """The draft rule the figures follow: ``draft_rule`` at T > 0, "n/a at T = 0" otherwise."""
        from remote_payload.metrics.sampled_rule import rule_of

        return rule_of(self.temperature, self.draft_rule)

    @property
    def sampling(self):
        """The law the target's tokens are drawn from (``inputs.sampling.Sampling``)."""
        from remote_payload.inputs.sampling import Sampling

        return Sampling(float(self.temperature), float(self.top_p), int(self.top_k))

    @property
    def thinking_both(self) -> bool:
        """``--enable-thinking both``: every prompt evaluated under each mode, paired (aggregate.thinking_breakdown)."""
        return self.enable_thinking == THINKING_BOTH

    @property
    def tree_K(self) -> int:  # the K of the DDTree paper
        # K >= budget makes the budgeted tree exact DDTree (ranks >= budget never enter a tree of budget nodes).
        return self.tree_budget

    @property
    def draft_topk(self) -> int:
        """Per-depth candidates the draft pass keeps: enough for the chain, top-k acceptance and the tree."""
        return max(self.topk, self.tree_k, self.tree_K)

    @property
    def dataset_specs(self) -> list:
        """The run's datasets (``inputs.datasets.registry.DatasetSpec``), the suite's first; [] for a prompt set."""
        return dataset_specs(self.datasets, self.suite)

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


def default_cache_dir() -> Path:
    return Path(os.environ.get("DFO_PAYLOAD_CACHE", Path.home() / ".cache" / "dfo-payload"))


def settings_from_values(given: dict) -> EvalSettings:
    """The settings of a run from the parsed value of every declared option (by field; see options.py)."""
    return EvalSettings(**settings_values(given))


def check_settings(s: EvalSettings) -> None:
    """Everything the run can check before it loads a model: the values, then the engine's interpreter."""
    check_values(s)
    _check_engine_python(s)


def check_values(s: EvalSettings) -> None:
    """The settings' values on their own and together; no file is read (the controller runs this too, on the
    command it is about to send)."""
    for option in payload_options():
        if (option.kind in (int, float) or option.choices) and not option.repeatable:
            check_value(option, getattr(s, option.field))
    clash = protocols.conflicts(vars(s), s.protocol)
    if clash:
        raise PayloadError(f"--protocol {s.protocol} fixes what it measures, but {'; '.join(clash)}: drop those "
                           "options, or drop --protocol")
    check_card_values(s)
    if s.dtype == "float16" and not s.allow_fp16:
        raise PayloadError(f"{FP16_REFUSED}. Use bfloat16 (float32 on CPU), or pass --allow-fp16 to force it")
    if not s.drafters:
        raise PayloadError("give at least one --drafter NAME=PATH")
    names = {n for n, _ in s.drafters}
    unknown_specs = sorted(set(s.drafter_specs) - names)
    if unknown_specs:
        raise PayloadError(f"--drafter-spec for unknown drafter name(s): {', '.join(unknown_specs)}")
    unknown_p1 = sorted(set(s.expect_p1) - names - {"*"})
    if unknown_p1:
        raise PayloadError(f"--expect-p1 for unknown drafter name(s): {', '.join(unknown_p1)}")
    check_needs(vars(s), payload_options(), at_payload_default)  # options that mean nothing alone
    check_engine_values(s)
    check_dataset_values(s)
    check_thinking_values(s)


def check_thinking_values(s: EvalSettings) -> None:
    """``--enable-thinking both`` renders each prompt twice on this host; a server renders one mode per request
    batch, which the server paths do not split yet."""
    if not s.thinking_both:
        return
    served = [f for f, on in (("--reference " + str(s.reference_url or s.reference_engine),
                                s.reference_url or s.reference_engine), (f"--engine {s.engine}", s.engine)) if on]
    if served:
        raise PayloadError(f"--enable-thinking both with {' and '.join(served)}: the two modes are evaluated with this "
                           "host's own references and no engine; run one mode per eval for a server (--enable-thinking "
                           "/ --no-enable-thinking) and compare the runs with `dfo runs compare`")


def check_card_values(s: EvalSettings) -> None:
    """--card fixes its known protocol fields (as --protocol does); --explain needs a card."""
    if s.card is None:
        if s.explain:
            raise PayloadError("--explain ranks the knobs behind a gap to a published figure: give --card NAME|FILE")
        return
    if s.protocol:
        raise PayloadError(f"--card and --protocol {s.protocol} both fix the protocol: give one of them")
    from remote_payload.cards import protocol as card_protocol
    from remote_payload.cards.schema import load_card

    card = load_card(s.card)
    clash = card_protocol.conflicts(vars(s), card)
    if clash:
        raise PayloadError(card_protocol.refusal(card, clash))



def check_dataset_values(s: EvalSettings) -> None:
    """--dataset/--suite replace the prompt set: no --prompts file or --samples beside them, files only for them."""
    specs = s.dataset_specs  # --selection without one: check_needs
    if not specs:
        if s.dataset_files:
            raise PayloadError(f"--dataset-file {', '.join(s.dataset_files)}: give the dataset too (--dataset NAME "
                               "or --suite zlab)")
        return
    if s.prompts != "builtin":
        raise PayloadError("--prompts FILE and --dataset/--suite both name what to evaluate: give one of them")
    if s.samples is not None:
        raise PayloadError("--samples counts prompts of a prompt set; with --dataset give the count as NAME@N "
                           "(e.g. humaneval@8)")
    unknown = sorted(set(s.dataset_files) - {d.name for d in specs})
    if unknown:
        raise PayloadError(f"--dataset-file for dataset(s) not evaluated: {', '.join(unknown)} (add --dataset NAME)")


def check_engine_settings(s: EvalSettings) -> None:
    """``--engine`` / ``--reference vllm``: a known engine, its interpreter (a file here), one reference source."""
    check_needs(vars(s), payload_options(), at_payload_default)
    check_engine_values(s)
    _check_engine_python(s)


def check_engine_values(s: EvalSettings) -> None:
    for flag, value in (("--engine", s.engine), ("--reference", s.reference_engine)):
        if value is not None and value not in ENGINES:
            raise PayloadError(f"{flag} {value!r}: unknown engine (known: {', '.join(ENGINES)})")
    if (s.engine or s.reference_engine) and not s.engine_python:
        name = s.engine or s.reference_engine
        what = f"--engine {name}" if s.engine else f"--reference {name}"
        raise PayloadError(f"{what} needs --engine-python PATH (the python of the {name} engine venv, made by "
                           f"`dfo provision --engine {name}`)")
    if s.reference_engine and s.reference_url:
        raise PayloadError("--reference takes one source: an engine name (vllm) or a URL, not both")
    for name in {s.engine, s.reference_engine} - {None}:
        check_engine_args(str(name), list(s.engine_args))


def _check_engine_python(s: EvalSettings) -> None:
    if s.engine_python and not Path(s.engine_python).is_file():
        raise PayloadError(f"--engine-python {s.engine_python}: no such file (is the engine venv provisioned? "
                           f"`dfo provision --host HOST --engine {s.engine or s.reference_engine or 'vllm'}`)")


def planted_fault() -> str | None:
    """The test-only fault named by ``$DFO_PAYLOAD_TEST_FAULT`` (None in production)."""
    fault = os.environ.get(TEST_FAULT_ENV) or None
    if fault is not None and fault not in TEST_FAULTS:
        raise PayloadError(f"${TEST_FAULT_ENV}={fault!r}: unknown test fault (known: {', '.join(TEST_FAULTS)}); "
                           "unset it — it exists only for the payload's tests")
    return fault
