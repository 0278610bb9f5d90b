"""A table that grows as new keys arrive and evicts the least-frequently-used rows: `DynamicEmbeddingBag`.

Raw int64 keys (any value) are mapped to rows by a sorted key array searched with
`torch.searchsorted`, kept on the weight's device: a lookup is vectorized, with no Python dict on
the hot path, and new keys are merged into the sorted array (no re-sort of the whole map). In
training mode, keys not yet in the table get rows:

1. free rows first; when there are not enough, the capacity doubles (weights, row-wise Adagrad
   state, frequencies and the map are copied over, new rows initialised from the table's own
   seeded generator, whose state the state dict holds) up to ``max_capacity``;
2. at ``max_capacity``, the rows with the smallest use counts are evicted (ties to the lower row
   index; rows used by the current batch are never evicted), re-initialised and reused.

Every lookup in training adds one to the use count of each id occurrence. In eval mode unknown
keys are treated as absent (they add nothing to a bag and do not count for a mean) and nothing is
inserted or counted.

Rows are updated by the fused sparse optimizer of `sessrec.embeddings.fused` during backward (SGD
or row-wise Adagrad), which reads the weight when backward runs, so growth between forward and
backward loses no update. Call backward before the next forward when eviction is possible: an
evicted row may otherwise receive the update meant for its previous key.

Shape letters: B bags, T ids, C capacity (rows), D width, K keys in the table, N new keys.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.embeddings.fused import _FusedLookup, flat_bags, seeded_generator

_STATE = ("weight", "momentum", "counts", "row_keys", "sorted_keys", "sorted_rows", "used")


def _merge(keys: torch.Tensor, rows: torch.Tensor, new_keys: torch.Tensor, new_rows: torch.Tensor):
    """Insert sorted, distinct ``new_keys`` (N,) absent from sorted ``keys`` (K,) into the map.

    Returns the (K + N,) sorted keys and their rows. Each new key lands at its `searchsorted` place
    plus the number of new keys before it; each old key moves right by the number of new keys
    inserted at or before its place (a cumulative sum). O(K + N log K): the K keys are moved, never
    compared, where a re-sort would cost O((K + N) log(K + N)) on every batch that brings new keys.
    """
    n, k, device = new_keys.numel(), keys.numel(), keys.device
    before = torch.searchsorted(keys, new_keys)  # (N,) old keys smaller than each new key
    shift = torch.bincount(before, minlength=k + 1)  # (K + 1,) new keys in each gap
    new_at = before + torch.arange(n, device=device)  # (N,)
    # int32 running sum (it is at most N): torch's CPU cumsum is far slower in int64
    old_at = torch.arange(k, device=device) + shift.cumsum(0, dtype=torch.int32)[:k]  # (K,)
    merged_keys, merged_rows = keys.new_empty(k + n), rows.new_empty(k + n)
    merged_keys.index_copy_(0, new_at, new_keys).index_copy_(0, old_at, keys)
    merged_rows.index_copy_(0, new_at, new_rows).index_copy_(0, old_at, rows)
    return merged_keys, merged_rows


class DynamicEmbeddingBag(nn.Module):
    """Embedding bags over raw int64 keys in a table that grows by doubling and evicts by frequency.

    Args:
        embedding_dim: width D.
        initial_capacity: rows allocated at first.
        max_capacity: the table never grows past this; beyond it, the least used rows are reused.
        pooling: ``sum`` or ``mean`` of each bag (an empty bag gives zeros).
        optimizer: fused optimizer applied in backward: ``sgd`` or ``adagrad_rowwise``.
        lr: learning rate of the fused optimizer.
        eps: row-wise Adagrad's epsilon.
        init_bound: new rows are uniform in +-init_bound.
        device: where the weight and the key map live.
        seed: seeds the generator that initialises rows (deterministic growth and eviction).
        compile_update: SGD on CPU through the compiled scatter (see `FusedEmbeddingBagCollection`).

    Examples:
        >>> table = DynamicEmbeddingBag(4, initial_capacity=2, max_capacity=8, seed=0)
        >>> table(torch.tensor([[10**12, 7], [5, 7]])).shape, table.capacity, table.num_keys
        (torch.Size([2, 4]), 4, 3)
    """

    def __init__(
        self,
        embedding_dim: int,
        initial_capacity: int = 1024,
        max_capacity: int = 1 << 20,
        pooling: Literal["sum", "mean"] = "sum",
        optimizer: Literal["sgd", "adagrad_rowwise"] = "sgd",
        lr: float = 0.01,
        eps: float = 1e-8,
        init_bound: float = 0.01,
        device: torch.device | str | None = None,
        seed: int | None = None,
        compile_update: bool = True,
    ) -> None:
        super().__init__()
        if embedding_dim < 1 or initial_capacity < 1 or max_capacity < initial_capacity:
            raise ValueError(
                f"need embedding_dim >= 1 and 1 <= initial_capacity <= max_capacity, got "
                f"{embedding_dim}, {initial_capacity}, {max_capacity}"
            )
        if pooling not in ("sum", "mean"):
            raise ValueError(f"pooling must be 'sum' or 'mean', got {pooling!r}")
        if optimizer not in ("sgd", "adagrad_rowwise"):
            raise ValueError(f"optimizer must be 'sgd' or 'adagrad_rowwise' (rows move on growth), got {optimizer!r}")
        if not lr > 0 or not eps > 0:
            raise ValueError(f"lr and eps must be > 0, got lr={lr}, eps={eps}")
        self.embedding_dim, self.max_capacity, self.pooling = embedding_dim, max_capacity, pooling
        self.optimizer, self.lr, self.eps, self.init_bound = optimizer, lr, eps, init_bound
        self.compile_update = compile_update
        # on the host whatever the table's device: new rows are drawn there and moved, so a table draws the same rows
        # on every device (and grows on a GPU), and its saved generator state loads on any
        self.generator = seeded_generator(seed)
        long = {"dtype": torch.long, "device": device}
        self.register_buffer("weight", self._new_rows(initial_capacity, device))  # (C, D)
        self.register_buffer("momentum", torch.zeros(initial_capacity, device=device))  # (C,) row-wise Adagrad
        self.register_buffer("counts", torch.zeros(initial_capacity, **long))  # (C,) uses per row
        self.register_buffer("row_keys", torch.zeros(initial_capacity, **long))  # (C,) key of each used row
        self.register_buffer("used", torch.zeros(initial_capacity, dtype=torch.bool, device=device))  # (C,)
        self.register_buffer("sorted_keys", torch.zeros(0, **long))  # (K,) the map: sorted keys ...
        self.register_buffer("sorted_rows", torch.zeros(0, **long))  # (K,) ... and their rows
        self._anchor = torch.zeros(0, device=device, requires_grad=True)  # makes autograd call backward

    def _new_rows(self, n: int, device: torch.device | str | None) -> torch.Tensor:
        rows = torch.empty(n, self.embedding_dim).uniform_(-self.init_bound, self.init_bound, generator=self.generator)
        return rows.to(device)

    @property
    def capacity(self) -> int:
        """C: rows allocated now."""
        return self.weight.shape[0]

    @property
    def num_keys(self) -> int:
        """K: keys that have a row."""
        return self.sorted_keys.numel()

    def lookup(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``keys`` (any shape) and whether each key is in the table (rows of absent keys: 0)."""
        if self.num_keys == 0:
            return torch.zeros_like(keys), torch.zeros_like(keys, dtype=torch.bool)
        pos = torch.searchsorted(self.sorted_keys, keys).clamp(max=self.num_keys - 1)
        found = self.sorted_keys[pos] == keys
        return torch.where(found, self.sorted_rows[pos], 0), found

    def _grow(self, capacity: int) -> None:
        """Reallocate to ``capacity`` rows, keeping every row and its state."""
        extra = capacity - self.capacity
        device = self.weight.device
        self.weight = torch.cat([self.weight, self._new_rows(extra, device)])
        self.momentum = torch.cat([self.momentum, self.momentum.new_zeros(extra)])
        self.counts = torch.cat([self.counts, self.counts.new_zeros(extra)])
        self.row_keys = torch.cat([self.row_keys, self.row_keys.new_zeros(extra)])
        self.used = torch.cat([self.used, self.used.new_zeros(extra)])

    def _insert(self, new_keys: torch.Tensor, protected: torch.Tensor) -> None:
        """Give rows to ``new_keys`` (N,) distinct, absent keys; ``protected`` rows are not evicted."""
        n = new_keys.numel()
        free = int((~self.used).sum())
        if free < n and self.capacity < self.max_capacity:
            capacity = self.capacity
            while capacity - self.capacity + free < n and capacity < self.max_capacity:
                capacity = min(2 * capacity, self.max_capacity)
            self._grow(capacity)
            free = int((~self.used).sum())
        rows = (~self.used).nonzero().squeeze(1)[:n]  # free rows, lowest first
        keys, key_rows = self.sorted_keys, self.sorted_rows
        if rows.numel() < n:
            victims = self._evict(n - rows.numel(), protected)
            rows = torch.cat([rows, victims])
            keep = self.used[key_rows]  # the evicted rows' old keys leave the map; order is kept
            keys, key_rows = keys[keep], key_rows[keep]
        self.row_keys[rows] = new_keys
        self.used[rows] = True
        self.sorted_keys, self.sorted_rows = _merge(keys, key_rows, new_keys, rows)

    def _evict(self, n: int, protected: torch.Tensor) -> torch.Tensor:
        """Free the ``n`` least used rows (ties: lower row first), skipping ``protected``; their rows."""
        score = self.counts.clone()
        score[protected] = torch.iinfo(torch.long).max
        score[~self.used] = torch.iinfo(torch.long).max  # the free rows are already given out
        order = torch.sort(score, stable=True).indices  # stable: equal counts keep row order
        victims = order[:n]
        if victims.numel() < n or bool((score[victims] == torch.iinfo(torch.long).max).any()):
            raise ValueError(
                f"DynamicEmbeddingBag: the batch needs {n} more rows than max_capacity={self.max_capacity} "
                f"allows (every other row is used by the batch); raise max_capacity or shrink the batch"
            )
        self.weight[victims] = self._new_rows(n, self.weight.device)
        self.momentum[victims] = 0.0
        self.counts[victims] = 0
        self.used[victims] = False
        return victims.sort().values

    def forward(
        self, keys: torch.Tensor, offsets: torch.Tensor | None = None, per_sample_weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Pooled (B, D) embeddings of bags of raw keys.

        Args:
            keys: (B, k) keys, one bag per row; or (T,) keys with ``offsets``.
            offsets: (B,) start of each bag in ``keys`` (as `nn.EmbeddingBag`).
            per_sample_weights: optional weights shaped like ``keys``.
        """
        if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64:
            raise TypeError(f"keys must be an int64 tensor, got {getattr(keys, 'dtype', type(keys))}")
        keys, offsets, per_sample_weights = flat_bags(keys, offsets, per_sample_weights, "keys")  # (T,), (B + 1,)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.to(self.weight.dtype)  # embedding_bag takes the table's dtype only
        rows, found = self.lookup(keys)
        if self.training:
            with torch.no_grad():
                missing = keys[~found]
                if missing.numel():
                    self._insert(torch.unique(missing), protected=rows[found])
                    rows, found = self.lookup(keys)
                self.counts.index_add_(0, rows, torch.ones_like(rows))
        weights = per_sample_weights
        if not bool(found.all()):  # eval: unknown keys are absent
            mask = found.to(self.weight.dtype)
            weights = mask if weights is None else weights * mask
        out = _FusedLookup.apply(
            self._anchor, self.weight, lambda: (self.weight, self.momentum), rows, offsets, weights,
            self.optimizer, self.lr, self.eps, float(self.embedding_dim), self.compile_update,
        )
        if self.pooling == "mean":
            known = torch.cat([found.new_zeros(1, dtype=torch.long), found.long().cumsum(0)])
            out = out / (known[offsets[1:]] - known[offsets[:-1]]).clamp(min=1).unsqueeze(1).to(out.dtype)
        return out

    def embedding(self, keys: torch.Tensor) -> torch.Tensor:
        """(*, D) current rows of ``keys`` (zeros for absent keys), without inserting or counting."""
        rows, found = self.lookup(keys)
        return F.embedding(rows, self.weight) * found.unsqueeze(-1)

    def get_extra_state(self) -> torch.Tensor:
        """The row-initialisation generator's state in the state dict: a loaded table that grows draws the rows
        the saved one would have drawn, so a resumed training equals an uninterrupted one."""
        return self.generator.get_state()

    def set_extra_state(self, state: torch.Tensor, name: str = "_extra_state") -> None:
        own = self.generator.get_state()
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.shape != own.shape:
            got = f"{state.dtype} of shape {tuple(state.shape)}" if isinstance(state, torch.Tensor) else type(state).__name__
            raise ValueError(
                f"{name}: the saved row-initialisation generator state is {got}, this table's uint8 of shape "
                f"{tuple(own.shape)} (a generator of another kind or device)"
            )
        self.generator.set_state(state.cpu())

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        saved = state_dict.get(prefix + "weight")
        if saved is not None and (saved.dim() != 2 or saved.shape[1] != self.embedding_dim):
            raise ValueError(
                f"{prefix}weight: the saved table's rows are {saved.shape[-1]} wide, this table's {self.embedding_dim}"
                f" (saved shape {tuple(saved.shape)}); build it with the width it was saved with"
            )
        if saved is not None and saved.shape[0] > self.max_capacity:
            raise ValueError(
                f"{prefix}weight: the saved table has {saved.shape[0]} rows, more than this table's "
                f"max_capacity={self.max_capacity}; build it with max_capacity >= {saved.shape[0]}"
            )
        extra = state_dict.get(prefix + "_extra_state")
        if extra is not None:
            self.set_extra_state(extra, prefix + "_extra_state")  # refused before any row is loaded
        for name in _STATE:  # the saved table may have grown: take its sizes first
            saved = state_dict.get(prefix + name)
            if saved is not None and saved.shape != getattr(self, name).shape:
                setattr(self, name, torch.empty_like(saved, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    def extra_repr(self) -> str:
        return (f"dim={self.embedding_dim}, capacity={self.capacity}, max_capacity={self.max_capacity}, "
                f"keys={self.num_keys}, pooling={self.pooling!r}, optimizer={self.optimizer!r}, lr={self.lr}")
