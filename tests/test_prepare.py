"""`sessrec prepare`: the engines write the same prepared dataset, byte for byte, as the in-memory path."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from sessrec.data import (
    EventLogSource,
    FeatureSpec,
    ItemVocab,
    PreparedSource,
    Schema,
    SchemaError,
    VirtualSpec,
    frame,
    prepare,
)
from sessrec.data.prepared import parse_bytes
from sessrec.data.prepared.dataset import read_manifest, sha256_of
from sessrec.data.streaming import StreamedSplits

SCHEMA = Schema(
    session_id="sid", item_id="item", timestamp="t", order_by="step",
    features=[FeatureSpec("virtual"), FeatureSpec("category"), FeatureSpec("price", "continuous")],
)
ROLE_SCHEMA = Schema(  # the same log, its virtual events marked by the schema's virtual role (ids null there)
    session_id="sid", item_id="item", timestamp="t", order_by="step",
    features=[FeatureSpec("category"), FeatureSpec("price", "continuous")],
    virtual=VirtualSpec("kind", ["search", "filter"], key=["kind", "category"]),
)
# the budget of the tests that are not about it: room whatever this process holds (test_prepare_budget.py tests budgets)
ROOMY = "16GiB"
LAYOUT = {"part_sessions": 37, "row_group_sessions": 8}  # several parts a split, several row groups a part


def event_log(seed: int = 0, sessions: int = 400, string_ids: bool = False) -> pa.Table:
    """Events in arrival order: ties of times within sessions (broken by `step`, some not at all), consecutive
    repeats, virtual events (``virtual`` 1, keys beyond the products), side features, and sessions ending at
    the same time (ties for the fraction splits)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, sessions)
    sid = np.repeat(rng.permutation(sessions) * 7 + 3, lengths)  # ids not in arrival order
    start = np.repeat(rng.integers(0, 10, sessions) * 3600.0, lengths)  # whole hours: equal end times
    within = np.concatenate([np.sort(rng.integers(0, 4, n)) for n in lengths]) * 60.0  # equal times in a session
    item = rng.zipf(1.6, lengths.sum()) % 50
    repeat = rng.random(lengths.sum()) < 0.2
    item[1:][repeat[1:]] = item[:-1][repeat[1:]]  # consecutive repeats
    virtual = (rng.random(lengths.sum()) < 0.15).astype(np.int64)
    item = np.where(virtual == 1, 1000 + item % 5, item)
    step = np.concatenate([rng.permutation(n) // 2 for n in lengths])  # ties left in step too: file order decides
    table = pa.table({
        "sid": sid, "item": item, "t": 1.4e9 + start + within, "step": step,
        "virtual": virtual, "category": rng.integers(0, 6, lengths.sum()), "price": rng.random(lengths.sum()).round(3),
        "other": np.arange(lengths.sum()),
    })
    kind = np.where(virtual == 1, np.where(item % 2 == 0, "search", "filter"), "product")
    table = table.append_column("kind", pa.array(kind))
    order = rng.permutation(table.num_rows)  # arrival order: sessions interleaved
    table = table.take(pa.array(order))
    if string_ids:
        table = table.set_column(0, "sid", pa.array([f"s{v}" for v in table.column("sid").to_pylist()]))
    return table


def write(table: pa.Table, path: Path) -> str:
    if path.suffix == ".parquet":
        pq.write_table(table, path, row_group_size=500)
    else:
        pacsv.write_csv(table, path)
    return str(path)


def hashes(directory: Path) -> dict[str, str]:
    return read_manifest(directory)["sha256"]


SPLITTINGS = {
    "days": {"test_days": 0.1, "valid_days": 0.1},
    "fractions": {"test_fraction": 0.2, "valid_fraction": 0.15},
    "repeats_and_cut": {"test_fraction": 0.25, "valid_days": 0.05, "drop_repeats": True, "max_length": 5, "min_length": 3},
}


@pytest.fixture(scope="module")
def dask_scheduler():
    """A local Dask cluster of two worker processes for the module's dask runs (started once)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


@pytest.mark.parametrize("splitting", list(SPLITTINGS))
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_engines_write_the_in_memory_dataset_byte_for_byte(tmp_path, splitting, suffix, dask_scheduler, monkeypatch):
    from sessrec.data.prepared import cluster, plan

    monkeypatch.setattr(cluster, "PIECE_BYTES", 4096)  # a CSV file in several pieces
    monkeypatch.setattr(cluster, "PIECE_ROWS", 1000)
    monkeypatch.setattr(plan, "BATCH_SESSIONS", 8)  # the local engine's partition files in many record batches
    path = write(event_log(), tmp_path / f"events{suffix}")
    source = EventLogSource(path, schema=SCHEMA, **SPLITTINGS[splitting])
    runs = prepared_by_every_engine(source, tmp_path, dask_scheduler, (1, 3, 8))
    splits, prepared = source.load(), PreparedSource(str(runs[3])).load()
    manifest = read_manifest(runs[3])
    for name in ("train", "valid", "test"):
        assert getattr(prepared, name).equals(getattr(splits, name))
        assert manifest["splits"][name]["sessions"] == getattr(splits, name).num_rows
        assert manifest["splits"][name]["events"] == frame.session_lengths(getattr(splits, name)).sum()
    assert all(getattr(splits, n).num_rows for n in ("train", "valid", "test"))
    items, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    virtual = frame.list_offsets(splits.train.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
    fitted = ItemVocab.fit(items, virtual=virtual)
    assert fitted.num_virtual > 0
    assert PreparedSource(str(runs[8])).vocab(1, None) == fitted


def prepared_by_every_engine(source: EventLogSource, tmp_path: Path, dask_scheduler: str,
                             partitions: tuple[int, ...]) -> dict[int | str, Path]:
    """The source prepared by the local engine (with each number of `partitions`) and the dask engine, each checked
    equal, byte for byte, to the in-memory dataset."""
    memory = prepare(source, str(tmp_path / "memory"), engine="memory", **LAYOUT)
    runs: dict[int | str, Path] = {
        p: prepare(source, str(tmp_path / f"local{p}"), engine="local", memory_budget=ROOMY, partitions=p, workers=2, **LAYOUT)
        for p in partitions
    }
    runs["dask"] = prepare(source, str(tmp_path / "dask"), engine="dask", partitions=4, scheduler=dask_scheduler, **LAYOUT)
    expected = hashes(memory)
    assert len([n for n in expected if n.startswith("train/")]) > 1  # several parts
    for run in runs.values():
        assert hashes(run) == expected
        assert (run / "manifest.json").read_bytes() == (memory / "manifest.json").read_bytes()
    return runs


@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("splitting", ["fractions", "repeats_and_cut"])
def test_the_engines_write_the_in_memory_dataset_of_a_log_with_the_virtual_role(tmp_path, splitting, keep, dask_scheduler,
                                                                                monkeypatch):
    from sessrec.data.prepared import cluster

    monkeypatch.setattr(cluster, "PIECE_BYTES", 4096)  # a CSV file in several pieces
    log = event_log()
    marked = pc.equal(log.column("virtual"), 1)
    log = log.set_column(1, "item", pc.if_else(marked, pa.scalar(None, pa.int64()), log.column("item")))
    path = write(log, tmp_path / "events.csv")
    schema = replace(ROLE_SCHEMA, virtual=replace(ROLE_SCHEMA.virtual, keep=keep))
    source = EventLogSource(path, schema=schema, **SPLITTINGS[splitting])
    runs = prepared_by_every_engine(source, tmp_path, dask_scheduler, (1, 3))
    splits, prepared = source.load(), PreparedSource(str(runs[3])).load()
    assert all(getattr(prepared, n).equals(getattr(splits, n)) for n in ("train", "valid", "test"))
    as_feature = EventLogSource(path, schema=replace(ROLE_SCHEMA, virtual=replace(ROLE_SCHEMA.virtual, keep=True)),
                                **SPLITTINGS[splitting]).load()
    for name in ("train", "valid", "test"):  # the same sessions whether the virtual events are kept or not
        assert getattr(splits, name).column("session_id").equals(getattr(as_feature, name).column("session_id"))
    vocab = PreparedSource(str(runs["dask"])).vocab(1, None)
    items, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    assert vocab == ItemVocab.fit(items, virtual=frame.virtual_flags(splits.train))
    assert (vocab.num_virtual > 0) == keep
    if keep:
        assert set(vocab.raw_ids.slice(vocab.num_products).to_pylist()) <= {f"{k}:{c}" for k in ("search", "filter") for c in range(6)}


def test_string_session_ids_and_a_shipped_test_file(tmp_path, dask_scheduler):
    log = event_log(seed=1, string_ids=True)
    late = pc.greater_equal(log.column("t"), 1.4e9 + 7 * 3600.0)  # the sessions of the last 3 hours
    train = write(log.filter(pc.invert(late)), tmp_path / "train.parquet")
    test = write(log.filter(late), tmp_path / "test.csv")
    schema = Schema(session_id="sid", item_id="item", timestamp="t", order_by="step", string_ids=True)
    source = EventLogSource(train, schema=schema, test_path=test, valid_fraction=0.2, min_length=2)
    memory = prepare(source, str(tmp_path / "memory"), engine="memory", **LAYOUT)
    local = prepare(source, str(tmp_path / "local"), engine="local", memory_budget=ROOMY, partitions=5, **LAYOUT)
    in_memory = prepare(source, str(tmp_path / "local1"), engine="local", memory_budget=ROOMY, partitions=1, **LAYOUT)  # hashed in two
    dask = prepare(source, str(tmp_path / "dask"), engine="dask", partitions=3, scheduler=dask_scheduler, **LAYOUT)
    assert hashes(local) == hashes(memory) == hashes(dask) == hashes(in_memory)
    splits, prepared = source.load(), PreparedSource(str(local)).load()
    assert prepared.test.equals(splits.test) and prepared.valid.equals(splits.valid)
    assert prepared.train.column("session_id").type == pa.string()


@pytest.mark.parametrize("engine", ["memory", "local"])
def test_a_min_item_count_that_keeps_no_item_is_refused_and_nothing_is_written(tmp_path, engine):
    """Such a dataset was written, exit 0, with a vocabulary of no item that no model can be trained on."""
    path = write(event_log(), tmp_path / "events.parquet")
    source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: min_item_count 100000 keeps no item of the training "
                                                         "split (none occurs 100000 times)")):
        prepare(source, str(tmp_path / "p"), engine=engine, memory_budget=ROOMY, min_item_count=100_000, **LAYOUT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet"]


def test_vocabulary_settings_are_the_datasets(tmp_path):
    from sessrec.tasks import SessionDataModule

    path = write(event_log(), tmp_path / "events.parquet")
    source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2)
    out = prepare(source, str(tmp_path / "p"), engine="local", memory_budget=ROOMY, min_item_count=3, max_vocab_size=20, **LAYOUT)
    splits = source.load()
    items, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    virtual = frame.list_offsets(splits.train.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
    dm = SessionDataModule(source=PreparedSource(str(out)), min_item_count=3, max_vocab_size=20)
    assert dm.vocab == ItemVocab.fit(items, 3, 20, virtual=virtual)
    other = SessionDataModule(source=PreparedSource(str(out)), min_item_count=1)
    with pytest.raises(ValueError, match=r"prepared with min_item_count 3, max_vocab_size 20, but the data module has 1, None"):
        _ = other.vocab


def test_a_changed_file_is_refused_by_name_and_nothing_half_written_is_left(tmp_path):
    path = write(event_log(), tmp_path / "events.parquet")
    source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2)
    out = prepare(source, str(tmp_path / "p"), engine="local", memory_budget=ROOMY, **LAYOUT)
    part = out / "valid" / "part-00000.parquet"
    table = pq.read_table(part)
    pq.write_table(table.slice(1), part)
    with pytest.raises(ValueError, match=r"valid/part-00000\.parquet: its content differs from the manifest's sha256"):
        PreparedSource(str(out)).load()
    part.unlink()
    with pytest.raises(FileNotFoundError, match=r"part-00000\.parquet: missing"):
        PreparedSource(str(out)).load()
    with pytest.raises(FileExistsError, match="exists"):
        prepare(source, str(out), engine="local", memory_budget=ROOMY)
    broken = EventLogSource(path, schema=Schema(session_id="sid", item_id="price"), test_fraction=0.2)
    with pytest.raises(ValueError, match="'price'"):
        prepare(broken, str(tmp_path / "q"), engine="local", memory_budget=ROOMY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet", "p"]


def test_a_prepare_without_overwrite_never_replaces_a_dataset_another_prepare_finished_meanwhile(tmp_path, monkeypatch):
    """Two ``sessrec prepare`` into one new --out, neither with --overwrite: the one that finishes second is refused in
    one line and leaves nothing (the first one's dataset stays whole)."""
    from sessrec.data.prepared.dataset import PreparedWriter

    out = tmp_path / "p"
    first = EventLogSource(write(event_log(seed=0), tmp_path / "a.parquet"), schema=SCHEMA, test_fraction=0.2)
    second = EventLogSource(write(event_log(seed=1), tmp_path / "b.parquet"), schema=SCHEMA, test_fraction=0.2)
    finish = PreparedWriter.finish

    def meanwhile(writer, *args, **kwargs):  # the other preparation finishes first
        monkeypatch.setattr(PreparedWriter, "finish", finish)
        prepare(first, str(out), engine="local", memory_budget=ROOMY, **LAYOUT)
        return finish(writer, *args, **kwargs)

    monkeypatch.setattr(PreparedWriter, "finish", meanwhile)
    with pytest.raises(FileExistsError, match=r"/p: another preparation wrote a dataset there while this one ran; "
                                              r"choose another --out, or pass --overwrite true to replace it$"):
        prepare(second, str(out), engine="local", memory_budget=ROOMY, **LAYOUT)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet", "p"]
    expected = tmp_path / "q"
    prepare(first, str(expected), engine="local", memory_budget=ROOMY, **LAYOUT)
    assert read_manifest(out)["sha256"] == read_manifest(expected)["sha256"]  # the first one's, whole


def test_a_dataset_replaced_by_another_prepare_while_it_is_read_is_refused_never_mixed(tmp_path):
    """``sessrec prepare --overwrite`` into a dataset that a fit is reading (its manifest read and checked, its splits
    or its vocabulary not yet): the parts and the vocabulary read are those of the manifest checked, or refused in one
    line naming the file; never the new dataset's files under the old manifest."""
    from sessrec.tasks import SessionDataModule

    out = tmp_path / "p"
    first = EventLogSource(write(event_log(seed=0), tmp_path / "a.parquet"), schema=SCHEMA, test_fraction=0.2)
    second = EventLogSource(write(event_log(seed=1), tmp_path / "b.parquet"), schema=SCHEMA, test_fraction=0.2)
    prepare(first, str(out), engine="local", memory_budget=ROOMY, **LAYOUT)
    source = PreparedSource(str(out))
    _ = source.manifest  # the reader has begun
    prepare(second, str(out), engine="local", memory_budget=ROOMY, overwrite=True, **LAYOUT)
    with pytest.raises(ValueError, match=r"^.*/p/train/part-00000\.parquet: replaced since its manifest was read \(by "
                                         r"another sessrec prepare\?\); read the dataset again$"):
        source.load()
    prepare(first, str(out), engine="local", memory_budget=ROOMY, overwrite=True, **LAYOUT)
    dm = SessionDataModule(source=PreparedSource(str(out)))
    assert dm.splits.train.num_rows  # the splits read: the first log's
    prepare(second, str(out), engine="local", memory_budget=ROOMY, overwrite=True, **LAYOUT)
    with pytest.raises(ValueError, match=r"^.*/p/vocab\.parquet: replaced since its manifest was read"):
        _ = dm.vocab
    with pytest.raises(ValueError, match=r"^.*/p/valid/part-00000\.parquet: replaced since its manifest was read"):
        StreamedSplits(out, dm.source.manifest)  # --data.streaming true: the evaluation splits read in memory


def test_an_edited_manifest_is_refused_before_a_split_is_read_short(tmp_path):
    """A manifest whose listing of a split's parts (with their hashes) or whose vocabulary settings were edited by
    hand would read a split short, or a vocabulary fitted otherwise than it says: its own content hash refuses it."""
    path = write(event_log(), tmp_path / "events.parquet")
    source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2)
    out = prepare(source, str(tmp_path / "p"), engine="local", memory_budget=ROOMY, part_sessions=20, row_group_sessions=8)
    whole = PreparedSource(str(out)).load()
    file = out / "manifest.json"
    manifest = json.loads(file.read_text())
    dropped = manifest["splits"]["test"]["files"].pop()
    assert manifest["splits"]["test"]["files"] and whole.test.num_rows > 20  # the test split had several parts
    del manifest["sha256"][dropped]
    file.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"p/manifest\.json: edited after sessrec prepare wrote it \(its content hash is "
                                         r"sha256:.*\): a split's files, counts or settings are not changed by hand"):
        PreparedSource(str(out)).load()
    manifest = json.loads(file.read_text())
    manifest["splits"]["test"]["files"].append(dropped)
    manifest["sha256"][dropped] = sha256_of(out / dropped)
    manifest["settings"]["min_item_count"] = 3
    file.write_text(json.dumps(manifest))
    from sessrec.tasks import SessionDataModule

    with pytest.raises(ValueError, match=r"manifest\.json: edited after sessrec prepare wrote it"):
        SessionDataModule(source=PreparedSource(str(out)), min_item_count=3).vocab
    manifest["settings"]["min_item_count"] = 1
    file.write_text(json.dumps(manifest, indent=3))  # the same content, spaced otherwise: read
    assert PreparedSource(str(out)).load().test.equals(whole.test)


def test_a_part_the_manifest_does_not_list_is_refused_by_name_not_ignored(tmp_path):
    path = write(event_log(), tmp_path / "events.parquet")
    source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2)
    out = prepare(source, str(tmp_path / "p"), engine="local", memory_budget=ROOMY, part_sessions=20, row_group_sessions=8)
    whole = PreparedSource(str(out)).load()
    extra = out / "train" / "part-99999.parquet"
    extra.write_bytes((out / "test" / "part-00000.parquet").read_bytes())
    with pytest.raises(ValueError, match=rf"^{re.escape(str(extra))}: a part the manifest of the prepared dataset "
                                         rf"{re.escape(str(out))} does not list, so it would not be read; remove it, or "
                                         "prepare the dataset again with it in the source$"):
        PreparedSource(str(out)).load()
    extra.unlink()
    (out / "notes.txt").write_text("mine")  # beside the dataset's files, not a part: read as before
    assert PreparedSource(str(out)).load().train.equals(whole.train)


