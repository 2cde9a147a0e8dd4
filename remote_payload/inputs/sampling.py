"""Sampling at temperature T > 0: the target's next-token law, one seed per drawn continuation.

The law is z-lab's ``sample()`` (softmax of logits / T, one multinomial draw) after vLLM's optional filters,
top-k then top-p (nucleus), applied in that order on the temperature-scaled distribution. The same function
draws the reference continuations (``sampled_reference.py``) and the target's tokens in the online loop
(``eval/online.py``), so both sample one law.

Seeds: draw ``j`` of a prompt uses ``draw_seed(S, prompt ids, j)`` (``--seed S``), a 31-bit number: it is
what a server gets as ``seed`` too. It depends on the prompt's tokens and ``j`` only, so a run with more
samples per prompt repeats the first draws of a run with fewer (their cache entries are reused), and two
runs with the same ``--seed`` draw the same continuations on the same target (comparisons pair them).
The draws are made on the CPU from float32 probabilities with a CPU generator: the same logits give the same
tokens on any device. Stdlib at import; torch is imported inside the functions that need it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

from remote_payload.inputs.cache import tokens_digest

SEED_BITS = 31  # servers take a signed 32-bit seed


@dataclass(frozen=True)
class Sampling:
    """How the target's tokens are drawn: temperature, top-p and top-k (0: off)."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def as_json(self) -> dict:
        return {"temperature": float(self.temperature), "top_p": float(self.top_p), "top_k": int(self.top_k)}

    def request_fields(self) -> dict:
        """The OpenAI-compatible completion fields of this law (vLLM and SGLang read top_k; -1 is off)."""
        return {"temperature": float(self.temperature), "top_p": float(self.top_p),
                "top_k": int(self.top_k) if self.top_k > 0 else -1}

    def label(self) -> str:
        extra = (f", top-p {self.top_p:g}" if self.top_p < 1 else "") + (f", top-k {self.top_k}" if self.top_k else "")
        return f"T={self.temperature:g}{extra}"


def draw_seed(seed: int, prompt_ids: Sequence[int], draw: int, purpose: str = "reference") -> int:
    """The seed of draw ``draw`` of the prompt ``prompt_ids`` under ``--seed seed``; ``purpose`` keeps the
    streams of the reference, its tail and the online check's own draws apart."""
    text = json.dumps([int(seed), int(draw), purpose, tokens_digest(prompt_ids)])
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) & ((1 << SEED_BITS) - 1)


def generator(seed: int):
    import torch

    g = torch.Generator(device="cpu")
    g.manual_seed(int(seed))
    return g


def probabilities(logits, sampling: Sampling):
    """[N, V] logits -> [N, V] float32 probabilities on the CPU: / T, then top-k, then top-p."""
    import torch

    return processed(logits.detach().to("cpu", torch.float32), sampling)


def processed(x, sampling: Sampling):
    """``probabilities`` on the logits' own device (float32): the sampled-rule estimator keeps its per-anchor
    distributions on the accelerator and reduces them there."""
    import torch

    x = x.float() / float(sampling.temperature)
    if sampling.top_k and sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if sampling.top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the tokens ranked above each one
        drop = before >= sampling.top_p  # the smallest set whose mass reaches top_p is kept (the top token always)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(logits, sampling: Sampling, gen) -> list[int]:
    """One token per row of ``logits`` ([N, V]), drawn in row order from ``gen``."""
    import torch

    probs = probabilities(logits, sampling)
    return torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()
