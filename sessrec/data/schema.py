"""Typed description of an interaction log, and its validation against a loaded table.

A `Schema` names the columns that hold the session id, the item id, the event time and any
side features, and (`VirtualSpec`) the values that mark non-product events. `Schema.validate` checks a `pyarrow.Table` read from a file and raises a
`SchemaError` naming the file, the column, an example bad value and its row, so a user can fix
the input without reading our code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.saved.registry import register

FeatureKind = Literal["categorical", "continuous"]
VIRTUAL = "virtual"  # the validated events' bool column (and the session table's list<bool> column) of virtual events
TimeUnit = Literal["s", "ms", "us", "ns", "datetime"]


class SchemaError(ValueError):
    """Input data that does not match its `Schema`. The message names file, column and value."""


@register  # a model directory's data section builds it (a source's schema)
@dataclass(frozen=True)
class FeatureSpec:
    """A per-interaction side feature.

    Args:
        name: column name in the input.
        kind: ``categorical`` (integer or string codes) or ``continuous`` (numbers).
    """

    name: str
    kind: FeatureKind = "categorical"

    def __post_init__(self) -> None:
        if self.kind not in get_args(FeatureKind):
            raise ValueError(
                f"feature {self.name!r}: kind must be one of {list(get_args(FeatureKind))}, got {self.kind!r}"
            )


@register  # a model directory's data section builds it (a source's schema)
@dataclass(frozen=True)
class VirtualSpec:
    """Non-product events of a log kept as *virtual items* (Coveo SIGIR'21): input tokens, never targets
    nor recommendations.

    An event is virtual when its `column` holds one of `values`; its item is then the text of its `key`
    columns joined by `separator` (e.g. ``filter selection:4 Star``), and its item id column may be null.
    Product ids become text too (virtual keys and products share one vocabulary). A session's end time
    is that of its last product, and a source's length filters count products only, so that the
    sessions, the split and the evaluation pairs do not depend on `keep`.

    Args:
        column: the column whose values mark virtual events (``event_type``, ``action_type``).
        values: the values of `column` that mark them, compared as text (``page_view``; ``true`` for a
            boolean column; ``3`` for an integer code).
        key: the columns whose values (null as empty text) key a virtual item; empty: `column` alone.
        separator: what joins the parts of the key.
        keep: False drops the virtual events once the sessions are filtered and split (the product ids
            keep their type): the baseline of an ablation, with the same sessions and evaluation pairs.
    """

    column: str
    values: list[str]
    key: list[str] = field(default_factory=list)
    separator: str = ":"
    keep: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ValueError(f"VirtualSpec: column must be a column name, got {self.column!r}")
        if not self.values:
            raise ValueError(f"VirtualSpec: values must name at least one value of column {self.column!r} that marks a virtual event")
        bad = [c for c in self.key if not isinstance(c, str) or not c]
        if bad:
            raise ValueError(f"VirtualSpec: key must be column names, got {bad[0]!r}")

    @property
    def columns(self) -> list[str]:
        """The columns it reads: `column`, then the key's."""
        return list(dict.fromkeys([self.column, *self.key]))

    def marks(self, table: pa.Table, source: str) -> np.ndarray:
        """(E,) bool: the rows of `table` whose `column` holds one of `values` (a null marks nothing)."""
        col = table.column(self.column)
        try:
            text = pc.cast(col, pa.string())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise SchemaError(
                f"{source}: column {self.column!r} has dtype {col.type}, which cannot mark virtual events; "
                "give a column of text, numbers or booleans"
            ) from err
        marked = pc.is_in(text, value_set=pa.array([str(v) for v in self.values], pa.string()))
        return marked.fill_null(False).to_numpy(zero_copy_only=False).astype(bool)

    def check_unmarked(self, table: pa.Table, item_id: str, virtual: np.ndarray, source: str, rows: Rows) -> None:
        """Refuse an unmarked event without an item id, naming the value of `column` that `values` misses."""
        missing = table.column(item_id).is_null().to_numpy(zero_copy_only=False) & ~virtual
        if missing.any():
            index = int(np.flatnonzero(missing)[0])
            raise SchemaError(
                f"{source}: column {item_id!r} has a null id at row {_row(rows, index)}, where column {self.column!r} "
                f"holds {table.column(self.column)[index].as_py()!r}, not one of virtual.values {list(self.values)}; "
                "list that value to mark the event virtual, or drop or fill the row"
            )

    def keys(self, table: pa.Table) -> pa.Array:
        """(E,) text key of every row of `table` (the `key` columns joined by `separator`)."""
        parts = [pc.cast(table.column(c), pa.string()).fill_null("") for c in (self.key or [self.column])]
        joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, self.separator)
        return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined

    def items(self, table: pa.Table, products: pa.ChunkedArray, virtual: np.ndarray) -> pa.Array:
        """(E,) item of every row: the validated product ids `products` (one per unmarked row, in order)
        and each marked row's key; as text when `keep`, else the products' type with null at marked rows."""
        index = np.empty(len(virtual), dtype=np.int64)
        index[~virtual] = np.arange(int((~virtual).sum()))
        index[virtual] = len(products) + np.arange(int(virtual.sum()))
        products = products.combine_chunks()
        if not self.keep:
            return pa.concat_arrays([products, pa.nulls(int(virtual.sum()), products.type)]).take(pa.array(index))
        keys = self.keys(table.filter(pa.array(virtual)))
        return pa.concat_arrays([products.cast(pa.string()), keys.cast(pa.string())]).take(pa.array(index))


