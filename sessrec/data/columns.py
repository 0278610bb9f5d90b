"""Checks of one column of an event table: ids, numbers and text, each refused in one line naming the file, the
column, a bad value and its file row (`SchemaError`); `Schema.validate` and the readers apply them. `no_such`: the
error for an input file or folder that is not there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class SchemaError(ValueError):
    """Input data that does not match its `Schema`. The message names file, column and value."""


def no_such(path: str | Path, what: str = "file") -> FileNotFoundError:
    """``PATH: no such <what>``; for a relative path, with the working directory it was read from (a recipe's
    relative data paths are read from where the command runs, not from the recipe's folder).

    Examples:
        >>> import os
        >>> str(no_such("/no/such.csv"))
        '/no/such.csv: no such file'
        >>> str(no_such("data/x.csv", "folder")) == f"data/x.csv: no such folder (read from the working directory {os.getcwd()})"
        True
    """
    where = "" if Path(path).is_absolute() else f" (read from the working directory {Path.cwd()})"
    return FileNotFoundError(f"{path}: no such {what}{where}")


class MissingIdError(SchemaError):
    """A null id (`check_id`, `VirtualSpec.check_unmarked`), at file row `row` of `column`: a CSV file's readers
    name the field's text (`readers.missing_id`), which Arrow read as null; `after`: the message after the row
    (``; drop or fill those rows``)."""

    def __init__(self, source: str, column: str, row: int, after: str) -> None:
        super().__init__(f"{source}: column {column!r} has a null id at row {row}{after}")
        self.column, self.row, self.after = column, row, after


Rows = int | np.ndarray
"""Where the values of a column sit in the file: the file row of the first value (each value one
row), or an (E,) array of the file row of every value (the flattened values of a list column)."""


def file_row(rows: Rows, index: int) -> int:
    return int(rows[index]) if isinstance(rows, np.ndarray) else rows + index


def bad_example(column: pa.ChunkedArray, bad: np.ndarray, rows: Rows = 0) -> tuple[object, int]:
    """The first bad value of `column` and its file row."""
    index = int(np.flatnonzero(bad)[0])
    return column[index].as_py(), file_row(rows, index)


_INT64_MAX = np.iinfo(np.int64).max
BEYOND_INT64 = "read the column as strings (Schema(string_ids=True), or store it as text)"


def first_not_decimal(text: pa.Array, ints: pa.Array) -> int | None:
    """Index of the first id of `text` that its integer cast `ints` writes otherwise (Arrow casts ``"01050"``,
    ``"0x41a"`` and ``"+1050"`` to 1050: text naming another id than ``"1050"``), or None when each is the decimal
    of its cast. Nulls pass."""
    at = pc.index(pc.not_equal(ints.cast(text.type), text).fill_null(False), True).as_py()
    return None if at < 0 else at


def first_failing_cast(values: pa.Array | pa.ChunkedArray, to: pa.DataType) -> int | None:
    """Index of the first value of `values` that does not cast to `to`, or None when all do.

    Found by bisection over casts of slices (each cast checks its whole slice), so the search
    stays vectorized: about log2(E) casts of shrinking slices, only when the whole cast fails.
    """
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    cast_errors = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)
    try:
        arr.cast(to)
        return None
    except cast_errors:
        lo, hi = 0, len(arr)  # the first failing value lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            arr.slice(lo, mid - lo).cast(to)
            lo = mid
        except cast_errors:
            hi = mid
    return lo


def check_text(col: pa.ChunkedArray, name: str, source: str, rows: Rows) -> pa.ChunkedArray:
    """A binary column as UTF-8 text; raises naming the first value that is not valid UTF-8."""
    bad = first_failing_cast(col, pa.string())
    if bad is not None:
        raise SchemaError(
            f"{source}: column {name!r} is not valid UTF-8 text: value {col[bad].as_py()!r} at row {file_row(rows, bad)}; "
            "re-encode the file as UTF-8"
        )
    return col.cast(pa.string())


MISSING_MARKERS = ("na", "n/a", "#n/a", "#na", "null", "<null>", "nan", "-nan", "<na>", "none", "nil")
"""What files write for a missing value (compared ignoring case and the spaces around it): an id column holding
one is refused (`check_id`), never read as an id named ``N/A``."""

MISSING_ADVICE = "drop or fill those rows"


def missing_marker(text: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(E,) bool: the values of a text column that are a missing-value marker (`MISSING_MARKERS`)."""
    lowered = pc.utf8_lower(pc.utf8_trim_whitespace(text))
    return pc.is_in(lowered, value_set=pa.array(MISSING_MARKERS)).fill_null(False).to_numpy(zero_copy_only=False)


def check_id(
    table: pa.Table, name: str, source: str, rows: Rows = 0, string_ids: bool = False, markers: bool = True
) -> pa.ChunkedArray:
    """Column `name` as ids (integers, or text with `string_ids`); a one-line SchemaError naming
    `source`, the column, a bad value and its file row (`rows`: the first row, or every row's). With `markers`
    (ids of sessions and items, not a feature's codes), a text id that is a missing-value marker (``N/A``,
    ``NULL``, ``nan``: `MISSING_MARKERS`) and a float NaN are refused as missing ids."""
    col = table.column(name)
    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        col = check_text(col, name, source, rows)
        typ = col.type
    if pa.types.is_decimal(typ):
        try:
            col, typ = col.cast(pa.int64()), pa.int64()
        except pa.ArrowInvalid:
            pass  # a fraction, or beyond int64: reported below
    if not (pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)):
        bad = col.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
            # point at a value with a fraction: a column of whole floats is reported at its first row
            values = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
            fraction = bad & (values != np.floor(values))
            too_big = bad & ~fraction & (np.abs(values) > _INT64_MAX)
            if too_big.any() and not fraction.any():
                value, row = bad_example(col, too_big, rows)
                raise SchemaError(
                    f"{source}: column {name!r} holds ids that do not fit int64 (e.g. {value} at row {row}, "
                    f"read as {typ}); {BEYOND_INT64}"
                )
            nan = bad & np.isnan(values)
            if markers and nan.any():
                raise SchemaError(f"{source}: column {name!r} has a missing id (NaN) at row "
                                  f"{bad_example(col, nan, rows)[1]}; {MISSING_ADVICE}")
            bad = fraction if fraction.any() else bad
        value, row = bad_example(col, bad, rows) if bad.any() else (None, file_row(rows, 0))
        raise SchemaError(
            f"{source}: column {name!r} has dtype {typ}, expected integer or string ids "
            f"(example value {value!r} at row {row})"
        )
    nulls = col.is_null().to_numpy(zero_copy_only=False)
    if nulls.any():
        row = bad_example(col, nulls, rows)[1]
        raise MissingIdError(source, name, row, f"; {MISSING_ADVICE}")
    if pa.types.is_signed_integer(typ):
        negative = pc.less(col, 0).to_numpy(zero_copy_only=False)
        if negative.any():
            value, row = bad_example(col, negative, rows)
            raise SchemaError(f"{source}: column {name!r} has a negative id {value!r} at row {row}")
    if pa.types.is_integer(typ):
        if pa.types.is_uint64(typ) and not string_ids:
            limit = pa.scalar(_INT64_MAX, pa.uint64())
            too_big = pc.greater(col, limit).to_numpy(zero_copy_only=False)
            if too_big.any():
                value, row = bad_example(col, too_big, rows)
                raise SchemaError(
                    f"{source}: column {name!r} holds ids that do not fit int64 (e.g. {value!r} at row {row}); "
                    f"{BEYOND_INT64}"
                )
        return col.cast(pa.string()) if string_ids else col.cast(pa.int64())
    if markers:
        marked = missing_marker(col)
        if marked.any():
            value, row = bad_example(col, marked, rows)
            raise SchemaError(f"{source}: column {name!r} has a missing id {value!r} at row {row}; {MISSING_ADVICE}")
    empty = pc.equal(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
    if empty.any():
        raise SchemaError(f"{source}: column {name!r} has an empty string id at row {bad_example(col, empty, rows)[1]}")
    return col.cast(pa.string())


def as_floats(numbers: pa.ChunkedArray) -> np.ndarray:
    """A column of numbers as float64, an integer beyond 2**53 (nanoseconds since the epoch) as the nearest one,
    which Arrow's checked cast refuses."""
    return pc.cast(numbers, pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def check_numeric(table: pa.Table, name: str, source: str, rows: Rows = 0) -> pa.ChunkedArray:
    col = table.column(name)
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        col = check_text(col, name, source, rows)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        bad = col.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            # the first text that is not a number, not merely the first value of the column
            number = pc.match_substring_regex(col, NUMBER).fill_null(True).to_numpy(zero_copy_only=False)
            text = bad & ~number
            bad = text if text.any() else bad
        value, row = bad_example(col, bad, rows) if bad.any() else (None, file_row(rows, 0))
        raise SchemaError(
            f"{source}: column {name!r} has dtype {col.type}, expected numbers "
            f"(value {value!r} at row {row} is not a number)"
        )
    values = as_floats(col)
    bad = ~np.isfinite(values)
    if bad.any():
        value, row = bad_example(col, bad, rows)
        raise SchemaError(f"{source}: column {name!r} has a missing or non-finite value {value!r} at row {row}")
    return pa.chunked_array([pa.array(values, pa.float64())])


NUMBER = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
