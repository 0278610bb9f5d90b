"""`catalogue_cross_entropy`: the full-softmax loss of a tied head, its (N, V) scores built once.

The loss ``cross_entropy((h @ table.T + bias) / temperature, targets)`` by autograd builds the (N, V)
scores, their log-softmax, a zero (N, V) gradient with -1 at the targets and the log-softmax's
backward: four passes over N x V floats and three fresh buffers of that size per step, besides the
three matrix products. Here the scores are written once into one buffer and turned into the softmax
in place; the loss reads the log-sum-exp of each row off the softmax at the row's largest score
(``lse = max - log max(softmax)``; that probability is at least 1 / V, so it never underflows),
and the backward subtracts the targets in place: the buffer becomes the gradient of the scores.

On a CPU the scores are computed in blocks of `BLOCK` items: a (N, D) x (D, V) product with a small
D writes its output faster a block of columns at a time. A buffer whose backward has run is kept
for the next call of the same dtype and device (`_spare`), as a caching allocator would: a fresh
one costs a page fault per 4 KiB page at its first write. Under autocast (mixed precision) the loss
is the plain composition of the scores in the autocast dtype and their log-softmax. The numbers are
`torch.nn.functional.cross_entropy`'s to float rounding (tests/test_catalogue_softmax.py).

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

    The backward can run once (the probabilities become the gradient in place).
    """
    if hidden.shape[0] == 0:
        raise ValueError("catalogue_cross_entropy needs at least one row")
    if torch.is_autocast_enabled(hidden.device.type) or hidden.dtype != table.dtype:
        # mixed precision: what autograd makes of the scores in the autocast dtype
        logp = torch.log_softmax(torch.addmm(bias, hidden, table.T) / temperature, dim=1)
        loss = -logp.gather(1, targets.long()[:, None]).squeeze(1)
        if label_smoothing > 0.0:
            valid = torch.isfinite(bias)
            loss = (1.0 - label_smoothing) * loss - label_smoothing * torch.where(valid, logp, 0.0).sum(dim=1) / valid.sum()
        return loss.mean()
    return _CatalogueCrossEntropy.apply(hidden, table, bias, targets.long(), float(temperature), float(label_smoothing))


_spare: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}  # a buffer back from its backward, for the next call


def _buffer(n: int, v: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised (n, v) tensor: a view of the spare buffer when it is large enough, else a new one
    with room for a quarter more rows (the number of targets varies from batch to batch)."""
    key = (like.dtype, like.device)
    spare = _spare.pop(key, None)
    if spare is None or spare.numel() < n * v:
        spare = like.new_empty((n + n // 4 + 1) * v)
    return spare[: n * v].view(n, v)


class _CatalogueCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, table, bias, targets, temperature, smoothing):
        n, v = hidden.shape[0], table.shape[0]
        scale = 1.0 / temperature
        probs = _buffer(n, v, hidden)
        block = BLOCK if hidden.device.type == "cpu" else v  # one product on an accelerator
        for start in range(0, v, block):  # the bias is written first and the product added to it
            torch.addmm(bias[start : start + block], hidden, table[start : start + block].T, beta=scale, alpha=scale,
                        out=probs[:, start : start + block])
        rows = torch.arange(n, device=hidden.device)
        picked = probs[rows, targets]  # (N,) the targets' scores
        valid = None
        if smoothing > 0.0:
            valid = torch.isfinite(bias)  # (V,)
            mean_valid = torch.where(valid, probs, 0.0).sum(dim=1) / valid.sum()  # (N,) mean score of the valid items
        top = probs.amax(dim=1)
        torch.softmax(probs, dim=1, out=probs)  # row by row: each row is read whole before it is written
        lse = top - probs.amax(dim=1).log()  # (N,) log-sum-exp: the top score's probability is 1 / sum(exp(s - top))
        loss = lse - picked
        if valid is not None:
            loss = (1.0 - smoothing) * loss + smoothing * (lse - mean_valid)
        ctx.save_for_backward(hidden, table, targets)
        ctx.probs, ctx.valid, ctx.scale, ctx.smoothing = probs, valid, scale, smoothing
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        hidden, table, targets = ctx.saved_tensors
        if ctx.probs is None:
            raise RuntimeError("catalogue_cross_entropy: backward ran a second time (its buffer became the first gradient)")
        scores_grad, ctx.probs = ctx.probs, None
        n = hidden.shape[0]
        scores_grad[torch.arange(n, device=targets.device), targets] -= 1.0 - ctx.smoothing
        if ctx.valid is not None:
            scores_grad.sub_(ctx.valid.to(scores_grad.dtype) * (ctx.smoothing / ctx.valid.sum()))
        scores_grad.mul_(grad * (ctx.scale / n))  # (N, V): d loss / d (h @ table.T + bias)
        hidden_grad = scores_grad @ table if ctx.needs_input_grad[0] else None
        table_grad = scores_grad.T @ hidden if ctx.needs_input_grad[1] else None
        bias_grad = scores_grad.new_ones(n) @ scores_grad if ctx.needs_input_grad[2] else None
        _spare[(scores_grad.dtype, scores_grad.device)] = scores_grad._base if scores_grad._base is not None else scores_grad
        return hidden_grad, table_grad, bias_grad, None, None, None
