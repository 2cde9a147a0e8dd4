"""`eval`: inputs checked -> target -> references -> features -> per drafter (offline, online) -> engine -> results.

``run_eval`` is the order of the stages; each stage is a function over one ``EvalContext`` (``stages.py``
for the run-wide ones, ``drafters.py`` per drafter, ``engine_stage.py`` for ``--engine``/``--reference vllm``,
``report.py`` for the outputs), testable alone.
"""

from __future__ import annotations

from pathlib import Path

from remote_payload.eval import card_stage, engine_results, engine_stage, stages
from remote_payload.eval.context import EvalContext
from remote_payload.eval.diagnosis import diagnostics_block
from remote_payload.eval.drafters import evaluate_drafter
from remote_payload.eval.report import comparison, results_document, sample_lines
from remote_payload.eval.settings import EvalSettings
from remote_payload.progress import SILENT, Progress
from remote_payload.results import write_outputs


def run_eval(s: EvalSettings, progress: Progress = SILENT) -> dict:
    ctx = EvalContext(settings=s, progress=progress)
    eng = engine_stage.EngineRun()
    stages.start(ctx)
    stages.check_inputs(ctx)  # opens the "load" stage
    if s.reference_url or s.reference_engine:  # server references before the target's weights take the GPU
        ctx.timings["load_s"] = progress.stage_done("load", message="inputs checked; the target loads after the "
                                                                    "references")
        if s.reference_engine:
            engine_stage.engine_references(ctx, eng)
        else:
            stages.server_references(ctx)
        progress.stage_start("target")
        stages.load_target(ctx)
        ctx.timings["load_s"] += progress.stage_done("target")
    else:
        stages.load_target(ctx)
        ctx.timings["load_s"] = progress.stage_done("load")
        stages.local_references(ctx)
    stages.run_checks(ctx)
    stages.extract_features(ctx)
    for name in ctx.drafters:
        evaluate_drafter(ctx, name)
    if s.engine:
        engine_stage.run_engine(ctx, eng)
    if s.card:
        ctx.card = card_stage.measure(ctx)
    return write_results(ctx, eng if (s.engine or s.reference_engine) else None)


def write_results(ctx: EvalContext, eng: engine_stage.EngineRun | None = None) -> dict:
    """``samples.jsonl`` then ``results.json`` (present = the run completed); the ``result`` line."""
    lines = sample_lines(ctx)
    if eng is not None:
        engine_results.sample_entries(ctx, lines)
    compared = comparison(ctx, lines)
    diagnostics = diagnostics_block(ctx) if ctx.settings.diagnose else None
    results = results_document(ctx, lines, compared, diagnostics)
    if eng is not None:
        s = ctx.settings
        results["engine"] = eng.block(s)
        results["timings"]["engine_s"] = round(eng.seconds, 3)
        results["settings"].update(engine=s.engine, engine_args=list(s.engine_args) or None)
        results["settings"]["reference"]["engine"] = s.reference_engine
        if s.reference_engine:  # the server this run started and stopped itself
            results["reference"]["server"]["started_by_payload"] = s.reference_engine
    if ctx.card is not None:
        results["card"] = ctx.card
    if diagnostics is not None:
        ctx.progress.text(diagnostics["text"])
    paths = write_outputs(Path(ctx.settings.out), results, lines)
    ctx.progress.result(**paths, drafters={n: r.summary["metrics"]["tau_macro"] for n, r in ctx.results.items()})
    return results
