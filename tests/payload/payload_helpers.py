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