def test_times_plausible_batch_by_batch_but_not_together_are_refused_as_in_memory(tmp_path, dask_scheduler, monkeypatch):
    """Every batch of this log passes validation alone (the first half in 2014, the second relative times
    from 0), the whole file does not: streamed and distributed reading refuse it as the in-memory path does."""
    from sessrec.data.prepared import cluster
    from sessrec.data.readers import scan_events

    times = np.r_[1.4e9 + np.arange(2000.0), np.arange(2000.0)]
    table = pa.table({"sid": np.arange(4000) // 4, "item": np.arange(4000) % 7, "t": times})
    path = write(table, tmp_path / "events.parquet")  # row groups of 500
    source = EventLogSource(path, schema=Schema(session_id="sid", item_id="item", timestamp="t"), test_fraction=0.2)
    with pytest.raises(ValueError) as whole:
        source.load()
    assert "has the time 0.0 at row 2000" in str(whole.value)
    with pytest.raises(ValueError) as streamed:
        list(scan_events(path, source.schema, batch_rows=500))
    monkeypatch.setattr(cluster, "PIECE_ROWS", 500)
    with pytest.raises(ValueError) as distributed:
        prepare(source, str(tmp_path / "p"), engine="dask", scheduler=dask_scheduler)
    assert str(streamed.value) == str(distributed.value) == str(whole.value)


def test_a_log_of_more_sessions_than_the_driver_held_at_this_budget_is_prepared_within_it(tmp_path, monkeypatch):
    """At a 40 KB budget for the data alone (some sixty partitions) the split and the parts hold a record
    batch of keys a partition, not 64 bytes a session (the 400 sessions would need 25.6 KB)."""
    from sessrec.data.prepared import local, plan

    monkeypatch.setattr(plan, "BATCH_SESSIONS", 4)
    for name in ("KEPT", "MIN_ROOM"):  # the budget is the data's: nothing held by the process or the allocators
        monkeypatch.setattr(local, name, 0)
    monkeypatch.setattr(local, "PEAK_PER_PART_BYTE", 0)  # nor by the parts (tests/test_prepare_budget.py)
    monkeypatch.setattr(local, "resident_bytes", lambda: 0)
    monkeypatch.setattr(local, "reading_bytes", lambda path: 0)
    used = []
    monkeypatch.setattr(local, "plan_parts", lambda *args: used.append(len(args[2])) or plan.plan_parts(*args))
    path = write(event_log(), tmp_path / "events.parquet")
    for splitting in ("fractions", "repeats_and_cut"):
        source = EventLogSource(path, schema=SCHEMA, **SPLITTINGS[splitting])
        memory = prepare(source, str(tmp_path / f"memory-{splitting}"), engine="memory", **LAYOUT)
        tiny = prepare(source, str(tmp_path / f"local-{splitting}"), engine="local", memory_budget="40KB", **LAYOUT)
        assert hashes(tiny) == hashes(memory)
    assert min(used) > 40  # partitions with sessions


def test_split_settings_the_in_memory_path_refuses_are_refused_by_the_partitioned_plan(tmp_path):
    path = write(event_log(), tmp_path / "events.parquet")
    untimed = EventLogSource(path, schema=Schema(session_id="sid", item_id="item", timestamp=None), test_fraction=0.2)
    with pytest.raises(ValueError, match="needs a timestamp column"):
        untimed.load()
    for partitions in (1, 3):
        with pytest.raises(ValueError, match="needs a timestamp column"):
            prepare(untimed, str(tmp_path / "p"), engine="local", memory_budget=ROOMY, partitions=partitions)
    assert not (tmp_path / "p").exists()


def test_what_the_driver_holds_does_not_grow_with_the_sessions(tmp_path, monkeypatch):
    """The driver keeps, between the steps, the partitions' summaries, the split rule and the part tasks:
    as many bytes for 3,000 sessions as for 300 (in 4 partitions, one part a split)."""
    import pickle

    from sessrec.data.prepared import local, plan

    held = {}

    def plan_parts(source, path, summaries, splits, layout, periods, earlier):
        tasks = plan.plan_parts(source, path, summaries, splits, layout, periods, earlier)
        named = [replace(s, sessions=Path(s.sessions).name, keys=Path(s.keys).name, by_end=Path(s.by_end).name)
                 for s in summaries]  # the files' names, not the temporary folder's
        named_tasks = [replace(t, reads=[(Path(p).name, a, b) for p, a, b in t.reads]) for t in tasks]
        held[source.path] = len(pickle.dumps((named, named_tasks)))
        return tasks

    monkeypatch.setattr(local, "plan_parts", plan_parts)
    for sessions in (300, 3000):
        log = event_log(sessions=sessions)
        path = write(log.set_column(0, "sid", pc.add(log.column("sid"), 10**6)), tmp_path / f"events{sessions}.parquet")
        source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2, valid_fraction=0.15)
        prepare(source, str(tmp_path / f"p{sessions}"), engine="local", memory_budget=ROOMY, partitions=4)
    small, large = held.values()
    assert abs(large - small) <= 64  # numbers of more digits; the old driver held 64 bytes more a session


def test_merged_puts_sorted_tables_in_one_order_a_batch_at_a_time():
    from sessrec.data.prepared.plan import END, PART, ROW, merged

    tables = [pa.table({END: [1.0, 1.0, 3.0, 5.0], "session_id": [4, 9, 2, 1]}),
              pa.table({END: [1.0, 2.0, 3.0], "session_id": [5, 0, 7]}),
              pa.table({END: [0.5, 6.0], "session_id": [3, 8]})]
    chunks = list(merged([pa.Table.from_batches(t.to_batches(max_chunksize=2)) for t in tables], [END, "session_id"]))
    out = pa.concat_tables(chunks)
    assert out.column("session_id").to_pylist() == [3, 4, 5, 9, 0, 2, 7, 1, 8]  # by end time, then id
    assert out.column(PART).to_pylist() == [2, 0, 1, 0, 1, 0, 1, 0, 2]
    assert out.column(ROW).to_pylist() == [0, 0, 0, 1, 1, 2, 2, 3, 1]
    assert len(chunks) > 1 and max(c.num_rows for c in chunks) <= 6  # a batch of 2 rows of each table at a time


def test_only_event_logs_are_partitioned(tmp_path):
    from sessrec.data import SyntheticSource

    source = SyntheticSource(num_sessions=300, num_items=40, days=4.0)
    with pytest.raises(ValueError, match="SyntheticSource is prepared whole: use --engine memory"):
        prepare(source, str(tmp_path / "p"), engine="local", memory_budget=ROOMY)
    out = prepare(source, str(tmp_path / "p"), engine="memory")
    assert PreparedSource(str(out)).load().train.equals(source.load().train)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["class_path"] == "sessrec.data.sources.SyntheticSource"
    assert manifest["splits"]["train"]["files"] == ["train/part-00000.parquet"]


def test_memory_budget_sizes():
    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("500MB") == 500_000_000 and parse_bytes(123) == 123
    with pytest.raises(ValueError, match="memory_budget: '4 parsecs' is not a size"):
        parse_bytes("4 parsecs")
    assert parse_bytes("1.5e3k") == 1_500_000 and parse_bytes(" 2 GB ") == 2_000_000_000
    for typo in ("1e", ".", "1.2.3GB", "e", "+", "1e999", "1e400MiB"):  # Python's float() words, or an overflow, before
        with pytest.raises(ValueError, match=rf"^memory_budget: {re.escape(repr(typo))} is not a size \(e.g. 4GiB"):
            parse_bytes(typo)


def test_the_recipes_fixture_holds_what_its_source_gives():
    from sessrec.data import SyntheticSource

    fixture = Path(__file__).parent / "fixtures" / "prepared" / "synthetic"
    splits = PreparedSource(str(fixture)).load()
    expected = SyntheticSource(num_sessions=2000, num_items=200, days=6.0).load()
    for name in ("train", "valid", "test"):
        assert getattr(splits, name).equals(getattr(expected, name))


# -- the shared datasets that have an event log --------------------------------------------------------

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
RSC15 = DATA / "rsc15_100k"
EVENT_LOGS = {  # every event log of ../shared/data (SOURCE.md), read as an event log can be
    "rsc15_full": {"path": "rsc15_100k/yoochoose-clicks-100k_train_full.txt.gz", "valid_days": 1.0,
                   "test_path": "rsc15_100k/yoochoose-clicks-100k_test.txt.gz",
                   "schema": Schema(session_id="SessionId", item_id="ItemId", timestamp="Time")},
    "rsc15_tr": {"path": "rsc15_100k/yoochoose-clicks-100k_train_tr.txt.gz", "valid_fraction": 0.1,
                 "test_path": "rsc15_100k/yoochoose-clicks-100k_train_valid.txt.gz", "drop_repeats": True,
                 "schema": Schema(session_id="SessionId", item_id="ItemId", timestamp="Time")},
    "diginetica_views": {"path": "diginetica_sample/sample_train-item-views.csv.gz", "test_days": 7.0, "valid_days": 7.0,
                         "schema": Schema(session_id="session_id", item_id="item_id", timestamp="eventdate",
                                          time_unit="datetime", order_by="timeframe")},
    "diginetica_purchases": {"path": "diginetica_sample/train-purchases.csv.gz", "test_fraction": 0.1, "min_length": 1,
                             "schema": Schema(session_id="sessionId", item_id="itemId", timestamp="eventdate",
                                              time_unit="datetime", order_by="timeframe")},
    "movielens": {"path": "movielens_latest_small/ratings.csv.gz", "test_fraction": 0.1, "valid_fraction": 0.1,
                  "max_length": 50, "schema": Schema(session_id="userId", item_id="movieId", timestamp="timestamp",
                                                     features=[FeatureSpec("rating", "continuous")])},
    "trivago": {"path": "trivago_rsc19_100k/trivago_val_100k.parquet.snappy", "test_fraction": 0.2, "drop_repeats": True,
                "schema": Schema(session_id="session_id", item_id="reference", timestamp="timestamp", order_by="step",
                                 features=[FeatureSpec("action_type"), FeatureSpec("device")])},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EVENT_LOGS))
