"""Item vocabulary: raw item ids <-> contiguous model ids, fitted on training data only.

Id layout: 0 = padding, 1 = out-of-vocabulary (rare or unseen items), 2.. = items by
decreasing training frequency, then (optionally) the *virtual items* by decreasing frequency:
input-only tokens for events that carry no product (a search, a filter change), keyed by text
(Coveo SIGIR'21). Virtual ids form the contiguous range ``[len(vocab) - num_virtual, len(vocab))``;
`recommendable` marks the ids that may be targets and recommendations (the products). The fitted
vocabulary is saved as parquet in the model directory, so that scoring maps raw ids exactly as
training did and returns raw ids.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.columns import first_failing_cast, first_not_decimal
from sessrec.saved.atomic import ParquetFile

PAD = 0
OOV = 1
NUM_SPECIAL = 2
# Up to this many ids, `encode` looks them up in the vocabulary's keys sorted once (binary search,
# microseconds); beyond, it hashes the whole vocabulary for the call (`pc.index_in`), which pays off
# on a file but costs tens of milliseconds per call at a million items (one request of a few ids) and
# seconds at ten million: integer ids fewer than the keys / `SORTED_RATIO` are searched too (a
# million ids in 10M keys: 0.26 s, hashing 2.6 s; docs/catalogues.md). A binary
# search over Python strings does not pay off beyond a request.
SMALL_LOOKUP = 4096
SORTED_RATIO = 8


@dataclass
class EncodeResult:
    """Model ids (E,) and how many raw ids were unknown (mapped to OOV)."""

    ids: np.ndarray
    num_unknown: int


class ItemVocab(ParquetFile):
    """Fitted mapping of raw item ids (integers or strings) to model ids.

    Examples:
        >>> vocab = ItemVocab.fit(pa.array([7, 7, 9, 5]), min_count=1)  # 7 most frequent; 5 before 9 (a tie)
        >>> vocab.encode(pa.array([9, 7, 42])).ids.tolist()  # 42 unseen: 1 (OOV)
        [4, 2, 1]
        >>> vocab.decode(np.array([4, 2])).to_pylist()
        [9, 7]
    """

    def __init__(self, raw_ids: pa.Array, counts: np.ndarray, num_virtual: int = 0) -> None:
        if len(raw_ids) != len(counts):
            raise ValueError("raw_ids and counts must have the same length")
        if not 0 <= num_virtual <= len(raw_ids):
            raise ValueError(f"num_virtual must be in [0, {len(raw_ids)}], got {num_virtual}")
        split = len(raw_ids) - num_virtual
        for part in (raw_ids.slice(0, split), raw_ids.slice(split)):
            if not _distinct(part):
                raise ValueError("vocabulary raw ids must be distinct (products among themselves, virtual keys too)")
        self.raw_ids = raw_ids
        self.counts = np.asarray(counts, dtype=np.int64)
        self.num_virtual = int(num_virtual)

    @classmethod
    def empty(cls) -> ItemVocab:
        """A vocabulary of no items (padding and OOV only): what `load_state_dict` fills."""
        return cls(pa.array([], type=pa.int64()), np.zeros(0, dtype=np.int64))

    @classmethod
    def fit(
        cls,
        items: pa.Array | pa.ChunkedArray,
        min_count: int = 1,
        max_size: int | None = None,
        virtual: np.ndarray | None = None,
    ) -> ItemVocab:
        """Count raw ids; keep those seen at least `min_count` times, the `max_size` most frequent.

        Ties in frequency are ordered by raw id, so fitting is deterministic.

        Args:
            items: raw ids (E,) of the training events.
            min_count: minimum training count of a product or virtual key.
            max_size: most products kept (virtual keys are not capped).
            virtual: optional (E,) bool, True where `items` holds a virtual key rather than a
                product; those get the ids after the products. Virtual keys and products then
                share the raw id type (text, since virtual keys are).
        """
        if isinstance(items, pa.ChunkedArray):
            items = items.combine_chunks()
        if items.null_count:
            raise ValueError(
                f"item ids hold {items.null_count} nulls (e.g. page views without an item); "
                "drop them before fitting, or key them as virtual items"
            )
        if virtual is None or not np.any(virtual):
            raw, cnt = _counted(items, min_count, max_size)
            return cls(raw, cnt)
        virtual = np.asarray(virtual, dtype=bool)
        if virtual.shape != (len(items),):
            raise ValueError(f"virtual must be a ({len(items)},) bool mask, got shape {virtual.shape}")
        return cls.from_counts(
            count_items(items.filter(pa.array(~virtual))), count_items(items.filter(pa.array(virtual))), min_count, max_size
        )

    @classmethod
    def from_counts(
        cls, products: pa.Table, virtual: pa.Table | None = None, min_count: int = 1, max_size: int | None = None
    ) -> ItemVocab:
        """The vocabulary `fit` gives for events whose products and virtual keys occur as counted.

        Args:
            products: `count_items` of the product events (summed over parts by `sum_counts`).
            virtual: `count_items` of the virtual events; None or empty: there are none.
            min_count: minimum training count of a product or virtual key.
            max_size: most products kept.
        """
        raw, cnt = _ranked(products, min_count, max_size)
        if virtual is None or virtual.num_rows == 0:
            return cls(raw, cnt)
        vraw, vcnt = _ranked(virtual, min_count, None)
        return cls(pa.concat_arrays([raw, vraw.cast(raw.type)]), np.concatenate([cnt, vcnt]), num_virtual=len(vraw))

    def grow(self, items: pa.Array | pa.ChunkedArray, min_count: int = 1) -> tuple[ItemVocab, np.ndarray]:
        """This vocabulary plus the products of `items` it lacks (seen `min_count` times), for retraining.

        Every known product keeps its model id; the new products get the ids after them (by
        decreasing count, then raw id), and the virtual items move up behind those. Counts add
        the new events to the old.

        Returns:
            the grown vocabulary, and (len(self),) int64: the new model id of every old model id.
        """
        items = items.combine_chunks() if isinstance(items, pa.ChunkedArray) else items
        items = items.drop_null().cast(self.raw_ids.type)
        seen = self.encode(items).ids  # (E,) model ids, OOV for the new products
        raw, cnt = _counted(items.filter(pa.array(seen == OOV)), min_count, None)
        added = np.bincount(seen, minlength=len(self))[NUM_SPECIAL:]
        products = slice(0, self.num_products)
        virtual = slice(self.num_products, None)
        grown = ItemVocab(
            pa.concat_arrays([self.raw_ids.slice(0, self.num_products), raw, self.raw_ids.slice(self.num_products)]),
            np.concatenate([self.counts[products] + added[products], cnt, self.counts[virtual] + added[virtual]]),
            self.num_virtual,
        )
        old_to_new = np.arange(len(self), dtype=np.int64)
        old_to_new[NUM_SPECIAL + self.num_products :] += len(raw)
        return grown, old_to_new

    def check_products(self, min_count: int, source: str) -> None:
        """Refuse in one line a vocabulary that `min_count` (the data module's ``min_item_count``) left without a
        product: a model of it would have nothing to recommend. `source`: the training split's file, for the message."""
        if self.num_products == 0:
            raise ValueError(f"{source}: min_item_count {min_count} keeps no item of the training split (none occurs "
                             f"{min_count} times), so there is nothing to recommend; lower min_item_count")

    def __len__(self) -> int:
        """Number of model ids, specials and virtual items included: the size of the score vector."""
        return len(self.raw_ids) + NUM_SPECIAL

    @property
    def num_products(self) -> int:
        """Items that can be recommended (ids ``2 .. 2 + num_products - 1``)."""
        return len(self.raw_ids) - self.num_virtual

    def recommendable(self) -> np.ndarray:
        """(len(self),) bool: True for product ids; False for padding, OOV and virtual items."""
        mask = np.zeros(len(self), dtype=bool)
        mask[NUM_SPECIAL : NUM_SPECIAL + self.num_products] = True
        return mask

    def id_counts(self) -> np.ndarray:
        """(len(self),) training count per model id; 0 for padding and OOV."""
        return np.concatenate([np.zeros(NUM_SPECIAL, dtype=np.int64), self.counts])

    def encode(
        self, raw: pa.Array | pa.ChunkedArray | list | np.ndarray, virtual: np.ndarray | None = None,
        source: str | None = None,
    ) -> EncodeResult:
        """Map raw ids to model ids; unknown ids map to OOV and are counted.

        Args:
            raw: raw ids (E,): an Arrow array, or a list or numpy array of ids (read by ``pa.array``).
            virtual: optional (E,) bool, True where `raw` holds a virtual key: those are looked
                up among the virtual keys only, the others among the products only.
            source: where `raw` comes from (file and column), for the message of a type mismatch.

        Raises:
            TypeError: when ids of another type than the vocabulary's do not all cast to it
                (text ids against an int64 vocabulary; the message names the first such id), or text ids
                of an int64 vocabulary are not written as its decimals (``"01050"``), or
                `raw` is no sequence of ids of one type (a string, a 2-d array, ints mixed with text).
        """
        raw = _as_arrow(raw, source)
        if raw.type != self.raw_ids.type:
            bad = first_failing_cast(raw, self.raw_ids.type)
            if bad is not None:
                where = f"{source}: " if source else ""
                raise TypeError(
                    f"{where}item ids of type {raw.type} cannot be matched with a vocabulary of {self.raw_ids.type}: "
                    f"{_shown(raw[bad].as_py())} is not a valid {self.raw_ids.type} id; give the ids with the type the "
                    "model was trained on"
                )
            cast = raw.cast(self.raw_ids.type)
            if pa.types.is_integer(cast.type) and (pa.types.is_string(raw.type) or pa.types.is_large_string(raw.type)):
                self._check_decimals(raw, cast, source)
            raw = cast
        n_prod = self.num_products
        ids = np.full(len(raw), OOV, dtype=np.int64)
        if virtual is None:
            virtual = np.zeros(len(raw), dtype=bool)
        virtual = np.asarray(virtual, dtype=bool)
        for is_virtual, first, keys in (
            (False, NUM_SPECIAL, self.raw_ids.slice(0, n_prod)),
            (True, NUM_SPECIAL + n_prod, self.raw_ids.slice(n_prod)),
        ):
            rows = np.flatnonzero(virtual == is_virtual)
            if len(rows) == 0:
                continue
            values = raw if len(rows) == len(raw) else raw.take(pa.array(rows))
            few = len(rows) <= SMALL_LOOKUP or (pa.types.is_integer(values.type) and len(rows) * SORTED_RATIO <= len(keys))
            if few and _searchable(values.type):
                valid = values.is_valid().to_numpy(zero_copy_only=False)
                pos = self._sorted_keys(is_virtual).positions(values.drop_null())
                ids[rows[valid][pos >= 0]] = pos[pos >= 0] + first
            else:
                pos = pc.index_in(values, value_set=keys)
                known = pos.is_valid().to_numpy(zero_copy_only=False)
                ids[rows[known]] = pos.drop_null().to_numpy().astype(np.int64) + first
        return EncodeResult(ids=ids, num_unknown=int((ids == OOV).sum()))

    @staticmethod
    def _check_decimals(text: pa.Array, ints: pa.Array, source: str | None) -> None:
        """Refuse a text id that Arrow casts to an integer id but that is not written as that id's decimal
        (``"01050"`` and ``"0x41a"`` cast to 1050): it names another item than the one it reads as."""
        at = first_not_decimal(text, ints)
        if at is not None:
            where = f"{source}: " if source else ""
            raise TypeError(
                f"{where}item ids of type {text.type} cannot be matched with a vocabulary of {ints.type}: "
                f"{_shown(text[at].as_py())} is not written as the vocabulary's {ints.type} ids are (no leading zeros, '+' "
                f"or spaces); give {str(ints[at].as_py())!r} or {ints[at].as_py()}"
            )

    def encode_ints(self, raw: np.ndarray) -> EncodeResult:
        """`encode` of a few int64 product ids given as numpy (a request's): a binary search of the sorted
        products, without Arrow arrays; the vocabulary's ids must be int64."""
        if self.raw_ids.type != pa.int64():
            raise TypeError(f"encode_ints needs a vocabulary of int64 ids, this one has {self.raw_ids.type}")
        ids = np.full(len(raw), OOV, dtype=np.int64)
        pos = self._sorted_keys(False).positions(np.asarray(raw, dtype=np.int64))
        ids[pos >= 0] = pos[pos >= 0] + NUM_SPECIAL
        return EncodeResult(ids=ids, num_unknown=int((ids == OOV).sum()))

    def _sorted_keys(self, virtual: bool) -> _SortedKeys:
        """The product keys (or the virtual keys) sorted, built at the first small lookup and kept
        for these very `raw_ids` (`load_state_dict` replaces them: the keys are sorted again)."""
        of, num_virtual, cache = self.__dict__.get("_sorted", (None, None, {}))
        if of is not self.raw_ids or num_virtual != self.num_virtual:
            cache = {}
            self.__dict__["_sorted"] = (self.raw_ids, self.num_virtual, cache)
        if virtual not in cache:
            n = self.num_products
            cache[virtual] = _SortedKeys(self.raw_ids.slice(n) if virtual else self.raw_ids.slice(0, n))
        return cache[virtual]

    def decode(self, ids: np.ndarray) -> pa.Array:
        """Map model ids back to raw ids; padding, OOV and virtual ids decode to null."""
        ids = np.asarray(ids).reshape(-1)
        special = (ids < NUM_SPECIAL) | (ids >= NUM_SPECIAL + self.num_products)
        out = self.raw_ids.take(pa.array(np.where(special, 0, ids - NUM_SPECIAL)))
        if special.any():
            out = pc.if_else(pa.array(special), pa.nulls(len(out), out.type), out)
        return out

    def decode_list(self, ids: np.ndarray) -> list[Any]:
        """`decode` as a Python list (None for padding, OOV and virtual ids); an int64 vocabulary's read
        through numpy, without Arrow arrays (a response's few ids)."""
        if self.raw_ids.type != pa.int64() or self.raw_ids.null_count:
            return self.decode(ids).to_pylist()
        ids = np.asarray(ids).reshape(-1)
        special = (ids < NUM_SPECIAL) | (ids >= NUM_SPECIAL + self.num_products)
        out = self.raw_ids.to_numpy()[np.where(special, NUM_SPECIAL, ids) - NUM_SPECIAL].tolist()
        for at in np.flatnonzero(special).tolist():
            out[at] = None
        return out

    def to_table(self) -> pa.Table:
        """``raw_id``/``count`` (and ``virtual`` if any) columns, one row per product then virtual item."""
        cols = {"raw_id": self.raw_ids, "count": self.counts}
        if self.num_virtual:
            cols["virtual"] = np.arange(len(self.raw_ids)) >= self.num_products
        return pa.table(cols)

    @classmethod
    def from_table(cls, table: pa.Table, source: str | os.PathLike) -> ItemVocab:
        """The vocabulary a `to_table` table holds; `source` names it in errors."""
        if table.column_names not in (["raw_id", "count"], ["raw_id", "count", "virtual"]):
            raise ValueError(f"{source}: not a sessrec vocabulary (columns {table.column_names})")
        num_virtual = 0
        if "virtual" in table.column_names:
            flags = table.column("virtual").to_numpy(zero_copy_only=False).astype(bool)
            num_virtual = int(flags.sum())
            if not np.array_equal(flags, np.arange(len(flags)) >= len(flags) - num_virtual):
                raise ValueError(f"{source}: column 'virtual' must mark a final run of rows (the virtual ids)")
        return cls(table.column("raw_id").combine_chunks(), table.column("count").to_numpy(), num_virtual)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ItemVocab)
            and self.raw_ids.equals(other.raw_ids)
            and np.array_equal(self.counts, other.counts)
            and self.num_virtual == other.num_virtual
        )


