"""The SGD row update as one loop compiled by TorchInductor, with the eager sorted update as fallback.

SGD is linear in the gradient: ``W[r] -= lr * sum of the gradients of r's occurrences`` can add the
occurrences one by one, in any order, so it needs no sort and no per-row sum first. Eager PyTorch
has no fast CPU kernel for that scatter (``index_add_`` and ``index_put_(accumulate=True)`` pay a
dispatch per row, so they lose to the sorted update of `sparse_update`, which sums each row's
occurrences and writes each touched row once). TorchInductor compiles
``W.index_put_((rows,), -lr * grad[bags], accumulate=True)`` into one vectorized C++ loop over the
ids (atomic adds when it runs on several threads), which reads each gradient row once and each
touched weight row once per occurrence, with no sort; the gather by ``bags`` and the per-sample
weights are fused into the loop. The compiled and sorted updates are compared in
``docs/benchmarks.md`` (Embedding core, ``--eager-update``).

Compilation needs a C++ compiler at run time. `sgd_scatter` compiles each variant (with or without
``bags`` and per-sample weights) on first use, on a tiny input, and returns ``None`` when that fails;
callers then take the eager path. Compiled graphs are cached on disk by TorchInductor, so later
processes load them instead of compiling again (the first compilation takes seconds).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

_KERNELS: dict[tuple[int, torch.dtype, bool, bool], Callable[..., None] | None] = {}
_warned = False


def _scatter_sgd(
    weight: torch.Tensor, rows: torch.Tensor, grad: torch.Tensor, bags: torch.Tensor | None,
    per_sample_weights: torch.Tensor | None, lr: float,
) -> None:
    """``weight[rows[t]] -= lr * psw[t] * grad[bags[t]]`` for every occurrence t, duplicates added."""
    g = grad if bags is None else grad[bags]  # (T, P)
    if per_sample_weights is not None:
        g = g * per_sample_weights.unsqueeze(1)
    weight.index_put_((rows,), g * -lr, accumulate=True)


def sgd_scatter(width: int, dtype: torch.dtype, with_bags: bool, with_weights: bool) -> Callable[..., None] | None:
    """The compiled scatter for this variant, or ``None`` when it cannot be compiled here.

    The first call for a variant compiles it on a tiny input of the real width and dtype and checks
    the result. The width stays static, so the inner loop over a row is vectorized for that exact
    width (a symbolic width leaves a generic, slower loop); the numbers of ids and rows are
    dynamic, so one compilation serves every batch and table size. A failure (no C++ compiler,
    an unsupported platform) is warned about once and remembered.
    """
    global _warned
    key = (width, dtype, with_bags, with_weights)
    if key not in _KERNELS:
        compiled = torch.compile(_scatter_sgd, fullgraph=True)

        def kernel(weight, rows, grad, bags, per_sample_weights, lr):
            for t in (weight, rows, grad, bags, per_sample_weights):
                if t is not None:
                    torch._dynamo.maybe_mark_dynamic(t, 0)
            compiled(weight, rows, grad, bags, per_sample_weights, lr)

        try:
            weight = torch.zeros(5, width, dtype=dtype)
            rows = torch.tensor([0, 2, 2, 4])
            grad = torch.ones(3 if with_bags else 4, width, dtype=dtype)
            bags = torch.tensor([0, 1, 1, 2]) if with_bags else None
            psw = torch.full((4,), 0.5, dtype=dtype) if with_weights else None
            kernel(weight, rows, grad, bags, psw, 1.0)
            expected = torch.zeros(5, width, dtype=dtype)
            expected.index_add_(0, rows, (grad if bags is None else grad[bags]) * (1.0 if psw is None else 0.5), alpha=-1.0)
            if not torch.equal(weight, expected):
                raise RuntimeError(f"compiled scatter gave {weight.tolist()}, expected {expected.tolist()}")
        except Exception as err:  # noqa: BLE001 - any compilation failure means: use the eager update
            if not _warned:
                warnings.warn(f"the compiled SGD update is unavailable ({type(err).__name__}: {err}); "
                              "using the eager sorted update", RuntimeWarning, stacklevel=3)
                _warned = True
            kernel = None
        _KERNELS[key] = kernel
    return _KERNELS[key]
