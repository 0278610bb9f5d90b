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
one costs a page fault per 4 KiB page at its first write. Under autocast (mixed precision) the three
products run in the autocast dtype (bfloat16 or float16: a CPU's AMX units, a GPU's tensor cores) and
everything else over N x V in float32: the scores' product, one (N, V) product in that dtype (its own
spare buffer), is added to the scaled bias in the float32 buffer, and the gradient is cast to the
autocast dtype once for the two backward products. The
numbers are `torch.nn.functional.cross_entropy`'s to float rounding, under autocast those of the
scores rounded to the autocast dtype (tests/test_catalogue_softmax.py).

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
    device = hidden.device.type
    if torch.is_autocast_enabled(device):  # the products in the autocast dtype, the rest in float32
        compute = torch.get_autocast_dtype(device)
    elif hidden.dtype == table.dtype == bias.dtype:
        compute = None
    else:
        raise ValueError(f"catalogue_cross_entropy needs hidden, table and bias of one dtype outside autocast, got "
                         f"{hidden.dtype}, {table.dtype}, {bias.dtype}")
    return _CatalogueCrossEntropy.apply(hidden, table, bias, targets.long(), float(temperature), float(label_smoothing),
                                        compute)


_spare: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}  # a buffer back from its backward, for the next call


def _buffer(n: int, v: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised (n, v) tensor: a view of the spare buffer when it is large enough, else a new one
    with room for a quarter more rows (the number of targets varies from batch to batch)."""
    spare = _spare.pop((dtype, device), None)
    if spare is None or spare.numel() < n * v:
        spare = torch.empty((n + n // 4 + 1) * v, dtype=dtype, device=device)
    return spare[: n * v].view(n, v)


def _keep(buffer: torch.Tensor) -> None:
    """Keep `buffer` (a view of `_buffer`'s) as the spare of its dtype and device."""
    _spare[(buffer.dtype, buffer.device)] = buffer._base if buffer._base is not None else buffer


class _CatalogueCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, table, bias, targets, temperature, smoothing, compute):
        # compute: the products' dtype under autocast (None: the inputs'); autocast is off inside, the casts explicit
        with torch.autocast(hidden.device.type, enabled=False):
            n, v = hidden.shape[0], table.shape[0]
            scale = 1.0 / temperature
            h, t = (hidden, table) if compute is None else (hidden.to(compute), table.to(compute))
            probs = _buffer(n, v, bias.dtype, hidden.device)
            if compute is None:
                block = BLOCK if hidden.device.type == "cpu" else v  # one product on an accelerator
                for start in range(0, v, block):  # the bias is written first and the product added to it
                    torch.addmm(bias[start : start + block], h, t[start : start + block].T, beta=scale, alpha=scale,
                                out=probs[:, start : start + block])
            else:  # one product in the low dtype, added to the scaled bias in float32
                product = torch.mm(h, t.T, out=_buffer(n, v, compute, hidden.device))
                torch.add(bias if scale == 1.0 else bias * scale, product, alpha=scale, out=probs)
                _keep(product)
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
        ctx.cast = None if compute is None else (h, t)  # the inputs in the products' dtype
        ctx.probs, ctx.valid, ctx.scale, ctx.smoothing = probs, valid, scale, smoothing
        return loss.mean()

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(grad.device.type, enabled=False):  # the dtypes as written, as in forward
            hidden, table, targets = ctx.saved_tensors
            if ctx.probs is None:
                raise RuntimeError("catalogue_cross_entropy: backward ran a second time (its buffer became the first gradient)")
            scores_grad, ctx.probs = ctx.probs, None
            h, t = (hidden, table) if ctx.cast is None else ctx.cast
            n = h.shape[0]
            scores_grad[torch.arange(n, device=targets.device), targets] -= 1.0 - ctx.smoothing
            if ctx.valid is not None:
                scores_grad.sub_(ctx.valid.to(scores_grad.dtype) * (ctx.smoothing / ctx.valid.sum()))
            scores_grad.mul_(grad * (ctx.scale / n))  # (N, V): d loss / d (h @ table.T + bias)
            bias_grad = scores_grad.new_ones(n) @ scores_grad if ctx.needs_input_grad[2] else None
            low = scores_grad
            if h.dtype != scores_grad.dtype:  # the gradient in the products' dtype, in a buffer of its own
                low = _buffer(n, scores_grad.shape[1], h.dtype, h.device).copy_(scores_grad)
            hidden_grad = (low @ t).to(hidden.dtype) if ctx.needs_input_grad[0] else None
            table_grad = (low.T @ h).to(table.dtype) if ctx.needs_input_grad[1] else None
            _keep(scores_grad)
            if low is not scores_grad:
                _keep(low)
            ctx.cast = None
            return hidden_grad, table_grad, bias_grad, None, None, None, None
