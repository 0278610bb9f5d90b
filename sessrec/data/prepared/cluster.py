"""`DaskEngine`: the partitioned plan (`sessrec.data.prepared.plan`) on a Dask cluster.

Dask reads the log in pieces (parquet row groups, byte ranges of a plain CSV file; a gzipped file is
one piece, since it can only be decompressed from its start), validates each piece with the
schema, shuffles the events by session id into partitions, and runs the plan's steps as tasks:
each partition sessionized with `EventLogSource.sessionize` into a session file, then each part
gathered from them. The scheduling, the shuffle (spilled to disk beyond the workers' memory) and the
transfers are Dask's.

Partitions are pandas frames (Arrow-backed columns) on CPUs, or cuDF frames with ``backend="cudf"``
(dask-cudf): then the pieces are read into GPU memory and shuffled there, and each partition comes
back to Arrow for the sessionization, so the semantics stay those of the Arrow code.

The session files and the parts are written under the output directory: on a cluster of several
machines it must be a filesystem that every worker sees (NFS, a mounted bucket).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from sessrec.data.columns import MissingIdError
from sessrec.data.periods import SplitPeriods
from sessrec.data.prepared.dataset import Layout
from sessrec.data.prepared.local import estimated_event_bytes, partitions_for
from sessrec.data.prepared.plan import (
    PartitionSummary,
    PartResult,
    build_part,
    needs_by_end,
    plan_parts,
    sessionize_partition,
)
from sessrec.data.readers import (
    NULL_VALUES,
    _is_parquet,
    _sniff_delimiter,
    check_time_samples,
    compression,
    first_block,
    integer_columns,
    integer_ids,
    missing_id,
    number_columns,
    parquet_metadata,
    read_numbers,
    time_sample,
)
from sessrec.data.schema import VIRTUAL, Schema, SchemaError
from sessrec.data.sources import EventLogSource

ROW = "__row"  # the file order of an event: piece << 32 | row within the piece
PIECE_BYTES = 64 << 20  # bytes of a plain CSV file in one piece
PIECE_ROWS = 1 << 21  # rows of a parquet file in one piece (whole row groups)


@dataclass(frozen=True)
class Piece:
    """A part of a log that one task reads: parquet row groups, or the lines starting in a byte range."""

    path: str
    index: int
    row_groups: tuple[int, ...] = ()  # parquet
    first_row: int = 0  # parquet: the file row of its first row
    start: int = 0  # CSV: lines whose first byte lies in [start, end); end None: to the end of the file
    end: int | None = None


def pieces_of(path: str) -> list[Piece]:
    """The pieces of a log: row groups of `PIECE_ROWS` rows, byte ranges of `PIECE_BYTES`, or a compressed file whole."""
    piece_bytes, piece_rows = PIECE_BYTES, PIECE_ROWS
    if _is_parquet(Path(path)):
        meta = parquet_metadata(path)
        pieces, groups, rows, first = [], [], 0, 0
        for g in range(meta.num_row_groups):
            groups.append(g)
            rows += meta.row_group(g).num_rows
            if rows >= piece_rows or g == meta.num_row_groups - 1:
                pieces.append(Piece(path, len(pieces), tuple(groups), first))
                first, groups, rows = first + rows, [], 0
        return pieces or [Piece(path, 0)]
    if compression(path) is not None:  # a compressed stream is read from its start
        return [Piece(path, 0)]
    size = os.path.getsize(path)
    bounds = list(range(0, size, piece_bytes)) + [size]
    return [Piece(path, i, start=a, end=b) for i, (a, b) in enumerate(itertools.pairwise(bounds))]


def read_piece(piece: Piece, schema: Schema, delimiter: str | None, column_types: pa.Schema | None) -> tuple[pa.Table, Any]:
    """The validated events of a piece, with their file order in the column `ROW`, and its `time_sample`.

    `column_types` are those of the file's first block (CSV): its id columns of integers are read as text, then
    as the integers they are written as (`integer_ids`), as `read_events` reads them; its number columns of
    integers as text, then as the numbers they are written as (`number_columns`, `read_numbers`); its text
    columns (`Schema.text_columns`) as text."""
    path = Path(piece.path)
    integers = [] if column_types is None else integer_columns(column_types, schema.decimal_id_columns)
    numbers = [] if column_types is None else number_columns(column_types, schema)
    try:
        if _is_parquet(path):
            parquet = pq.ParquetFile(path)
            names = parquet.schema_arrow.names
            columns = schema.columns if all(c in names for c in schema.columns) else None
            table = parquet.read_row_groups(list(piece.row_groups), columns=columns)
            where = str(path)
        else:
            delim = delimiter or _sniff_delimiter(path)
            text = [*integers, *numbers, *schema.text_columns]
            convert = pacsv.ConvertOptions(column_types={f.name: pa.string() if f.name in text else f.type
                                                         for f in column_types or []},
                                           null_values=NULL_VALUES, strings_can_be_null=True)
            parse = pacsv.ParseOptions(delimiter=delim)
            if piece.end is None:  # the whole file (gzipped)
                table = pacsv.read_csv(path, parse_options=parse, convert_options=convert)
                where = str(path)
            else:
                table = pacsv.read_csv(pa.py_buffer(_lines(path, piece.start, piece.end)), parse_options=parse,
                                       convert_options=convert)
                where = f"{path} (the lines from byte {piece.start})"
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as err:
        raise SchemaError(f"{path}: cannot be read as {'parquet' if _is_parquet(path) else 'CSV'}: {err}") from err
    raw = table = read_numbers(table, numbers)
    try:
        table = integer_ids(table, integers, where, piece.first_row)
        if not table.num_rows:
            return _empty(schema, table).append_column(ROW, pa.array([], pa.int64())), None
        events = schema.validate(table, source=where, first_row=piece.first_row)
    except SchemaError as err:
        if piece.end is None or piece.start == 0:
            if isinstance(err, MissingIdError):
                raise missing_id(err, path, delimiter, where) from err
            raise
        first = rows_before(path, piece.start, parse)  # checked again with the rows of the file, as `read_events` names them
        try:
            schema.validate(integer_ids(raw, integers, str(path), first), source=str(path), first_row=first)
        except MissingIdError as again:
            raise missing_id(again, path, delimiter) from again
        raise
    rows = (np.int64(piece.index) << np.int64(32)) + np.arange(events.num_rows, dtype=np.int64)
    return events.append_column(ROW, pa.array(rows)), time_sample(table, events, schema, piece.first_row)


def _empty(schema: Schema, table: pa.Table) -> pa.Table:
    """No events, with the columns `Schema.validate` gives."""
    columns = {c: table.column(c) for c in schema.role_columns}
    return pa.table(columns | ({VIRTUAL: pa.array([], pa.bool_())} if schema.virtual is not None else {}))


def _row_count(text: bytes, parse: pacsv.ParseOptions) -> int:
    """The rows Arrow reads from `text` (a header line, then lines of a CSV file), as `read_piece` reads them."""
    header = pacsv.open_csv(pa.py_buffer(text), parse_options=parse).schema.names[:1]
    convert = pacsv.ConvertOptions(include_columns=header, column_types={name: pa.string() for name in header})
    return pacsv.read_csv(pa.py_buffer(text), parse_options=parse, convert_options=convert).num_rows


def rows_before(path: Path, start: int, parse: pacsv.ParseOptions) -> int:
    """The file row of the first line of a CSV file whose first byte lies at or after `start` (the first row of a piece),
    counted a piece's bytes at a time: only a refusal asks for it, to name the rows of the file."""
    return sum(_row_count(_lines(path, a, min(a + PIECE_BYTES, start)), parse) for a in range(0, start, PIECE_BYTES))


