"""Array backends for feature engineering: one array-API code path for NumPy, CuPy and friends.

`sessrec.features` is written against the Python array API standard
(``xp = array_api_compat.array_namespace(x)``), so the same code runs on NumPy arrays (CPU, the
default), CuPy arrays (GPU) and ``array_api_strict`` arrays (the tests' proof that nothing
NumPy-only slipped in). This module holds what the standard does not:

* **Input adapters** (`get_column`, `as_column`): numpy arrays, pyarrow ``Array``/``ChunkedArray``
  (zero-copy where Arrow allows), pandas Series, cuDF Series and any array-API array become a
  `Column`: an array-API array plus a validity mask for nulls. Text columns stay a host
  ``pyarrow`` array; the features module maps them to integer codes with Arrow kernels, and
  everything after that is array code.
* **Shims** for operations missing from the standard: `bincount` (a NumPy branch, a CuPy branch
  and one written in the standard alone, used by ``array_api_strict``) and a portable integer
  hash (`mix64`, `hash_columns`) in plain uint64 arithmetic.
* **Checked reads** of a column for the ops (`integer_values`, `finite_floats`, `check_nulls`),
  whose errors name the column, an example bad value and its row.

cuDF is never imported: a cuDF Series is recognised by its module name, numeric columns become
CuPy arrays through ``__cuda_array_interface__`` (``cupy.asarray``, zero-copy when the column has
no nulls; with nulls the holes are filled with 0 on the GPU and a validity mask is kept), and
text or categorical columns come to the host through ``Series.to_arrow()`` (a copy).
CuPy is imported only inside the branches that need it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np
import pyarrow as pa
from array_api_compat import device

__all__ = [
    "Column", "as_column", "bincount", "check_nulls", "column_names", "device", "finite_floats", "first_bad",
    "from_host", "gather", "get_column", "hash_columns", "integer_values", "mix64", "namespace",
    "on_backend_of", "to_host", "value_at",
]

Array = Any  # an array-API array (numpy.ndarray, cupy.ndarray, array_api_strict Array, ...)
_MASK64 = (1 << 64) - 1
_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_NUMPY_CONSTANTS = tuple(np.uint64(c) for c in (_GAMMA, _M1, _M2))  # `mix64`'s, made once for NumPy arrays


@dataclass
class Column:
    """One input column, ready for array code.

    Args:
        name: the column's name, for error messages.
        values: array-API array (E,) for numeric and boolean columns; a host ``pyarrow`` string
            array for text columns (`is_text`). Null slots of numeric columns hold 0.
        valid: boolean array (E,) on the same backend, False at nulls; None when there are none.
    """

    name: str
    values: Any
    valid: Array | None = None

    @property
    def is_text(self) -> bool:
        return isinstance(self.values, pa.Array)

    def __len__(self) -> int:
        return len(self.values) if self.is_text else int(self.values.shape[0])


def namespace(*arrays: Array) -> Any:
    """The array-API namespace of `arrays` (``array_api_compat.numpy`` for NumPy arrays, known without asking
    ``array_namespace``, whose checks of each array's type cost a request's features about a tenth of their ops' time)."""
    if all(type(x) is np.ndarray for x in arrays):
        return _NUMPY
    return array_api_compat.array_namespace(*arrays)


_NUMPY = array_api_compat.array_namespace(np.zeros(0))


def to_host(x: Array) -> np.ndarray:
    """Copy an array-API array to a NumPy array (no copy when it already is one)."""
    if array_api_compat.is_numpy_array(x):
        return np.asarray(x)
    if array_api_compat.is_cupy_array(x):
        return x.get()
    return np.from_dlpack(x)  # other CPU arrays (array_api_strict) speak DLPack


def from_host(values: np.ndarray, like: Array) -> Array:
    """Put a NumPy array (a fitted table) on the backend and device of `like`."""
    if array_api_compat.is_numpy_array(like):
        return values
    xp = namespace(like)
    return xp.asarray(values, device=device(like))


def bincount(x: Array, size: int, weights: Array | None = None) -> Array:
    """Per-bin counts (int64) or weight sums (float64) of non-negative int64 codes ``x < size``.

    The standard has no scatter-add. NumPy and CuPy use their native ``bincount``; other
    backends sort the codes and difference a cumulative sum, which uses only the standard.
    Counts are exact everywhere; float sums may differ in the last bits between backends
    (CuPy adds in parallel, in no fixed order), and are exact for integer-valued weights
    such as binary targets.
    """
    xp = namespace(x)
    if array_api_compat.is_numpy_array(x) or array_api_compat.is_cupy_array(x):
        mod = np if array_api_compat.is_numpy_array(x) else _cupy()
        out = mod.bincount(x, weights=weights, minlength=size)
        return out.astype(mod.float64 if weights is not None else mod.int64, copy=False)
    order = xp.argsort(x, stable=True)
    edges = xp.searchsorted(xp.take(x, order), xp.arange(size + 1, dtype=x.dtype, device=device(x)))
    if weights is None:
        return edges[1:] - edges[:-1]
    cum = xp.cumulative_sum(xp.astype(xp.take(weights, order), xp.float64), include_initial=True)
    return xp.take(cum, edges[1:]) - xp.take(cum, edges[:-1])


def _cupy() -> Any:
    import cupy  # optional (the `gpu` extra): only reached with CuPy arrays in hand

    return cupy


# ---------------------------------------------------------------- portable hash (no standard one)
def mix64(x: Array) -> Array:
    """SplitMix64's finalizer on a uint64 array (wrapping arithmetic): a fixed, portable bijection.

    ``z = x + 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
    z = (z ^ z >> 27) * 0x94D049BB133111EB; return z ^ z >> 31``. ``mix64(0)`` is
    ``0xE220A8397B1DCDAF``, the first output of the SplitMix64 generator seeded with 0.
    """
    xp = namespace(x)
    if xp is _NUMPY:
        gamma, m1, m2 = _NUMPY_CONSTANTS
    else:
        gamma, m1, m2 = (xp.asarray(c, dtype=xp.uint64, device=device(x)) for c in (_GAMMA, _M1, _M2))
    z = x + gamma  # constants as uint64 arrays: no backend may read them as (overflowing) int64
    z = (z ^ (z >> 30)) * m1
    z = (z ^ (z >> 27)) * m2
    return z ^ (z >> 31)


def _mix64_int(x: int) -> int:
    z = (x + _GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def hash_columns(columns: list[Array], buckets: int, seed: int = 0) -> Array:
    """Bucket (E,) in ``[0, buckets)`` of each row's tuple of integer values.

    ``h = mix64(seed)``, then ``h = mix64(h ^ uint64(v))`` for each column's value ``v`` in
    order, and the bucket is ``h % buckets``. Negative values enter as their two's complement.
    The same on every platform and backend, unlike Python's salted ``hash()``.
    """
    xp = namespace(*columns)
    h = xp.full(columns[0].shape, _mix64_int(seed & _MASK64), dtype=xp.uint64, device=device(columns[0]))
    for col in columns:
        h = mix64(h ^ xp.astype(col, xp.uint64))
    return xp.astype(h % buckets, xp.int64)


# ------------------------------------------------------------------- checked columns for the ops
def value_at(col: Column, row: int) -> Any:
    """The Python value of `col` at `row` (None at a null), for error messages."""
    if col.is_text:
        return col.values[row].as_py()
    if col.valid is not None and not bool(col.valid[row]):
        return None
    return to_host(col.values[row : row + 1]).tolist()[0]


def first_bad(col: Column, bad: Array) -> tuple[Any, int]:
    """Value and row of the first True of `bad` (E,) in `col`, for error messages."""
    row = int(namespace(bad).nonzero(bad)[0][0])
    return value_at(col, row), row


def check_nulls(col: Column, policy: str, fix: str) -> None:
    """Raise on nulls unless the policy handles them."""
    if col.valid is None or policy != "error":
        return
    xp = namespace(col.valid)
    if not bool(xp.all(col.valid)):
        _, row = first_bad(col, ~col.valid)
        raise ValueError(f"column {col.name!r} has a null at row {row}; drop or fill those rows or set {fix}")


def integer_values(col: Column) -> Array:
    """Integer values (E,) of a categorical numeric column as int64."""
    xp = namespace(col.values)
    x = col.values
    if xp.isdtype(x.dtype, "bool"):
        return xp.astype(x, xp.int64)
    if not xp.isdtype(x.dtype, "integral"):
        value, row = first_bad(col, xp.ones(x.shape, dtype=xp.bool, device=device(x)))
        raise TypeError(
            f"column {col.name!r} has dtype {x.dtype} (e.g. {value!r} at row {row}); a categorical "
            "column needs integer or string codes: cast whole-number floats to int64"
        )
    return xp.astype(x, xp.int64)


def finite_floats(col: Column, what: str) -> Array:
    """Finite float64 values (E,) of a continuous column; nulls and NaN/inf are refused."""
    if col.is_text:
        example = col.values[0].as_py()
        raise TypeError(f"column {col.name!r} holds text (e.g. {example!r}); {what} needs numbers")
    xp = namespace(col.values)
    x = xp.astype(col.values, xp.float64)
    bad = ~xp.isfinite(x) if col.valid is None else ~(xp.isfinite(x) & col.valid)
    if bool(xp.any(bad)):
        value, row = first_bad(col, bad)
        raise ValueError(f"column {col.name!r} has a missing or non-finite value {value!r} at row {row}")
    return x


def on_backend_of(x: Array, like: Array) -> Array:
    """`x` moved to the backend of `like` (text columns are coded on the host)."""
    if namespace(x) is namespace(like):
        return x
    return from_host(to_host(x), like)


def gather(table: Array, codes: Array, default: float) -> Array:
    """``table[codes]`` with `default` where ``codes < 0`` (unseen or null)."""
    xp = namespace(codes)
    if table.shape[0] == 0:
        return xp.full(codes.shape, default, dtype=table.dtype, device=device(codes))
    picked = xp.take(table, xp.clip(codes, 0, table.shape[0] - 1))
    return xp.where(codes >= 0, picked, xp.asarray(default, dtype=table.dtype, device=device(codes)))


def column_names(frame: Any) -> list[str]:
    """Column names of a pyarrow Table, a mapping of name -> column, or a pandas/cuDF DataFrame."""
    if isinstance(frame, pa.Table):
        return frame.column_names
    if isinstance(frame, Mapping):
        return list(frame)
    if hasattr(frame, "columns"):
        return [str(c) for c in frame.columns]
    raise TypeError(f"expected a pyarrow Table, a dict of columns or a DataFrame, got {type(frame).__name__}")


def get_column(frame: Any, name: str) -> Column:
    """Column `name` of `frame` as a `Column`; a clear error when the column is absent."""
    if isinstance(frame, Mapping) and name in frame:  # no list of the names to search
        return as_column(frame[name], name)
    names = column_names(frame)
    if name not in names:
        raise ValueError(f"column {name!r} is not in the input; it has columns {names}")
    return as_column(frame.column(name) if isinstance(frame, pa.Table) else frame[name], name)


def as_column(values: Any, name: str) -> Column:
    """Adapt one column (numpy, pyarrow, pandas, cuDF, CuPy or other array-API array, list)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return _from_arrow(values, name)
    module = type(values).__module__.split(".")[0]
    if module == "cudf":
        return _from_cudf(values, name)
    if module == "pandas" or isinstance(values, (list, tuple)):
        return _from_arrow(pa.array(values), name)
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"column {name!r} must be 1-d, got shape {values.shape}")
        if values.dtype.kind in "USO":  # text or Python objects: let Arrow type them
            return _from_arrow(pa.array(values), name)
        if values.dtype.kind not in "biuf":
            raise TypeError(f"column {name!r} has dtype {values.dtype}; expected numbers, booleans or text")
        return Column(name, values)
    if array_api_compat.is_array_api_obj(values):
        if len(values.shape) != 1:
            raise ValueError(f"column {name!r} must be 1-d, got shape {values.shape}")
        return Column(name, values)
    raise TypeError(f"column {name!r}: cannot read a {type(values).__name__} as a column")


def _from_arrow(values: pa.Array | pa.ChunkedArray, name: str) -> Column:
    arr = values
    if isinstance(values, pa.ChunkedArray):  # one chunk is used as is; more are concatenated (a copy)
        arr = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    typ = arr.type
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
        return Column(name, arr.cast(pa.string()), valid)
    if pa.types.is_null(typ):
        raise ValueError(f"column {name!r} holds only nulls (e.g. None at row 0)")
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
        hint = " (Schema.validate turns timestamps into float seconds)" if pa.types.is_temporal(typ) else ""
        raise TypeError(f"column {name!r} has Arrow type {typ}; expected numbers, booleans or text{hint}")
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False)
        arr = arr.fill_null(pa.scalar(False if pa.types.is_boolean(typ) else 0, typ))
    return Column(name, arr.to_numpy(zero_copy_only=False), valid)  # zero-copy for null-free numbers


def _from_cudf(series: Any, name: str) -> Column:
    kind = str(series.dtype)
    if kind in ("object", "string", "str", "category"):
        return _from_arrow(series.to_arrow(), name)  # text is mapped to codes on the host
    cupy = _cupy()
    if not series.has_nulls:
        return Column(name, cupy.asarray(series))  # __cuda_array_interface__: no copy
    return Column(name, cupy.asarray(series.fillna(0)), cupy.asarray(series.notna()))
