"""The partitioned preparation of an event log, step by step; the engines run these steps.

1. **Partition**: events go to the partition their session id hashes to (`hash_partition`), or, when the
   log is split in memory, to the range of session ids it falls in (`split_in_ranges`), in file order,
   so every session lies whole in one partition.
2. **Sessionize** each partition with the source's own code (`EventLogSource.sessionize`: sort, group,
   drop repeats, cut lengths) into a session file sorted by session id, beside its keys: the session id
   and end time of every session, in that order, and for a split by fractions sorted by end time too
   (`sessionize_partition`). The driver keeps a partition's `PartitionSummary`: counts, its latest end
   time, the names of its files.
3. **Split**: the source's split rule (`EventLogSource.split_labels`) as thresholds (`Labeller`): the
   latest end time and the latest training end time are reductions over the partitions; a fraction's
   threshold is the session at its rank in (end time, session id) order, found by merging the
   partitions' keys sorted by end time (`merged`). A session's split is then a function of its own end
   time and id, the split the whole log gives it: equal end times are ordered by session id, as the
   in-memory path orders them by position in session-id order. Each file's splits join one
   `SplitPeriods` (their counts and first and last end times, from the merge below), which refuses an
   empty split or one that goes back in time before any part is written (`EventLogSource.check_file`,
   as the in-memory path checks them).
4. **Parts**: merging the partitions' keys in session-id order counts each split and cuts it into parts
   of `Layout.part_sessions` sessions; a part is, in each partition, a range of rows (`plan_parts`).
   `build_part` reads those rows a record batch at a time, keeps the part's split, puts them in
   session-id order and writes them; the training parts count their items (`count_items`), and the
   vocabulary is the sum of those counts (`ItemVocab.from_counts`), ranked as `ItemVocab.fit` ranks them.

The driver holds a record batch of keys of each partition while it merges (`BATCH_SESSIONS` sessions,
16 bytes a session), the summaries and the part tasks (a row range for each partition of each part):
nothing for each session of the log. Everything else is held a partition or a part at a time.

So the parts equal, byte for byte, what the in-memory path (`EventLogSource.load`, `ItemVocab.fit`)
writes, whatever the number of partitions (tests/test_prepare.py).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data import frame
from sessrec.data.periods import SPLIT_LABELS as LABELS
from sessrec.data.periods import Span, SplitPeriods, check_id_types
from sessrec.data.prepared.dataset import Layout, PartWritten, write_part
from sessrec.data.sources import EventLogSource
from sessrec.data.vocab import ItemVocab, count_items, sum_counts

BATCH_SESSIONS = 65_536  # sessions in a record batch of a partition's files (what a merge or a part reads at a time)
END = "end"  # a key file's column of end times
PART, ROW = "__partition", "__row"  # what `merged` adds to each row: its run, its row in the run
BATCH_KEY = b"sessrec.batch_rows"


def hash_partition(ids: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """(E,) partition in [0, partitions) of each session id (integers, or non-empty text), the same in
    every process: a multiplicative hash of the integer, or of a polynomial hash of the text's bytes."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if pa.types.is_integer(ids.type):
        keys = ids.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    else:
        keys = _text_hash(ids.cast(pa.large_string()))
    mixed = (keys * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return (mixed % np.uint64(partitions)).astype(np.int64)


def _text_hash(text: pa.LargeStringArray) -> np.ndarray:
    """(E,) uint64 sum of byte * 31^(bytes after it) of each string (wrapping), vectorized over the bytes."""
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset:text.offset + len(text) + 1]
    data = np.frombuffer(text.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]].astype(np.uint64)
    lengths = np.diff(offsets)
    after = np.repeat(offsets[1:] - offsets[0], lengths) - np.arange(len(data)) - 1  # (B,) bytes after each byte
    powers = np.cumprod(np.concatenate([[1], np.full(int(lengths.max(initial=1)) - 1, 31)]).astype(np.uint64))  # 31^k
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(data * powers[after], dtype=np.uint64)])  # wrap mod 2^64
    return sums[offsets[1:] - offsets[0]] - sums[offsets[:-1] - offsets[0]]  # an empty string hashes to 0


