"""Fitted feature operations: the `FeatureOp` base, fitted keys, and the column encoders.

The contract of an operation (typed constructor as config, ``fit`` / ``transform`` /
``fit_transform``, frames and array backends) is described once, in `sessrec.features`.

Shape letters: E events (rows), K distinct keys of a fitted column, N sessions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.vocab import NUM_SPECIAL, OOV, PAD, ItemVocab
from sessrec.features.backend import (
    Array,
    Column,
    bincount,
    check_nulls,
    device,
    finite_floats,
    first_bad,
    from_host,
    gather,
    get_column,
    hash_columns,
    integer_values,
    namespace,
    on_backend_of,
    to_host,
)
from sessrec.saved.registry import Configurable, config_of

TimeUnit = Literal["s", "ms"]
_SECONDS = {"s": 1.0, "ms": 1e-3}
FORMAT = "sessrec.features"


class NotFittedError(ValueError):
    """An operation that learns from data was asked to transform before `fit`."""


# ---------------------------------------------------------------------------------- fitted keys
@dataclass
class _Keys:
    """Distinct non-null values of a training column, sorted, with their counts (K,).

    `values` is an int64 numpy array, or a pyarrow string array for text columns (sorted by
    Arrow's byte order, as `ItemVocab` sorts ties).
    """

    values: np.ndarray | pa.Array
    counts: np.ndarray

    @classmethod
    def fit(cls, col: Column) -> _Keys:
        if col.is_text:
            vc = pc.value_counts(col.values.drop_null())
            order = pc.sort_indices(vc.field("values"))
            keys = vc.field("values").take(order)
            return cls(keys, vc.field("counts").take(order).to_numpy().astype(np.int64))
        x = integer_values(col)
        xp = namespace(x)
        if col.valid is not None:
            x = x[col.valid]
        uniq = xp.unique_counts(x)
        order = xp.argsort(uniq.values, stable=True)  # the standard leaves unique's order open
        counts = xp.astype(xp.take(uniq.counts, order), xp.int64)
        return cls(to_host(xp.take(uniq.values, order)), to_host(counts))

    def lookup(self, col: Column, like: Array | None = None) -> Array:
        """Position (E,) of each value among the keys; -1 for unseen values and nulls."""
        if col.is_text != isinstance(self.values, pa.Array):
            col = _as_kind(col, self.values)
        if col.is_text:
            codes = pc.index_in(col.values, value_set=self.values).fill_null(-1)
            codes = codes.to_numpy(zero_copy_only=False).astype(np.int64)
            return codes if like is None else on_backend_of(codes, like)
        x = integer_values(col)
        xp = namespace(x)
        keys = from_host(self.values, x)
        if keys.shape[0] == 0:
            return xp.full(x.shape, -1, dtype=xp.int64, device=device(x))
        pos = xp.clip(xp.searchsorted(keys, x), 0, keys.shape[0] - 1)
        hit = xp.take(keys, pos) == x
        if col.valid is not None:
            hit = hit & col.valid
        codes = xp.where(hit, pos, -1)
        return codes if like is None else on_backend_of(codes, like)

    def state_dict(self) -> dict[str, np.ndarray]:
        if not isinstance(self.values, pa.Array):
            return {"keys": self.values, "counts": self.counts}
        # Arrow's own layout, so no pickling: UTF-8 bytes and int64 offsets (K + 1,)
        large = self.values.cast(pa.large_string())
        _, offsets, data = large.buffers()
        offsets = np.frombuffer(offsets, dtype=np.int64)[large.offset : large.offset + len(large) + 1]
        data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        text = {"text_offsets": offsets - offsets[0], "text_data": data[offsets[0] : offsets[-1]]}
        return {**text, "counts": self.counts}

    @classmethod
    def from_arrays(cls, state: Mapping[str, np.ndarray]) -> _Keys:
        """The keys a `state_dict` holds."""
        if "keys" in state:
            return cls(state["keys"], state["counts"])
        offsets, data = state["text_offsets"], state["text_data"]
        text = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))
        return cls(text.cast(pa.string()), state["counts"])


INTEGER_TEXT = r"^-?(0|[1-9][0-9]{0,37})$"  # the decimal text of an integer, as Arrow casts it back


def _as_kind(col: Column, keys: np.ndarray | pa.Array) -> Column:
    """Column `col` in the kind of the fitted `keys` (integers, or text as a text file's codes are read), a code's
    identity being its decimal text: integer codes as their text (fitted on a CSV, scoring a parquet file's
    integers); text codes as the integers they write canonically (fitted on integers, scoring a CSV), other text
    (``01``, ``x``) a code never seen, never another code's: ``01`` is not category 1. Refused when the two kinds
    share no code at all (text codes of which none is an integer's, or integers against text keys of which none
    is): another column, not another spelling."""
    fitted = "text" if isinstance(keys, pa.Array) else "integer"
    refused = TypeError(f"column {col.name!r} was fitted on {fitted} values; now it holds another kind, none of its "
                        "codes an integer's decimal text")
    if isinstance(keys, pa.Array):
        if not pc.any(pc.match_substring_regex(keys, INTEGER_TEXT)).as_py():
            raise refused
        values = pa.array(to_host(integer_values(col)), mask=None if col.valid is None else ~to_host(col.valid))
        return Column(col.name, values.cast(pa.string()))
    canonical = pc.fill_null(pc.match_substring_regex(col.values, INTEGER_TEXT), False)
    if col.values.null_count < len(col.values) and not pc.any(canonical).as_py():
        raise refused
    number = pc.cast(pc.if_else(canonical, col.values, "0"), pa.decimal128(38, 0))
    low, high = (pa.scalar(Decimal(bound), pa.decimal128(38, 0)) for bound in (-(2**63), 2**63 - 1))
    fits = pc.and_(canonical, pc.and_(pc.greater_equal(number, low), pc.less_equal(number, high)))
    values = pc.cast(pc.if_else(fits, number, low), pa.int64())
    return Column(col.name, values.to_numpy(zero_copy_only=False), fits.to_numpy(zero_copy_only=False))


# ------------------------------------------------------------------------------------ operations
class FeatureOp(Configurable):
    """Base of all operations: constructor arguments are the config; `fit` learns, `transform` applies.

    Every subclass registers itself and records its constructor arguments (`Configurable`), so a
    saved pipeline rebuilds it with `sessrec.saved.registry.instantiate`; what `fit` learned is
    its `state_dict` (named numpy arrays), taken back by `load_state_dict`. Stateless operations
    (time features, hashing) need no `fit`; stateful ones raise `NotFittedError` when
    transforming before it.
    """

    stateful: ClassVar[bool] = False  # learns in `fit`, saves arrays

    def fit(self, frame: Any) -> FeatureOp:
        return self

    def transform(self, frame: Any) -> Any:
        raise NotImplementedError

    def fit_transform(self, frame: Any) -> Any:
        """Fit on the training frame and return its features (out-of-fold where it matters)."""
        return self.fit(frame).transform(frame)

    def state_dict(self) -> dict[str, np.ndarray]:
        """What `fit` learned, as named numpy arrays (nothing for a stateless operation)."""
        return {}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> FeatureOp:
        """Take what a `state_dict` of an operation of the same config holds; returns self."""
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in config_of(self)["init_args"].items())
        return f"{type(self).__name__}({args})"

    def _fitted(self, value: Any) -> Any:
        if value is None:
            raise NotFittedError(f"{self!r} is not fitted: fit() on training data (or load a fitted FeaturePipeline)")
        return value


class _KeyedOp(FeatureOp):
    """An operation whose state is a `_Keys` table of one categorical column plus derived arrays."""

    stateful = True
    column: str
    keys_: _Keys | None = None

    def state_dict(self) -> dict[str, np.ndarray]:
        return self._fitted(self.keys_).state_dict()

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> _KeyedOp:
        self.keys_ = _Keys.from_arrays(state)
        return self


class Categorify(_KeyedOp):
    """Map categories to contiguous ids with frequency capping: `ItemVocab`'s id layout.

    0 is padding (and null, with ``nulls="pad"``), 1 is out-of-vocabulary (rare or unseen
    values), 2.. are values by decreasing training count, ties by value; `to_vocab` returns the
    equivalent `ItemVocab`. Output: int64 ids (E,).

    Args:
        column: integer or string column.
        min_count: keep values seen at least this often in training.
        max_size: keep at most this many values (the most frequent).
        nulls: ``error`` refuses nulls; ``pad`` maps them to 0.

    Examples:
        >>> Categorify("c", min_count=2).fit({"c": np.array([5, 7, 5, 9, 7, 5])}).transform(
        ...     {"c": np.array([7, 5, 9, 4])}).tolist()
        [3, 2, 1, 1]
    """

    def __init__(
        self,
        column: str,
        min_count: int = 1,
        max_size: int | None = None,
        nulls: Literal["error", "pad"] = "error",
    ) -> None:
        if min_count < 1 or (max_size is not None and max_size < 0):
            raise ValueError(f"Categorify({column!r}): min_count must be >= 1 and max_size >= 0")
        self.column, self.min_count, self.max_size, self.nulls = column, min_count, max_size, nulls
        self.keys_ = None
        self.ids_: np.ndarray | None = None

    def fit(self, frame: Any) -> Categorify:
        col = get_column(frame, self.column)
        check_nulls(col, self.nulls, "nulls='pad'")
        return self.load_state_dict(_Keys.fit(col).state_dict())

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> Categorify:
        super().load_state_dict(state)
        counts = np.asarray(state["counts"])  # (K,) a small host table: plain NumPy
        order = np.argsort(-counts, kind="stable")  # keys are sorted, so ties go to the smaller value
        kept = int(np.sum(counts >= self.min_count))
        if self.max_size is not None:
            kept = min(kept, self.max_size)
        self.ids_ = np.full(counts.shape, OOV, dtype=np.int64)
        self.ids_[order[:kept]] = np.arange(NUM_SPECIAL, NUM_SPECIAL + kept)
        return self

    def transform(self, frame: Any) -> Array:
        keys = self._fitted(self.keys_)
        col = get_column(frame, self.column)
        check_nulls(col, self.nulls, "nulls='pad'")
        codes = keys.lookup(col)
        ids = gather(from_host(self.ids_, codes), codes, OOV)
        if col.valid is not None:
            ids = namespace(ids).where(on_backend_of(col.valid, ids), ids, PAD)
        return ids

    @property
    def num_ids(self) -> int:
        """Size of an embedding table for the output: kept values plus padding and OOV."""
        return int(np.sum(self._fitted(self.ids_) >= NUM_SPECIAL)) + NUM_SPECIAL

    def to_vocab(self) -> ItemVocab:
        """The same mapping as an `ItemVocab` (raw ids in id order, with their counts)."""
        keys = self._fitted(self.keys_)
        kept = np.flatnonzero(self.ids_ >= NUM_SPECIAL)
        kept = kept[np.argsort(self.ids_[kept])]
        values = keys.values
        raw = values.take(pa.array(kept)) if isinstance(values, pa.Array) else pa.array(values[kept])
        return ItemVocab(raw, keys.counts[kept])


class CountEncoding(_KeyedOp):
    """Training count of each row's value; unseen values (and nulls with ``nulls="unseen"``) get 0.

    Output: int64 counts (E,).
    """

    def __init__(self, column: str, nulls: Literal["error", "unseen"] = "error") -> None:
        self.column, self.nulls = column, nulls
        self.keys_ = None

    def fit(self, frame: Any) -> CountEncoding:
        col = get_column(frame, self.column)
        check_nulls(col, self.nulls, "nulls='unseen'")
        self.keys_ = _Keys.fit(col)
        return self

    def transform(self, frame: Any) -> Array:
        keys = self._fitted(self.keys_)
        col = get_column(frame, self.column)
        check_nulls(col, self.nulls, "nulls='unseen'")
        codes = keys.lookup(col)
        return gather(from_host(keys.counts, codes), codes, 0)


class TargetEncoding(_KeyedOp):
    """Smoothed mean of a target per category: ``(sum + m * prior) / (count + m)``.

    `transform` uses the statistics of the whole training split and its mean as the prior;
    unseen values (and nulls with ``nulls="unseen"``) get the prior. `fit_transform` gives the
    training rows out-of-fold values: a row in fold k sees the sums, counts and prior of the
    training rows outside fold k only, so its own target never enters its feature. The fold of
    a row is ``hash_columns([key], n_folds, seed)`` of its `fold_by` value (rows of one session
    share a fold; text keys enter as their rank among the sorted distinct keys), or of its row
    number when `fold_by` is None. Output: float64 (E,).

    Args:
        column: categorical column to encode.
        target: binary or continuous target column (finite numbers).
        fold_by: column whose equal values share a fold, e.g. the session id.
        n_folds: number of folds K (>= 2).
        smoothing: prior weight m (>= 0).
        seed: seed of the fold hash.
        nulls: ``error`` refuses nulls in `column`; ``unseen`` treats them as unseen values.
    """

    def __init__(
        self,
        column: str,
        target: str,
        fold_by: str | None = None,
        n_folds: int = 5,
        smoothing: float = 10.0,
        seed: int = 0,
        nulls: Literal["error", "unseen"] = "error",
    ) -> None:
        if n_folds < 2:
            raise ValueError(f"TargetEncoding({column!r}): n_folds must be >= 2, got {n_folds}")
        if not smoothing >= 0:
            raise ValueError(f"TargetEncoding({column!r}): smoothing must be >= 0, got {smoothing}")
        self.column, self.target, self.fold_by = column, target, fold_by
        self.n_folds, self.smoothing, self.seed, self.nulls = n_folds, float(smoothing), seed, nulls
        self.keys_ = None
        self.sums_: np.ndarray | None = None
        self.prior_: float | None = None

    def folds(self, frame: Any) -> Array:
        """Fold id (E,) in ``[0, n_folds)`` of each row, deterministic for the seed."""
        if self.fold_by is None:
            target = finite_floats(get_column(frame, self.target), "a target")
            xp = namespace(target)
            key = xp.arange(target.shape[0], dtype=xp.int64, device=device(target))
        else:
            col = get_column(frame, self.fold_by)
            check_nulls(col, "error", "a fold_by column without nulls")
            key = _Keys.fit(col).lookup(col) if col.is_text else integer_values(col)
        return hash_columns([key], self.n_folds, self.seed)

    def _stats(self, frame: Any) -> tuple[Column, Array, Array]:
        col = get_column(frame, self.column)
        check_nulls(col, self.nulls, "nulls='unseen'")
        y = finite_floats(get_column(frame, self.target), "a target")
        return col, y, namespace(y)

    def fit(self, frame: Any) -> TargetEncoding:
        self._fit(frame)
        return self

    def _fit(self, frame: Any) -> tuple[Array, Array, Array]:
        col, y, xp = self._stats(frame)
        if y.shape[0] == 0:
            raise ValueError(f"TargetEncoding({self.column!r}): no training rows")
        keys = _Keys.fit(col)
        codes = keys.lookup(col, like=y)
        seen = codes >= 0
        safe = xp.where(seen, codes, 0)  # a valid index for every row; `seen` masks the rest
        self.keys_ = keys
        self.sums_ = to_host(bincount(safe, keys.counts.shape[0], xp.where(seen, y, 0.0)))
        self.prior_ = float(xp.mean(y))
        return codes, y, safe

    def _encode(self, sums: Array, counts: Array, prior: Array) -> Array:
        xp = namespace(sums)
        den = counts + self.smoothing
        den_ok = den > 0  # only with smoothing 0 and no data: the prior alone
        value = (sums + self.smoothing * prior) / xp.where(den_ok, den, xp.ones_like(den))
        return xp.where(den_ok, value, prior)

    def transform(self, frame: Any) -> Array:
        keys = self._fitted(self.keys_)
        col = get_column(frame, self.column)
        check_nulls(col, self.nulls, "nulls='unseen'")
        codes = keys.lookup(col)
        xp = namespace(codes)
        sums = gather(from_host(self.sums_, codes), codes, 0.0)
        counts = xp.astype(gather(from_host(keys.counts, codes), codes, 0), xp.float64)
        return self._encode(sums, counts, xp.asarray(self.prior_, dtype=xp.float64, device=device(codes)))

    def fit_transform(self, frame: Any) -> Array:
        codes, y, safe = self._fit(frame)
        xp = namespace(y)
        k = self.n_folds
        fold = on_backend_of(self.folds(frame), y)
        seen = codes >= 0
        cell = safe * k + fold  # (code, fold) cell of each row
        size = self.keys_.counts.shape[0] * k
        cell_sum = bincount(cell, size, xp.where(seen, y, 0.0))
        cell_cnt = bincount(cell, size, xp.astype(seen, xp.float64))
        tot_sum = from_host(self.sums_, y)
        tot_cnt = xp.astype(from_host(self.keys_.counts, y), xp.float64)
        fold_sum, fold_cnt = bincount(fold, k, y), bincount(fold, k)
        out_cnt = xp.astype(y.shape[0] - fold_cnt, xp.float64)
        prior = xp.where(
            out_cnt > 0, (xp.sum(y) - fold_sum) / xp.where(out_cnt > 0, out_cnt, 1.0), self.prior_
        )  # (K,) out-of-fold prior; an empty outside (one session in all) falls back to the full mean
        if size == 0:  # no category seen at all (every value null): the prior alone
            return xp.take(prior, fold)
        sums = xp.where(seen, xp.take(tot_sum, safe) - xp.take(cell_sum, cell), 0.0)
        counts = xp.where(seen, xp.take(tot_cnt, safe) - xp.take(cell_cnt, cell), 0.0)
        return self._encode(sums, counts, xp.take(prior, fold))

    def state_dict(self) -> dict[str, np.ndarray]:
        prior = np.asarray([self.prior_], dtype=np.float64)
        return {**super().state_dict(), "sums": self.sums_, "prior": prior}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> TargetEncoding:
        super().load_state_dict(state)
        self.sums_, self.prior_ = np.asarray(state["sums"]), float(state["prior"][0])
        return self


class LogNormalize(FeatureOp):
    """``(log1p(x) - mean) / std`` with the training mean and (population) std of ``log1p(x)``.

    A constant training column has std 0 and is only centred (std taken as 1).

    Args:
        column: continuous column (finite numbers).
        negatives: ``error`` refuses negative values (log1p is undefined below -1 and
            meaningless for counts/prices below 0); ``clip`` maps them to 0 first.
    """

    stateful = True

    def __init__(self, column: str, negatives: Literal["error", "clip"] = "error") -> None:
        self.column, self.negatives = column, negatives
        self.mean_: float | None = None
        self.std_: float | None = None

    def _log(self, frame: Any) -> Array:
        col = get_column(frame, self.column)
        x = finite_floats(col, "log-normalisation")
        xp = namespace(x)
        if self.negatives == "clip":
            x = xp.clip(x, 0.0, None)
        elif bool(xp.any(x < 0)):
            value, row = first_bad(col, x < 0)
            raise ValueError(
                f"column {col.name!r} has a negative value {value!r} at row {row}; "
                "log-normalisation needs values >= 0 (or set negatives='clip')"
            )
        return xp.log1p(x)

    def fit(self, frame: Any) -> LogNormalize:
        z = self._log(frame)
        if z.shape[0] == 0:
            raise ValueError(f"LogNormalize({self.column!r}): no training rows")
        xp = namespace(z)
        std = float(xp.std(z, correction=0))
        self.mean_, self.std_ = float(xp.mean(z)), std if std > 0 else 1.0
        return self

    def transform(self, frame: Any) -> Array:
        mean, std = self._fitted(self.mean_), self._fitted(self.std_)
        return (self._log(frame) - mean) / std

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"mean_std": np.asarray([self._fitted(self.mean_), self.std_], dtype=np.float64)}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> LogNormalize:
        self.mean_, self.std_ = (float(v) for v in state["mean_std"])
        return self


class AsGiven(FeatureOp):
    """A continuous column used as it is, e.g. one normalised upstream (NVTabular's ``Normalize``); stateless.

    Output: float64 values (E,); nulls and non-finite values are refused (`finite_floats`).
    """

    def __init__(self, column: str) -> None:
        self.column = column

    def transform(self, frame: Any) -> Array:
        return finite_floats(get_column(frame, self.column), "a continuous feature")


class HashedCross(FeatureOp):
    """Cross of integer columns hashed into `buckets` (see `hash_columns`); stateless.

    Text columns are refused: categorify them first (an earlier op of the same pipeline) and
    cross the ids. Output: int64 buckets (E,) in ``[0, buckets)``.
    """

    def __init__(self, columns: list[str], buckets: int, seed: int = 0) -> None:
        if not columns or buckets < 1:
            raise ValueError(f"HashedCross: give columns and buckets >= 1 (got {columns}, {buckets})")
        self.columns, self.buckets, self.seed = list(columns), buckets, seed

    def transform(self, frame: Any) -> Array:
        cols = []
        for name in self.columns:
            col = get_column(frame, name)
            if col.is_text:
                raise TypeError(
                    f"column {name!r} holds text (e.g. {col.values[0].as_py()!r}); HashedCross hashes "
                    "integers: add a Categorify op for it earlier in the pipeline and cross its output"
                )
            check_nulls(col, "error", "a column without nulls")
            cols.append(integer_values(col))
        cols = [on_backend_of(c, cols[0]) for c in cols]
        return hash_columns(cols, self.buckets, self.seed)