def _distinct(keys: pa.Array) -> bool:
    """Whether `keys` holds no null and no value twice. Integers are sorted by numpy, ten times
    faster than Arrow's hashing (`pc.count_distinct`) at 10M ids."""
    if keys.null_count:
        return False
    if pa.types.is_integer(keys.type):
        ordered = np.sort(keys.to_numpy())
        return not (ordered[1:] == ordered[:-1]).any()
    return len(pc.unique(keys)) == len(keys)


def _searchable(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)


class _SortedKeys:
    """Distinct keys (integers or strings) sorted for binary search: `positions` of a few values."""

    def __init__(self, keys: pa.Array) -> None:
        order = pc.sort_indices(keys)  # byte order of UTF-8 is code-point order: Python's str order
        self.order = order.to_numpy().astype(np.int64)
        self.keys = keys.take(order).to_numpy(zero_copy_only=False)

    def positions(self, values: pa.Array | np.ndarray) -> np.ndarray:
        """(E,) position of each value (no nulls) among the keys as given, -1 where absent."""
        query = values if isinstance(values, np.ndarray) else values.to_numpy(zero_copy_only=False)
        if not len(self.keys):
            return np.full(len(query), -1, dtype=np.int64)
        # the values in order: numpy starts each binary search where the previous one ended, so the
        # searches walk the keys once (a million searches in 10M keys: several times faster than in random order)
        order = np.argsort(query)
        at = np.empty(len(query), dtype=np.int64)
        at[order] = np.searchsorted(self.keys, query[order])
        at = np.minimum(at, len(self.keys) - 1)
        return np.where(self.keys[at] == query, self.order[at], -1)


