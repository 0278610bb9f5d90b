"""Synthetic Criteo-like click data for scale and speed tests: 13 dense and 26 categorical features.

Dense features are ``log(1 + x)`` of log-normal counts (Criteo's usual preprocessing). Categorical
ids follow a power law over each table (id rank r drawn with P(r) ~ (r + 1)^-alpha, then scattered
over the table by a fixed bijection so hot ids are not all adjacent). Labels come from a hidden,
seeded logistic model (dense weights plus a per-id weight of every categorical value), so a model
can learn them; the bias is set so the expected click rate is `ctr`. Everything is vectorized and
deterministic for a seed.

Shape letters: N samples, B batch, k ids per bag (multi-hot), F categorical features (26).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sessrec.embeddings.jagged import SparseFeatures

NUM_DENSE = 13
NUM_SPARSE = 26
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class CriteoLike:
    """A generated data set, held as tensors.

    Args:
        dense: (N, 13) float32.
        ids: (26, N, k) int64 categorical ids, feature-major; ``ids[f] < cardinalities[f]``.
        labels: (N,) float32 clicks.
        cardinalities: rows of each categorical feature's table.
    """

    dense: torch.Tensor
    ids: torch.Tensor
    labels: torch.Tensor
    cardinalities: tuple[int, ...]

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f"cat_{f}" for f in range(len(self.cardinalities)))

    def __len__(self) -> int:
        return self.labels.shape[0]

    def batch(self, start: int, stop: int) -> tuple[torch.Tensor, SparseFeatures, torch.Tensor]:
        """Rows ``start:stop`` as (dense (B, 13), `SparseFeatures` of the 26 features, labels (B,))."""
        ids = self.ids[:, start:stop]  # (F, B, k)
        lengths = torch.full((ids.shape[0] * ids.shape[1],), ids.shape[2], dtype=torch.int64)
        sparse = SparseFeatures(keys=self.keys, values=ids.reshape(-1), lengths=lengths)
        return self.dense[start:stop], sparse, self.labels[start:stop]


def _hash_uniform(ids: np.ndarray, salt: int) -> np.ndarray:
    """A fixed pseudo-random value in [0, 1) per (id, salt), without a table the size of the vocabulary."""
    with np.errstate(over="ignore"):
        h = (ids.astype(np.uint64) + np.uint64(salt) * np.uint64(1_000_003)) * _GOLDEN
        h ^= h >> np.uint64(29)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(32)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def generate_criteo(
    num_samples: int,
    cardinalities: Sequence[int] = (1000,) * NUM_SPARSE,
    multi_hot: int = 1,
    alpha: float = 1.1,
    ctr: float = 0.25,
    signal: float = 1.0,
    seed: int = 0,
) -> CriteoLike:
    """Generate `num_samples` Criteo-like samples.

    Args:
        num_samples: N.
        cardinalities: rows of each of the 26 categorical tables (any number of features works).
        multi_hot: ids per bag (1 = one-hot).
        alpha: power-law exponent of the id frequencies (larger = more skewed).
        ctr: approximate click rate.
        signal: scale of the hidden model's weights (0 = labels are coin flips at `ctr`).
        seed: seeds everything, the hidden model included.

    Examples:
        >>> data = generate_criteo(8, cardinalities=[10, 20], seed=0)
        >>> data.dense.shape, data.ids.shape
        (torch.Size([8, 13]), torch.Size([2, 8, 1]))
    """
    if num_samples < 1 or multi_hot < 1 or not cardinalities or min(cardinalities) < 1:
        raise ValueError(
            f"need num_samples >= 1, multi_hot >= 1 and positive cardinalities; got {num_samples}, {multi_hot}, "
            f"{list(cardinalities)}"
        )
    if alpha <= 0 or not 0 < ctr < 1:
        raise ValueError(f"need alpha > 0 and 0 < ctr < 1, got alpha={alpha}, ctr={ctr}")
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=1.0, sigma=1.5, size=(num_samples, NUM_DENSE))
    dense = np.log1p(np.floor(raw))  # counts, then log(1 + x)
    logit = ((dense - dense.mean(0)) / (dense.std(0) + 1e-6)) @ (rng.standard_normal(NUM_DENSE) * 0.3 * signal)

    n_f = len(cardinalities)
    ids = np.empty((n_f, num_samples, multi_hot), dtype=np.int64)
    for f, card in enumerate(cardinalities):
        # inverse CDF of a continuous power law on [1, card + 1), floored to a rank 0..card-1
        u = rng.random((num_samples, multi_hot))
        top = float(card + 1)
        if abs(alpha - 1.0) < 1e-9:
            x = np.exp(u * np.log(top))
        else:
            x = (u * (top ** (1 - alpha) - 1) + 1) ** (1 / (1 - alpha))
        rank = np.minimum(np.floor(x).astype(np.int64) - 1, card - 1)
        ids[f] = (rank * 2_654_435_761) % card if card > 1 else 0  # a bijection when card is not a multiple of that prime
        weight = (_hash_uniform(ids[f], seed * 131 + f) - 0.5) * 2.0 * signal  # (N, k) hidden per-id weights
        logit += weight.mean(axis=1)
    # the bias that makes the mean click probability `ctr` (bisection; the mean is monotone in it)
    lo, hi = -30.0, 30.0
    for _ in range(50):
        bias = (lo + hi) / 2
        lo, hi = (bias, hi) if np.mean(1.0 / (1.0 + np.exp(-(logit + bias)))) < ctr else (lo, bias)
    labels = (rng.random(num_samples) < 1.0 / (1.0 + np.exp(-(logit + bias)))).astype(np.float32)
    return CriteoLike(
        dense=torch.from_numpy(dense.astype(np.float32)),
        ids=torch.from_numpy(ids),
        labels=torch.from_numpy(labels),
        cardinalities=tuple(int(c) for c in cardinalities),
    )