def test_every_shared_event_log_prepares_the_same_with_every_engine(tmp_path, name, dask_scheduler):
    settings = dict(EVENT_LOGS[name])
    for key in ("path", "test_path"):
        if key in settings:
            settings[key] = str(DATA / settings[key])
    if not Path(settings["path"]).exists():
        pytest.skip(f"{settings['path']} is not available here")
    source = EventLogSource(**settings)
    memory = prepare(source, str(tmp_path / "memory"), engine="memory")
    local = prepare(source, str(tmp_path / "local"), engine="local", memory_budget=ROOMY, partitions=4)
    dask = prepare(source, str(tmp_path / "dask"), engine="dask", partitions=3, scheduler=dask_scheduler)
    assert hashes(memory) == hashes(local) == hashes(dask)
    splits = source.load()
    prepared = PreparedSource(str(dask)).load()
    assert all(getattr(prepared, s).equals(getattr(splits, s)) for s in ("train", "valid", "test"))


@pytest.mark.slow
def test_trivago_with_virtual_items_and_side_features_prepares_whole(tmp_path):
    from sessrec.datasets import TrivagoSource

    path = DATA / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"
    if not path.exists():
        pytest.skip(f"{path} is not available here")
    source = TrivagoSource(str(path), virtual_items=True, features=["price", "device"])
    out = prepare(source, str(tmp_path / "p"), engine="memory", part_sessions=500)
    splits, prepared = source.load(), PreparedSource(str(out)).load()
    assert all(getattr(prepared, s).equals(getattr(splits, s)) for s in ("train", "valid", "test"))
    items, _ = frame.list_offsets(splits.train.column(frame.ITEMS))
    virtual = frame.list_offsets(splits.train.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False).astype(bool)
    assert PreparedSource(str(out)).vocab(1, None) == ItemVocab.fit(items, virtual=virtual)