def _host(values: Any) -> np.ndarray:
    """A tensor (on any device) or array as a host numpy array."""
    return values.cpu().numpy() if hasattr(values, "cpu") else np.asarray(values)


def _filled(items: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, k) model ids and scores -> the ids and float32 scores of the filled slots (special ids, the empty
    slots, dropped), row-major: each row's in order, and (B + 1,) offsets of the rows."""
    items, scores = _host(items), _host(scores)
    filled = items >= NUM_SPECIAL  # (B, k)
    return items[filled], scores[filled].astype(np.float32), np.concatenate([[0], np.cumsum(filled.sum(axis=1))])


def _as_arrow(raw: Any, source: str | None) -> pa.Array:
    """Raw ids as one Arrow array: an Arrow array as it is (chunks combined), a list or numpy array by ``pa.array``."""
    if isinstance(raw, pa.ChunkedArray):
        return raw.combine_chunks()
    if isinstance(raw, pa.Array):
        return raw
    where = f"{source}: " if source else ""
    if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
        raise TypeError(f"{where}raw ids must be an Arrow array, a list or a numpy array of ids, got {type(raw).__name__}")
    try:
        return pa.array(raw)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise TypeError(f"{where}raw ids are not one array of ids of one type: {' '.join(str(err).split())}") from None