@register  # a model directory's data section builds it (a source's schema)
@dataclass(frozen=True)
class Schema:
    """Column roles of an event log (one row per interaction).

    Args:
        session_id: column grouping events into sessions (users, for one-sequence-per-user data).
        item_id: column with the item identifier (non-negative integer or string).
        timestamp: event time column, or None when the row order within a session is the time order.
        time_unit: unit of a numeric ``timestamp`` (``s``, ``ms``, ``us``, ``ns``), or ``datetime`` for
            timestamp/date columns and ISO-8601 strings. Numeric times that this unit places
            outside 1990..2100 are refused with the unit that would fit (milliseconds read as
            seconds would be the year 46,000); times that no unit places there are relative.
        order_by: optional tie-breaking column within a session (e.g. trivago's ``step``,
            DIGINETICA's ``timeframe``).
        features: side-feature columns carried along with the items.
        string_ids: read the session and item id columns of a text file as strings, for ids that
            do not fit int64 (20-digit ids) or that are written with leading zeros (``01050``, which a
            text file's integer ids refuse); integer ids of a parquet file are converted to text.
        virtual: the column and values that mark non-product events as virtual items (`VirtualSpec`);
            None: every event is a product.

    Raises:
        ValueError: on an unknown `time_unit`, or one column given two roles (which would make
            the validated table drop one of them silently), or a role column named ``virtual`` when
            the schema marks virtual events (the validated table's column of their flags).
    """

    session_id: str = "session_id"
    item_id: str = "item_id"
    timestamp: str | None = "timestamp"
    time_unit: TimeUnit = "s"
    order_by: str | None = None
    features: list[FeatureSpec] = field(default_factory=list)
    string_ids: bool = False
    virtual: VirtualSpec | None = None

    def __post_init__(self) -> None:
        if self.time_unit not in get_args(TimeUnit):
            raise ValueError(f"Schema: time_unit must be one of {list(get_args(TimeUnit))}, got {self.time_unit!r}")
        roles = [("session_id", self.session_id), ("item_id", self.item_id)]
        roles += [(role, c) for role, c in (("timestamp", self.timestamp), ("order_by", self.order_by)) if c is not None]
        roles += [(f"features[{i}]", f.name) for i, f in enumerate(self.features)]
        seen: dict[str, str] = {}
        for role, column in roles:
            if not isinstance(column, str) or not column:
                raise ValueError(f"Schema: {role} must be a column name, got {column!r}")
            if column in seen:
                raise ValueError(
                    f"Schema: column {column!r} is given two roles, {seen[column]} and {role}; "
                    "each role needs its own column"
                )
            seen[column] = role
        if self.virtual is not None and VIRTUAL in seen:
            raise ValueError(
                f"Schema: the {seen[VIRTUAL]} column is named {VIRTUAL!r}, the name of the flags of virtual events; "
                "rename it"
            )

    @property
    def role_columns(self) -> list[str]:
        """The columns of the session id, item id, timestamp, tie-break and features."""
        cols = [self.session_id, self.item_id]
        cols += [c for c in (self.timestamp, self.order_by) if c is not None]
        return cols + [f.name for f in self.features]

    @property
    def columns(self) -> list[str]:
        """The columns read from a file: `role_columns`, then those that mark and key virtual events."""
        cols = self.role_columns
        return cols + [c for c in (self.virtual.columns if self.virtual else []) if c not in cols]

    @property
    def id_columns(self) -> list[str]:
        """The session and item id columns (read as text from a CSV file when `string_ids`)."""
        return [self.session_id, self.item_id]

    @property
    def text_columns(self) -> list[str]:
        """The columns a text file's readers read as text, not as the numbers Arrow would take them for: the id
        columns with `string_ids`, the categorical features (codes are labels: ``01`` is another one than ``1``)
        but a ``virtual`` one (the flags of virtual events, `frame.virtual_flags`), and the key columns of virtual
        items that have no role of their own nor mark the events (``search:01`` is another item than ``search:1``)."""
        ids = self.id_columns if self.string_ids else []
        categorical = [f.name for f in self.features if f.kind == "categorical" and f.name != VIRTUAL]
        keys = [c for c in self.virtual.key if c not in self.role_columns and c != self.virtual.column] if self.virtual else []
        return ids + categorical + keys

    @property
    def number_columns(self) -> list[str]:
        """The columns `validate` reads as float64 numbers: a numeric timestamp's (not one of ``datetime``), the
        tie-break and the continuous features."""
        cols = [c for c in (None if self.time_unit == "datetime" else self.timestamp, self.order_by) if c is not None]
        return cols + [f.name for f in self.features if f.kind == "continuous"]

    @property
    def decimal_id_columns(self) -> list[str]:
        """The id columns that a text file whose first block holds integers in them reads as integers written
        as decimals (`readers.integer_ids`): none with `string_ids`; the session ids, and the item ids unless
        the schema marks virtual events, whose item column may hold their text keys."""
        if self.string_ids:
            return []
        return [self.session_id] if self.virtual is not None else self.id_columns

    def validate(self, table: pa.Table, source: str = "<table>", first_row: int = 0) -> pa.Table:
        """Check `table` against the schema and return it with normalized columns.

        The returned table has the schema's columns only; the timestamp (if any) is converted to
        float64 seconds since the epoch. With `virtual`, the item ids are those of `VirtualSpec.items`
        (only the products' are checked) and a bool column ``virtual`` marks the virtual events.

        Args:
            table: the rows read from `source`.
            source: the file (or a description of it), for messages.
            first_row: the file row of the table's first row (a chunk of a streamed file), so that
                messages name rows of the file.

        Raises:
            SchemaError: on a missing column or one the file has twice, wrong dtype, null or negative id, or
                unparsable time.
        """
        if table.num_rows == 0:
            raise SchemaError(f"{source}: the file has no rows")
        missing = [c for c in self.columns if c not in table.column_names]
        if missing:
            raise SchemaError(
                f"{source}: column {missing[0]!r} is missing; the file has columns {table.column_names}. "
                "Set the schema's column names to match the file."
            )
        twice = [c for c in self.columns if table.column_names.count(c) > 1]
        if twice:
            raise SchemaError(
                f"{source}: column {twice[0]!r} appears {table.column_names.count(twice[0])} times in the file's columns "
                f"{table.column_names}, so which one it is is unknown; rename or drop the others"
            )
        rows = first_row
        out = {self.session_id: check_id(table, self.session_id, source, rows, self.string_ids)}
        if self.virtual is None:
            out[self.item_id] = check_id(table, self.item_id, source, rows, self.string_ids)
        else:
            virtual = self.virtual.marks(table, source)
            self.virtual.check_unmarked(table, self.item_id, virtual, source, rows)
            products = table.filter(pa.array(~virtual)).select([self.item_id])
            ids = check_id(products, self.item_id, source, rows + np.flatnonzero(~virtual), self.string_ids)
            out[self.item_id] = self.virtual.items(table, ids, virtual)
        if self.timestamp is not None:
            out[self.timestamp] = parse_time(table, self.timestamp, self.time_unit, source, rows)
        if self.order_by is not None:
            out[self.order_by] = _check_numeric(table, self.order_by, source, rows)
        for feat in self.features:
            if feat.kind == "continuous":
                out[feat.name] = _check_numeric(table, feat.name, source, rows)
            else:
                out[feat.name] = check_id(table, feat.name, source, rows)
        if self.virtual is not None:
            out[VIRTUAL] = pa.array(virtual)
        return pa.table(out)