@pytest.mark.slow
def test_a_prepared_rsc15_trains_to_the_in_memory_validation_metrics(tmp_path, monkeypatch):
    """The same recipe, seed and tiny model on rsc15 read as an event log and as a prepared dataset
    (``sessrec prepare``, then ``--data.source.class_path sessrec.data.PreparedSource``): equal validation metrics."""
    from sessrec.cli import cli, run

    if not RSC15.exists():
        pytest.skip(f"{RSC15} is not available here")
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "shared").symlink_to(DATA.parent)
    monkeypatch.chdir(work)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    root = Path(__file__).resolve().parents[1]
    recipe = ["--config", str(root / "recipes/data/rsc15.yaml"), "--config", str(root / "recipes/model/gru4rec.yaml")]
    run(["prepare", *recipe, "--out", "prepared", "--engine", "local", "--partitions", "3", "--memory_budget", ROOMY])
    tiny = ["--model.encoder.init_args.d_model", "16", "--model.loss.init_args.num_samples", "64",
            "--model.schedule.warmup_steps", "0", "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
            "--trainer.logger.class_path", "pytorch_lightning.loggers.CSVLogger"]  # two fits in one process: no wandb run
    metrics = []
    for extra in ([], ["--data.source.class_path", "sessrec.data.PreparedSource", "--data.source.init_args.path", "prepared"]):
        done = cli(["fit", *recipe, *tiny, *extra])
        assert type(done.datamodule.source).__name__ == ("PreparedSource" if extra else "EventLogSource")
        metrics.append({k: float(v) for k, v in done.trainer.callback_metrics.items() if k.startswith("val/")})
    assert len(metrics[0]) >= 6 and metrics[0].keys() == metrics[1].keys()
    for key, value in metrics[0].items():
        assert abs(metrics[1][key] - value) <= 1e-6, key


