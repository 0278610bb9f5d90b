"""The partitioned preparation of an event log, step by step; the engines run these steps.

1. **Partition**: events go to the partition their session id hashes to (`hash_partition`), in file
   order, so every session lies whole in one partition.
2. **Sessionize** each partition with the source's own code (`EventLogSource.sessionize`: sort, group,
   drop repeats, cut lengths) into a session file sorted by session id (`sessionize_partition`).
3. **Split**: the end time and session id of every session (16 bytes a session, on the driver) give each
   session its split by the source's rule (`EventLogSource.split_labels`), the ties of end times broken
   by session id, as the in-memory path breaks them by position in session-id order. Each file's splits
   join one `SplitPeriods`, which refuses an empty split or one that goes back in time before any part is
   written (`EventLogSource.check_file`, as the in-memory path checks them).
4. **Parts**: each part file of a split is the split's next `Layout.part_sessions` sessions in session-id
   order, gathered from the partitions' session files (`plan_parts`, `build_part`); the training parts
   count their items (`count_items`), and the vocabulary is the sum of those counts
   (`ItemVocab.from_counts`), ranked as `ItemVocab.fit` ranks them.

Steps 3 and 4 hold `DRIVER_BYTES_PER_SESSION` bytes a session of a file in one process, the driver
(`check_driver_memory` refuses a file that would need more than half the memory budget); everything
else is held a partition or a part at a time.

So the parts equal, byte for byte, what the in-memory path (`EventLogSource.load`, `ItemVocab.fit`)
writes, whatever the number of partitions (tests/test_prepare.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data import frame
from sessrec.data.prepared.dataset import Layout, PartWritten, write_part
from sessrec.data.sources import SPLIT_LABELS, EventLogSource, SplitPeriods
from sessrec.data.vocab import ItemVocab, count_items, sum_counts

BATCH_SESSIONS = 65_536  # sessions in a record batch of a partition's session file (what a part reads at a time)


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
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(partitions + 1))
    ordered = events.take(pa.array(order))
    for p in range(partitions):
        if bounds[p + 1] > bounds[p]:
            yield p, ordered.slice(bounds[p], bounds[p + 1] - bounds[p])


@dataclass
class PartitionSummary:
    """The sessions of one partition: written to `path` (Arrow IPC, record batches of `BATCH_SESSIONS`), or
    held in memory (`path` the table itself) when the engine keeps them."""

    path: str | pa.Table
    sessions: pa.Array  # (n,) session ids, ascending
    ends: np.ndarray | None  # (n,) end times; None without timestamps
    count: int  # sessions before the length filter
    longest: int  # their greatest length
    schema: pa.Schema = field(repr=False, default=None)  # type: ignore[assignment]


def sessionize_partition(source: EventLogSource, events: pa.Table, path: str | os.PathLike | None) -> PartitionSummary:
    """Step 2 for one partition's events (in file order): its sessions written to `path` (None: kept)."""
    kept, count, longest = source.sessionize(events)
    if path is not None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, kept.schema) as writer:
            for start in range(0, kept.num_rows, BATCH_SESSIONS):
                writer.write_table(kept.slice(start, BATCH_SESSIONS).combine_chunks())
    return PartitionSummary(kept if path is None else str(path), kept.column(frame.SESSION).combine_chunks(),
                            frame.end_times(kept), count, longest, kept.schema)


def read_rows(sessions: str | pa.Table, rows: np.ndarray) -> pa.Table:
    """Rows (ascending) of a partition's sessions; of a session file only the record batches that hold them."""
    first = 0
    if isinstance(sessions, str):
        with pa.OSFile(sessions, "rb") as file:
            reader = pa.ipc.open_file(file)
            first, last = int(rows[0]) // BATCH_SESSIONS, int(rows[-1]) // BATCH_SESSIONS
            sessions = pa.Table.from_batches([reader.get_batch(i) for i in range(first, last + 1)])
        first *= BATCH_SESSIONS
    if rows[-1] - rows[0] + 1 == len(rows):  # a run of rows: a slice
        return sessions.slice(int(rows[0]) - first, len(rows))
    return sessions.take(pa.array(rows - first))


@dataclass
class PartTask:
    """Part `index` of `split`: the rows of each partition's session file it gathers, and the
    permutation that puts their concatenation in session-id order."""

    split: str
    index: int
    reads: list[tuple[str | pa.Table, np.ndarray]]  # (the sessions of a partition, rows ascending)
    order: np.ndarray | None  # (n,) take of the concatenated rows; None: in order (one partition)
    schema: pa.Schema