Rows = int | np.ndarray
"""Where the values of a column sit in the file: the file row of the first value (each value one
row), or an (E,) array of the file row of every value (the flattened values of a list column)."""


def _row(rows: Rows, index: int) -> int:
    return int(rows[index]) if isinstance(rows, np.ndarray) else rows + index


def _example(column: pa.ChunkedArray, bad: np.ndarray, rows: Rows = 0) -> tuple[object, int]:
    """The first bad value of `column` and its file row."""
    index = int(np.flatnonzero(bad)[0])
    return column[index].as_py(), _row(rows, index)


_INT64_MAX = np.iinfo(np.int64).max
_BEYOND_INT64 = "read the column as strings (Schema(string_ids=True), or store it as text)"


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


def _check_text(col: pa.ChunkedArray, name: str, source: str, rows: Rows) -> pa.ChunkedArray:
    """A binary column as UTF-8 text; raises naming the first value that is not valid UTF-8."""
    bad = first_failing_cast(col, pa.string())
    if bad is not None:
        raise SchemaError(
            f"{source}: column {name!r} is not valid UTF-8 text: value {col[bad].as_py()!r} at row {_row(rows, bad)}; "
            "re-encode the file as UTF-8"
        )
    return col.cast(pa.string())


def check_id(
    table: pa.Table, name: str, source: str, rows: Rows = 0, string_ids: bool = False
) -> pa.ChunkedArray:
    """Column `name` as ids (integers, or text with `string_ids`); a one-line SchemaError naming
    `source`, the column, a bad value and its file row (`rows`: the first row, or every row's)."""
    col = table.column(name)
    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = col.type
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        col = _check_text(col, name, source, rows)
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
                value, row = _example(col, too_big, rows)
                raise SchemaError(
                    f"{source}: column {name!r} holds ids that do not fit int64 (e.g. {value} at row {row}, "
                    f"read as {typ}); {_BEYOND_INT64}"
                )
            bad = fraction if fraction.any() else bad
        value, row = _example(col, bad, rows) if bad.any() else (None, _row(rows, 0))
        raise SchemaError(
            f"{source}: column {name!r} has dtype {typ}, expected integer or string ids "
            f"(example value {value!r} at row {row})"
        )
    nulls = col.is_null().to_numpy(zero_copy_only=False)
    if nulls.any():
        raise SchemaError(
            f"{source}: column {name!r} has a null id at row {_example(col, nulls, rows)[1]}; drop or fill those rows"
        )
    if pa.types.is_signed_integer(typ):
        negative = pc.less(col, 0).to_numpy(zero_copy_only=False)
        if negative.any():
            value, row = _example(col, negative, rows)
            raise SchemaError(f"{source}: column {name!r} has a negative id {value!r} at row {row}")
    if pa.types.is_integer(typ):
        if pa.types.is_uint64(typ) and not string_ids:
            limit = pa.scalar(_INT64_MAX, pa.uint64())
            too_big = pc.greater(col, limit).to_numpy(zero_copy_only=False)
            if too_big.any():
                value, row = _example(col, too_big, rows)
                raise SchemaError(
                    f"{source}: column {name!r} holds ids that do not fit int64 (e.g. {value!r} at row {row}); "
                    f"{_BEYOND_INT64}"
                )
        return col.cast(pa.string()) if string_ids else col.cast(pa.int64())
    empty = pc.equal(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
    if empty.any():
        raise SchemaError(f"{source}: column {name!r} has an empty string id at row {_example(col, empty, rows)[1]}")
    return col.cast(pa.string())


def as_floats(numbers: pa.ChunkedArray) -> np.ndarray:
    """A column of numbers as float64, an integer beyond 2**53 (nanoseconds since the epoch) as the nearest one,
    which Arrow's checked cast refuses."""
    return pc.cast(numbers, pa.float64(), safe=False).to_numpy(zero_copy_only=False)


def _check_numeric(table: pa.Table, name: str, source: str, rows: Rows = 0) -> pa.ChunkedArray:
    col = table.column(name)
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        col = _check_text(col, name, source, rows)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        bad = col.is_valid().to_numpy(zero_copy_only=False)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            # the first text that is not a number, not merely the first value of the column
            number = pc.match_substring_regex(col, _NUMBER).fill_null(True).to_numpy(zero_copy_only=False)
            text = bad & ~number
            bad = text if text.any() else bad
        value, row = _example(col, bad, rows) if bad.any() else (None, _row(rows, 0))
        raise SchemaError(
            f"{source}: column {name!r} has dtype {col.type}, expected numbers "
            f"(value {value!r} at row {row} is not a number)"
        )
    values = as_floats(col)
    bad = ~np.isfinite(values)
    if bad.any():
        value, row = _example(col, bad, rows)
        raise SchemaError(f"{source}: column {name!r} has a missing or non-finite value {value!r} at row {row}")
    return pa.chunked_array([pa.array(values, pa.float64())])


_NUMBER = r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$"
_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_time(table: pa.Table, name: str, unit: TimeUnit, source: str, rows: Rows = 0) -> pa.ChunkedArray:
    """Return event times as float64 seconds since the epoch.

    A negative number is refused: it is a placeholder for a missing time (-1) far more often than
    a time before 1970, and it would sort the event first in its session.
    """
    col = table.column(name)
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        col = _check_text(col, name, source, rows)
    typ = col.type
    numbers = col  # the column's numbers (its values, or its text read as numbers); messages quote `col`
    text = pa.types.is_string(typ) or pa.types.is_large_string(typ)
    if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
        stamps = col if pa.types.is_timestamp(typ) else pc.cast(col, pa.timestamp("s" if pa.types.is_date32(typ) else "ms"))
        # counted in the column's own unit (UTC): a cast to another unit would refuse nanoseconds it cannot hold
        seconds = pc.cast(stamps, pa.int64()).to_numpy(zero_copy_only=False) * _UNIT_SECONDS[stamps.type.unit]
        nulls = col.is_null().to_numpy(zero_copy_only=False)
    elif text:
        nulls = col.is_null().to_numpy(zero_copy_only=False)
        if nulls.any():
            value, row = _example(col, nulls, rows)
            raise SchemaError(f"{source}: column {name!r} has a missing timestamp {value!r} at row {row}")
        parsed = _parse_time_strings(col)
        iso = parsed.is_valid().to_numpy(zero_copy_only=False)
        if iso.all():
            seconds = pc.cast(parsed, pa.int64()).to_numpy(zero_copy_only=False) * 1e-6
        else:
            numbers = _numeric_time_text(col, iso, name, unit, source, rows)
    elif not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
        raise SchemaError(
            f"{source}: column {name!r} has dtype {typ} (e.g. {col[0].as_py()!r} at row {_row(rows, 0)}), "
            "which is not a timestamp; "
            "expected numbers, timestamps or ISO-8601 text"
        )
    numeric = pa.types.is_integer(numbers.type) or pa.types.is_floating(numbers.type)
    if numeric:
        if unit == "datetime":
            raise SchemaError(
                f"{source}: column {name!r} holds numbers (e.g. {col[0].as_py()!r} at row {_row(rows, 0)}); "
                "set time_unit to s, ms, us or ns"
            )
        seconds = as_floats(numbers) * _UNIT_SECONDS[unit]
        nulls = ~np.isfinite(seconds)
        negative = ~nulls & (seconds < 0)
        if negative.any():
            value, row = _example(col, negative, rows)
            raise SchemaError(
                f"{source}: column {name!r} has a negative timestamp {value!r} at row {row} (before 1970); "
                "drop or fill those rows"
            )
    if nulls.any():
        value, row = _example(col, nulls, rows)
        raise SchemaError(f"{source}: column {name!r} has a missing timestamp {value!r} at row {row}")
    if numeric:
        _check_plausible(col, seconds, name, unit, source, rows)
    return pa.chunked_array([pa.array(np.asarray(seconds, dtype=np.float64))])


_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}
_ISO_FORM = "ISO-8601 (2016-05-09 or 2016-05-09T10:51:09Z)"