def test_text_session_ids_hash_by_their_bytes_alone():
    """Each string's hash is sum(byte * 31^(bytes after it)) mod 2^64, whatever its neighbours (an empty one: 0)."""
    from sessrec.data.prepared.plan import _text_hash

    texts = ["ab", "", "session-" * 40, "é", ""]
    reference = [sum(b * pow(31, len(t.encode()) - i - 1, 2**64) for i, b in enumerate(t.encode())) % 2**64 for t in texts]
    assert _text_hash(pa.array(texts, pa.large_string())).tolist() == reference
    assert _text_hash(pa.array(texts[1:], pa.large_string())).tolist() == reference[1:]  # no neighbour changes a hash


def test_a_session_with_events_in_two_split_files_is_refused_by_every_engine(tmp_path, dask_scheduler):
    """A test file that holds the later events of a training session would test a session whose start was trained on:
    refused in one line naming both files and the session, by the in-memory load and by every engine, before a part is
    written."""
    log = event_log(seed=2)
    late = pc.greater_equal(log.column("t"), 1.4e9 + 7 * 3600.0)
    train_rows, test_rows = log.filter(pc.invert(late)), log.filter(late)
    shared = sorted(set(train_rows.column("sid").to_pylist()))[5]
    moved = train_rows.filter(pc.equal(train_rows.column("sid"), shared))  # its last two events go to the test file
    moved = moved.take(pc.sort_indices(moved, sort_keys=[("t", "ascending"), ("step", "ascending")]))
    tail = moved.slice(moved.num_rows - 2)
    tail = tail.set_column(2, "t", pc.add(tail.column("t"), 8 * 3600.0))
    train = write(train_rows.filter(pc.invert(pc.is_in(train_rows.column("other"), tail.column("other")))),
                  tmp_path / "train.csv")
    test = write(pa.concat_tables([test_rows, tail]), tmp_path / "test.parquet")
    source = EventLogSource(train, schema=SCHEMA, test_path=test, valid_fraction=0.2, min_length=1)
    message = (f"{test}: session {shared} also has events in {train}; a session belongs to the period of its last "
               "event, so its events must all lie in one file: move them into one file, or give the sessions of each "
               "file their own ids")
    with pytest.raises(ValueError) as refused:
        source.load()
    assert str(refused.value) == message
    refused_by_every_engine(source, message, tmp_path / "p", (
        ("memory", {}), ("local", {"partitions": 1, "memory_budget": ROOMY}), ("local", {"partitions": 3, "memory_budget": ROOMY}),
        ("dask", {"partitions": 2, "scheduler": dask_scheduler})))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.parquet", "train.csv"]


