"""Dropout whose masks cost a fraction as much on a CPU.

Why not torch's: on a CPU, `F.dropout` (bernoulli_) and `rand_like` draw one 32-bit number of
the mt19937 generator per element and convert it to a float; at bench config S the dropout masks
took 6 of a training step's ~65 ms. Here each element takes 16 bits and keeps itself when they
clear a threshold: the rate is p rounded to a multiple of 1/65536 (0.1 becomes 0.100006), and
the scale is that rate's. The bits come from a hash of (a seed drawn from torch's generator, the
element's index) in C (`cpu_kernels.dropout`): forward and backward are one pass each and no
mask is kept, backward hashes it again. Without the C kernels they are full-range int64 draws of
torch's generator, four masks a draw (measured on 2 cores at [64, 72, 64]: 1,535 us for
F.dropout, 828 for rand_like >= p, 232 for the draws). Elsewhere (CUDA's Philox is fast, and
torch.compile without the kernels has its own) torch's dropout runs unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import foxhunt.models.cpu_kernels as cpu_kernels
from foxhunt.models.cpu_kernels import LEVELS, threshold


def fast_masks(x: Tensor) -> bool:
    """Whether `x`'s masks are foxhunt's (on a CPU: eager, or compiled where the C kernels run,
    whose op stays in the graph) rather than torch's."""
    return x.device.type == "cpu" and (
        not torch.compiler.is_compiling() or cpu_kernels.available(x)
    )


def keep_scale(p: float, x: Tensor) -> float:
    """1 / (1 - the rate the masks for `x` drop at): p, or p rounded to 1/65536 on a CPU."""
    if not fast_masks(x):
        return 1.0 / (1.0 - p)
    return LEVELS / (LEVELS - threshold(p))


def keep_mask(x: Tensor, p: float) -> Tensor:
    """A boolean mask shaped as `x`, each element kept with probability 1 - p (rounded to 1/65536
    on a CPU, as `keep_scale` says)."""
    if not fast_masks(x):
        return torch.rand_like(x) >= p
    n = x.numel()
    # full-range int64 draws (`random_(-2**63, None)`), seen as four uniform int16 each
    bits = torch.empty(math.ceil(n / 4), dtype=torch.int64).random_(-(2**63), None)
    return bits.view(torch.int16)[:n].view(x.shape) >= threshold(p) - LEVELS // 2


class Dropout(nn.Dropout):
    """nn.Dropout with `keep_mask`'s masks (or the C kernels' hashed ones) in training on a CPU;
    torch's elsewhere."""

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0 or not fast_masks(x):
            return F.dropout(x, self.p, self.training, self.inplace)
        if cpu_kernels.available(x):  # (its backward hashes the mask again)
            seed = cpu_kernels.draw_seed(self.p)
            return cpu_kernels.dropout(x.contiguous(), seed, self.p, keep_scale(self.p, x))
        return x.mul(keep_mask(x, self.p)).mul_(keep_scale(self.p, x))
