"""Feature engineering: operations fitted on training columns, applied to every split, saved to one file.

Each operation is a small class whose typed constructor arguments are its configuration and
whose input columns are named there. ``fit(frame)`` learns from the training split,
``transform(frame)`` applies what was learned to any split (unseen values get a documented
default), and ``fit_transform(frame)`` gives the training split's own features, which for
target encoding are out-of-fold. A `FeaturePipeline` runs named operations in order and saves
every fitted table to one ``.npz`` file, so scoring applies exactly the transforms of training.

A frame is a ``pyarrow.Table``, a dict of columns, or a pandas/cuDF DataFrame, one row per
event; columns are numpy, pyarrow, pandas, cuDF, CuPy or other array-API arrays (see
`sessrec.data.array_backend`). The array code is written once against the array API standard
and runs on NumPy (CPU) and CuPy (GPU); outputs live on the backend of the input. Integer
outputs are identical across backends; float outputs agree to rounding (a few ulp: ``sin``
and parallel sums are not bit-identical across devices).

Shape letters: E events (rows), K distinct keys of a fitted column, N sessions.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import zipfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.array_backend import (
    Array,
    Column,
    bincount,
    check_nulls,
    column_names,
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
    value_at,
)
from sessrec.data.atomic import atomic_path
from sessrec.data.vocab import NUM_SPECIAL, OOV, PAD, ItemVocab

TimeUnit = Literal["s", "ms"]
_SECONDS = {"s": 1.0, "ms": 1e-3}
FORMAT = "sessrec.features"
VERSION = 1


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
            fitted = "text" if isinstance(self.values, pa.Array) else "integer"
            raise TypeError(f"column {col.name!r} was fitted on {fitted} values; now it holds another kind")
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

    def state(self) -> dict[str, np.ndarray]:
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
    def from_state(cls, state: dict[str, np.ndarray]) -> _Keys:
        if "keys" in state:
            return cls(state["keys"], state["counts"])
        offsets, data = state["text_offsets"], state["text_data"]
        text = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))
        return cls(text.cast(pa.string()), state["counts"])


# ------------------------------------------------------------------------------------ operations
class FeatureOp:
    """Base of all operations: constructor arguments are the config; `fit` learns, `transform` applies.

    Stateless operations (time features, hashing) need no `fit`; stateful ones raise
    `NotFittedError` when transforming before it.
    """

    stateful: ClassVar[bool] = False  # learns in `fit`, saves arrays

    def fit(self, frame: Any) -> FeatureOp:
        return self

    def transform(self, frame: Any) -> Any:
        raise NotImplementedError

    def fit_transform(self, frame: Any) -> Any:
        """Fit on the training frame and return its features (out-of-fold where it matters)."""
        return self.fit(frame).transform(frame)

    def get_config(self) -> dict[str, Any]:
        params = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in params if name != "self"}

    def get_state(self) -> dict[str, np.ndarray]:
        return {}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        pass

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"

    def _fitted(self, value: Any) -> Any:
        if value is None:
            raise NotFittedError(f"{self!r} is not fitted: fit() on training data (or FeaturePipeline.load)")
        return value


class _KeyedOp(FeatureOp):
    """An operation whose state is a `_Keys` table of one categorical column plus derived arrays."""

    stateful = True
    column: str
    keys_: _Keys | None = None

    def get_state(self) -> dict[str, np.ndarray]:
        return self._fitted(self.keys_).state()

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self.keys_ = _Keys.from_state(state)


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

    Example:
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
        self.set_state(_Keys.fit(col).state())
        return self

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        super().set_state(state)
        counts = state["counts"]  # (K,) a small host table: plain NumPy
        order = np.argsort(-counts, kind="stable")  # keys are sorted, so ties go to the smaller value
        kept = int(np.sum(counts >= self.min_count))
        if self.max_size is not None:
            kept = min(kept, self.max_size)
        self.ids_ = np.full(counts.shape, OOV, dtype=np.int64)
        self.ids_[order[:kept]] = np.arange(NUM_SPECIAL, NUM_SPECIAL + kept)

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

    def get_state(self) -> dict[str, np.ndarray]:
        prior = np.asarray([self.prior_], dtype=np.float64)
        return {**super().get_state(), "sums": self.sums_, "prior": prior}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        super().set_state(state)
        self.sums_, self.prior_ = state["sums"], float(state["prior"][0])


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

    def get_state(self) -> dict[str, np.ndarray]:
        return {"mean_std": np.asarray([self._fitted(self.mean_), self.std_], dtype=np.float64)}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        self.mean_, self.std_ = (float(v) for v in state["mean_std"])


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


# -------------------------------------------------------------------------------- time features
@dataclass
class SessionTimes:
    """Per-event session features (E,): times in seconds, positions 0-based."""

    since_prev: Array  # time since the previous event of the session; 0 for the first
    elapsed: Array  # time since the session's first event
    position: Array  # index from the start
    position_from_end: Array  # index from the end: 0 for the last event


def session_offsets(session_ids: Array) -> Array:
    """Offsets (N + 1,) of runs of equal consecutive session ids (rows sorted by session)."""
    xp = namespace(session_ids)
    n = session_ids.shape[0]
    change = xp.nonzero(session_ids[1:] != session_ids[:-1])[0] + 1
    ends = xp.asarray([0, n] if n else [0], dtype=xp.int64, device=device(session_ids))
    return xp.concat([ends[:1], xp.astype(change, xp.int64), ends[1:]])


def session_times(times: Array, offsets: Array) -> SessionTimes:
    """`SessionTimes` of float times (E,) sorted by session and time; sessions are `offsets` (N + 1,)."""
    xp = namespace(times, offsets)
    row = xp.arange(times.shape[0], dtype=xp.int64, device=device(times))
    session = xp.searchsorted(offsets[1:], row, side="right")  # (E,) session of each row
    start, end = xp.take(offsets[:-1], session), xp.take(offsets[1:], session)
    position = row - start
    prev = xp.concat([times[:1], times[:-1]])
    since = xp.where(position > 0, times - prev, 0.0)
    elapsed = times - xp.take(times, start) if times.shape[0] else times
    return SessionTimes(since, elapsed, position, end - 1 - row)


class SessionTimeFeatures(FeatureOp):
    """Lagged/positional features of events sorted by session then time (`SessionTimes`); stateless.

    Rows of a session must be adjacent and their times non-decreasing (`frame.sort_events`
    orders an event log so); both are checked.

    Args:
        session: session id column.
        timestamp: event time column (numbers).
        time_unit: ``s`` or ``ms``; outputs are in seconds.
    """

    def __init__(
        self, session: str = "session_id", timestamp: str = "timestamp", time_unit: TimeUnit = "s"
    ) -> None:
        self.session, self.timestamp, self.time_unit = session, timestamp, time_unit

    def transform(self, frame: Any) -> SessionTimes:
        tcol = get_column(frame, self.timestamp)
        times = finite_floats(tcol, "session time features") * _SECONDS[self.time_unit]
        xp = namespace(times)
        scol = get_column(frame, self.session)
        check_nulls(scol, "error", "a session column without nulls")
        if scol.is_text:
            ids = _Keys.fit(scol).lookup(scol, like=times)
        else:
            ids = on_backend_of(integer_values(scol), times)
        offsets = session_offsets(ids)
        starts = offsets[:-1]
        order = xp.argsort(xp.take(ids, starts), stable=True)
        run_ids = xp.take(ids, xp.take(starts, order))  # first id of each run, sorted by id
        again = xp.take(starts, order)[1:][run_ids[1:] == run_ids[:-1]]  # later runs of a session
        if again.shape[0]:
            row = int(xp.min(again))
            raise ValueError(
                f"column {self.session!r}: the rows of session {value_at(scol, row)!r} are not adjacent "
                f"(again at row {row}); sort events by session and time first (frame.sort_events)"
            )
        out = session_times(times, offsets)
        back = (out.position > 0) & (out.since_prev < 0)
        if bool(xp.any(back)):
            value, row = first_bad(tcol, back)
            raise ValueError(
                f"column {self.timestamp!r} goes back in time within a session: {value!r} at row {row}; "
                "sort events by session and time first (frame.sort_events)"
            )
        return out


@dataclass
class CyclicTimes:
    """Hour of day and day of week (UTC) on the unit circle (E,) each."""

    hour_sin: Array
    hour_cos: Array
    weekday_sin: Array
    weekday_cos: Array


class CyclicTime(FeatureOp):
    """Hour of day and day of week as sin/cos, in UTC; stateless.

    The hour is fractional (``(t mod 86400) / 3600``, so 06:30 is 6.5) and the angle is
    ``2 pi hour / 24``; the weekday is whole (Monday 0 .. Sunday 6; 1970-01-01 was a
    Thursday) and the angle ``2 pi weekday / 7``.

    Args:
        timestamp: event time column, seconds or milliseconds since the epoch.
        time_unit: ``s`` or ``ms``.
    """

    def __init__(self, timestamp: str = "timestamp", time_unit: TimeUnit = "s") -> None:
        self.timestamp, self.time_unit = timestamp, time_unit

    def transform(self, frame: Any) -> CyclicTimes:
        t = finite_floats(get_column(frame, self.timestamp), "cyclic time features")
        t = t * _SECONDS[self.time_unit]
        xp = namespace(t)
        hour = xp.remainder(t, 86400.0) / 3600.0
        weekday = xp.remainder(xp.floor(t / 86400.0) + 3.0, 7.0)
        a, b = hour * (2 * math.pi / 24), weekday * (2 * math.pi / 7)
        return CyclicTimes(xp.sin(a), xp.cos(a), xp.sin(b), xp.cos(b))


# -------------------------------------------------------------------------------------- pipeline
_OPS: dict[str, type[FeatureOp]] = {
    cls.__name__: cls
    for cls in (
        Categorify, CountEncoding, TargetEncoding, LogNormalize, HashedCross, SessionTimeFeatures, CyclicTime
    )
}  # the types a saved pipeline may name; anything else is refused at load


class FeaturePipeline:
    """Named operations run in order; fitted on training data, saved to and loaded from one file.

    Each op sees the input columns plus the outputs of the ops before it (an output shadows an
    input column of the same name), so ``HashedCross`` can cross a ``Categorify`` output.
    Outputs are named after the op; ops with several outputs (`SessionTimes`, `CyclicTimes`)
    give ``<name>_<field>``.

    Example:
        >>> pipe = FeaturePipeline({"cat": Categorify("c"), "n": CountEncoding("c")})
        >>> out = pipe.fit_transform({"c": np.array([4, 4, 9])})
        >>> out["cat"].tolist(), out["n"].tolist()
        ([2, 2, 3], [2, 2, 1])
    """

    def __init__(self, ops: dict[str, FeatureOp]) -> None:
        for name, op in ops.items():
            if not isinstance(op, FeatureOp):
                raise TypeError(f"feature op {name!r} must be a FeatureOp, got {type(op).__name__}")
        self.ops = dict(ops)
        self.fitted = False

    def fit(self, frame: Any) -> FeaturePipeline:
        self.fit_transform(frame)
        return self

    def fit_transform(self, frame: Any) -> dict[str, Array]:
        """Fit every op on the training frame; return its features (target encoding out-of-fold)."""
        out = self._run(frame, fit=True)
        self.fitted = True
        return out

    def transform(self, frame: Any) -> dict[str, Array]:
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: call fit() on training data, or load() one")
        return self._run(frame, fit=False)

    def _run(self, frame: Any, fit: bool) -> dict[str, Array]:
        view = _View(frame)
        out: dict[str, Array] = {}
        for name, op in self.ops.items():
            result = op.fit_transform(view) if fit else op.transform(view)
            if isinstance(result, (SessionTimes, CyclicTimes)):
                produced = {f"{name}_{f.name}": getattr(result, f.name) for f in fields(result)}
            else:
                produced = {name: result}
            out.update(produced)
            view.extra.update(produced)
        return out

    def save(self, path: str | os.PathLike) -> Path:
        """Write configs (JSON) and fitted arrays to one ``.npz``, under a temporary name then renamed."""
        if not self.fitted:
            raise NotFittedError("FeaturePipeline is not fitted: nothing to save")
        spec = [{"name": k, "op": type(op).__name__, "config": op.get_config()} for k, op in self.ops.items()]
        header = json.dumps({"format": FORMAT, "version": VERSION, "ops": spec}, sort_keys=True)
        arrays = {"__pipeline__": np.frombuffer(header.encode(), dtype=np.uint8)}
        for i, op in enumerate(self.ops.values()):
            arrays.update({f"{i}/{key}": np.asarray(value) for key, value in op.get_state().items()})
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> FeaturePipeline:
        """Read a pipeline written by `save`; a clear error for any other file."""
        arrays, header = _read(path)
        ops = {}
        for i, spec in enumerate(header["ops"]):
            name, kind = spec["name"], _OPS.get(spec["op"])
            if kind is None:
                known = sorted(_OPS)
                raise ValueError(f"{path}: op {name!r} has unknown type {spec['op']!r}; known: {known}")
            try:
                op = kind(**spec["config"])
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}: op {name!r} has a config this version cannot read: {err}") from err
            state = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{i}/")}
            if kind.stateful:
                try:
                    op.set_state(state)
                except KeyError as err:
                    raise ValueError(f"{path}: op {name!r} lacks its fitted array {err}") from err
            ops[name] = op
        pipe = cls(ops)
        pipe.fitted = True
        return pipe


def _read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays and JSON header of a saved pipeline."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        header = json.loads(arrays.pop("__pipeline__").tobytes().decode())
    except (OSError, ValueError, KeyError, AttributeError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path}: not a sessrec feature pipeline ({type(err).__name__}: {err})") from err
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        found = f"{header.get('format')!r} version {header.get('version')!r}"
        raise ValueError(f"{path}: a feature file {found}; this sessrec reads {FORMAT!r} version {VERSION}")
    return arrays, header


class _View:
    """A frame plus the outputs of earlier ops, readable like a dict of columns."""

    def __init__(self, frame: Any) -> None:
        self.frame, self.extra = frame, {}
        self._names = column_names(frame)

    @property
    def columns(self) -> list[str]:
        return list(self.extra) + [n for n in self._names if n not in self.extra]

    def __getitem__(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        return self.frame.column(name) if isinstance(self.frame, pa.Table) else self.frame[name]


__all__ = [
    "Categorify", "CountEncoding", "CyclicTime", "CyclicTimes", "FeatureOp", "FeaturePipeline", "HashedCross",
    "LogNormalize", "NotFittedError", "SessionTimeFeatures", "SessionTimes", "TargetEncoding",
    "session_offsets", "session_times",
]
