"""Hot rows on the accelerator, the rest in host memory: `HybridEmbeddingBag`.

The ``num_hot`` most frequent rows (by given or fitted counts; ties to the lower id) live in a
(H, D) weight on ``device``; the other N - H rows live in a (N - H, D) weight in host memory,
pinned when CUDA is available so its results copy to the GPU asynchronously. A lookup splits the
ids of each bag into hot and cold ones (their order, hence bag membership, is kept), pools each part
with one `embedding_bag` where its rows live, copies only the (B, D) pooled cold part to the device
and adds the two. The result, and the gradients of both weights, are exactly those of one plain
`nn.EmbeddingBag` holding all N rows.

On a CPU-only machine both parts are on the CPU and the same code runs. Moving the module
(``.to(device)``) moves the hot rows and the id maps; the cold rows stay in host memory.

Shape letters: N rows, H hot rows, D width, B bags, T ids.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.embeddings.fused import flat_bags, seeded_generator


def hot_rows(counts: torch.Tensor, num_hot: int) -> torch.Tensor:
    """(H,) ids of the ``num_hot`` largest ``counts`` (ties: the lower id first)."""
    return torch.sort(counts, descending=True, stable=True).indices[:num_hot]


class HybridEmbeddingBag(nn.Module):
    """An embedding bag split by hotness between ``device`` and host memory, looked up as one table.

    Args:
        num_embeddings: N rows.
        embedding_dim: D.
        num_hot: H rows kept on ``device``.
        counts: optional (N,) observed frequency of each id; None takes ids 0..H-1 as the hot ones.
        pooling: ``sum`` or ``mean`` (an empty bag gives zeros).
        device: where the hot rows (and the outputs) live; the cold rows are always on the CPU.
        seed: seeds the initial weights (uniform in +-sqrt(1 / N), the same whatever the split).

    Examples:
        >>> bag = HybridEmbeddingBag(100, 8, num_hot=10, counts=torch.arange(100.0).flip(0), seed=0)
        >>> bag(torch.tensor([[0, 99], [5, 50]])).shape
        torch.Size([2, 8])
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        num_hot: int,
        counts: torch.Tensor | None = None,
        pooling: Literal["sum", "mean"] = "sum",
        device: torch.device | str | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        if num_embeddings < 1 or embedding_dim < 1 or not 0 <= num_hot <= num_embeddings:
            raise ValueError(
                f"need num_embeddings, embedding_dim >= 1 and 0 <= num_hot <= num_embeddings, got "
                f"{num_embeddings}, {embedding_dim}, {num_hot}"
            )
        if pooling not in ("sum", "mean"):
            raise ValueError(f"pooling must be 'sum' or 'mean', got {pooling!r}")
        if counts is not None and counts.shape != (num_embeddings,):
            raise ValueError(f"counts must have shape ({num_embeddings},), got {tuple(counts.shape)}")
        self.num_embeddings, self.embedding_dim, self.num_hot, self.pooling = num_embeddings, embedding_dim, num_hot, pooling
        generator = seeded_generator(seed)
        bound = math.sqrt(1.0 / num_embeddings)
        weight = torch.empty(num_embeddings, embedding_dim).uniform_(-bound, bound, generator=generator)
        hot = torch.arange(num_hot) if counts is None else hot_rows(counts.cpu(), num_hot)
        self._place(weight, hot, device)

    def _place(self, weight: torch.Tensor, hot: torch.Tensor, device: torch.device | str | None) -> None:
        n = weight.shape[0]
        is_hot = torch.zeros(n, dtype=torch.bool)
        is_hot[hot] = True
        cold = (~is_hot).nonzero().squeeze(1)
        slot = torch.empty(n, dtype=torch.long)
        slot[hot], slot[cold] = torch.arange(hot.numel()), torch.arange(cold.numel())  # row in its part
        host = weight[cold].contiguous()
        if torch.cuda.is_available():
            host = host.pin_memory()
        self.hot_weight = nn.Parameter(weight[hot].to(device))  # (H, D) on the accelerator
        self.cold_weight = nn.Parameter(host)  # (N - H, D) in host memory
        self.register_buffer("is_hot", is_hot.to(device))  # (N,) maps live with the ids
        self.register_buffer("slot", slot.to(device))
        self.register_buffer("hot_ids", hot.to(device))  # (H,)
        self.register_buffer("cold_ids", cold.to(device))  # (N - H,)

    def _apply(self, fn, recurse=True):
        """Moves and casts (``.to``, ``.cuda``, ``.half``) apply to every tensor, then the cold rows go
        back to host memory: a model moved to the accelerator keeps its cold rows where they are."""
        super()._apply(fn, recurse)
        cold = self.cold_weight
        if cold.device.type != "cpu":
            host = cold.data.cpu()
            cold.data = host.pin_memory() if torch.cuda.is_available() else host
            if cold.grad is not None:
                cold.grad = cold.grad.cpu()
        return self

    def full_weight(self) -> torch.Tensor:
        """(N, D) all rows in id order, on the hot rows' device (for checks and export)."""
        out = self.hot_weight.new_empty(self.num_embeddings, self.embedding_dim)
        out[self.hot_ids] = self.hot_weight
        out[self.cold_ids] = self.cold_weight.to(out.device)
        return out

    def forward(
        self, input: torch.Tensor, offsets: torch.Tensor | None = None, per_sample_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, D) pooled embeddings; arguments as `nn.EmbeddingBag` ((B, k) ids, or (T,) ids with (B,) offsets)."""
        if not isinstance(input, torch.Tensor) or input.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must be an int64 tensor, got {getattr(input, 'dtype', type(input))}")
        input, offsets, per_sample_weights = flat_bags(input, offsets, per_sample_weights)  # (T,), (B + 1,)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(self.hot_weight.dtype)  # embedding_bag takes the table's dtype only
        ids = input.long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            bad = ids[(ids < 0) | (ids >= self.num_embeddings)][0]
            raise ValueError(f"id {int(bad)} out of range for a table of {self.num_embeddings} rows")
        hot = self.is_hot[ids]  # (T,)
        slots = self.slot[ids]
        seen = torch.cat([hot.new_zeros(1, dtype=torch.long), hot.long().cumsum(0)])  # hot ids before each position
        out = self._pool(slots[hot], self.hot_weight, seen[offsets], None if per_sample_weights is None else per_sample_weights[hot])
        cold = ~hot
        cold_offsets = offsets - seen[offsets]  # cold ids before each bag start
        host = self.cold_weight.device
        cold_out = self._pool(
            slots[cold].to(host), self.cold_weight, cold_offsets.to(host),
            None if per_sample_weights is None else per_sample_weights[cold].to(host),
        )
        out = out + cold_out.to(out.device, non_blocking=True)  # only (B, D) crosses to the device
        if self.pooling == "mean":
            out = out / offsets.diff().clamp(min=1).unsqueeze(1).to(out.dtype)
        return out

    @staticmethod
    def _pool(ids: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, psw: torch.Tensor | None) -> torch.Tensor:
        return F.embedding_bag(ids, weight, offsets, mode="sum", per_sample_weights=psw, include_last_offset=True)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, hot={self.num_hot} on {self.hot_weight.device}, "
                f"cold on {self.cold_weight.device}, pooling={self.pooling!r}")
