"""Optimizer construction shared by the tasks and the benchmarks that mirror their steps."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


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