def file_time_samples(path: str, pieces: list[Piece], samples: list[Any], parse: pacsv.ParseOptions) -> list[Any]:
    """The `time_sample` of each piece (in `pieces`' order) with the rows of the file: a byte range's sample counts
    its rows from the piece's first."""
    out, first = [], 0
    for piece, sample in zip(pieces, samples, strict=True):
        if sample is not None:
            out.append((*sample[:2], sample[2] + first, *sample[3:]))
        else:
            out.append(None)
        if piece.end is not None:
            first += _row_count(_lines(Path(path), piece.start, piece.end), parse)
    return out


def _lines(path: Path, start: int, end: int) -> bytes:
    """The header line and the lines of a text file whose first byte lies in [start, end)."""
    with open(path, "rb") as fh:
        header = fh.readline()
        if start <= len(header):
            start = len(header)
            fh.seek(start)
        else:
            fh.seek(start - 1)
            if fh.read(1) != b"\n":
                fh.readline()  # the rest of a line that starts before `start`
        pos = fh.tell()
        if pos >= end:
            return header
        data = fh.read(end - pos)
        if data and not data.endswith(b"\n"):
            data += fh.readline()  # the line that starts before `end` ends after it
    return header + data


def _to_frame(table: pa.Table, backend: str) -> Any:
    if backend == "cudf":
        import cudf

        return cudf.DataFrame.from_arrow(table)
    import pandas as pd

    return table.to_pandas(types_mapper=pd.ArrowDtype)


