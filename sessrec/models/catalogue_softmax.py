"""`catalogue_cross_entropy`: the full-softmax loss of a tied head, its (N, V) scores built once.

The loss ``cross_entropy((h @ table.T + bias) / temperature, targets)`` by autograd builds the (N, V)
scores, their log-softmax, a zero (N, V) gradient with -1 at the targets and the log-softmax's
backward: four passes over N x V floats and three fresh buffers of that size per step, besides the
three matrix products. Here the scores are written once, turned into log-probabilities in place, and
the backward turns those into ``softmax - target`` in place: one (N, V) buffer, no zero fill. The
scores are computed in blocks of `BLOCK` items: a (N, D) x (D, V) product with a small D writes its
output faster a block of columns at a time (on one CPU thread, about half the time of one `addmm`).
The numbers are `torch.nn.functional.cross_entropy`'s to float rounding (tests/test_catalogue_softmax.py).

Shape letters: N rows (targets), D width, V items.
"""

from __future__ import annotations

import torch

BLOCK = 256  # items per block of the score product


def catalogue_cross_entropy(
    hidden: torch.Tensor,
    table: torch.Tensor,
    bias: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy of the scores ``(hidden @ table.T + bias) / temperature`` against `targets`.

    Args:
        hidden: (N, D) hidden states.
        table: (V, D) item vectors.
        bias: (V,) item biases; -inf marks items that are never a target (padding, OOV, virtual).
        targets: (N,) item ids.
        temperature: the scores are divided by it.
        label_smoothing: share of each row's target mass spread uniformly over the items whose bias
            is finite (`sessrec.tasks.losses.smoothed_cross_entropy`'s rule).

    The backward can run once (the log-probabilities become the gradient in place).
    """
    if hidden.shape[0] == 0:
        raise ValueError("catalogue_cross_entropy needs at least one row")
    return _CatalogueCrossEntropy.apply(hidden, table, bias, targets.long(), float(temperature), float(label_smoothing))


class _CatalogueCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, table, bias, targets, temperature, smoothing):
        n, v = hidden.shape[0], table.shape[0]
        scale = 1.0 / temperature
        logp = hidden.new_empty(n, v)
        for start in range(0, v, BLOCK):
            end = min(start + BLOCK, v)
            torch.addmm(bias[start:end], hidden, table[start:end].T, beta=scale, alpha=scale, out=logp[:, start:end])
        torch.log_softmax(logp, dim=1, out=logp)  # row by row: each row is read whole before it is written
        loss = -logp.gather(1, targets[:, None]).squeeze(1)  # (N,) negative log-likelihood
        valid = None
        if smoothing > 0.0:
            valid = torch.isfinite(bias)  # (V,)
            uniform = -torch.where(valid, logp, 0.0).sum(dim=1) / valid.sum()
            loss = (1.0 - smoothing) * loss + smoothing * uniform
        ctx.save_for_backward(hidden, table, targets)
        ctx.logp, ctx.valid, ctx.scale, ctx.smoothing = logp, valid, scale, smoothing
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        hidden, table, targets = ctx.saved_tensors
        if ctx.logp is None:
            raise RuntimeError("catalogue_cross_entropy: backward ran a second time (its buffer became the first gradient)")
        scores_grad, ctx.logp = ctx.logp.exp_(), None  # softmax, in place
        n = hidden.shape[0]
        scores_grad[torch.arange(n, device=targets.device), targets] -= 1.0 - ctx.smoothing
        if ctx.valid is not None:
            scores_grad.sub_(ctx.valid.to(scores_grad.dtype) * (ctx.smoothing / ctx.valid.sum()))
        scores_grad.mul_(grad * (ctx.scale / n))  # (N, V): d loss / d (h @ table.T + bias)
        hidden_grad = scores_grad @ table if ctx.needs_input_grad[0] else None
        table_grad = scores_grad.T @ hidden if ctx.needs_input_grad[1] else None
        bias_grad = scores_grad.new_ones(n) @ scores_grad if ctx.needs_input_grad[2] else None
        return hidden_grad, table_grad, bias_grad, None, None, None
