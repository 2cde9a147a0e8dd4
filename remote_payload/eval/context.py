"""The state one `eval` run carries from stage to stage (``EvalContext``) and its parts.

Each stage (``stages.py``, ``drafters.py``) reads what earlier stages put here and fills in its own part, so
a stage can run alone on a context prepared by hand (the tests do). Fields stay empty (``None``, ``[]``) until
the stage that owns them has run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_payload.eval.settings import EvalSettings, default_cache_dir
from remote_payload.progress import SILENT, Progress


@dataclass
class References:
    """The continuations the rounds are measured against: one per chosen prompt (greedy), or one per draw at
    T > 0 (``inputs.sampled_reference.SampledReference``, with its seed)."""

    refs: list = field(default_factory=list)  # inputs.reference.Reference, in prompt order
    batch: Any = None  # inputs.server_reference.ReferenceBatch when they came from a server, else None
    tokens: int = 0  # tokens generated in this run (cache hits excluded)
    seconds: float = 0.0
    tail_unavailable: str | None = None  # why the tokens past the stop (Reference.tail) could not be had
    decode: dict = field(default_factory=dict)  # local decoding: the batch asked and used, rate, idle share, OOMs

    @property
    def from_server(self) -> bool:
        return self.batch is not None

    @property
    def cache_hits(self) -> int:
        return sum(1 for r in self.refs if r.cached)


@dataclass
class Extraction:
    """The target's hidden states at the drafters' layers, for every sample."""

    layer_ids: list[int] = field(default_factory=list)
    store: Any = None  # inputs.features.FeatureStore
    teacher_forced_mismatches: list = field(default_factory=list)  # per sample (None: not computed)
    tokens: int = 0
    seconds: float = 0.0
    cache_hits: int = 0
    hidden_stats: dict = field(default_factory=dict)  # layer id -> diagnose.tensors.TensorStats, with --diagnose
    probe_features: dict = field(default_factory=dict)  # diagnosed sample -> {layer id: tensor}, more layers
    bytes_per_token: int = 0  # feature cache bytes per token (layers × hidden × dtype)
    memory: dict = field(default_factory=dict)  # the extraction's peak memory (stages.PeakMemory)
    cache: dict = field(default_factory=dict)  # the cache folder against its size limit (inputs.cache.enforce_limit)


@dataclass
class DrafterRun:
    """One drafter's outcome: its ``results.json`` entry and the per-sample data behind it."""

    summary: dict  # results["drafters"][name]
    rounds: list  # per sample: [metrics.chain.Round]
    trees: list | None  # per sample: metrics.tree.TreeRounds; None where DDTree is not defined (DFlash2)
    online: list | None = None  # per sample: the online check's outcome, with --online-check
    conventions: list | None = None  # per sample: {"zlab-2604": record, "vllm": record} (metrics.conventions.record)
    by_k: list | None = None  # per sample: {K: [rounds, accepted]} (metrics.by_k.sample_record)
    diagnostics: Any = None  # diagnose.report.DrafterDiagnostics, with --diagnose
    expected_p1: tuple = (None, None)  # (position-1 acceptance it should reach, where that figure comes from)
    sampled_rule: list | None = None  # per sample at T > 0 under --draft-rule sampled: eval.sampled_rule entries


@dataclass
class EvalContext:
    settings: EvalSettings
    progress: Progress = SILENT
    started: float = field(default_factory=time.perf_counter)
    fault: str | None = None  # test-only planted fault (settings.planted_fault)
    device: str = "cpu"  # resolved by stages.start
    cache_dir: Path = field(default_factory=default_cache_dir)  # resolved by stages.start
    warnings: list[str] = field(default_factory=list)
    # inputs checked before the target's weights load
    target_config: Any = None  # models.target.TargetConfig
    tokenizer: Any = None
    stop_ids: list[int] = field(default_factory=list)
    drafters: dict = field(default_factory=dict)  # name -> models.checkpoint.LoadedDrafter, in --drafter order
    prompt_info: dict | None = None
    datasets: list = field(default_factory=list)  # per benchmark dataset: what inputs.datasets.load records
    prompts: list = field(default_factory=list)  # the chosen inputs.prompts.Prompt, in order (later turns: with
    #                                              their history once the turn before has its reference)
    draws: list = field(default_factory=list)  # at T > 0: eval.draws.Draw per entry of ``prompts`` ([] greedy)
    # later stages
    target: Any = None  # models.target.Target
    references: References = field(default_factory=References)
    run_facts: Any = None  # diagnose.findings.RunFacts
    findings: list = field(default_factory=list)  # diagnose.findings.Finding, in the order found
    extraction: Extraction = field(default_factory=Extraction)
    diagnosed_samples: int = 0  # the first N samples get the --diagnose probes
    results: dict = field(default_factory=dict)  # name -> DrafterRun, in --drafter order
    timings: dict = field(default_factory=dict)  # load_s, reference_s, extract_s
    card: dict | None = None  # with --card: results.json "card" (eval/card_stage.py)

    def warn(self, message: str) -> None:
        """A warning line now, and once in ``results.warnings``."""
        if message not in self.warnings:
            self.warnings.append(message)
        self.progress.warning(message)

    def add_findings(self, findings, warn_all: bool = False) -> None:
        """Record findings; warnings (or every finding, for the run checks) also become warning lines."""
        for f in findings:
            self.findings.append(f)
            if warn_all or f.severity == "warning":
                self.warn(f.line())