def _numeric_time_text(col: pa.ChunkedArray, iso: np.ndarray, name: str, unit: TimeUnit, source: str,
                       rows: Rows) -> pa.ChunkedArray:
    """A text column of times that are not all ISO-8601 (`iso`: those that are): numbers as text, read in the
    numeric `unit` (float64); else a one-line SchemaError naming the first value that does not parse.

    The column's first value tells its form (numbers in `unit`, or ISO-8601): the first value of another
    form is named, with the form expected; a first value of neither form is named itself.
    """
    number = pc.match_substring_regex(col, _NUMBER).to_numpy(zero_copy_only=False)
    numeric_unit = unit != "datetime"
    if numeric_unit and number.all():
        return pc.cast(pc.utf8_trim_whitespace(col), pa.float64())
    numbers = f"a number of {_UNIT_WORDS[unit]} since the epoch (time_unit: {unit})" if numeric_unit else ""
    first = f"{col[0].as_py()!r} at row {_row(rows, 0)}"
    if numeric_unit and number[0]:
        bad, expected = ~number, f"{numbers}, as {first} is"
    elif iso[0]:
        bad, expected = ~iso, f"{_ISO_FORM}, as {first} is"
    elif numeric_unit:
        bad, expected = ~iso & ~number, f"{_ISO_FORM} or {numbers}"
    else:
        bad, expected = ~iso, f"{_ISO_FORM} with time_unit: datetime (for numbers set time_unit to s, ms, us or ns)"
    value, row = _example(col, bad, rows)
    raise SchemaError(f"{source}: column {name!r} has an unparsable timestamp {value!r} at row {row}; expected {expected}")