def refused_by_every_engine(source: EventLogSource, message: str, out: Path, engines: tuple) -> None:
    """`prepare` of `source` into `out` by each (engine, settings) of `engines` refuses it with `message`, writing nothing."""
    for engine, settings in engines:
        with pytest.raises(ValueError) as refused:
            prepare(source, str(out), engine=engine, **settings)
        assert str(refused.value) == message
        assert not out.exists()


def test_split_files_whose_session_ids_differ_in_type_are_refused_by_every_engine(tmp_path, dask_scheduler):
    """Session 3 of the training file and session '3' of the test file may be one session: the check that a
    session's events lie in one file compared nothing between ids of two types, and let them through."""
    log = event_log(seed=2)
    late = pc.greater_equal(log.column("t"), 1.4e9 + 7 * 3600.0)
    train = write(log.filter(pc.invert(late)), tmp_path / "train.parquet")
    test_rows = log.filter(late)
    test = write(test_rows.set_column(0, "sid", test_rows.column("sid").cast(pa.string())), tmp_path / "test.parquet")
    source = EventLogSource(train, schema=SCHEMA, test_path=test, valid_fraction=0.2, min_length=1)
    message = (f"{test}: its session ids are text, those of {train} integers, so whether a session has events in both "
               "files cannot be told; give the files session ids of one type, or read them as text (the schema's "
               "string_ids: true)")
    with pytest.raises(ValueError) as refused:
        source.load()
    assert str(refused.value) == message
    refused_by_every_engine(source, message, tmp_path / "p", (
        ("memory", {}), ("local", {"partitions": 2, "memory_budget": ROOMY}), ("dask", {"partitions": 2, "scheduler": dask_scheduler})))
    as_text = EventLogSource(train, schema=replace(SCHEMA, string_ids=True), test_path=test,
                             valid_fraction=0.2, min_length=1)
    assert as_text.load().test.num_rows == source.sessions(test).num_rows