@dataclass
class PartResult:
    written: PartWritten
    products: pa.Table | None  # count_items of a training part's product events
    virtual: pa.Table | None  # ... of its virtual events


def build_part(task: PartTask, directory: str | os.PathLike, layout: Layout) -> PartResult:
    """Gather, order and write one part; a training part also counts its items."""
    pieces = [read_rows(sessions, rows) for sessions, rows in task.reads]
    table = pa.concat_tables(pieces) if pieces else task.schema.empty_table()
    if task.order is not None:
        table = table.take(pa.array(task.order))
    written = write_part(table, Path(directory), task.split, task.index, layout)
    if task.split != "train":
        return PartResult(written, None, None)
    items, _ = frame.list_offsets(table.column(frame.ITEMS))
    if frame.VIRTUAL not in table.column_names:
        return PartResult(written, count_items(items), None)
    virtual = frame.list_offsets(table.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
    return PartResult(written, count_items(items.filter(pa.array(~virtual))), count_items(items.filter(pa.array(virtual))))


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


def plan_parts(
    source: EventLogSource, path: str, summaries: list[PartitionSummary], splits: tuple[str, ...], layout: Layout,
    periods: SplitPeriods,
) -> list[PartTask]:
    """Steps 3 and 4 for one file of the source: the part tasks of the `splits` it provides.

    `splits` is ``("train", "valid", "test")`` for the source's main file (labelled by
    `EventLogSource.split_labels`), or the one split that a `test_path` / `valid_path` file is
    (`EventLogSource.splits_of`). The file's splits join `periods` (`EventLogSource.check_file`), which
    refuses an empty split, or one that starts before a split it follows ends, before any part is written.
    """
    source.check_kept(path, sum(len(s.sessions) for s in summaries), sum(s.count for s in summaries),
                      max((s.longest for s in summaries), default=0))
    summaries = [s for s in summaries if len(s.sessions)]
    sizes = np.array([len(s.sessions) for s in summaries], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    ids = pa.concat_arrays([s.sessions for s in summaries])
    by_id = pc.sort_indices(ids).to_numpy().astype(np.int64)  # (N,) the sessions in session-id order
    ends = None if summaries[0].ends is None else np.concatenate([s.ends for s in summaries])
    if len(splits) == 1:
        labels = np.full(len(ids), SPLIT_LABELS[splits[0]], dtype=np.int64)
    else:
        rank = np.empty(len(ids), dtype=np.int64)
        rank[by_id] = np.arange(len(ids))
        labels = source.split_labels(ends, len(ids), order=rank)
    source.check_file(periods, path, splits, labels, ends)
    partition_of = np.repeat(np.arange(len(summaries)), sizes)
    tasks = []
    for split in splits:
        chosen = by_id[labels[by_id] == SPLIT_LABELS[split]]
        for k in range(layout.parts(len(chosen))):
            chunk = chosen[k * layout.part_sessions:(k + 1) * layout.part_sessions]
            part = partition_of[chunk]
            grouped = np.argsort(part, kind="stable")  # by partition, each partition's rows ascending
            order = np.empty(len(chunk), dtype=np.int64)
            order[grouped] = np.arange(len(chunk))
            bounds = np.searchsorted(part[grouped], np.arange(len(summaries) + 1))
            reads = [(summaries[p].path, chunk[grouped[bounds[p]:bounds[p + 1]]] - starts[p])
                     for p in range(len(summaries)) if bounds[p + 1] > bounds[p]]
            tasks.append(PartTask(split, k, reads, order if len(reads) > 1 else None, summaries[0].schema))
    return tasks


DRIVER_BYTES_PER_SESSION = 64  # what steps 3 and 4 hold a session: its id, end time, order, split, partition, row


def check_driver_memory(path: str, summaries: list[PartitionSummary], memory_budget: int) -> None:
    """Refuse a file whose sessions the split and the ordering of the parts cannot hold in half the budget."""
    sessions = sum(len(s.sessions) for s in summaries)
    need = sessions * DRIVER_BYTES_PER_SESSION
    if need > memory_budget / 2:
        raise ValueError(
            f"{path}: its {sessions:,} sessions need about {need / 2**30:.1f} GiB to be split and put in order "
            f"({DRIVER_BYTES_PER_SESSION} bytes a session), more than half the memory budget "
            f"({memory_budget / 2**30:.1f} GiB); raise --memory_budget"
        )
