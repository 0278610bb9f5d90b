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

from sessrec.data.columns import MissingIdError, Rows, SchemaError, check_id, check_numeric, file_row
from sessrec.data.times import TimeUnit, parse_time
from sessrec.saved.registry import register

FeatureKind = Literal["categorical", "continuous"]
VIRTUAL = "virtual"  # the validated events' bool column (and the session table's list<bool> column) of virtual events


def header_hint(names: list[str]) -> str | None:
    """What a text file's column names say went wrong when a schema's column is not among them: a header line
    that was not split into fields (another separator), or a first line of values (a file without a header)."""
    if len(names) == 1 and any(sep in names[0] for sep in (" ", ",", ";", "\t", "|")):
        return (f"The file reads as one column, {names[0]!r}: its separator is not the one it was read with (a comma, "
                "tab, semicolon or bar is found from the header line; a source's `delimiter` sets another).")
    if names and all(_is_number(name) for name in names):
        return ("The file's first line holds values, not column names: the file needs a header line naming its "
                "columns.")
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
        """Refuse an unmarked event without an item id (a `MissingIdError`: a CSV file's readers name the field's
        text), naming the value of `column` that `values` misses."""
        missing = table.column(item_id).is_null().to_numpy(zero_copy_only=False) & ~virtual
        if missing.any():
            index = int(np.flatnonzero(missing)[0])
            raise MissingIdError(
                source, item_id, file_row(rows, index),
                f", where column {self.column!r} holds {table.column(self.column)[index].as_py()!r}, not one of "
                f"virtual.values {list(self.values)}; list that value to mark the event virtual, or drop or fill the row"
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
        timestamp: event time column, or None when the row order within a session is the time order (the
            text ``None``, which the command line gives for a null, is None too).
        time_unit: unit of a numeric ``timestamp`` (``s``, ``ms``, ``us``, ``ns``), or ``datetime`` for
            timestamp/date columns and ISO-8601 strings. Numeric times that this unit places
            outside 1990..2100 are refused with the unit that would fit (milliseconds read as
            seconds would be the year 46,000); times that no unit places there are relative.
            Timestamps, dates and ISO-8601 strings are held to the same rule: before 1970, after
            2100, or before 1990 beside times in 1990..2100 is refused.
        order_by: optional tie-breaking column within a session (e.g. trivago's ``step``,
            DIGINETICA's ``timeframe``); None (or the text ``None``) for none.
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
        for role in ("timestamp", "order_by"):
            if getattr(self, role) == "None":  # the command line's parser gives a null of a source's schema as 'None'
                object.__setattr__(self, role, None)
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

    def _check_no_header_row(self, table: pa.Table, source: str, first_row: int) -> None:
        """Refuse a row whose session and item ids are their columns' names: the header line again (CSV files
        concatenated with their headers), which would be read as a session named ``session_id`` where the ids are
        text (`string_ids`, or a first block that holds that line)."""
        ids = [table.column(c) for c in (self.session_id, self.item_id)]
        if not all(pa.types.is_string(c.type) or pa.types.is_large_string(c.type) for c in ids):
            return
        named = pc.and_(pc.equal(ids[0], self.session_id), pc.equal(ids[1], self.item_id))
        at = pc.index(named.fill_null(False), True).as_py()
        if at >= 0:
            raise SchemaError(f"{source}: row {first_row + at} repeats the header line (column {self.session_id!r} holds "
                              f"{self.session_id!r}, column {self.item_id!r} holds {self.item_id!r}): files concatenated "
                              "with their header lines? drop that line")

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
            SchemaError: on a missing column or one the file has twice, the header line again, wrong dtype, null or
                negative id, or unparsable time.
        """
        if table.num_rows == 0:
            raise SchemaError(f"{source}: the file has no rows")
        missing = [c for c in self.columns if c not in table.column_names]
        if missing:
            raise SchemaError(
                f"{source}: column {missing[0]!r} is missing; the file has columns {table.column_names}. "
                + (header_hint(table.column_names) or "Set the schema's column names to match the file.")
            )
        twice = [c for c in self.columns if table.column_names.count(c) > 1]
        if twice:
            raise SchemaError(
                f"{source}: column {twice[0]!r} appears {table.column_names.count(twice[0])} times in the file's columns "
                f"{table.column_names}, so which one it is is unknown; rename or drop the others"
            )
        rows = first_row
        self._check_no_header_row(table, source, rows)
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
            out[self.order_by] = check_numeric(table, self.order_by, source, rows)
        for feat in self.features:
            if feat.kind == "continuous":
                out[feat.name] = check_numeric(table, feat.name, source, rows)
            else:
                out[feat.name] = check_id(table, feat.name, source, rows, markers=False)
        if self.virtual is not None:
            out[VIRTUAL] = pa.array(virtual)
        return pa.table(out)