def _to_arrow(frame: Any) -> pa.Table:
    if hasattr(frame, "to_arrow"):  # cuDF
        return frame.to_arrow()
    return pa.Table.from_pandas(frame, preserve_index=False)


def _load_piece(piece: Piece, schema: Schema, delimiter: str | None, column_types: pa.Schema | None,
                backend: str) -> tuple[Any, Any]:
    events, sample = read_piece(piece, schema, delimiter, column_types)
    return _to_frame(events, backend), sample


def _sessionize(frame: Any, source: EventLogSource, path: str, schema: pa.Schema, by_end: bool) -> PartitionSummary:
    """Step 2 on a shuffled partition: back in Arrow with the validated events' types (`schema`; cuDF may
    give large strings), back in file order, then the source's sessionization."""
    events = _to_arrow(frame).select(schema.names).cast(schema)
    events = events.take(pc.sort_indices(events.column(ROW))).drop_columns([ROW])
    return sessionize_partition(source, events, path, by_end)


class DaskEngine:
    """Runs the partitioned plan on a Dask cluster.

    Args:
        memory_budget: memory of the local cluster's workers together (each gets its share); the
            partitions are sized for it, also on a remote cluster.
        workers: workers of the local cluster (one thread each).
        partitions: number of partitions of the shuffle; None: enough for `memory_budget`.
        scheduler: address of a running scheduler (``tcp://host:8786``); None: a local cluster.
        backend: ``pandas`` (CPU) or ``cudf`` (GPU, dask-cudf).
    """

    def __init__(self, memory_budget: int, workers: int = 2, partitions: int | None = None,
                 scheduler: str | None = None, backend: str = "pandas") -> None:
        if backend not in ("pandas", "cudf"):
            raise ValueError(f"backend must be 'pandas' or 'cudf', got {backend!r}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if partitions is not None and partitions < 1:  # 0 would be read as None (as many as the budget needs)
            raise ValueError(f"partitions must be >= 1, or None for as many as the budget needs; got {partitions}")
        self.memory_budget, self.workers, self.partitions = memory_budget, workers, partitions
        self.scheduler, self.backend = scheduler, backend

    def client(self) -> Any:
        from distributed import Client, LocalCluster

        if self.scheduler is not None:
            return Client(self.scheduler)
        if self.backend == "cudf":
            from dask_cuda import LocalCUDACluster

            return Client(LocalCUDACluster())
        cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,  # quiet: see `Engine`
                               memory_limit=self.memory_budget // self.workers, dashboard_address=":0",
                               silence_logs=logging.CRITICAL)
        return Client(cluster)

    def run(self, source: EventLogSource, directory: Path, layout: Layout) -> Iterator[PartResult]:
        """Write the parts of every split into `directory`; yields what each part gave."""
        import dask
        from distributed import as_completed

        if self.backend == "cudf":
            import cudf  # noqa: F401 - the cuDF backend needs it: a missing one is said before the cluster starts
        for name in ("distributed.shuffle._scheduler_plugin", "distributed.shuffle._worker_plugin"):
            logging.getLogger(name).setLevel(logging.ERROR)  # each shuffle's start and end, at WARNING
        scratch = directory / ".scratch"
        scratch.mkdir()
        client = self.client()
        try:
            with dask.config.set({"dataframe.backend": self.backend, "dataframe.shuffle.method": "p2p"}):
                tasks, periods, files_read = [], SplitPeriods(), []
                for f, (path, splits) in enumerate(source.splits_of()):
                    summaries = self.sessionize(client, source, path, scratch / f"file{f}", needs_by_end(source, splits))
                    tasks += plan_parts(source, path, summaries, splits, layout, periods, files_read)
                    files_read.append((path, [s for s in summaries if s.kept]))
                futures = client.map(build_part, tasks, directory=directory, layout=layout, pure=False)
                for done in as_completed(futures):  # the driver folds the counts as the parts finish
                    yield done.result()
                    done.release()
        finally:
            cluster = client.cluster if self.scheduler is None else None
            client.close()
            if cluster is not None:
                cluster.close()
            shutil.rmtree(scratch, ignore_errors=True)

    def sessionize(self, client: Any, source: EventLogSource, path: str, folder: Path,
                   by_end: bool) -> list[PartitionSummary]:
        """Steps 1 and 2 for one file: read and shuffle its events by session, then sessionize each partition."""
        import dask
        import dask.dataframe as dd

        folder.mkdir()
        column_types = None
        if not _is_parquet(Path(path)):  # every piece parses with the types inferred from the file's first block
            delim = pacsv.ParseOptions(delimiter=source.delimiter or _sniff_delimiter(Path(path)))
            try:
                column_types = first_block(path, delim)
            except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as err:  # as `read_piece` words it
                raise SchemaError(f"{path}: cannot be read as CSV: {err}") from err
        pieces = pieces_of(path)
        first, _ = read_piece(pieces[0], source.schema, source.delimiter, column_types)
        meta = _to_frame(first.slice(0, 0), self.backend)
        loaded = [dask.delayed(_load_piece, nout=2)(piece, source.schema, source.delimiter, column_types, self.backend)
                  for piece in pieces]
        events = dd.from_delayed([frame for frame, _ in loaded], meta=meta, verify_meta=False)
        partitions = self.partitions or partitions_for(estimated_event_bytes(path, len(source.schema.columns)),
                                                       self.memory_budget // 2, self.workers)
        shuffled = events.shuffle(on=source.schema.session_id, npartitions=partitions)
        parts = shuffled.to_delayed()
        summaries = [dask.delayed(_sessionize)(part, source, str(folder / f"sessions-{p:05d}.arrow"), first.schema,
                                                  by_end)
                     for p, part in enumerate(parts)]
        summaries, samples = client.gather(client.compute([summaries, [sample for _, sample in loaded]]))
        if not any(summary.count for summary in summaries):  # no session: no event (a header alone, an empty parquet file)
            raise SchemaError(f"{path}: the file has no rows")
        try:
            check_time_samples(samples, source.schema, path)  # the pieces' times, plausible together
        except SchemaError:
            if column_types is None or len(pieces) == 1:
                raise
            check_time_samples(file_time_samples(path, pieces, samples, delim), source.schema, path)  # rows of the file
            raise
        return list(summaries)
