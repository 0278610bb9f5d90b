"""`LocalEngine`: the partitioned plan (`sessrec.data.prepared.plan`) in this process, within a memory budget.

The log is streamed in batches (`scan_events`) into Arrow IPC files, one per partition, in a
temporary folder; the partitions are sessionized one at a time per worker thread (Arrow's kernels
release the GIL), and the parts are gathered from them the same way. Enough partitions are used that
each worker's partition fits its share of the budget; a log that fits whole is split in memory, a
range of session ids a worker, and its sessions are kept in memory (so a part is a run of rows of one
partition after another, concatenated without a sort).

The budget is the process's: what it holds when the preparation starts (Python and the libraries it
imported), what reading the log holds (a parquet file's row groups) and what the allocators keep
(`KEPT`) are counted, and the rest
(`Budget.room`) sizes the batches read, the partitions and how many parts are written at once: the
partitions sessionized at once, and the parts written at once, each within a third of the room (`share`;
the rest: the partitions' summaries, the item counts, the keys merged).
A part larger than the share is refused before any is written (its size is `Layout.part_sessions`,
which every engine shares), as is a budget that leaves too little room.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa

from sessrec.data.periods import SplitPeriods
from sessrec.data.prepared.dataset import Layout
from sessrec.data.prepared.plan import (
    PartitionSummary,
    PartResult,
    PartTask,
    build_part,
    needs_by_end,
    plan_parts,
    sessionize_partition,
    split_by_partition,
    split_in_ranges,
)
from sessrec.data.readers import parquet_metadata, scan_events
from sessrec.data.sources import EventLogSource
from sessrec.saved.atomic import remove_abandoned, stage_name

PEAK_PER_EVENT_BYTE = 6  # bytes that sessionizing a partition holds at its peak, per byte of its events in Arrow
PEAK_PER_PART_BYTE = 3  # bytes that gathering, ordering, writing and counting a part holds, per byte of its sessions
PEAK_PER_READ_VALUE = 96  # bytes that reading a batch of the log holds, per value (row x column), parsing included
MIN_ROOM = 32 * 2**20  # the least room for the data a budget must leave
KEPT = 160 * 2**20  # what the allocators keep of the batches read and the steps before (measured: 10M events)
MIN_BATCH_ROWS = 4096
SCRATCH = "sessrec-prepare-"  # the partition files' folder: sessrec-prepare-<host>-<pid>-<random> (`stage_name`)
T = TypeVar("T")
R = TypeVar("R")


def estimated_event_bytes(path: str, columns: int) -> int:
    """Bytes of a log's validated events in Arrow, estimated from the file (parquet: its row count)."""
    if ".parquet" in Path(path).name or Path(path).suffix == ".pq":
        return parquet_metadata(path).num_rows * 8 * columns
    return os.path.getsize(path) * (5 if Path(path).suffix == ".gz" else 1)


def reading_bytes(path: str) -> int:
    """What reading a log holds besides its batches: for parquet, two of its largest row groups decoded
    (one read, one partitioned); a CSV file is read in small blocks."""
    if ".parquet" in Path(path).name or Path(path).suffix == ".pq":
        meta = parquet_metadata(path)
        return 2 * max((meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)), default=0)
    return 0