def decode_lists(vocab: ItemVocab, items: Any, scores: Any) -> tuple[pa.ListArray, pa.ListArray]:
    """(B, k) model ids and scores -> (B,) lists of raw ids and float32 scores; special ids (empty slots) dropped."""
    ids, values, offsets = _filled(items, scores)
    offsets = pa.array(offsets.astype(np.int32))
    return pa.ListArray.from_arrays(offsets, vocab.decode(ids)), pa.ListArray.from_arrays(offsets, pa.array(values))


def decode_dicts(vocab: ItemVocab, items: Any, scores: Any) -> list[dict[str, list]]:
    """Per row ``{"item_ids": [...], "scores": [...]}`` (raw ids, best first): `decode_lists` as Python lists,
    built without Arrow arrays (`ItemVocab.decode_list`)."""
    ids, values, offsets = _filled(items, scores)
    ids, values, offsets = vocab.decode_list(ids), values.tolist(), offsets.tolist()
    return [{"item_ids": ids[lo:hi], "scores": values[lo:hi]} for lo, hi in zip(offsets[:-1], offsets[1:])]


def count_items(items: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``raw_id``/``count``: the distinct values of `items` and how often each occurs (any order).

    Counts of parts of the training events add up (`sum_counts`) to the counts of all of them,
    which `ItemVocab.from_counts` ranks as `ItemVocab.fit` ranks the events.
    """
    counts = pc.value_counts(items)
    return pa.table({"raw_id": counts.field("values"), "count": counts.field("counts").cast(pa.int64())})


def sum_counts(parts: list[pa.Table]) -> pa.Table:
    """The `count_items` tables of several parts of the events, summed per raw id (any order)."""
    if len(parts) == 1:  # a count table's raw ids are distinct already
        return parts[0]
    table = pa.concat_tables(parts)
    summed = table.group_by("raw_id").aggregate([("count", "sum")])
    return pa.table({"raw_id": summed.column("raw_id"), "count": summed.column("count_sum")})


def _counted(items: pa.Array, min_count: int, max_size: int | None) -> tuple[pa.Array, np.ndarray]:
    """Distinct values of `items` seen at least `min_count` times, by decreasing count then value."""
    return _ranked(count_items(items), min_count, max_size)


def _ranked(counts: pa.Table, min_count: int, max_size: int | None) -> tuple[pa.Array, np.ndarray]:
    """The raw ids of a `count_items` table seen at least `min_count` times, by decreasing count then
    raw id (the `max_size` first), and their counts."""
    raw = counts.column("raw_id").combine_chunks()
    cnt = counts.column("count").to_numpy().astype(np.int64)
    order = pc.sort_indices(pa.table({"c": cnt, "r": raw}), sort_keys=[("c", "descending"), ("r", "ascending")])
    order = order.to_numpy()
    keep = order[cnt[order] >= min_count]
    if max_size is not None:
        keep = keep[:max_size]
    return raw.take(pa.array(keep)), cnt[keep]


def _shown(value: Any) -> str:
    """An id for a one-line message: its repr, cut to 60 characters (a request may send one of a megabyte)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def vocab_difference(saved: ItemVocab, used: ItemVocab) -> str:
    """What differs between a checkpoint's vocabulary (`saved`) and the one in use, in words: the number of
    ids, of virtual ids, the first id that stands for another item, or else the first item counted otherwise."""
    if len(saved) != len(used) or saved.num_virtual != used.num_virtual:
        virtual = f", {saved.num_virtual} and {used.num_virtual} of them virtual" if saved.num_virtual != used.num_virtual else ""
        return f"{len(saved)} ids in the checkpoint, {len(used)} here{virtual}"
    theirs, mine = saved.raw_ids.to_pylist(), used.raw_ids.to_pylist()
    differ = [i for i, (a, b) in enumerate(zip(theirs, mine, strict=True)) if a != b or type(a) is not type(b)]
    if differ:
        i = differ[0]
        return (f"both have {len(saved)} ids, but {len(differ)} of them stand for other items: id {i + NUM_SPECIAL} is "
                f"item {theirs[i]!r} in the checkpoint, {mine[i]!r} here")
    i = int(np.flatnonzero(saved.counts != used.counts)[0])
    return (f"the same {len(saved)} ids of the same items, counted on other sessions: item {theirs[i]!r} "
            f"{saved.counts[i]} times in the checkpoint, {used.counts[i]} here")