PLAUSIBLE_SECONDS = (631_152_000.0, 4_102_444_800.0)  # 1990-01-01 and 2100-01-01 (UTC), seconds since the epoch
_SECONDS_PER_YEAR = 31_556_952.0


def _check_plausible(col: pa.ChunkedArray, seconds: np.ndarray, name: str, unit: TimeUnit, source: str, rows: Rows) -> None:
    """Refuse numeric times that the given `unit` places outside 1990..2100 (`PLAUSIBLE_SECONDS`).

    A time after 2100 is always refused; so is a time before 1990 in a column that has times in
    1990..2100, or whose times all fall in that range under another unit (seconds read as ms).
    A column whose times no unit places in the range holds relative times (seconds from a
    start, as in toy data) and passes.

    Raises:
        SchemaError: naming the file, the column, the first implausible value, its year under
            `unit`, and the unit that would fit when there is one.
    """
    low, high = PLAUSIBLE_SECONDS
    inside = (seconds >= low) & (seconds < high)
    if inside.all():
        return
    raw_low, raw_high = seconds.min() / _UNIT_SECONDS[unit], seconds.max() / _UNIT_SECONDS[unit]
    fits = [u for u, f in _UNIT_SECONDS.items() if u != unit and low <= raw_low * f and raw_high * f < high]
    late = seconds >= high
    if not (late.any() or inside.any() or fits):
        return
    value, row = _example(col, late if late.any() else ~inside, rows)
    year = int(np.floor(1970 + float(value) * _UNIT_SECONDS[unit] / _SECONDS_PER_YEAR))
    fix = (f"it looks like {fits[0]}; set time_unit: {fits[0]}" if fits
           else "fix or drop the rows, or set time_unit to the column's unit")
    raise SchemaError(
        f"{source}: column {name!r} has the time {value!r} at row {row}, read with time_unit: {unit} as the year "
        f"{f'{year:,}' if year >= 10_000 else year} (outside 1990..2100); {fix}"
    )


