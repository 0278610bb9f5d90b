"""Bounded-memory stream of sessions to score, read from a parquet or CSV file in chunks.

Two input layouts are accepted:
- one row per session, with a list column of raw item ids (as ``sessrec`` writes splits);
- one row per event, rows of a session contiguous (as loggers write them). A session cut by a
  chunk boundary is carried over to the next chunk, so memory stays at one chunk plus one
  session (and the session ids seen, to refuse one that comes again).

Batches hold `batch_size` sessions each (the last one the rest), cut the same way whatever the
chunks read: batch ``i`` is the sessions ``i * batch_size ..`` of the file. `ScoringStream.partitions`
cuts the file into row ranges of whole sessions (a session never spans two), read from the session
id column alone; a stream over one range (``rows``) yields exactly the batches of the whole file's
stream that fall in it when the range starts at a multiple of `batch_size` sessions.

Either way the schema's ``timestamp`` column, when the file has it, orders the events of each
session (a list column of times in the list layout); without it the file order is the time order.
Asked for them (``times=True``), the batches carry those times in seconds (`SessionBatch.times`).

A model trained with side features needs their columns in the file, under the names the
recipe's ``side_features`` gives (per event, or as list columns beside ``item_id``), and a
timestamp column for time features; they are transformed by the transforms fitted in training
(``features.npz``). Virtual events are those the schema's virtual role (`VirtualSpec`) marks, in
the event layout; without it, a boolean ``virtual`` column, when present, marks events whose
``item_id`` holds a virtual item's key (e.g. ``filter selection:4 Star``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from sessrec.data import frame
from sessrec.data.batch import ITEM_DTYPE, SessionBatch
from sessrec.data.columns import MissingIdError, SchemaError, check_id, no_such
from sessrec.data.readers import (
    BLOCK_BYTES,
    NULL_VALUES,
    _is_parquet,
    _sniff_delimiter,
    first_block,
    integer_columns,
    integer_ids,
    missing_id,
    number_columns,
    read_numbers,
)
from sessrec.data.schema import FeatureSpec, Schema, header_hint
from sessrec.data.side import FittedSideFeatures
from sessrec.data.times import parse_time
from sessrec.data.vocab import EncodeResult, ItemVocab


class Partition(NamedTuple):
    """File rows ``[start, stop)`` that hold `sessions` whole sessions."""

    start: int
    stop: int
    sessions: int


class ScoringStream:
    """Iterate over `SessionBatch`es (with raw session ids in ``keys``) of a sessions file.

    The events of a session are ordered by the schema's ``timestamp`` column (then its
    ``order_by``) when the file has that column, and kept in file order when it has none. A
    session id must name one session: a repeated id (a second row of the list layout, or rows
    apart in the event layout) is refused, since it would give two ambiguous output rows. The
    ids streamed so far are kept for that check (8 bytes per integer id).

    Args:
        path: parquet, or CSV/TSV (plain or compressed: .gz, .bz2, .zst, .lz4).
        vocab: the fitted vocabulary of the model; unknown items map to OOV and are counted.
        schema: session/item (and optional timestamp) column names of the file.
        max_length: most recent items kept per session.
        batch_size: sessions per batch.
        chunk_rows: rows read from the file at a time.
        side: fitted side-feature transforms of the model, if it uses side features.
        rank: this process's index among the data-parallel processes (0 .. world_size - 1).
        world_size: the number of data-parallel processes. Every rank reads (and
            checks) the whole file and yields every `world_size`-th batch from batch `rank` on.
        times: give each batch its sessions' event times (`SessionBatch.times`, seconds since the
            epoch, right-aligned with the items, 0 on padding) when the file has the schema's
            ``timestamp`` column (read from the file's header here); ``self.times`` then says
            whether the batches carry them.
        rows: read only the file rows ``[start, stop)`` (a range of `partitions`); a session
            repeated outside it is not seen here (`partitions` refuses it for the whole file).
        schema_flag: the command-line setting that names the file's columns (``--data.predict_schema``), which
            the refusal of a file without the schema's session or item column names; None: the schema's.

    Raises:
        SchemaError: (while iterating) on a bad row; the message names the file, column, row and value.
            Asked for times, an unreadable header already here.
    """

    def __init__(
        self,
        path: str | Path,
        vocab: ItemVocab,
        schema: Schema = Schema(),  # noqa: B008 - a config value, never mutated
        max_length: int = 20,
        batch_size: int = 1024,
        chunk_rows: int = 100_000,
        side: FittedSideFeatures | None = None,
        rank: int = 0,
        world_size: int = 1,
        times: bool = False,
        rows: tuple[int, int] | None = None,
        schema_flag: str | None = None,
    ) -> None:
        if rows is not None and not 0 <= rows[0] < rows[1]:
            raise ValueError(f"rows must be a range [start, stop) with 0 <= start < stop, got {rows}")
        self.rows = rows
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need world_size >= 1 and 0 <= rank < world_size, got rank {rank} of {world_size}")
        self.rank, self.world_size = rank, world_size
        self.path = Path(path)
        if not self.path.exists():
            raise no_such(self.path, "file to score")
        for name, value in (("max_length", max_length), ("batch_size", batch_size), ("chunk_rows", chunk_rows)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.vocab, self.schema, self.side, self.schema_flag = vocab, schema, side, schema_flag
        self.extra = [] if side is None else [*side.config.categorical, *side.config.continuous]
        if side is not None and side.config.time and schema.timestamp is None:
            raise ValueError(
                f"the model's side features {side.config.time} need event times: set --data.predict_schema.timestamp "
                f"to the time column of {self.path}"
            )
        self.max_length, self.batch_size, self.chunk_rows = max_length, batch_size, chunk_rows
        self.num_sessions = self.num_items = self.num_unknown = 0
        self.times = times and schema.timestamp is not None and schema.timestamp in self.columns()

    @property
    def no_times(self) -> str:
        """What the sessions lack when the batches carry no event times, in words (for a refusal)."""
        if self.schema.timestamp is None:
            return "no time column (the schema's timestamp is null)"
        return f"no {self.schema.timestamp!r} column"

    @property
    def _needs_times(self) -> bool:
        return self.times or (self.side is not None and bool(self.side.config.time))

    def columns(self) -> list[str]:
        """The file's column names, read from its header (parquet schema, CSV first line)."""
        try:
            return list(pq.read_schema(self.path).names if _is_parquet(self.path) else self._csv()[0].schema.names)
        except (pa.ArrowInvalid, OSError) as err:
            raise SchemaError(f"{self.path}: cannot be read: {err}") from err

    def _csv(self, columns: list[str] | None = None) -> tuple[pacsv.CSVStreamingReader, list[str], list[str]]:
        """A streaming reader of the CSV file's `columns` (None: all), the id columns it reads as text that
        `integer_ids` reads as integers (those its first block holds integers in, as `integer_columns`) and the
        number columns it reads as text that `read_numbers` reads as numbers (`number_columns`); its categorical
        columns (the schema's and the model's side features) it reads as text (`Schema.text_columns`), and so its item ids
        where the model's vocabulary holds text ids (``002`` is that vocabulary's ``'002'``, not the integer 2)."""
        parse = pacsv.ParseOptions(delimiter=_sniff_delimiter(self.path))

        def reader(types: dict[str, pa.DataType]) -> pacsv.CSVStreamingReader:
            convert = pacsv.ConvertOptions(column_types=types, null_values=NULL_VALUES, strings_can_be_null=True,
                                           include_columns=columns or [])
            return pacsv.open_csv(self.path, read_options=pacsv.ReadOptions(block_size=BLOCK_BYTES), parse_options=parse,
                                  convert_options=convert)

        inferred = first_block(self.path, parse)
        side = [c for c in self.side.config.categorical if c != frame.VIRTUAL] if self.side is not None else []
        text_ids = pa.types.is_string(self.vocab.raw_ids.type) or pa.types.is_large_string(self.vocab.raw_ids.type)
        items = [self.schema.item_id] if text_ids else []
        text = [*self.schema.text_columns, *side, *items]
        integers = integer_columns(inferred, [c for c in self.schema.decimal_id_columns if c not in items])
        numbers = number_columns(inferred, self.schema)
        return reader({c: pa.string() for c in [*text, *integers, *numbers]}), integers, numbers

    def _chunks(self, columns: list[str] | None = None) -> Iterator[tuple[pa.Table, int]]:
        """(rows, file row of the first one) chunk by chunk, of `columns` (None: all) and of the rows
        of ``self.rows`` (None: all); raises when the file has no rows."""
        start, stop = self.rows if self.rows is not None else (0, None)
        first = 0
        try:
            if _is_parquet(self.path):
                meta = pq.ParquetFile(self.path, pre_buffer=False)  # pre-buffering caches every row group read
                sizes = np.array([meta.metadata.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)
                ends = np.cumsum(sizes)
                # the row groups that hold rows of [start, stop): skip those before, read none after
                groups = [g for g in range(len(sizes)) if ends[g] > start and (stop is None or ends[g] - sizes[g] < stop)]
                first = int(ends[groups[0]] - sizes[groups[0]]) if groups else 0
                batches = meta.iter_batches(batch_size=self.chunk_rows, row_groups=groups, columns=columns)
                integers, numbers = [], []
            else:
                batches, integers, numbers = self._csv(columns)
            for rb in batches:
                lo, hi = max(start - first, 0), rb.num_rows if stop is None else min(stop - first, rb.num_rows)
                if hi > lo:
                    rows = pa.Table.from_batches([rb.slice(lo, hi - lo)])
                    yield integer_ids(read_numbers(rows, numbers), integers, str(self.path), first + lo), first + lo
                first += rb.num_rows
                if stop is not None and first >= stop:
                    break
        except (pa.ArrowInvalid, OSError) as err:
            raise SchemaError(f"{self.path}: cannot be read: {err}") from err
        if first == 0:
            raise SchemaError(f"{self.path}: the file has no rows")

    def partitions(self, sessions: int) -> list[Partition]:
        """The file cut into row ranges ``[start, stop)`` of `sessions` whole sessions each (the last
        one the rest), in file order, read from the session id column alone.

        Every session id is checked as iterating checks it (a null or bad id, a session that comes
        again), for the whole file: streams over the ranges (``rows``) then need not see each other.

        Raises:
            SchemaError: a missing session column, a bad or repeated session id (the file, column,
                value and row named), a file without rows.
        """
        if sessions < 1:
            raise ValueError(f"sessions per partition must be >= 1, got {sessions}")
        s, columns = self.schema, self.columns()
        if s.session_id not in columns:
            hint = header_hint(columns) or (f"Name the file's columns with {self.schema_flag} '{{session_id: <its session "
                                            "column>, item_id: <its item column>}'." if self.schema_flag else None)
            raise SchemaError(f"{self.path}: column {s.session_id!r} is missing; the file has columns {columns}"
                              + (f". {hint}" if hint else ""))
        lists = _is_parquet(self.path) and s.item_id in columns and _is_list(pq.read_schema(self.path).field(s.item_id).type)
        seen, cuts, count, last, end = _SeenIds(), [], 0, None, 0
        for chunk, first in self._chunks([s.session_id]):
            try:
                ids = check_id(chunk, s.session_id, str(self.path), first, s.string_ids)
            except MissingIdError as err:
                raise missing_id(err, self.path) from err
            keys = ids.to_numpy(zero_copy_only=False)
            new = np.ones(len(keys), dtype=bool)
            if not lists:  # the event layout: a session is a run of rows with one id
                new[1:] = keys[1:] != keys[:-1]
                new[0] = last is None or keys[0] != last
            starts = np.flatnonzero(new)
            self._check_new(seen, pa.table({frame.SESSION: ids.take(starts)}), first + starts, s)
            number = count + np.arange(len(starts))  # of each session starting here, in the file
            cuts.extend((first + starts[number % sessions == 0]).tolist())
            count, last, end = count + len(starts), keys[-1], first + len(keys)
        counts = [sessions] * (len(cuts) - 1) + [count - sessions * (len(cuts) - 1)]
        return [Partition(*bounds) for bounds in zip(cuts, [*cuts[1:], end], counts)]

    def _file_schema(self, columns: list[str]) -> Schema:
        """The schema, without its timestamp when the file has no such column (file order then)."""
        s = self.schema
        missing = [c for c in (s.session_id, s.item_id) if c not in columns]
        if missing and self.schema_flag is not None:
            raise SchemaError(
                f"{self.path}: column {missing[0]!r} is missing; the file has columns {columns}. " + (
                    header_hint(columns) or f"Name the file's columns with {self.schema_flag} "
                    "'{session_id: <its session column>, item_id: <its item column>}'.")
            )
        if s.timestamp is None or s.timestamp in columns:
            return s
        if self._needs_times:
            why = "the event times were asked for"
            if not self.times:
                why = f"the model's side features {self.side.config.time} need event times"
            raise SchemaError(f"{self.path}: column {s.timestamp!r} is missing; {why} (the file has columns {columns})")
        return replace(s, timestamp=None)

    def _sessions(self) -> Iterator[pa.Table]:
        """Complete sessions (``session_id``, ``item_id`` list), chunk by chunk."""
        carry: pa.Table | None = None
        carry_row = 0  # file row of the carried session's first event
        seen = _SeenIds()
        for chunk, first in self._chunks():
            s = self._file_schema(chunk.column_names)
            if chunk.column_names.count(s.item_id) == 1 and _is_list(chunk.schema.field(s.item_id).type):
                if s.virtual is not None:
                    raise SchemaError(f"{self.path}: column {s.item_id!r} holds lists; the schema's virtual role marks "
                                      "events of the event layout (one row per event): give one row per event")
                sessions = self._validate_lists(chunk, first, s)
                self._check_new(seen, sessions, first + np.arange(sessions.num_rows), s)
                yield sessions
                continue
            try:
                events = s.validate(chunk, source=str(self.path), first_row=first)
            except MissingIdError as err:
                raise missing_id(err, self.path) from err
            flags = [frame.VIRTUAL] if frame.VIRTUAL in chunk.column_names and s.virtual is None else []
            for name in [*self.extra, *flags]:
                if name not in chunk.column_names:
                    raise SchemaError(
                        f"{self.path}: column {name!r} is missing; the model uses it as a side feature "
                        f"(the file has columns {chunk.column_names})"
                    )
                if name not in events.column_names:  # one the schema's features carry is validated there
                    events = events.append_column(name, chunk.column(name))
            base = first
            if carry is not None:
                events = pa.concat_tables([carry, events], promote_options="default")
                base = carry_row
            ids = events.column(s.session_id).to_numpy(zero_copy_only=False)
            offsets = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1, [len(ids)]])
            run_ids = ids[offsets[:-1]]
            repeat = _duplicated(run_ids)
            if repeat.any():
                at = int(offsets[np.flatnonzero(repeat)[0]])
                raise SchemaError(
                    f"{self.path}: column {s.session_id!r}: session {events.column(s.session_id)[at].as_py()!r} comes "
                    f"again at row {base + at} after rows of other sessions; group the events of a session together"
                )
            carry, carry_row = events.slice(offsets[-2]), base + int(offsets[-2])
            complete = events.slice(0, offsets[-2])
            if complete.num_rows:
                self._check_new(seen, pa.table({frame.SESSION: run_ids[:-1]}), base + offsets[:-2], s)
                yield self._group(complete, s)
        if carry is not None and carry.num_rows:
            self._check_new(seen, pa.table({frame.SESSION: carry.column(s.session_id).slice(0, 1)}), [carry_row], s)
            yield self._group(carry, s)

    def _check_new(self, seen: _SeenIds, sessions: pa.Table, rows: np.ndarray, s: Schema) -> None:
        """Refuse a session id streamed before (or twice in `sessions`); `rows` are the sessions' file rows."""
        ids = sessions.column(frame.SESSION)
        repeat = seen.add(ids)
        if repeat is not None:
            raise SchemaError(
                f"{self.path}: column {s.session_id!r} has session {ids[repeat].as_py()!r} again at row "
                f"{int(rows[repeat])}; each session needs one row (list layout) or adjacent rows (event layout), "
                "else its recommendations would be written twice"
            )

    def _group(self, events: pa.Table, s: Schema) -> pa.Table:
        """One row per session, each session's events in time order (stable: file order on ties)."""
        keys = [(c, "ascending") for c in (s.timestamp, s.order_by) if c is not None]
        if keys:
            ids = events.column(s.session_id).to_numpy(zero_copy_only=False)
            run = np.concatenate([[0], np.cumsum(ids[1:] != ids[:-1])]) if len(ids) else np.zeros(0, np.int64)
            ranked = events.append_column("__session_run", pa.array(run))  # sessions stay in file order
            events = events.take(pc.sort_indices(ranked, sort_keys=[("__session_run", "ascending"), *keys]))
        carried = [c for c in events.column_names if c not in (s.session_id, s.item_id, s.timestamp, s.order_by)]
        grouping = Schema(
            s.session_id, s.item_id, s.timestamp if self._needs_times else None, features=[FeatureSpec(c) for c in carried]
        )
        sessions = frame.group_sessions(events, grouping)
        if s.virtual is None or s.virtual.keep:
            return sessions
        dropped = frame.drop_virtual(sessions)
        empty = frame.session_lengths(dropped) == 0
        if empty.any():
            raise SchemaError(
                f"{self.path}: session {dropped.column(frame.SESSION)[int(np.flatnonzero(empty)[0])].as_py()!r} is made only "
                f"of virtual events (column {s.virtual.column!r} holds one of {list(s.virtual.values)} on each), which "
                "virtual.keep false drops, leaving nothing to score; keep them or drop the session"
            )
        return dropped

    def _validate_lists(self, chunk: pa.Table, first: int, s: Schema) -> pa.Table:
        """Sessions of the list layout, ids checked and items in time order; messages name file rows."""
        if s.session_id not in chunk.column_names:
            raise SchemaError(f"{self.path}: column {s.session_id!r} is missing; the file has {chunk.column_names}")
        sid = check_id(chunk, s.session_id, str(self.path), first, s.string_ids)
        lists = chunk.column(s.item_id)
        lengths = pc.list_value_length(lists).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        if (lengths == 0).any():
            row = int(np.flatnonzero(lengths == 0)[0])
            raise SchemaError(
                f"{self.path}: column {s.item_id!r}: session {sid[row].as_py()!r} (row {first + row}) has no items"
            )
        row_of = first + np.repeat(np.arange(len(lengths)), lengths)  # (E,) file row of every item
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        flat = frame.list_offsets(lists)[0]
        items = check_id(pa.table({s.item_id: flat}), s.item_id, str(self.path), row_of, s.string_ids)
        out = {frame.SESSION: sid, frame.ITEMS: _relist(offsets, items)}
        extra = [*self.extra, *([frame.VIRTUAL] if frame.VIRTUAL in chunk.column_names else [])]
        for name in extra:
            if name not in chunk.column_names:
                raise SchemaError(
                    f"{self.path}: column {name!r} is missing; the model uses it as a side feature "
                    f"(the file has columns {chunk.column_names})"
                )
            out[name] = chunk.column(name)
        if s.timestamp is not None and _is_list(chunk.schema.field(s.timestamp).type):
            seconds = self._list_times(chunk.column(s.timestamp), lengths, row_of, s)
            order = np.lexsort((seconds, row_of))  # stable: file order on ties
            take = pa.array(order)
            for name, col in out.items():
                values = frame.list_offsets(col)[0] if _is_list(col.type) else None
                if values is not None and len(values) == len(order):  # per-event lists (else side features refuse them)
                    out[name] = _relist(offsets, values.take(take))
            if self._needs_times:
                out[frame.TIMES] = _relist(offsets, pa.array(seconds[order]))
        elif self._needs_times:
            out[frame.TIMES] = chunk.column(s.timestamp)
        return pa.table(out)

    def _list_times(self, times: pa.ChunkedArray, lengths: np.ndarray, row_of: np.ndarray, s: Schema) -> np.ndarray:
        """(E,) seconds of a list column of event times, one per item of each row."""
        n_times = pc.list_value_length(times).fill_null(0).to_numpy(zero_copy_only=False)
        if not np.array_equal(n_times, lengths):
            row = int(np.flatnonzero(n_times != lengths)[0])
            raise SchemaError(
                f"{self.path}: column {s.timestamp!r} has {n_times[row]} times for the {lengths[row]} items of column "
                f"{s.item_id!r} at row {int(row_of[0]) + row}"
            )
        flat = pa.table({s.timestamp: frame.list_offsets(times)[0]})
        return parse_time(flat, s.timestamp, s.time_unit, str(self.path), row_of).to_numpy()

    def _encode(self, sessions: pa.Table, values: pa.Array) -> EncodeResult:
        """The model ids of the sessions' flat item ids `values`, virtual ones looked up as such."""
        virtual = None
        if frame.VIRTUAL in sessions.column_names:
            virtual = frame.list_offsets(sessions.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
        return self.vocab.encode(values, virtual=virtual, source=f"{self.path}: column {self.schema.item_id!r}")

    def check_known(self) -> None:
        """Refuse a file whose first batch of sessions holds no item id the vocabulary knows:
        sessions of another catalogue, or ids of another kind, which would be scored as sessions of unknown
        items alone (the same list for each) and written as if they were recommendations.

        Raises:
            SchemaError: the file, its item column, how many ids of how many sessions were read, and the first.
        """
        for sessions in _whole_batches(self._sessions(), self.batch_size):
            sessions = sessions.slice(0, self.batch_size)
            values, _ = frame.list_offsets(sessions.column(frame.ITEMS))
            encoded = self._encode(sessions, values)
            if len(values) and encoded.num_unknown == len(values):
                raise SchemaError(
                    f"{self.path}: column {self.schema.item_id!r}: none of the {len(values)} item ids of its first "
                    f"{sessions.num_rows} sessions is known to the model (the first: {values[0].as_py()!r}); these are "
                    "sessions of another catalogue, or another column's ids: check the file and the schema's item_id")
            return

    def __iter__(self) -> Iterator[SessionBatch]:
        batch = -1
        for sessions in _whole_batches(self._sessions(), self.batch_size):
            values, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
            encoded = self._encode(sessions, values)
            if self.rank == 0:  # every rank reads the whole file: rank 0 counts it
                self.num_sessions += sessions.num_rows
                self.num_items += len(encoded.ids)
                self.num_unknown += encoded.num_unknown
            starts, ends = offsets[:-1], offsets[1:]
            items = torch.from_numpy(frame.pad_sessions(encoded.ids, starts, ends, self.max_length, ITEM_DTYPE))
            flat = {} if self.side is None else self.side.transform(sessions, str(self.path))
            feats = {k: torch.from_numpy(frame.pad_sessions(v, starts, ends, self.max_length)) for k, v in flat.items()}
            keys = sessions.column(frame.SESSION).combine_chunks()
            stamps = self._times(sessions) if self.times else None
            for lo in range(0, sessions.num_rows, self.batch_size):
                batch += 1
                if batch % self.world_size != self.rank:
                    continue
                hi = min(lo + self.batch_size, sessions.num_rows)
                rows = items[lo:hi]
                width = max(int((rows != 0).sum(dim=1).max()), 1)
                yield SessionBatch(
                    items=rows[:, -width:],
                    index=torch.arange(lo, hi),
                    keys=keys.slice(lo, hi - lo),
                    features={k: v[lo:hi, -width:] for k, v in feats.items()} if self.side is not None else None,
                    times=None if stamps is None else stamps[lo:hi, -width:],
                )

    def _times(self, sessions: pa.Table) -> torch.Tensor:
        """(N, max_length) float64 event times of the sessions, right-aligned, 0 on padding."""
        column = sessions.column(frame.TIMES)
        if not _is_list(column.type):
            raise SchemaError(
                f"{self.path}: column {self.schema.timestamp!r} holds one value per session; give a list of event "
                f"times per session, one per item of column {self.schema.item_id!r}"
            )
        values, offsets = frame.list_offsets(column)
        seconds = values.to_numpy(zero_copy_only=False).astype(np.float64)
        return torch.from_numpy(frame.pad_sessions(seconds, offsets[:-1], offsets[1:], self.max_length, np.float64))


def _whole_batches(tables: Iterator[pa.Table], size: int) -> Iterator[pa.Table]:
    """The rows of `tables` again, in tables of a multiple of `size` rows (the last one the rest):
    batches cut from them do not depend on where the chunks were cut."""
    carry = None
    for table in tables:
        if carry is not None:
            table = pa.concat_tables([carry, table])
        whole = table.num_rows - table.num_rows % size
        if whole:
            yield table.slice(0, whole)
        carry = table.slice(whole)
    if carry is not None and carry.num_rows:
        yield carry


def _is_list(typ: pa.DataType) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ)


