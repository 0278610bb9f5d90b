"""`sessrec prepare --engine local` within `--memory_budget`: the process's own memory counted, parts and
partitions started only while they fit, and a budget it cannot keep refused before anything is written."""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessrec.data import EventLogSource, Schema, prepare
from sessrec.data.prepared import local, plan
from sessrec.data.prepared.dataset import read_manifest
from sessrec.data.readers import scan_events

SCHEMA = Schema(session_id="sid", item_id="item", timestamp="t")


def log(path, sessions: int = 600, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 7, sessions)
    table = pa.table({"sid": np.repeat(np.arange(sessions), lengths), "item": rng.integers(0, 80, lengths.sum()),
                      "t": 1.4e9 + np.repeat(np.arange(sessions) * 60.0, lengths) + np.arange(lengths.sum()) % 7})
    pq.write_table(table.take(pa.array(rng.permutation(table.num_rows))), path, row_group_size=400)
    return str(path)


@pytest.fixture
def data_only(monkeypatch):
    """The budget is the data's alone: nothing held by the process, the reading or the allocators."""
    for name in ("KEPT", "MIN_ROOM"):
        monkeypatch.setattr(local, name, 0)
    monkeypatch.setattr(local, "resident_bytes", lambda: 0)
    monkeypatch.setattr(local, "reading_bytes", lambda path: 0)


def test_a_budget_below_what_the_process_holds_is_refused_before_anything_is_written(tmp_path):
    source = EventLogSource(log(tmp_path / "events.parquet"), schema=SCHEMA, test_fraction=0.2)
    with pytest.raises(ValueError, match=r"memory_budget 95 MiB: this process already holds [\d.]+ [MG]iB \(Python "
                                         r"and the libraries it imported\).*give at least [\d.]+ [MG]iB$"):
        prepare(source, str(tmp_path / "out"), engine="local", memory_budget="100MB")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc/self/statm")
def test_what_the_process_holds_leaves_out_the_free_memory_its_allocator_keeps():
    before = local.resident_bytes()
    chunks = [bytearray(3000) for _ in range(100_000)]  # about 300 MiB of small blocks on the heap
    kept = chunks[::50]  # one block in 50 stays: the heap cannot shrink from its top by itself
    del chunks
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    held = local.resident_bytes()
    assert rss - before > 200 * 2**20  # the freed blocks still count in the process's resident memory
    assert held - before < 60 * 2**20  # but not in what it holds: about 6 MiB of blocks kept, and their pages
    assert len(kept) == 2000


def test_a_part_larger_than_its_share_is_refused_with_the_part_size_that_fits(tmp_path, data_only, monkeypatch):
    source = EventLogSource(log(tmp_path / "events.parquet"), schema=SCHEMA, test_fraction=0.2)
    budget = 60_000  # a share of 20 KB: a part of 300 sessions (about 30 KB of Arrow, 90 KB at its peak) does not fit
    with pytest.raises(ValueError) as refused:
        prepare(source, str(tmp_path / "out"), engine="local", memory_budget=str(budget), part_sessions=300)
    message = str(refused.value)
    assert message.startswith("memory_budget 0 MiB: part 0 of train (300 sessions, part_sessions 300) holds about ")
    assert not (tmp_path / "out").exists()
    fits = int(message.rsplit("give part_sessions ", 1)[1].split()[0].replace(",", ""))
    assert 0 < fits < 300
    out = prepare(source, str(tmp_path / "out"), engine="local", memory_budget=str(budget), part_sessions=fits)
    whole = prepare(source, str(tmp_path / "whole"), engine="memory", part_sessions=fits)
    assert read_manifest(out)["sha256"] == read_manifest(whole)["sha256"]
    tasks = []

    def recorded(*args):
        made = plan.plan_parts(*args)
        tasks.extend(made)
        return made

    monkeypatch.setattr(local, "plan_parts", recorded)
    prepare(source, str(tmp_path / "again"), engine="local", memory_budget=str(budget), part_sessions=fits)
    assert max(t.nbytes for t in tasks) * local.PEAK_PER_PART_BYTE <= budget / 3
    splits = read_manifest(out)["splits"]
    assert sum(t.sessions for t in tasks) == sum(splits[s]["sessions"] for s in ("train", "valid", "test"))


def test_items_start_only_while_the_costs_of_those_running_fit_the_room():
    engine = local.LocalEngine(memory_budget=0, workers=3)
    held, peak, lock = [0], [0], threading.Lock()
    costs = [60, 30, 30, 50, 10, 10, 100]

    def work(i: int) -> int:
        with lock:
            held[0] += costs[i]
            peak[0] = max(peak[0], held[0])
        time.sleep(0.02)
        with lock:
            held[0] -= costs[i]
        return i * i

    assert list(engine.map(work, range(len(costs)), costs, room=100)) == [i * i for i in range(len(costs))]
    assert peak[0] <= 100
    peak[0] = 0
    assert list(engine.map(work, range(len(costs)))) == [i * i for i in range(len(costs))]  # no costs: 3 at once
    assert peak[0] > 100


def test_an_item_larger_than_the_room_runs_alone():
    engine = local.LocalEngine(memory_budget=0, workers=2)
    assert list(engine.map(lambda x: -x, [1, 2, 3], [10, 500, 10], room=100)) == [-1, -2, -3]


def test_rows_read_in_part_from_a_batch_do_not_hold_the_batch(tmp_path):
    table = pa.table({plan.frame.SESSION: np.arange(1000, dtype=np.int64), "x": np.arange(1000.0)})
    path = str(tmp_path / "sessions.arrow")
    stored = plan._store(table, path)
    pieces = list(plan._file_rows(stored, 10, 20))
    assert [p.column("x").to_pylist() for p in pieces] == [list(np.arange(10.0, 20.0))]
    assert pieces[0].get_total_buffer_size() < 10 * 16 * 2  # ten rows' buffers, not the batch's


def test_reading_a_parquet_log_holds_its_row_groups_one_at_a_time(tmp_path):
    rows = 400_000
    path = tmp_path / "events.parquet"
    pq.write_table(pa.table({"sid": np.arange(rows), "item": np.arange(rows) % 97, "t": 1.4e9 + np.arange(rows)}),
                   path, row_group_size=20_000)  # 20 row groups of 480 KB
    before, most = pa.total_allocated_bytes(), 0
    for batch in scan_events(path, SCHEMA, batch_rows=20_000):
        most = max(most, pa.total_allocated_bytes() - before)
        del batch
    assert most < 5 * 480_000  # a pre-buffered reader keeps every row group it read: 9.6 MB by the end
