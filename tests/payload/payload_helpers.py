"""Test helpers: a synthetic drafter with errors at chosen positions, and result-file readers."""

from __future__ import annotations

import json
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
MAX_NEW = 160  # max_new_tokens of the fixture references (every fixture answer ends well before)


class SyntheticDrafter:
    """A draft source that proposes the reference continuation, wrong exactly where told.

    ``errors`` maps an anchor position to the set of draft depths (1..B-1) that are wrong there; every
    other draft is the reference token. It implements the same interface as DrafterRuntime, so the
    offline replay and the online loop run it unchanged.
    """

    def __init__(self, reference_tokens: list[int], block_size: int, errors: dict[int, set[int]], vocab: int):
        self.ref = list(reference_tokens)
        self.block_size = block_size
        self.errors = errors
        self.vocab = vocab
        self.calls: list[list[int]] = []

    def prepare(self, features):
        return None

    def _token(self, anchor: int, depth: int) -> int:
        pos = anchor + depth
        truth = self.ref[pos] if pos < len(self.ref) else 0
        return (truth + 1) % self.vocab if depth in self.errors.get(anchor, set()) else truth

    def draft(self, ctx, tokens, anchors, topk: int = 1):
        anchors = list(map(int, anchors))
        self.calls.append(anchors)
        B1 = self.block_size - 1
        ids = torch.tensor([[self._token(a, d) for d in range(1, B1 + 1)] for a in anchors], dtype=torch.long)
        ids = ids[..., None].repeat(1, 1, topk)
        return ids, torch.zeros(ids.shape)


def read_results(out: Path) -> tuple[dict, list[dict]]:
    results = json.loads((out / "results.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return results, samples


def json_lines(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def drafter_copy(src: Path, dst: Path, config=None, weights=None) -> Path:
    """A copy of a drafter folder with its config.json and/or weights changed (to plant a fault).

    ``config(cfg)`` edits the parsed config.json in place; ``weights(dict)`` returns the new tensors.
    """
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    if weights is not None:
        tensors = weights(load_file(str(dst / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def prompts_file(path: Path, ids: list[str]) -> Path:
    """A JSONL prompt file holding the built-in prompts with these ids, in this order."""
    from remote_payload.inputs.prompts import BUILTIN

    lines = {json.loads(line)["id"]: line for line in BUILTIN.read_text().splitlines() if line.strip()}
    path.write_text("".join(lines[i] + "\n" for i in ids))
    return path