def split_by_partition(events: pa.Table, column: str, partitions: int) -> Iterator[tuple[int, pa.Table]]:
    """(partition, its rows of `events` in their order) for every partition that has rows."""
    part = hash_partition(events.column(column), partitions)
    order = np.argsort(part.astype(np.uint16 if partitions <= 1 << 16 else np.int64), kind="stable")  # a radix sort
    bounds = np.searchsorted(part[order], np.arange(partitions + 1))
    ordered = events.take(pa.array(order))
    for p in range(partitions):
        if bounds[p + 1] > bounds[p]:
            yield p, ordered.slice(bounds[p], bounds[p + 1] - bounds[p])


def split_in_ranges(events: pa.Table, column: str, parts: int) -> list[pa.Table]:
    """`events` cut into about equal `parts` by ranges of integer session ids (each part's rows in their
    order), so that the parts' sessions, each part in id order, follow each other in id order; text ids
    are hash-partitioned (`split_by_partition`)."""
    ids = events.column(column)
    if parts == 1:
        return [events]
    if not pa.types.is_integer(ids.type):
        return [rows for _, rows in split_by_partition(events, column, parts)]
    values = ids.to_numpy()
    at = [len(values) * k // parts for k in range(1, parts)]
    bounds = np.partition(values, at)[at]
    part = np.searchsorted(bounds, values, side="left")  # ids up to bounds[0]: 0, ...
    return [t for t in (events.filter(pa.array(part == p)) for p in range(parts)) if t.num_rows]


Stored = str | pa.Table  # an Arrow IPC file of record batches, or a table kept in memory


@dataclass
class PartitionSummary:
    """What the driver keeps of a sessionized partition: its files (or tables, when the engine keeps
    them in memory) and its counts."""

    sessions: Stored  # its sessions in session-id order (record batches of `BATCH_SESSIONS`)
    keys: Stored  # (session id, `END`) of each session, in the same order
    by_end: Stored | None  # the same keys ordered by (`END`, session id); None unless a fraction split needs them
    kept: int  # its sessions
    count: int  # sessions before the length filter
    longest: int  # their greatest product count
    last_end: float | None  # the latest end time of its sessions; None without sessions or timestamps
    nbytes: int = 0  # its sessions' bytes in Arrow
    schema: pa.Schema = field(repr=False, default=None)  # type: ignore[assignment]
    virtual: int = 0  # its virtual events (marked by the schema's `VirtualSpec`)


def _ends(sessions: pa.Table) -> np.ndarray | None:
    """(N,) end time of each session (`frame.last_times`; empty for no sessions), None without timestamps."""
    if frame.TIMES not in sessions.column_names:
        return None
    return frame.last_times(sessions)


def _store(table: pa.Table, path: str | None) -> Stored:
    """`table` itself (`path` None), or written to `path` in record batches of `BATCH_SESSIONS` rows (a
    number its schema's metadata keeps, for the readers)."""
    if path is None:
        return table
    schema = table.schema.with_metadata({BATCH_KEY: str(BATCH_SESSIONS)})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for start in range(0, table.num_rows, BATCH_SESSIONS):
            writer.write_table(table.slice(start, BATCH_SESSIONS).combine_chunks())
    return path


def sessionize_partition(source: EventLogSource, events: pa.Table, path: str | os.PathLike | None,
                         by_end: bool) -> PartitionSummary:
    """Step 2 for one partition's events (in file order): its sessions and keys written beside `path`
    (None: kept in memory); with `by_end` also its keys ordered by end time."""
    kept, count, longest, virtual = source.sessionize(events)
    ends = _ends(kept)
    keys = pa.table({frame.SESSION: kept.column(frame.SESSION).combine_chunks()}
                    | ({} if ends is None else {END: ends}))
    name = None if path is None else str(path)
    ordered = None
    if by_end:
        ordered = _store(keys.take(pc.sort_indices(keys, sort_keys=[(END, "ascending"), (frame.SESSION, "ascending")])),
                         None if name is None else f"{name}.by-end")
    last = float(ends.max()) if ends is not None and len(ends) else None
    return PartitionSummary(_store(kept, name), _store(keys, None if name is None else f"{name}.keys"), ordered,
                            kept.num_rows, count, longest, last, kept.nbytes, kept.schema, virtual)


class Run:
    """The record batches of a stored table, read one at a time."""

    def __init__(self, stored: Stored) -> None:
        if isinstance(stored, pa.Table):
            self.file, self.reader, self.batches = None, None, stored.to_batches()
        else:
            self.file = pa.OSFile(stored, "rb")  # read, not mapped: a batch is freed with its table
            self.reader = pa.ipc.open_file(self.file)
        self.count = len(self.batches) if self.reader is None else self.reader.num_record_batches

    def batch(self, i: int) -> pa.RecordBatch:
        return self.batches[i] if self.reader is None else self.reader.get_batch(i)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return (self.batch(i) for i in range(self.count))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _at_most(table: pa.Table, bound: pa.Table, keys: list[str]) -> int:
    """How many rows of `table` (sorted by `keys`) are at most the row `bound` in that order."""
    mask = None
    for key in reversed(keys):
        col, value = table.column(key), bound.column(key)[0]
        mask = pc.less_equal(col, value) if mask is None else pc.or_(pc.less(col, value),
                                                                      pc.and_(pc.equal(col, value), mask))
    return int(pc.sum(mask).as_py() or 0)


def merged(stored: list[Stored], keys: list[str]) -> Iterator[pa.Table]:
    """The rows of several tables, each sorted by `keys` (ascending, no row equal to another's), in one
    ascending order, a chunk at a time, with their table (`PART`) and row in it (`ROW`) as columns.

    Holds a record batch of each table: a chunk is every held row up to the least last held row of the
    tables with batches left, so each chunk empties at least one table's batch.
    """
    runs = [Run(s) for s in stored]
    sort_keys = [(k, "ascending") for k in keys]
    heads: list[pa.Table | None] = [None] * len(runs)
    read, first = [0] * len(runs), [0] * len(runs)
    try:
        while True:
            for p, run in enumerate(runs):
                while (heads[p] is None or heads[p].num_rows == 0) and read[p] < run.count:
                    batch = run.batch(read[p])
                    heads[p] = pa.Table.from_batches([batch]).append_column(
                        PART, pa.array(np.full(batch.num_rows, p, np.int64))).append_column(
                        ROW, pa.array(np.arange(first[p], first[p] + batch.num_rows)))
                    read[p], first[p] = read[p] + 1, first[p] + batch.num_rows
            live = [p for p in range(len(runs)) if heads[p] is not None and heads[p].num_rows]
            if not live:
                return
            more = [p for p in live if read[p] < runs[p].count]
            take = {p: heads[p].num_rows for p in live}
            if more:
                lasts = pa.concat_tables([heads[p].slice(heads[p].num_rows - 1) for p in more])
                bound = lasts.take(pc.sort_indices(lasts, sort_keys=sort_keys)[:1])
                take = {p: _at_most(heads[p], bound, keys) for p in live}
            pieces = [heads[p].slice(0, take[p]) for p in live if take[p]]
            for p in live:
                heads[p] = heads[p].slice(take[p])
            yield _in_order(pieces, sort_keys)
    finally:
        for run in runs:
            run.close()


def _in_order(pieces: list[pa.Table], sort_keys: list[tuple[str, str]]) -> pa.Table:
    """Tables, each sorted by `sort_keys`, as one sorted table: concatenated when their ranges of the
    first key follow each other, else sorted (integers alone by numpy's stable sort, which merges the
    sorted runs)."""
    key = sort_keys[0][0]
    pieces = [p for p in pieces if p.num_rows]
    pieces.sort(key=lambda p: p.column(key)[0].as_py())
    table = pa.concat_tables(pieces)
    if all(pc.less(a.column(key)[-1], b.column(key)[0]).as_py() for a, b in itertools.pairwise(pieces)):
        return table
    if len(sort_keys) == 1 and pa.types.is_integer(table.schema.field(key).type):
        return table.take(pa.array(np.argsort(table.column(key).to_numpy(), kind="stable")))
    return table.take(pc.sort_indices(table, sort_keys=sort_keys))


Cut = tuple[float, Any]
"""(end time t, session id s): a session is at or after the cut if it ends after t, or at t with an id >= s
(s None: after t only)."""


@dataclass(frozen=True)
class Labeller:
    """The split of a session from its end time and id (0 train, 1 valid, 2 test): `split` for every
    session of a file that is one split, else test from `test` on, valid from `valid` on (`Cut`s)."""

    split: int | None = None
    test: Cut | None = None
    valid: Cut | None = None

    def labels(self, ids: pa.Array | pa.ChunkedArray, ends: np.ndarray | None) -> np.ndarray:
        if self.split is not None:
            return np.full(len(ids), self.split, dtype=np.int8)
        return np.where(_after(self.test, ids, ends), 2, np.where(_after(self.valid, ids, ends), 1, 0)).astype(np.int8)


def _after(cut: Cut | None, ids: pa.Array | pa.ChunkedArray, ends: np.ndarray) -> np.ndarray:
    if cut is None:
        return np.zeros(len(ends), dtype=bool)
    t, sid = cut
    later = ends > t
    at = ends == t
    if sid is not None and at.any():
        later |= at & pc.greater_equal(ids, pa.scalar(sid, ids.type)).to_numpy(zero_copy_only=False)
    return later


def _keys_at(summaries: list[PartitionSummary], ranks: list[int]) -> dict[int, Cut]:
    """The (end time, session id) of the sessions at `ranks` of the (end time, session id) order."""
    found: dict[int, Cut] = {}
    wanted, seen = sorted(set(ranks)), 0
    if not wanted:
        return found
    for chunk in merged([s.by_end for s in summaries], [END, frame.SESSION]):
        while wanted and wanted[0] < seen + chunk.num_rows:
            row = wanted.pop(0) - seen
            found[row + seen] = (chunk.column(END)[row].as_py(), chunk.column(frame.SESSION)[row].as_py())
        seen += chunk.num_rows
        if not wanted:
            break
    return found


def _train_ends(summaries: list[PartitionSummary], t_test: float) -> tuple[int, float | None]:
    """The number and the latest end time of the sessions ending at or before `t_test`."""
    count, latest = 0, None
    for s in summaries:
        run = Run(s.keys)
        for batch in run:
            ends = batch.column(END).to_numpy(zero_copy_only=False)
            ends = ends[ends <= t_test]
            count += len(ends)
            if len(ends):
                latest = ends.max() if latest is None else max(latest, ends.max())
        run.close()
    return count, latest


def needs_by_end(source: EventLogSource, splits: tuple[str, ...]) -> bool:
    """Whether the split of a file with these `splits` takes a rank in end-time order (a fraction)."""
    if source.schema.timestamp is None:  # no end times: `labeller` refuses a split by time
        return False
    return ("test" in splits and source.test_days is None) or ("valid" in splits and source.valid_days is None)


def labeller(source: EventLogSource, summaries: list[PartitionSummary], splits: tuple[str, ...]) -> Labeller:
    """`EventLogSource.split_labels` of a file's sessions (`summaries`) as thresholds (see `frame.time_labels`):
    test from the latest end time less `test_days`, or the latest `test_fraction` of the sessions; valid
    likewise among the rest."""
    if len(splits) == 1:
        return Labeller(split=LABELS[splits[0]])
    source.split_labels(None if source.schema.timestamp is None else np.zeros(0), 0)  # the source's own refusals
    n = sum(s.kept for s in summaries)
    ends = [s.last_end for s in summaries if s.last_end is not None]
    t_max = max(ends) if ends else 0.0
    n_train, train_last, n_test, n_valid = n, (t_max if ends else None), 0, 0
    if "test" in splits and source.test_days is not None:
        t_test = t_max - source.test_days * 86400.0
        if "valid" in splits:
            n_train, train_last = _train_ends(summaries, t_test)
    elif "test" in splits:
        n_test = round(n * source.test_fraction)
        n_train = n - n_test
    if "valid" in splits and source.valid_days is None:
        n_valid = round(n_train * (source.valid_fraction or 0.0))
    last_wanted = "valid" in splits and source.valid_days is not None and n_test > 0 and n_train > 0
    cuts = _keys_at(summaries, [n_train] * (n_test > 0) + [n_train - 1] * last_wanted + [n_train - n_valid] * (n_valid > 0))
    if last_wanted:
        train_last = cuts[n_train - 1][0]
    test = valid = None
    if "test" in splits:
        test = (t_test, None) if source.test_days is not None else cuts.get(n_train)
    if "valid" in splits and source.valid_days is not None:
        valid = ((train_last if train_last is not None else 0.0) - source.valid_days * 86400.0, None)
    elif "valid" in splits:
        valid = cuts.get(n_train - n_valid) if n_valid else None
    return Labeller(None, test, valid)


@dataclass
class PartTask:
    """Part `index` of `split`: in each partition the row range [first, stop) that holds its sessions
    (among sessions of other splits, which `labeller` tells apart)."""

    split: str
    index: int
    reads: list[tuple[Stored, int, int]]  # (a partition's sessions, first row, stop row)
    labeller: Labeller
    schema: pa.Schema
    sessions: int = 0  # the part's sessions
    nbytes: int = 0  # about the bytes of its sessions in Arrow (each partition's bytes a session, times its share)


@dataclass
class PartResult:
    written: PartWritten
    products: pa.Table | None  # count_items of a training part's product events
    virtual: pa.Table | None  # ... of its virtual events


def read_part_rows(task: PartTask) -> pa.Table:
    """The sessions of a part, in session-id order: its row ranges read a record batch at a time, each
    kept to the part's split."""
    label, pieces = LABELS[task.split], []
    for stored, first, stop in task.reads:
        if isinstance(stored, pa.Table):
            tables = [stored.slice(first, stop - first)]
        else:
            tables = _file_rows(stored, first, stop)
        for table in tables:
            if task.labeller.split is None:
                keep = task.labeller.labels(table.column(frame.SESSION), _ends(table)) == label
                table = table if keep.all() else table.filter(pa.array(keep))
            pieces.append(table)
    if not any(p.num_rows for p in pieces):
        return task.schema.empty_table()
    return _in_order(pieces, [(frame.SESSION, "ascending")])


def _file_rows(path: str, first: int, stop: int) -> Iterator[pa.Table]:
    """Rows [first, stop) of a session file (`_store`), a record batch at a time; the rows of a batch
    read in part are copied, so that the batch is freed."""
    run = Run(path)
    size = int(run.reader.schema.metadata[BATCH_KEY])
    try:
        for i in range(first // size, -(-stop // size)):
            start = i * size
            table = pa.Table.from_batches([run.batch(i)]).replace_schema_metadata()
            lo, hi = max(first - start, 0), min(stop - start, table.num_rows)
            yield table if hi - lo == table.num_rows else table.take(np.arange(lo, hi))
    finally:
        run.close()


def build_part(task: PartTask, directory: str | os.PathLike, layout: Layout) -> PartResult:
    """Gather, order and write one part; a training part also counts its items."""
    table = read_part_rows(task)
    written = write_part(table, Path(directory), task.split, task.index, layout)
    if task.split != "train":
        return PartResult(written, None, None)
    items, _ = frame.list_offsets(table.column(frame.ITEMS))
    if frame.VIRTUAL not in table.column_names:
        return PartResult(written, count_items(items), None)
    virtual = frame.list_offsets(table.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
    return PartResult(written, count_items(items.filter(pa.array(~virtual))), count_items(items.filter(pa.array(virtual))))


COUNT_PEAK_PER_ROW = 48  # bytes that summing pending item counts holds, per pending row


class CountFold:
    """The training parts' item counts summed as they arrive (`sum_counts` whenever `rows` are pending),
    so that memory holds about one catalogue of counts, not one per part."""

    def __init__(self, rows: int = 4_000_000) -> None:
        self.rows = rows
        self.pending: dict[str, list[pa.Table]] = {"products": [], "virtual": []}

    def add(self, result: PartResult) -> None:
        for kind, table in (("products", result.products), ("virtual", result.virtual)):
            if table is not None:
                self.pending[kind].append(table)
                if sum(t.num_rows for t in self.pending[kind]) > self.rows:
                    self.pending[kind] = [sum_counts(self.pending[kind])]
        result.products = result.virtual = None

    def vocab(self, min_count: int, max_size: int | None) -> ItemVocab:
        """The vocabulary of the counts (`ItemVocab.from_counts`): `ItemVocab.fit` of the training split."""
        products, virtual = self.pending["products"], self.pending["virtual"]
        return ItemVocab.from_counts(sum_counts(products), sum_counts(virtual) if virtual else None, min_count, max_size)


def shared_session(path: str, summaries: list[PartitionSummary],
                   earlier: list[tuple[str, list[PartitionSummary]]]) -> tuple[object, str] | None:
    """`periods.first_shared` of file `path`'s sessionized partitions: the least session id of `summaries` that an
    `earlier` file's partitions (path, summaries) also hold, and the first such file; their keys merged in
    session-id order (`merged`), where a session of two files is two equal rows side by side. Item and session ids of
    another kind than an earlier file's are refused (`check_id_types`)."""
    found: tuple[object, str] | None = None
    for other_path, others in earlier:
        if not summaries or not others:
            continue
        check_id_types(path, summaries[0].schema.field(frame.ITEMS).type.value_type, other_path,
                       others[0].schema.field(frame.ITEMS).type.value_type, "item")
        check_id_types(path, summaries[0].schema.field(frame.SESSION).type, other_path,
                       others[0].schema.field(frame.SESSION).type)
        for chunk in merged([s.keys for s in summaries] + [s.keys for s in others], [frame.SESSION]):
            ids = chunk.column(frame.SESSION)
            equal = np.flatnonzero(pc.equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False))
            if len(equal):
                shared = ids[int(equal[0])].as_py()
                if found is None or shared < found[0]:
                    found = (shared, other_path)
                break
    return found


def plan_parts(
    source: EventLogSource, path: str, summaries: list[PartitionSummary], splits: tuple[str, ...], layout: Layout,
    periods: SplitPeriods, earlier: list[tuple[str, list[PartitionSummary]]],
) -> list[PartTask]:
    """Steps 3 and 4 for one file of the source: the part tasks of the `splits` it provides.

    `splits` is ``("train", "valid", "test")`` for the source's main file (split by
    `EventLogSource.split_labels`' rule, `labeller`), or the one split that a `test_path` / `valid_path`
    file is (`EventLogSource.splits_of`). A session that a file read before (`earlier`: their paths and
    partitions) also holds is refused (`EventLogSource.check_shared`). The file's splits join `periods`
    (`EventLogSource.check_file`), which refuses an empty split, or one that starts before a split it
    follows ends, before any part is written.
    """
    source.check_kept(path, sum(s.kept for s in summaries), sum(s.count for s in summaries),
                      max((s.longest for s in summaries), default=0), sum(s.virtual for s in summaries))
    summaries = [s for s in summaries if s.kept]
    source.check_shared(path, shared_session(path, summaries, earlier))
    rule = labeller(source, summaries, splits)
    k = len(summaries)
    counts = np.zeros(3, dtype=np.int64)
    firsts, lasts = np.full(3, np.inf), np.full(3, -np.inf)  # each split's first and last end time
    spans: dict[tuple[int, int], dict[int, list[int]]] = {}  # (split, part) -> partition -> [first, last, sessions]
    for chunk in merged([s.keys for s in summaries], [frame.SESSION]):
        ends = None if END not in chunk.column_names else chunk.column(END).to_numpy()
        labels = rule.labels(chunk.column(frame.SESSION), ends)
        partition, rows = chunk.column(PART).to_numpy(), chunk.column(ROW).to_numpy()
        for label in {LABELS[s] for s in splits}:
            chosen = np.flatnonzero(labels == label)
            if not len(chosen):
                continue
            if ends is not None:
                firsts[label] = min(firsts[label], ends[chosen].min())
                lasts[label] = max(lasts[label], ends[chosen].max())
            key = (counts[label] + np.arange(len(chosen))) // layout.part_sessions * k + partition[chosen]
            counts[label] += len(chosen)
            where, first, size = np.unique(key, return_index=True, return_counts=True)
            last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]
            for u, a, b, n in zip(where.tolist(), rows[chosen[first]].tolist(), rows[chosen[last]].tolist(),
                                  size.tolist()):
                span = spans.setdefault((label, u // k), {}).setdefault(u % k, [a, b, 0])
                span[1], span[2] = b, span[2] + n
    timed = source.schema.timestamp is not None
    source.check_file(periods, path, {split: _span(int(counts[LABELS[split]]), firsts[LABELS[split]],
                                                   lasts[LABELS[split]], timed) for split in splits})
    tasks = []
    for split in splits:
        for index in range(layout.parts(int(counts[LABELS[split]]))):
            held = spans.get((LABELS[split], index), {})
            reads = [(summaries[p].sessions, a, b + 1) for p, (a, b, _) in sorted(held.items())]
            nbytes = sum(n * summaries[p].nbytes // max(summaries[p].kept, 1) for p, (_, _, n) in held.items())
            tasks.append(PartTask(split, index, reads, rule, summaries[0].schema,
                                  sum(n for _, _, n in held.values()), nbytes))
    return tasks


def _span(count: int, first: float, last: float, timed: bool) -> Span:
    return (count, float(first), float(last)) if timed and count else (count, None, None)