def test_split_files_whose_item_ids_differ_in_type_are_refused_before_anything_is_trained_or_written(tmp_path):
    """Items of an integer training file and a text test file were only refused by `sessrec test`, after training,
    naming the training file; `sessrec prepare` wrote such a dataset, exit 0."""
    log = event_log(seed=2).drop_columns(["virtual"])
    schema = replace(SCHEMA, features=SCHEMA.features[1:])
    late = pc.greater_equal(log.column("t"), 1.4e9 + 7 * 3600.0)
    train = write(log.filter(pc.invert(late)), tmp_path / "train.parquet")
    test_rows = log.filter(late)
    test = write(test_rows.set_column(1, "item", test_rows.column("item").cast(pa.string())), tmp_path / "test.parquet")
    source = EventLogSource(train, schema=schema, test_path=test, valid_fraction=0.2, min_length=1)
    message = (f"{test}: its item ids are text, those of {train} integers, so whether an item of one file is an item "
               "of the other cannot be told; give the files item ids of one type, or read them as text (the schema's "
               "string_ids: true)")
    with pytest.raises(ValueError) as refused:
        source.load()
    assert str(refused.value) == message
    refused_by_every_engine(source, message, tmp_path / "p", (
        ("memory", {}), ("local", {"partitions": 2, "memory_budget": ROOMY})))