def _relist(offsets: np.ndarray, values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A list array of `values` cut at `offsets` (N + 1,)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if offsets[-1] < 2**31:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
    return pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64)), values)


class _SeenIds:
    """Session ids streamed so far, to refuse one that comes again.

    Held as a few sorted arrays of decreasing size, two merged when the newer one grows as large
    as the one before it (a log-structured merge): checking n ids against N costs O(n log N), and
    memory is one copy of the ids.
    """

    def __init__(self) -> None:
        self.levels: list[np.ndarray] = []

    def add(self, ids: pa.Array | pa.ChunkedArray) -> int | None:
        """Record `ids`; the index of the first one seen before (or twice among `ids`), else None."""
        if len(ids) == 0:  # a chunk inside one session starts none: an empty level would break every later search
            return None
        if pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type):
            ids = pc.binary_join_element_wise(ids, "", "\x01")  # a last character: fixed-width text drops trailing NULs
        keys = ids.to_numpy(zero_copy_only=False)
        if keys.dtype == object:
            keys = keys.astype(str)  # text ids: fixed-width strings sort and search in C ("s" and "s\x00" kept apart)
        repeat = _duplicated(keys)
        for level in self.levels:
            at = np.minimum(np.searchsorted(level, keys), len(level) - 1)
            repeat |= level[at] == keys
        if repeat.any():
            return int(np.flatnonzero(repeat)[0])
        new = np.sort(keys)
        while self.levels and len(self.levels[-1]) <= len(new):
            new = np.sort(np.concatenate([self.levels.pop(), new]))
        self.levels.append(new)
        return None


def _duplicated(values: np.ndarray) -> np.ndarray:
    """Boolean mask of entries equal to an earlier entry (first occurrences are False)."""
    _, first = np.unique(values, return_index=True)
    dup = np.ones(len(values), dtype=bool)
    dup[first] = False
    return dup