_UTC_OFFSET = r"(?P<sign>[+-])(?P<hours>\d{2})(?::?(?P<minutes>\d{2}))?$"  # after a time of day: +02:00, -0130, +01
_OFFSET_AFTER_TIME = r"[T ]\d{2}(:\d{2}(:\d{2}(\.\d+)?)?)?[+-]\d{2}(:?\d{2})?$"  # 10:51:09+02:00, 10-05, 10:51+0130
_ISO_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H",
                "%Y-%m-%d %H")


def _parse_time_strings(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """ISO-8601 strings to timestamp[us] (UTC); unparsable entries become null.

    The forms Arrow's CSV reader takes: a date, or a date and a time to the hour, the minute or the
    second. Fractional seconds are kept to the microsecond (YOOCHOOSE clicks are ``...T10:51:09.277Z``):
    strptime has no directive for them, so they are parsed apart and added back. A UTC offset after
    the time of day (``Z``, ``+02:00``, ``-0130``, ``+01``) is taken off, as Arrow's CSV reader takes it off.
    """
    text = pc.replace_substring_regex(col, r"(Z|[+-]00:?00)$", "")
    east = None  # minutes east of UTC of each time with an offset
    zoned = pc.match_substring_regex(text, _OFFSET_AFTER_TIME)
    if pc.any(zoned).as_py():
        offset = pc.extract_regex(pc.if_else(zoned, text, pa.scalar(None, pa.string())), _UTC_OFFSET)
        given = pc.struct_field(offset, "minutes")  # empty for an offset of hours
        minutes = pc.add(pc.multiply(pc.cast(pc.struct_field(offset, "hours"), pa.int64()), 60),
                         pc.cast(pc.if_else(pc.equal(given, ""), "0", given), pa.int64()))
        east = pc.if_else(pc.equal(pc.struct_field(offset, "sign"), "-"), pc.negate(minutes), minutes).fill_null(0)
        text = pc.if_else(zoned, pc.replace_substring_regex(text, r"[+-]\d{2}(:?\d{2})?$", ""), text)
    whole = pc.replace_substring_regex(text, r"\.\d+$", "")
    out = None
    for fmt in _ISO_FORMATS:  # until every text parses: a column of one form is read by one of them
        parsed = pc.strptime(whole, format=fmt, unit="us", error_is_null=True)
        out = parsed if out is None else pc.coalesce(out, parsed)
        if out.null_count == whole.null_count:
            break
    digits = pc.struct_field(pc.extract_regex(text, r"\.(?P<frac>\d+)$"), "frac")
    micros = pc.cast(pc.utf8_slice_codeunits(pc.utf8_rpad(digits, width=6, padding="0"), 0, 6), pa.int64())
    local = pc.add(pc.cast(out, pa.int64()), micros.fill_null(0))
    return pc.cast(local if east is None else pc.subtract(local, pc.multiply(east, 60_000_000)), pa.timestamp("us"))
