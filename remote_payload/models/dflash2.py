"""What a DFlash2 drafter adds to the DFlash block drafter: grouped dynamic convolutions over the block's rows
around each sub-layer, and the candidate selector's weights (its walk: ``selector.py``).

The convolution, for rows x [G·B, H] laid out block after block (the drafter's flat query layout)::

    out[i, c] = Σ_{t < taps} (base[side, t, c] + δ[i, t, group(c)]) · x[i − t, c]      (x before the block's row 0: 0)

δ comes from one projection of the sub-layer's (normed) input, ``kernel_projection`` (H → 2·taps·groups): the
first half convolves that input (``prepare``), the second half the sub-layer's output (``finish``). Rows never
read across a block's start, so a block sees nothing the draft has not proposed, and the context rows (K/V from
the target's features) are not convolved at all.

Weight names are the z-lab / vLLM ones: ``layers.N.{attention_conv,mlp_conv}.{base_kernel,
kernel_projection.weight}`` and ``candidate_selector.{predecessor_codebook, successor_codebook,
hidden_projection.weight}``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from remote_payload.models.spec import DrafterSpec


class GroupedConv(nn.Module):
    def __init__(self, hidden_size: int, block_size: int, taps: int, group_size: int):
        super().__init__()
        self.block_size, self.taps, self.group_size = block_size, taps, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.groups, bias=False)

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int, block: int) -> torch.Tensor:
        # x [G·b, H] -> [G, b, groups, group_size]; delta [G·b, taps, groups]; b the block's rows
        rows = x.reshape(-1, block, self.groups, self.group_size)
        coef = (self.base_kernel[side].view(1, 1, self.taps, self.groups, self.group_size)
                + delta.reshape(-1, block, self.taps, self.groups, 1))
        out = coef[:, :, 0] * rows
        for t in range(1, self.taps):
            earlier = F.pad(rows[:, :-t], (0, 0, 0, 0, t, 0))  # row i reads row i − t, zeros before row 0
            out = out + coef[:, :, t] * earlier
        return out.reshape(x.shape)

    def prepare(self, x: torch.Tensor, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The sub-layer's input convolved with side 0, and the side-1 coefficients for ``finish``. ``block``: the
        rows per block when the engine plans fewer than the trained block size (bonus row + K mask rows)."""
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        return self._convolve(x, delta[:, 0], 0, block or self.block_size), delta[:, 1]

    def finish(self, y: torch.Tensor, delta: torch.Tensor, block: int | None = None) -> torch.Tensor:
        return self._convolve(y, delta, 1, block or self.block_size)


def layer_convs(spec: DrafterSpec) -> tuple[GroupedConv, GroupedConv] | None:
    """(attention_conv, mlp_conv) for one layer of a DFlash2 drafter; None for DFlash."""
    if spec.dflash2 is None:
        return None
    f = spec.dflash2
    return tuple(GroupedConv(spec.hidden_size, spec.block_size, f.conv_kernel_size, f.conv_group_size)
                 for _ in range(2))  # type: ignore[return-value]


class SelectorWeights(nn.Module):
    """The selector's parameters under their checkpoint names; ``vocab`` is the target's vocabulary size."""

    def __init__(self, hidden_size: int, vocab: int, rank: int):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)


def selector_shapes(spec: DrafterSpec, vocab: int) -> dict:
    """Expected shapes of the DFlash2-only weights (the convolutions of every layer, the selector's)."""
    if spec.dflash2 is None:
        return {}
    f, H = spec.dflash2, spec.hidden_size
    conv = {"base_kernel": [2, f.conv_kernel_size, H],
            "kernel_projection.weight": [2 * f.conv_kernel_size * (H // f.conv_group_size), H]}
    shapes = {f"layers.{i}.{which}.{k}": v for i in range(spec.num_layers) for which in ("attention_conv", "mlp_conv")
              for k, v in conv.items()}
    shapes.update({"candidate_selector.predecessor_codebook": [vocab, f.selector_rank],
                   "candidate_selector.successor_codebook": [vocab, f.selector_rank],
                   "candidate_selector.hidden_projection.weight": [f.selector_rank, H]})
    return shapes
