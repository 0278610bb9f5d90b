"""Raw ids from unbounded vocabularies into table rows: `IdHasher` and `FrequencyCap`.

- `IdHasher` maps any int64 id to one of ``num_buckets`` rows with a fixed 64-bit mix (the
  MurmurHash3 ``fmix64`` finalizer applied to ``id + seed * 0x9E3779B97F4A7C15``, arithmetic
  modulo 2^64), read as a signed int64 and reduced by floor modulo (`torch.remainder`). It is
  deterministic across runs, machines and devices and needs no fitting; distinct ids may collide.
- `FrequencyCap` is fitted on observed ids: ids seen at least ``min_count`` times (optionally only
  the ``max_rows - 1`` most frequent, ties to the smaller id) get rows 1..K in id order; every
  other id, seen or not, shares the out-of-vocabulary row 0. Counts can be accumulated over many
  batches (`update`) and the fitted state saved and restored as tensors (`state_dict`). Rows
follow id order, so refitting (``update`` after training started) can move existing ids to other
rows: fit first, then train, or use a `DynamicEmbeddingBag` for vocabularies that keep growing.

Both are vectorized (a sorted key array and `torch.searchsorted`, no Python dict) and keep the
device of their input.

Shape letters: N ids, K kept ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sessrec.saved.registry import check_integers

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xFF51AFD7ED558CCD - 2**64
_M2 = 0xC4CEB9FE1A85EC53 - 2**64


def _shift_right(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic on signed ints)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _check_seed(seed: int, what: str) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"{what}seed must be an integer, got {seed!r}")


def hash_ids(ids: torch.Tensor, num_buckets: int, seed: int = 0) -> torch.Tensor:
    """(N,) any int64 ids -> (N,) rows in [0, num_buckets). See the module docstring for the formula."""
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids))}")
    check_integers({"num_buckets": num_buckets})
    _check_seed(seed, "")
    offset = (seed * _GOLDEN) % 2**64
    x = ids.long() + (offset - 2**64 if offset >= 2**63 else offset)  # as signed int64; the sum wraps mod 2^64
    x = x ^ _shift_right(x, 33)
    x = x * _M1
    x = x ^ _shift_right(x, 33)
    x = x * _M2
    x = x ^ _shift_right(x, 33)
    return torch.remainder(x, num_buckets)


@dataclass(frozen=True)
class IdHasher:
    """Hash raw ids into ``num_buckets`` rows (stateless; the config is its whole state).

    Examples:
        >>> IdHasher(1000, seed=1)(torch.tensor([7, 10**15])).tolist() == IdHasher(1000, seed=1)(torch.tensor([7, 10**15])).tolist()
        True
    """

    num_buckets: int
    seed: int = 0

    def __post_init__(self) -> None:
        check_integers({"num_buckets": self.num_buckets}, "IdHasher ")
        _check_seed(self.seed, "IdHasher ")

    @property
    def num_embeddings(self) -> int:
        """Rows the table needs."""
        return self.num_buckets

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return hash_ids(ids, self.num_buckets, self.seed)


class FrequencyCap:
    """Ids seen at least ``min_count`` times get their own row (1..K); all others share row 0.

    Args:
        min_count: minimum number of occurrences for an id to get its own row.
        max_rows: optional cap on the table size including the OOV row: only the ``max_rows - 1``
            most frequent ids are kept (ties to the smaller id).

    Examples:
        >>> cap = FrequencyCap(min_count=2).fit(torch.tensor([5, 9, 5, 42, 9, 9]))
        >>> cap(torch.tensor([9, 5, 42, 7])).tolist(), cap.num_embeddings
        ([2, 1, 0, 0], 3)
    """

    def __init__(self, min_count: int = 1, max_rows: int | None = None) -> None:
        check_integers({"min_count": min_count} | ({} if max_rows is None else {"max_rows": max_rows}), "FrequencyCap ")
        self.min_count, self.max_rows = min_count, max_rows
        self.seen = torch.zeros(0, dtype=torch.long)  # sorted distinct ids observed
        self.counts = torch.zeros(0, dtype=torch.long)  # their occurrences
        self.keys = torch.zeros(0, dtype=torch.long)  # (K,) sorted kept ids: id keys[i] -> row i + 1

    @staticmethod
    def _check(ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor, got {getattr(ids, 'dtype', type(ids))}")
        return ids.long().reshape(-1)

    def update(self, ids: torch.Tensor) -> FrequencyCap:
        """Add the occurrences of ``ids`` (any shape) to the counts and refit the kept ids."""
        ids = self._check(ids)
        seen, counts = self.seen.to(ids.device), self.counts.to(ids.device)
        new, new_counts = torch.unique(ids, return_counts=True)
        merged, inverse = torch.unique(torch.cat([seen, new]), return_inverse=True)
        self.counts = torch.zeros_like(merged).index_add_(0, inverse, torch.cat([counts, new_counts]))
        self.seen = merged
        self._refit()
        return self

    def fit(self, ids: torch.Tensor) -> FrequencyCap:
        """Count ``ids`` from scratch and choose the kept ids."""
        self.seen = self.seen[:0].to(ids.device)
        self.counts = self.counts[:0].to(ids.device)
        return self.update(ids)

    def _refit(self) -> None:
        keep = self.counts >= self.min_count
        keys, counts = self.seen[keep], self.counts[keep]
        if self.max_rows is not None and keys.numel() > self.max_rows - 1:
            # most frequent first; seen is sorted, so a stable sort breaks ties by the smaller id
            order = torch.sort(counts, descending=True, stable=True).indices[: self.max_rows - 1]
            keys = keys[order].sort().values
        self.keys = keys

    @property
    def num_embeddings(self) -> int:
        """Rows the table needs: the kept ids plus the OOV row 0."""
        return self.keys.numel() + 1

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids`` (same shape): 1..K for kept ids, 0 for all others."""
        flat = self._check(ids)
        keys = self.keys.to(flat.device)
        if keys.numel() == 0:
            return torch.zeros_like(ids, dtype=torch.long)
        pos = torch.searchsorted(keys, flat).clamp(max=keys.numel() - 1)
        rows = torch.where(keys[pos] == flat, pos + 1, 0)
        return rows.reshape(ids.shape)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to restore the cap (tensors, e.g. for `torch.save` or a checkpoint); ``config``
        holds ``[min_count, max_rows]`` (-1: no cap), which `load_state_dict` checks."""
        return {"seen": self.seen, "counts": self.counts, "keys": self.keys, "config": torch.tensor(self._config())}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> FrequencyCap:
        """Take the ids and counts of a `state_dict` of a cap with the same settings; returns self."""
        saved = state["config"].tolist()
        if saved != self._config():
            raise ValueError(
                f"FrequencyCap: the state is of a cap with [min_count, max_rows] = {saved}, not {self._config()} "
                "(max_rows -1: no cap); build the cap with the settings it was fitted with"
            )
        self.seen, self.counts, self.keys = state["seen"], state["counts"], state["keys"]
        return self

    def _config(self) -> list[int]:
        return [self.min_count, -1 if self.max_rows is None else self.max_rows]
