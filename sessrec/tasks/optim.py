"""Optimizer construction shared by the tasks and the benchmarks that mirror their steps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


def decayed_and_rest(module: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The parameters of `module` that weight decay applies to, the matrices of its layers (every `nn.Linear`
    weight; convolution, recurrent and attention projection weights), and the rest: biases (relative position
    and time biases included), norms, per-channel scales (one dimension above 1) and embedding tables
    (`nn.Embedding`s, and parameters named ``*emb*`` or ``*table*``)."""
    decayed, rest, seen = [], [], set()
    for owner in module.modules():
        table = isinstance(owner, (nn.Embedding, nn.EmbeddingBag))
        for name, param in owner.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            matrix = (isinstance(owner, nn.Linear) and name == "weight") or (
                sum(size > 1 for size in param.shape) >= 2 and not any(w in name for w in ("bias", "emb", "table")))
            (decayed if matrix and not table else rest).append(param)
    return decayed, rest


def adamw(params: Iterable[Any], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per parameter where this torch build supports it.

    The fused step reads and writes each parameter, gradient and moment once; the default
    multi-tensor step makes several passes over each of them. The item table is the largest
    parameter, so the optimizer step grows with the catalogue, and once a sampled loss has made the
    rest of the step cheap it is a large part of it. Torch builds without a fused CPU AdamW
    (before 2.4) fall back to the default implementation.
    """
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
