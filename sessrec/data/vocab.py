"""Item vocabulary: raw item ids <-> contiguous model ids, fitted on training data only.

Id layout: 0 = padding, 1 = out-of-vocabulary (rare or unseen items), 2.. = items by
decreasing training frequency. The fitted vocabulary is saved as parquet beside the checkpoint,
so that scoring maps raw ids exactly as training did and returns raw ids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sessrec.data.atomic import atomic_path

PAD = 0
OOV = 1
NUM_SPECIAL = 2


@dataclass
class EncodeResult:
    """Model ids (E,) and how many raw ids were unknown (mapped to OOV)."""

    ids: np.ndarray
    num_unknown: int


class ItemVocab:
    """Fitted mapping of raw item ids (integers or strings) to model ids.

    Example:
        >>> vocab = ItemVocab.fit(pa.array([7, 7, 9, 5]), min_count=1)
        >>> vocab.encode(pa.array([9, 7, 42])).ids.tolist()
        [3, 2, 1]
        >>> vocab.decode(np.array([3, 2])).to_pylist()
        [9, 7]
    """

    def __init__(self, raw_ids: pa.Array, counts: np.ndarray) -> None:
        if len(raw_ids) != len(counts):
            raise ValueError("raw_ids and counts must have the same length")
        if pc.count_distinct(raw_ids).as_py() != len(raw_ids):
            raise ValueError("vocabulary raw ids must be distinct")
        self.raw_ids = raw_ids
        self.counts = np.asarray(counts, dtype=np.int64)

    @classmethod
    def fit(cls, items: pa.Array | pa.ChunkedArray, min_count: int = 1, max_size: int | None = None) -> ItemVocab:
        """Count raw ids; keep those seen at least `min_count` times, the `max_size` most frequent.

        Ties in frequency are ordered by raw id, so fitting is deterministic.
        """
        if isinstance(items, pa.ChunkedArray):
            items = items.combine_chunks()
        if items.null_count:
            raise ValueError(
                f"item ids hold {items.null_count} nulls (e.g. page views without an item); "
                "drop them before fitting"
            )
        counts = pc.value_counts(items)
        raw = counts.field("values")
        cnt = counts.field("counts").to_numpy().astype(np.int64)
        order = pc.sort_indices(pa.table({"c": cnt, "r": raw}), sort_keys=[("c", "descending"), ("r", "ascending")])
        order = order.to_numpy()
        keep = order[cnt[order] >= min_count]
        if max_size is not None:
            keep = keep[:max_size]
        return cls(raw.take(pa.array(keep)), cnt[keep])

    def __len__(self) -> int:
        """Number of model ids, specials included: the size of the score vector."""
        return len(self.raw_ids) + NUM_SPECIAL

    def id_counts(self) -> np.ndarray:
        """(len(self),) training count per model id; 0 for padding and OOV."""
        return np.concatenate([np.zeros(NUM_SPECIAL, dtype=np.int64), self.counts])

    def encode(self, raw: pa.Array | pa.ChunkedArray) -> EncodeResult:
        """Map raw ids to model ids; unknown ids map to OOV and are counted."""
        if isinstance(raw, pa.ChunkedArray):
            raw = raw.combine_chunks()
        if raw.type != self.raw_ids.type:
            try:
                raw = raw.cast(self.raw_ids.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise TypeError(
                    f"item ids of type {raw.type} cannot be matched with a vocabulary of {self.raw_ids.type}"
                ) from err
        pos = pc.index_in(raw, value_set=self.raw_ids)
        known = pos.is_valid().to_numpy(zero_copy_only=False)
        ids = np.full(len(raw), OOV, dtype=np.int64)
        ids[known] = pos.drop_null().to_numpy().astype(np.int64) + NUM_SPECIAL
        return EncodeResult(ids=ids, num_unknown=int((~known).sum()))

    def decode(self, ids: np.ndarray) -> pa.Array:
        """Map model ids back to raw ids; padding and OOV ids decode to null."""
        ids = np.asarray(ids).reshape(-1)
        special = ids < NUM_SPECIAL
        out = self.raw_ids.take(pa.array(np.where(special, 0, ids - NUM_SPECIAL)))
        if special.any():
            out = pc.if_else(pa.array(special), pa.nulls(len(out), out.type), out)
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``raw_id``/``count`` parquet atomically (temporary name, then rename)."""
        with atomic_path(path) as tmp:
            pq.write_table(pa.table({"raw_id": self.raw_ids, "count": self.counts}), tmp)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> ItemVocab:
        table = pq.read_table(path)
        if table.column_names != ["raw_id", "count"]:
            raise ValueError(f"{path}: not a sessrec vocabulary (columns {table.column_names})")
        return cls(table.column("raw_id").combine_chunks(), table.column("count").to_numpy())

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ItemVocab)
            and self.raw_ids.equals(other.raw_ids)
            and np.array_equal(self.counts, other.counts)
        )
