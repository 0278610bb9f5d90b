"""Keyed jagged ids: `SparseFeatures` (the layout of TorchRec's KeyedJaggedTensor).

F features, each with one bag of ids per sample, stored feature-major: all bags of the first
feature (samples 0 .. B-1), then all bags of the second, and so on. ``lengths[f * B + b]`` is the
number of ids of feature f in sample b; ``values`` holds the ids of all bags back to back.

Shape letters: F features, B batch, T total ids (``lengths.sum()``), k ids per sample (dense input).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SparseFeatures:
    """Ids of F features for a batch of B samples, jagged and feature-major.

    Args:
        keys: feature names, in the order of the blocks of ``lengths``.
        values: (T,) int64 ids, all bags concatenated, feature-major.
        lengths: (F * B,) int64 number of ids per (feature, sample), feature-major.
        weights: optional (T,) floating per-id weights (pooled as weighted sum / mean).

    The constructor checks dtypes, shapes and that ``lengths`` adds up to ``len(values)``; ids must
    be >= 0 (each table checks its own upper bound at lookup) and weights finite.

    Examples:
        >>> f = SparseFeatures.from_dense({"city": torch.tensor([3, 1]), "tags": torch.tensor([[2, 5], [4, -1]])})
        >>> f.lengths.tolist(), f.values.tolist()
        ([1, 1, 2, 1], [3, 1, 2, 5, 4])
    """

    keys: tuple[str, ...]
    values: torch.Tensor
    lengths: torch.Tensor
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.keys = tuple(self.keys)
        if not self.keys or any(not isinstance(k, str) or not k for k in self.keys):
            raise ValueError(f"SparseFeatures.keys must be non-empty feature names, got {self.keys!r}")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"SparseFeatures.keys has duplicates: {self.keys!r}")
        for name in ("values", "lengths"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"SparseFeatures.{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != torch.int64:
                hint = " (float ids are not ids: convert with .long() if they are whole numbers)" if t.is_floating_point() else ""
                raise TypeError(f"SparseFeatures.{name} must be int64, got {t.dtype}{hint}")
            if t.dim() != 1:
                raise ValueError(f"SparseFeatures.{name} must be 1-D, got shape {tuple(t.shape)}")
        n = len(self.keys)
        if self.lengths.numel() % n:
            raise ValueError(
                f"SparseFeatures.lengths has {self.lengths.numel()} entries, not a multiple of the {n} keys {self.keys!r}"
            )
        if self.lengths.numel() and int(self.lengths.min()) < 0:
            raise ValueError(f"SparseFeatures.lengths must be >= 0, got {int(self.lengths.min())}")
        total = int(self.lengths.sum())
        if total != self.values.numel():
            raise ValueError(f"SparseFeatures.lengths sums to {total} but values has {self.values.numel()} ids")
        if self.values.numel() and int(self.values.min()) < 0:
            first = int((self.values < 0).nonzero()[0, 0])
            key = self.keys[int(self._feature_of(first))]
            raise ValueError(f"feature {key!r}: negative id {int(self.values[first])} (ids must be >= 0)")
        if self.weights is not None:
            if not isinstance(self.weights, torch.Tensor) or not self.weights.is_floating_point():
                raise TypeError(f"SparseFeatures.weights must be a floating tensor, got {getattr(self.weights, 'dtype', type(self.weights))}")
            if self.weights.shape != self.values.shape:
                raise ValueError(f"SparseFeatures.weights has shape {tuple(self.weights.shape)}, values {tuple(self.values.shape)}")
            bad = ~torch.isfinite(self.weights)
            if bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                key = self.keys[self._feature_of(first)]
                raise ValueError(
                    f"feature {key!r}: weight {float(self.weights[first])} at position {first} (of values); "
                    "per-id weights must be finite"
                )

    def _feature_of(self, position: int) -> int:
        """Index of the feature that owns value ``position`` (for error messages)."""
        per_feature = self.lengths.view(len(self.keys), -1).sum(1).cumsum(0)
        return int(torch.searchsorted(per_feature, torch.tensor(position), right=True))

    @classmethod
    def from_dense(cls, ids: dict[str, torch.Tensor], weights: dict[str, torch.Tensor] | None = None) -> SparseFeatures:
        """Build from dense per-feature ids: (B,) one id per sample or (B, k) several.

        Negative entries mean "absent" (padding of a multi-hot row); they are dropped, so a row of
        only negatives is an empty bag. All features must have the same B.

        Args:
            ids: feature name -> (B,) or (B, k) integer ids.
            weights: optional feature name -> weights of the same shape as its ids (all or none).
        """
        if not ids:
            raise ValueError("from_dense needs at least one feature")
        if weights is not None and set(weights) != set(ids):
            raise ValueError(f"weights must be given for every feature: ids {sorted(ids)}, weights {sorted(weights)}")
        batch = None
        values, lengths, ws = [], [], []
        for key, x in ids.items():
            if not isinstance(x, torch.Tensor) or x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
                raise TypeError(f"feature {key!r}: ids must be an integer tensor, got {getattr(x, 'dtype', type(x))}")
            if x.dim() not in (1, 2):
                raise ValueError(f"feature {key!r}: ids must be (B,) or (B, k), got shape {tuple(x.shape)}")
            x2 = x.long().reshape(x.shape[0], -1)  # (B, k)
            if batch is None:
                batch = x2.shape[0]
            elif x2.shape[0] != batch:
                raise ValueError(f"feature {key!r}: batch {x2.shape[0]} differs from {batch} of the first feature")
            present = x2 >= 0  # (B, k)
            values.append(x2[present])
            lengths.append(present.sum(1))
            if weights is not None:
                w = weights[key]
                if w.shape != x.shape:
                    raise ValueError(f"feature {key!r}: weights shape {tuple(w.shape)} differs from ids {tuple(x.shape)}")
                ws.append(w.reshape(x2.shape)[present])
        return cls(
            keys=tuple(ids), values=torch.cat(values), lengths=torch.cat(lengths),
            weights=torch.cat(ws) if weights is not None else None,
        )

    @property
    def batch_size(self) -> int:
        """B: samples per feature."""
        return self.lengths.numel() // len(self.keys)

    def offsets(self) -> torch.Tensor:
        """(F * B + 1,) start of each bag in ``values``, with the total at the end."""
        return torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)])

    def feature_lengths(self) -> torch.Tensor:
        """(F,) ids per feature over the whole batch."""
        return self.lengths.view(len(self.keys), -1).sum(1)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseFeatures:
        """A copy on ``device`` (the checks are not repeated)."""
        out = object.__new__(SparseFeatures)
        out.keys = self.keys
        out.values = self.values.to(device, non_blocking=non_blocking)
        out.lengths = self.lengths.to(device, non_blocking=non_blocking)
        out.weights = None if self.weights is None else self.weights.to(device, non_blocking=non_blocking)
        return out

    def pin_memory(self) -> SparseFeatures:
        """A copy in pinned host memory (for ``to(cuda, non_blocking=True)``)."""
        out = object.__new__(SparseFeatures)
        out.keys, out.values, out.lengths = self.keys, self.values.pin_memory(), self.lengths.pin_memory()
        out.weights = None if self.weights is None else self.weights.pin_memory()
        return out
