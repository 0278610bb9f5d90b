"""`LocalEngine`: the partitioned plan (`sessrec.data.prepared.plan`) in this process, within a memory budget.

The log is streamed in batches (`scan_events`) into Arrow IPC files, one per partition, in a
temporary folder; the partitions are sessionized one at a time per worker thread (Arrow's kernels
release the GIL), and the parts are gathered from them the same way. Enough partitions are used that
each worker's partition fits its share of the budget; a log that fits whole is split in memory, a
range of session ids a worker, and its sessions are kept in memory (so a part is a run of rows of one
partition after another, concatenated without a sort).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from sessrec.data.prepared.dataset import Layout
from sessrec.data.prepared.plan import (
    PartitionSummary,
    PartResult,
    build_part,
    needs_by_end,
    plan_parts,
    sessionize_partition,
    split_by_partition,
    split_in_ranges,
)
from sessrec.data.readers import scan_events
from sessrec.data.sources import EventLogSource, SplitPeriods

PEAK_PER_EVENT_BYTE = 6  # bytes that sessionizing a partition holds at its peak, per byte of its events in Arrow
T = TypeVar("T")
R = TypeVar("R")


def estimated_event_bytes(path: str, columns: int) -> int:
    """Bytes of a log's validated events in Arrow, estimated from the file (parquet: its row count)."""
    if ".parquet" in Path(path).name or Path(path).suffix == ".pq":
        return pq.ParquetFile(path).metadata.num_rows * 8 * columns
    return os.path.getsize(path) * (5 if Path(path).suffix == ".gz" else 1)


def partitions_for(event_bytes: int, memory_budget: int, workers: int) -> int:
    """The fewest partitions such that the partitions sessionized at once (one a worker) peak within half
    the budget (the other half: the batches read, a batch of keys a partition while merging, the parts being
    written)."""
    need = event_bytes * PEAK_PER_EVENT_BYTE
    if need <= memory_budget / 2:
        return 1
    return math.ceil(need * workers / (memory_budget / 2))


class LocalEngine:
    """Runs the partitioned plan on this machine.

    Args:
        memory_budget: bytes the preparation may hold at its peak (the partitions are sized for it).
        workers: threads that sessionize partitions and gather parts at once.
        partitions: number of hash partitions; None: enough for `memory_budget`.
        batch_rows: rows read from the log at a time.
        scratch: folder for the partition files (a temporary folder inside it, removed at the end);
            None: beside the output.
    """

    def __init__(self, memory_budget: int, workers: int = 2, partitions: int | None = None,
                 batch_rows: int = 1 << 20, scratch: str | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.memory_budget, self.workers, self.partitions = memory_budget, workers, partitions
        self.batch_rows, self.scratch = batch_rows, scratch

    def partitions_for(self, source: EventLogSource, path: str) -> int:
        if self.partitions is not None:
            return self.partitions
        return partitions_for(estimated_event_bytes(path, len(source.schema.columns)), self.memory_budget, self.workers)

    def run(self, source: EventLogSource, directory: Path, layout: Layout) -> Iterator[PartResult]:
        """Write the parts of every split into `directory`; yields what each part gave, as it is written."""
        with tempfile.TemporaryDirectory(prefix="sessrec-prepare-", dir=self.scratch or directory.parent) as scratch:
            tasks, periods = [], SplitPeriods()
            for f, (path, splits) in enumerate(source.splits_of()):
                summaries = self.sessionize(source, path, Path(scratch) / f"file{f}", needs_by_end(source, splits))
                tasks += plan_parts(source, path, summaries, splits, layout, periods)
            yield from self.map(lambda task: build_part(task, directory, layout), tasks)

    def sessionize(self, source: EventLogSource, path: str, folder: Path, by_end: bool) -> list[PartitionSummary]:
        """Steps 1 and 2 for one file: partition its events to disk, then sessionize each partition."""
        folder.mkdir(parents=True)
        partitions = self.partitions_for(source, path)
        if partitions == 1:  # the log fits: a range of session ids a worker, in memory
            events = pa.concat_tables(scan_events(path, source.schema, source.delimiter, self.batch_rows))
            parts = split_in_ranges(events, source.schema.session_id, self.workers)
            del events
            return list(self.map(lambda rows: sessionize_partition(source, rows, None, by_end), parts))
        files = [folder / f"events-{p:05d}.arrow" for p in range(partitions)]
        writers: dict[int, pa.ipc.RecordBatchFileWriter] = {}

        def write(batch: pa.Table) -> None:
            for p, rows in split_by_partition(batch, source.schema.session_id, partitions):
                if p not in writers:
                    writers[p] = pa.ipc.new_file(str(files[p]), rows.schema)
                writers[p].write_table(rows)

        pending: Future | None = None
        try:
            with ThreadPoolExecutor(1) as writer:  # a batch is partitioned and written while the next is read
                for batch in scan_events(path, source.schema, source.delimiter, self.batch_rows):
                    if pending is not None:
                        pending.result()
                    pending = writer.submit(write, batch)
                if pending is not None:
                    pending.result()
        finally:
            for file in writers.values():
                file.close()

        def one(p: int) -> PartitionSummary:
            with pa.OSFile(str(files[p]), "rb") as file:  # read, not mapped: freed with the table
                events = pa.ipc.open_file(file).read_all()
            summary = sessionize_partition(source, events, folder / f"sessions-{p:05d}.arrow", by_end)
            files[p].unlink()
            return summary

        return list(self.map(one, sorted(writers)))

    def map(self, func: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """`func` of each item, in order, on `workers` threads."""
        items = list(items)
        if self.workers == 1 or len(items) < 2:
            yield from map(func, items)
            return
        with ThreadPoolExecutor(self.workers) as pool:
            yield from pool.map(func, items)