def test_a_preparation_removes_what_one_killed_on_this_host_left_beside_its_dataset(tmp_path):
    """A SIGKILL leaves a preparation's temporary dataset folder and its scratch folder beside `out`; the next
    preparation into `out` removes them when their process is gone, and leaves a live one's and another host's alone."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        left = [f".p.tmp-{host}-{gone.pid}", f"sessrec-prepare-{host}-{gone.pid}-x1", f".p.old-{host}-{gone.pid}"]
        kept = [f".p.tmp-{host}-{live.pid}", f"sessrec-prepare-{host}-{live.pid}-x2", ".p.tmp-another-host-1"]
        for name in left + kept:
            (tmp_path / name).mkdir()
            (tmp_path / name / "part-00000.parquet").write_bytes(b"half")
        path = write(event_log(), tmp_path / "events.parquet")
        prepare(EventLogSource(path, schema=SCHEMA, test_fraction=0.2), str(tmp_path / "p"), memory_budget=ROOMY)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, "events.parquet", "p"])
    finally:
        live.kill()
        live.wait()


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_out_reached_through_a_missing_folder_and_back_is_checked_as_the_folder_it_names(tmp_path, overwrite):
    """``new/../mine`` names ``mine`` once ``new`` is made: a folder of other files there is refused and kept, with or
    without --overwrite, and neither ``new`` nor a temporary folder is left."""
    source = EventLogSource(write(event_log(sessions=60), tmp_path / "events.parquet"), schema=SCHEMA, test_fraction=0.2)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("kept")
    message = "exists and is not a prepared dataset" if overwrite else "exists; remove it, choose another --out"
    with pytest.raises(FileExistsError, match=rf"^{tmp_path}/mine: {message}"):
        prepare(source, f"{tmp_path}/new/../mine", engine="local", memory_budget=ROOMY, overwrite=overwrite, **LAYOUT)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["events.parquet", "mine", "mine/notes.txt"]
    assert (tmp_path / "mine" / "notes.txt").read_text() == "kept"


def test_an_out_that_is_a_file_or_holds_the_event_log_it_replaces_is_refused_and_kept(tmp_path):
    log = event_log(sessions=60)
    (tmp_path / "afile").write_text("kept")
    source = EventLogSource(write(log, tmp_path / "events.parquet"), schema=SCHEMA, test_fraction=0.2)
    for overwrite in (False, True):  # --overwrite would not replace it either: the advice is another --out
        with pytest.raises(FileExistsError, match=rf"^{tmp_path}/afile: is a file, not a folder; choose another --out$"):
            prepare(source, str(tmp_path / "afile"), engine="local", memory_budget=ROOMY, overwrite=overwrite, **LAYOUT)
    out = prepare(source, str(tmp_path / "p"), engine="local", memory_budget=ROOMY, **LAYOUT)
    inside = EventLogSource(write(log, out / "events.parquet"), schema=SCHEMA, test_fraction=0.3)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=rf"^{out}: holds {out}/events.parquet, a file the preparation reads, which "
                                         "replacing the dataset would delete; move the file out of it or choose another"):
        prepare(inside, str(out), engine="local", memory_budget=ROOMY, overwrite=True, **LAYOUT)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (tmp_path / "afile").read_text() == "kept" and pq.read_table(out / "events.parquet").equals(log)


@pytest.mark.parametrize(("setting", "message"), [
    ({"partitions": 0}, "partitions must be >= 1, or None for as many as the budget needs; got 0"),
    ({"partitions": -1}, "partitions must be >= 1, or None for as many as the budget needs; got -1"),
    ({"engine": "dask", "partitions": 0}, "partitions must be >= 1, or None for as many as the budget needs; got 0"),
    ({"max_vocab_size": 0}, "max_vocab_size must be >= 1, or None for no limit; got 0"),
])
def test_a_count_setting_below_1_is_refused_naming_it_and_nothing_is_written(tmp_path, setting, message):
    source = EventLogSource(write(event_log(sessions=60), tmp_path / "events.parquet"), schema=SCHEMA, test_fraction=0.2)
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        prepare(source, str(tmp_path / "p"), **{"engine": "local", "memory_budget": ROOMY, **LAYOUT, **setting})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet"]


@pytest.mark.parametrize(("setting", "message"), [
    ({"engine": "memory", "partitions": 4}, "--partitions 4 needs --engine local or dask (the memory engine loads the "
                                            "source whole, in no partitions)"),
    ({"engine": "memory", "partitions": 0}, "--partitions 0 needs --engine local or dask (the memory engine loads the "
                                            "source whole, in no partitions)"),
    ({"scheduler": "tcp://host:8786"}, "--scheduler tcp://host:8786 needs --engine dask (the local engine runs in this "
                                       "process)"),
    ({"engine": "memory", "backend": "cudf"}, "--backend cudf needs --engine dask (the memory engine runs in this process)"),
])
def test_a_setting_the_engine_cannot_honour_is_refused_naming_it_and_nothing_is_written(tmp_path, setting, message):
    source = EventLogSource(write(event_log(sessions=60), tmp_path / "events.parquet"), schema=SCHEMA, test_fraction=0.2)
    with pytest.raises(ValueError, match=rf"^{re.escape(message)}$"):
        prepare(source, str(tmp_path / "p"), **{"engine": "local", "memory_budget": ROOMY, **LAYOUT, **setting})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.parquet"]


@pytest.mark.parametrize("engine", ["memory", "local", "dask"])
@pytest.mark.parametrize("which", ["path", "test_path"])
def test_a_missing_or_folder_event_log_is_refused_naming_it_and_nothing_is_written(tmp_path, engine, which):
    log = write(event_log(sessions=60), tmp_path / "events.parquet")
    (tmp_path / "afolder").mkdir()
    for given, error, message in ((tmp_path / "nope.csv", FileNotFoundError, "no such file"),
                                  (tmp_path / "afolder", SchemaError, "is a folder, expected a CSV/TSV or parquet file")):
        source = EventLogSource(**{"path": log, "test_fraction": 0.2, **{which: str(given)}}, schema=SCHEMA)
        with pytest.raises(error, match=rf"^{re.escape(f'{given}: {message}')}$"):
            prepare(source, str(tmp_path / "p"), engine=engine, memory_budget=ROOMY, **LAYOUT)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afolder", "events.parquet"]


@pytest.mark.parametrize("engine", ["memory", "local", "dask"])
def test_a_log_that_is_no_parquet_file_or_has_no_rows_is_refused_naming_it_by_every_engine(tmp_path, engine):
    """A parquet log of 0 bytes or of another format, and a log of no rows (an empty parquet file, a CSV header
    alone): the same one line naming the file from every engine, nothing written."""
    empty = tmp_path / "empty.parquet"
    pq.write_table(event_log(sessions=5).slice(0, 0), empty)
    (tmp_path / "zero.parquet").write_bytes(b"")
    (tmp_path / "text.parquet").write_text("sid,item,t\n1,2,1400000000\n")
    (tmp_path / "header.csv").write_text("sid,item,t,step,virtual,category,price\n")
    cases = {"zero.parquet": "cannot be read as parquet: .*0 bytes", "text.parquet": "cannot be read as parquet: .*magic bytes",
             "empty.parquet": "the file has no rows", "header.csv": "the file has no rows"}
    for name, message in cases.items():
        source = EventLogSource(str(tmp_path / name), schema=SCHEMA, test_fraction=0.2)
        with pytest.raises(SchemaError, match=rf"^{re.escape(str(tmp_path / name))}: {message}"):
            prepare(source, str(tmp_path / "p"), engine=engine, memory_budget=ROOMY, **LAYOUT)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(cases)
