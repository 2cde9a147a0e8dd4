"""Fixtures for the payload tests: real tiny transformers models and drafters, built once and cached.

The fixture set (remote_payload/fixtures/) is built deterministically and cached on disk keyed by a
hash of the code and parameters that build it ($DFO_FIXTURE_CACHE, default <repo>/.cache/fixtures), so a
session pays the ~1 min CPU build only when that code changed. References and features of the built-in
prompts are cached next to it (the eval's own caches).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from payload_helpers import MAX_NEW, REPO  # noqa: E402

os.environ.setdefault("DFO_FIXTURE_CACHE", str(REPO / ".cache" / "fixtures"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

torch = pytest.importorskip("torch", reason="payload tests need the payload stack (pip install -e '.[payload]')")
pytest.importorskip("transformers")

from remote_payload.fixtures import build as fx  # noqa: E402
from remote_payload.models import kernels  # noqa: E402

kernels.apply_policy("cpu")  # before any transformers model code is imported in this process
# tiny models: 1 thread is fastest, and robust on a busy box
torch.set_num_threads(int(os.environ.get("DFO_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def fixture_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("payload-fixtures")
    fx.build(out, fx.ALL, use_cache=True)
    return out


@pytest.fixture(scope="session")
def eval_cache(fixture_dir) -> Path:
    """Reference/feature cache shared by sessions (keyed like the fixtures, so it never goes stale)."""
    path = fx.default_cache_root() / fx.build_key() / "eval-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def target(fixture_dir):
    from remote_payload.models.target import load_target

    return load_target(fixture_dir / "target", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def qwen3_target(tmp_path_factory):
    """The fixture set's dense Qwen3 target (``engine-target``: the engine tests' target, trained the same way),
    fp32 on the CPU; built once per fixture key, like the others."""
    from remote_payload.models.target import load_target

    out = tmp_path_factory.mktemp("payload-qwen3")
    fx.build(out, ["engine-target"], use_cache=True)
    return load_target(out / "engine-target", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def samples(target, eval_cache):
    """(prompt, reference, features of layers 1, 3, 5) for every built-in prompt, fp32."""
    from remote_payload.inputs.features import cached_features
    from remote_payload.inputs.prompts import load_prompts
    from remote_payload.inputs.reference import cached_reference
    from remote_payload.models.target import render_prompt

    prompts, _ = load_prompts("builtin")
    out = []
    for p in prompts:
        ids = render_prompt(target.tokenizer, p.message_dicts(), False)
        ref = cached_reference(target, ids, MAX_NEW, eval_cache)
        feats = cached_features(target, ref.tokens, len(ids), [1, 3, 5], eval_cache)
        out.append((p, ref, feats))
    return out


@pytest.fixture(scope="session")
def loaded(fixture_dir):
    """The trained drafter in all three formats, the random one and the DFlash2 one, loaded (not yet bound to a
    target)."""
    from remote_payload.models.checkpoint import load_drafter

    return {
        "training": load_drafter(fixture_dir / "trained-drafter" / "checkpoint.pt",
                                 fixture_dir / "trained-drafter" / "spec.json"),
        "zlab": load_drafter(fixture_dir / "zlab-drafter"),
        "speculators": load_drafter(fixture_dir / "speculators-drafter"),
        "random": load_drafter(fixture_dir / "random-drafter"),
        "dflash2": load_drafter(fixture_dir / "dflash2-drafter"),
    }


@pytest.fixture(scope="session")
def runtime_for(target):
    from remote_payload.models.drafter import DrafterRuntime

    def make(ld, dtype=None):
        return DrafterRuntime(ld, target.model.get_input_embeddings(), target.model.get_output_embeddings(),
                              dtype=dtype or torch.float32)

    return make


@pytest.fixture
def run_payload(tmp_path):
    """Run ``python -m remote_payload ARGS`` in a subprocess, like the controller does."""
    import subprocess

    def run(*args, env=None, timeout=600):
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), full_env.get("PYTHONPATH")]))
        return subprocess.run([sys.executable, "-m", "remote_payload", *map(str, args)], cwd=str(REPO),
                              capture_output=True, text=True, env=full_env, timeout=timeout)

    return run