def resident_bytes() -> int:
    """This process's resident memory now (Linux's ``/proc``), else its peak so far; 0 where neither is known.
    Unreachable Python objects are collected and glibc's allocator hands back the free memory it keeps
    (``malloc_trim``, every thread's arena) first: memory the preparation would reuse is not counted as held."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
            pass
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def size_text(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class Budget:
    """The memory a preparation may hold (`total`), less what the process held when it began (`resident`)
    and what reading the log holds (`reading`).

    Raises:
        ValueError: when the budget leaves less than `MIN_ROOM` for the data.
    """

    total: int
    resident: int
    reading: int = 0

    def __post_init__(self) -> None:
        if self.room < MIN_ROOM:
            raise ValueError(
                f"memory_budget {size_text(self.total)}: this process already holds {size_text(self.resident)} "
                f"(Python and the libraries it imported), reading the log {size_text(self.reading)} and the allocators "
                f"about {size_text(KEPT)}, which leaves less than {size_text(MIN_ROOM)} for the data; give at least "
                f"{size_text(self.resident + self.reading + KEPT + MIN_ROOM)}"
            )

    @property
    def room(self) -> int:
        return self.total - self.resident - self.reading - KEPT

    @property
    def share(self) -> float:
        return self.room / 3

    def batch_rows(self, columns: int) -> int:
        """Rows read from the log at a time: a batch being read and one being partitioned within an eighth
        of the room."""
        return max(MIN_BATCH_ROWS, min(1 << 20, self.room // 16 // (PEAK_PER_READ_VALUE * columns)))

    def check_parts(self, tasks: Sequence[PartTask], part_sessions: int) -> list[int]:
        """What each part holds while it is written (`PEAK_PER_PART_BYTE` times its sessions' bytes);
        refuses a part larger than the `share`."""
        costs = [task.nbytes * PEAK_PER_PART_BYTE for task in tasks]
        worst = max(range(len(tasks)), key=costs.__getitem__, default=None)
        if worst is not None and costs[worst] > self.share:
            task = tasks[worst]
            fits = max(1, int(part_sessions * self.share / costs[worst] * 0.9))
            raise ValueError(
                f"memory_budget {size_text(self.total)}: part {task.index} of {task.split} ({task.sessions:,} sessions, "
                f"part_sessions {part_sessions:,}) holds about {size_text(costs[worst])} while it is written, more than "
                f"the {size_text(self.share)} this budget leaves for a part; give part_sessions {fits:,} or a larger "
                "budget"
            )
        return costs


def partitions_for(event_bytes: int, memory: int, workers: int) -> int:
    """The fewest partitions such that the partitions sessionized at once (one a worker) peak within
    `memory`."""
    need = event_bytes * PEAK_PER_EVENT_BYTE
    if need <= memory:
        return 1
    return math.ceil(need * workers / memory)


class LocalEngine:
    """Runs the partitioned plan on this machine.

    Args:
        memory_budget: bytes the process may hold at its peak while it prepares (`Budget`).
        workers: threads that sessionize partitions and gather parts at once.
        partitions: number of hash partitions; None: enough for `memory_budget`.
        batch_rows: rows read from the log at a time; None: as many as the budget gives room for.
        scratch: folder for the partition files (a temporary folder inside it, removed at the end, or by the next
            preparation there when this one is killed);
            None: beside the output.
    """

    def __init__(self, memory_budget: int, workers: int = 2, partitions: int | None = None,
                 batch_rows: int | None = None, scratch: str | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if partitions is not None and partitions < 1:  # 0 would be read as None (as many as the budget needs)
            raise ValueError(f"partitions must be >= 1, or None for as many as the budget needs; got {partitions}")
        self.memory_budget, self.workers, self.partitions = memory_budget, workers, partitions
        self.batch_rows, self.scratch = batch_rows, scratch

    def run(self, source: EventLogSource, directory: Path, layout: Layout) -> Iterator[PartResult]:
        """Write the parts of every split into `directory`; yields what each part gave, as it is written."""
        files = list(source.splits_of())
        budget = Budget(self.memory_budget, resident_bytes(), max(reading_bytes(path) for path, _ in files))
        where = self.scratch or directory.parent
        remove_abandoned(where, SCRATCH)  # the scratch of a preparation killed on this host
        with tempfile.TemporaryDirectory(prefix=f"{stage_name(SCRATCH)}-", dir=where) as scratch:
            tasks, periods, files_read = [], SplitPeriods(), []
            for f, (path, splits) in enumerate(files):
                summaries = self.sessionize(source, path, Path(scratch) / f"file{f}", needs_by_end(source, splits), budget)
                tasks += plan_parts(source, path, summaries, splits, layout, periods, files_read)
                files_read.append((path, [s for s in summaries if s.kept]))
            costs = budget.check_parts(tasks, layout.part_sessions)

            def build(task: PartTask) -> PartResult:
                result = build_part(task, directory, layout)
                pa.default_memory_pool().release_unused()  # what the part held, back to the system
                return result

            yield from self.map(build, tasks, costs, budget.share)

    def sessionize(self, source: EventLogSource, path: str, folder: Path, by_end: bool,
                   budget: Budget) -> list[PartitionSummary]:
        """Steps 1 and 2 for one file: partition its events to disk, then sessionize each partition."""
        folder.mkdir(parents=True)
        columns = len(source.schema.columns)
        partitions = self.partitions or partitions_for(estimated_event_bytes(path, columns), budget.share, self.workers)
        batch_rows = self.batch_rows or budget.batch_rows(columns)
        if partitions == 1:  # the log fits: a range of session ids a worker, in memory
            events = pa.concat_tables(scan_events(path, source.schema, source.delimiter, batch_rows))
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
                for batch in scan_events(path, source.schema, source.delimiter, batch_rows):
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
            del events
            pa.default_memory_pool().release_unused()
            return summary

        used = sorted(writers)
        costs = [files[p].stat().st_size * PEAK_PER_EVENT_BYTE for p in used]
        if self.partitions is not None and max(costs) > budget.share:
            raise ValueError(
                f"memory_budget {size_text(budget.total)}: with partitions {partitions} of {path}, one holds about "
                f"{size_text(max(costs))} while it is sessionized, more than the {size_text(budget.share)} this "
                "budget leaves for it; give more partitions, or none (enough for the budget)"
            )
        return list(self.map(one, used, costs, budget.share))

    def map(self, func: Callable[[T], R], items: Iterable[T], costs: Sequence[float] | None = None,
            room: float = math.inf) -> Iterator[R]:
        """`func` of each item, in order, on `workers` threads, with items started only while the `costs`
        (bytes each holds at its peak) of those running fit `room` (an item alone always runs)."""
        items = list(items)
        if self.workers == 1 or len(items) < 2:
            yield from map(func, items)
            return
        costs = costs if costs is not None else [0.0] * len(items)
        with ThreadPoolExecutor(self.workers) as pool:
            running: deque[tuple[Future, float]] = deque()
            held = 0.0
            for item, cost in zip(items, costs):
                while running and (len(running) >= self.workers or held + cost > room):
                    future, done = running.popleft()
                    held -= done
                    yield future.result()
                running.append((pool.submit(func, item), cost))
                held += cost
            while running:
                yield running.popleft()[0].result()
