"""`FastDropout`: the same inverted dropout, with a mask that is cheaper to draw on CPU.

On CPU, `torch.nn.Dropout` draws one Bernoulli sample per element (`bernoulli_`), a large share
of a small model's training step (``docs/benchmarks.md``, Training step, where a step goes).
`FastDropout` draws one 64-bit random integer per four elements instead and compares its 16-bit
lanes with a threshold: a quarter of the random draws. The keep probability is ``1 - p`` to
within 2^-17 (8e-6), kept elements are scaled by ``1 / (1 - p)`` as usual, the mask comes from
torch's default generator (so `torch.manual_seed` makes it reproducible), and only a bool mask is
saved for backward. The mask is applied as a float factor (``x * keep.float() * scale``, the bool
read as bytes): multiplying by a bool tensor directly goes through a slow type-promoting loop. Off
CPU it is `torch.nn.functional.dropout` itself (CUDA's Philox Bernoulli is already fast).

`use_fast_dropout(module)` swaps every `nn.Dropout` inside a module (the HF encoders' included)
for a `FastDropout` of the same ``p``; dropout has no weights, so checkpoints do not change.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.saved.registry import check_probabilities


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool tensor of `shape`, each element True with probability ``1 - p`` (to 2^-17).

    One random int64, drawn over the whole int64 range, gives four 16-bit lanes, each uniform
    over the int16 range; the first n lanes are compared with one threshold, written as bytes
    (a direct bool result takes a slower path) and read as bool.
    """
    n = 1
    for size in shape:
        n *= int(size)
    words = torch.empty(-(-n // 4), dtype=torch.int64, device=device).random_(-(2**63), None)
    keep = torch.empty(n, dtype=torch.uint8, device=device)
    torch.lt(words.view(torch.int16)[:n], round((1.0 - p) * 65536) - 32768, out=keep)
    return keep.view(torch.bool).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale, saving the bool mask (1 byte an element) for backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, keep: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep.view(torch.uint8).to(x.dtype)).mul_(scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        return grad.mul(keep.view(torch.uint8).to(grad.dtype)).mul_(ctx.scale), None, None


class FastDropout(nn.Module):
    """Drop-in for `nn.Dropout(p)` (same ``p`` attribute, same train/eval behaviour).

    Args:
        p: probability of zeroing an element, in [0, 1).
    """

    def __init__(self, p: float = 0.1) -> None:
        super().__init__()
        check_probabilities({"p": p}, "FastDropout ")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or not x.is_floating_point() or sys.byteorder != "little":
            return F.dropout(x, self.p, training=True)  # the lane layout above assumes little-endian
        return _MaskedScale.apply(x, keep_mask(x.shape, self.p, x.device), 1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}"


def use_fast_dropout(module: nn.Module) -> nn.Module:
    """Replace every `nn.Dropout` below `module` (in place) by a `FastDropout` of the same ``p``."""
    for parent in module.modules():
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout and child.p < 1.0:
                setattr(parent, name, FastDropout(child.p))
    return module
