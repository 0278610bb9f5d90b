"""Bad data settings and inputs are refused in one line naming the setting, or the file, column, row and value:
validation periods given twice, gzipped logs cut short, one ISO-8601 time among numbers."""

from __future__ import annotations

import codecs
import gzip
import json
import logging
import os
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessrec.data import frame
from sessrec.data.readers import read_events, read_user_sequences, scan_events
from sessrec.data.schema import FeatureSpec, Schema, SchemaError, VirtualSpec
from sessrec.data.sources import EventLogSource, TimeWindowSource, UserSequenceSource
from sessrec.data.stream import ScoringStream
from sessrec.data.vocab import ItemVocab
from sessrec.tasks.session_data import SessionDataModule

SCHEMA = Schema(session_id="sid", item_id="iid", timestamp="ts", time_unit="s")


def event_lines(n: int = 400) -> list[list[str]]:
    """`n` events of sessions of 4, one every 37 seconds from 2023-11-14."""
    return [[str(i // 4), str(1 + i % 50), str(1_700_000_000 + 37 * i)] for i in range(n)]


def write_csv(path, rows: list[list[str]]) -> str:
    path.write_text("sid,iid,ts\n" + "".join(",".join(r) + "\n" for r in rows))
    return str(path)


# ------------------------------------------------------------------------------ validation periods
@pytest.mark.parametrize("fraction", [0.3, 0.5])
def test_valid_days_with_a_valid_fraction_is_refused_like_test_days_with_test_fraction(fraction):
    with pytest.raises(ValueError, match="^" + re.escape(
            "EventLogSource takes one of valid_days and valid_fraction to hold out validation sessions, not both; "
            f"got valid_days 1, valid_fraction {fraction:g}")):
        EventLogSource("events.csv", test_days=1, valid_days=1, valid_fraction=fraction)
    EventLogSource("events.csv", test_days=1, valid_days=1)  # the default fraction gives way to the days
    EventLogSource("events.csv", test_days=1, valid_days=1, valid_fraction=None)


@pytest.mark.parametrize("settings", [
    {"test_days": 1, "valid_days": 1, "valid_fraction": 1.5},
    {"test_days": 1, "valid_path": "valid.csv", "valid_fraction": 1.5},
    {"test_path": "test.csv", "test_fraction": 2.0},
], ids=["with-valid_days", "with-valid_path", "test_fraction-with-test_path"])
def test_a_fraction_out_of_range_is_refused_whenever_given(settings):
    name, value = next((k, v) for k, v in settings.items() if k.endswith("_fraction"))
    with pytest.raises(ValueError, match="^" + re.escape(f"EventLogSource: {name} must be a share in (0, 1), got {value}")):
        EventLogSource("events.csv", **settings)


@pytest.mark.parametrize("settings,named", [
    ({"test_days": 1.0, "valid_fraction": 0.3}, "test_days 1 and valid_fraction 0.3"),
    ({"test_fraction": 0.2, "valid_days": 1.0}, "test_fraction 0.2 and valid_days 1"),
])
def test_time_labels_refuse_days_mixed_with_fractions(settings, named):
    with pytest.raises(ValueError, match=re.escape(f"not both; got {named}, which would be ignored")):
        frame.time_labels(np.arange(10.0) * frame.DAY, **settings)


# ------------------------------------------------------------------------------ truncated gzip
@pytest.fixture
def cut_logs(tmp_path):
    """The same gzipped log cut at 60, 300 and 3000 bytes (early cuts end inside the first 4 KiB read)."""
    text = "sid,iid,ts\n" + "".join(",".join(r) + "\n" for r in event_lines(2000))
    whole = gzip.compress(text.encode())
    assert len(whole) > 3000
    paths = []
    for size in (60, 300, 3000):
        path = tmp_path / f"cut{size}.csv.gz"
        path.write_bytes(whole[:size])
        paths.append(path)
    return paths


READERS = {
    "read_events": lambda path: read_events(path, SCHEMA),
    "scan_events": lambda path: list(scan_events(path, SCHEMA)),
    "ScoringStream": lambda path: list(ScoringStream(path, ItemVocab.fit(pa.array(np.arange(1, 51))), SCHEMA)),
    "ScoringStream.partitions": lambda path: ScoringStream(path, ItemVocab.fit(pa.array([1])), SCHEMA).partitions(10),
    "read_user_sequences": lambda path: read_user_sequences(path, "lines"),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_gzip_cut_anywhere_is_refused_in_one_line_naming_the_file(cut_logs, reader):
    messages = []
    for path in cut_logs:
        with pytest.raises(SchemaError) as err:
            READERS[reader](path)
        message = str(err.value)
        assert message.startswith(f"{path}: cannot be read") and "\n" not in message, message
        messages.append(message.replace(str(path), "<file>"))
    assert len(set(messages)) == 1, messages  # cut early or late: the same words


# ------------------------------------------------------------------------------ a header line missing or not split
HEADER_READERS = {name: READERS[name] for name in ("read_events", "scan_events", "ScoringStream", "ScoringStream.partitions")}


@pytest.mark.parametrize("reader", list(HEADER_READERS))
@pytest.mark.parametrize("header, hint", [
    (False, "The file's first line holds values, not column names: the file needs a header line naming its columns."),
    (True, "The file reads as one column, 'sid iid ts': its separator is not the one it was read with (a comma, tab, "
           "semicolon or bar is found from the header line; a source's `delimiter` sets another)."),
], ids=["no-header-line", "space-separated"])
def test_a_file_without_a_header_line_or_split_by_spaces_is_refused_saying_so_by_every_reader(tmp_path, reader, header, hint):
    """A file whose first line is data (SASRec's ``user item`` files) or whose separator is a space reads as columns
    named by values, or as one column: the refusal says which, not only that the schema's column is missing."""
    rows = event_lines(8)
    path = tmp_path / "events.csv"
    if header:
        path.write_text("sid iid ts\n" + "".join(" ".join(r) + "\n" for r in rows))
        names = ["sid iid ts"]
    else:
        path.write_text("".join(",".join(r) + "\n" for r in rows))
        names = rows[0]
    with pytest.raises(SchemaError) as err:
        HEADER_READERS[reader](path)
    assert str(err.value) == f"{path}: column 'sid' is missing; the file has columns {names}. {hint}"


# ------------------------------------------------------------------------------ integer ids written otherwise
def dask_piece(path):
    from sessrec.data.prepared.cluster import Piece, read_piece

    types = pa.csv.open_csv(path).schema  # the first block's types, as the dask engine reads them
    return read_piece(Piece(str(path), 0, start=0, end=os.path.getsize(path)), SCHEMA, None, types)


ID_READERS = {name: READERS[name] for name in ("read_events", "scan_events", "ScoringStream", "ScoringStream.partitions")}
ID_READERS["dask piece"] = dask_piece


@pytest.mark.parametrize("reader", list(ID_READERS))
@pytest.mark.parametrize("column,written,number", [("sid", "01", 1), ("iid", "01050", 1050), ("iid", "0x41a", 1050)])
def test_an_integer_id_of_a_csv_file_written_otherwise_than_its_decimal_is_refused_by_every_reader(
        tmp_path, reader, column, written, number):
    """Arrow reads ``01050`` and ``0x41a`` as 1050, the id of ``1050`` too, and ``01`` as session 1: refused naming
    the file, the column, the value and its row, by every reader of a CSV file; `string_ids` reads them as text."""
    if reader == "ScoringStream.partitions" and column == "iid":
        pytest.skip("partitions read the session ids alone")
    rows = event_lines(12)
    rows[9][["sid", "iid"].index(column)] = written
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as err:
        ID_READERS[reader](path)
    where = f"{path} (the lines from byte 0)" if reader == "dask piece" else str(path)
    assert str(err.value) == (f"{where}: column {column!r} has the id {written!r} at row 9, which reads as the integer "
                              f"{number}, as {str(number)!r} does; write it {number}, or read the ids as text (the "
                              "schema's string_ids: true)")
    text = read_events(path, Schema(session_id="sid", item_id="iid", timestamp="ts", string_ids=True))
    assert text.column(column)[9].as_py() == written


def test_a_text_id_after_a_first_block_of_integers_is_refused_alike_read_whole_or_streamed(tmp_path):
    """The first block of a CSV file decides an id column's type for every reader: a later ``x7`` is named at its
    row (read whole, Arrow read the column as text; streamed, it failed naming no row)."""
    rows = event_lines(300_000)  # 6 MB: past the first block of every reader (1 MB; the scoring stream's 4 MB)
    rows[290_000][1] = "x7"
    path = write_csv(tmp_path / "events.csv", rows)
    message = (f"{path}: column 'iid' has the id 'x7' at row 290000, not an integer as the column's first ids are; fix "
               "the row, or read the ids as text (the schema's string_ids: true)")
    for reader in ("read_events", "scan_events", "ScoringStream"):
        with pytest.raises(SchemaError) as err:
            READERS[reader](path)
        assert str(err.value) == message, reader


def test_a_decimal_time_after_a_first_block_of_integer_times_reads_alike_whole_or_streamed(tmp_path):
    """A number column holding integers in its first block and a decimal later is read as floats by `read_csv`; the
    streamed readers (`prepare`'s, the scoring stream's, the dask pieces') refused the decimal."""
    rows = event_lines(300_000)  # 6 MB: past the first block of every reader
    rows[290_000][2] += ".5"
    path = write_csv(tmp_path / "events.csv", rows)
    whole = read_events(path, SCHEMA)
    assert whole.column("ts")[290_000].as_py() == 1_700_000_000 + 37 * 290_000 + 0.5
    assert pa.concat_tables(scan_events(path, SCHEMA, batch_rows=100_000)).equals(whole)
    assert dask_piece(path)[0].drop_columns("__row").equals(whole)
    assert sum(len(batch.items) for batch in READERS["ScoringStream"](path)) == 75_000


@pytest.mark.parametrize("written", ["1240", "1240.5"])
def test_a_bad_time_after_the_first_block_is_named_as_the_file_writes_it_by_every_reader(tmp_path, monkeypatch,
                                                                                        written):
    """The streamed readers read a number column of integers in its first block as floats: a time written 1240 was
    named 1240.0, where the file read whole names it 1240."""
    from sessrec.data.prepared import cluster

    monkeypatch.setattr(cluster, "PIECE_BYTES", 2_000_000)  # row 290000 in the third piece
    rows = event_lines(300_000)  # 6 MB: past the first block of every reader
    rows[290_000][2] = written
    path = write_csv(tmp_path / "events.csv", rows)
    message = (f"{path}: column 'ts' has the time {written} at row 290000, read with time_unit: s as the year 1970 "
               "(outside 1990..2100); fix or drop the rows, or set time_unit to the column's unit")
    for name, reader in [*((n, READERS[n]) for n in ("read_events", "scan_events", "ScoringStream")),
                         ("dask pieces", pieces_read)]:
        with pytest.raises(SchemaError) as err:
            reader(path)
        assert str(err.value) == message, name


def test_categorical_codes_of_a_csv_file_are_read_as_their_text_by_every_reader(tmp_path):
    """A category written ``01`` and one written ``1`` are two categories: Arrow read both as the integer 1 (one
    category), whether the file was read whole, streamed, in dask pieces or scored."""
    from sessrec.data.prepared.cluster import Piece, read_piece
    from sessrec.data.side import SideFeatures
    from sessrec.features import SideFeatureTransform

    path = tmp_path / "events.csv"
    path.write_text("sid,iid,ts,cat\n" + "".join(f"{s},{i},{t},{['1', '01', '2'][n % 3]}\n"
                                                 for n, (s, i, t) in enumerate(event_lines(12))))
    schema = Schema(session_id="sid", item_id="iid", timestamp="ts", features=[FeatureSpec("cat")])
    codes = ["1", "01", "2"] * 4
    assert read_events(path, schema).column("cat").to_pylist() == codes
    assert pa.concat_tables(scan_events(path, schema)).column("cat").to_pylist() == codes
    piece = read_piece(Piece(str(path), 0, start=0, end=os.path.getsize(path)), schema, None, pa.csv.open_csv(path).schema)
    assert piece[0].column("cat").to_pylist() == codes
    sessions = EventLogSource(str(path), schema, test_fraction=0.25, valid_fraction=0.34, min_length=1).sessions(str(path))
    side = SideFeatureTransform(SideFeatures(categorical=["cat"])).fit(sessions)
    scored = list(ScoringStream(path, ItemVocab.fit(pa.array(np.arange(1, 51))), Schema("sid", "iid", "ts"), side=side))
    assert len({int(c) for b in scored for c in b.features["cat"][b.items > 0]}) == 3


def test_virtual_key_columns_of_a_csv_file_are_read_as_their_text_by_every_reader(tmp_path):
    """A search for ``01`` and one for ``1`` are two virtual items: Arrow read the key column as integers, so both
    became ``search:1``, whether the file was read whole, streamed, in dask pieces or scored."""
    from sessrec.data.prepared.cluster import Piece, read_piece

    path = tmp_path / "events.csv"
    path.write_text("sid,iid,ts,etype,q\n" + "".join(
        f"{s},,{t},search,{['01', '1', '2'][n // 4]}\n" if n % 4 == 1 else f"{s},{i},{t},view,\n"
        for n, (s, i, t) in enumerate(event_lines(12))))
    schema = Schema(session_id="sid", item_id="iid", timestamp="ts",
                    virtual=VirtualSpec("etype", ["search"], key=["etype", "q"]))
    items = ["1", "search:01", "3", "4", "5", "search:1", "7", "8", "9", "search:2", "11", "12"]
    assert read_events(path, schema).column("iid").to_pylist() == items
    assert pa.concat_tables(scan_events(path, schema)).column("iid").to_pylist() == items
    piece = read_piece(Piece(str(path), 0, start=0, end=os.path.getsize(path)), schema, None, pa.csv.open_csv(path).schema)
    assert piece[0].column("iid").to_pylist() == items
    marked = np.array([item.startswith("search") for item in items])
    vocab = ItemVocab.fit(pa.array(items), virtual=marked)
    ids = np.concatenate([np.asarray(b.items).ravel() for b in ScoringStream(path, vocab, schema)])
    assert sorted(set(ids[ids >= len(vocab) - 3].tolist())) == [len(vocab) - 3, len(vocab) - 2, len(vocab) - 1]  # 3 virtual items


@pytest.mark.parametrize("column", ["sid", "iid"])
@pytest.mark.parametrize("reader", ["read_events", "scan_events", "ScoringStream"])
def test_a_text_id_past_the_first_mebibyte_is_refused_by_every_reader(tmp_path, reader, column):
    """The scoring stream typed its columns by a first block of 4 MiB, the other readers by one of 1 MiB: a text id
    2 MB into the file, refused by fit, was read by predict as text (an unknown item, a session named by text)."""
    rows = event_lines(110_000)
    at = next(n for n, size in enumerate(np.cumsum([len(",".join(r)) + 1 for r in rows])) if size > 2_000_000)
    rows[at][["sid", "iid"].index(column)] = "x7"
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as err:
        READERS[reader](path)
    assert str(err.value) == (f"{path}: column {column!r} has the id 'x7' at row {at}, not an integer as the column's "
                              "first ids are; fix the row, or read the ids as text (the schema's string_ids: true)")


@pytest.mark.parametrize("reader", ["read_events", "scan_events", "ScoringStream"])
def test_a_role_column_the_file_has_twice_is_refused_by_every_reader_naming_it(tmp_path, reader):
    path = tmp_path / "events.csv"
    path.write_text("sid,iid,iid,ts\n" + "".join(f"{s},{i},{i}1,{t}\n" for s, i, t in event_lines(8)))
    with pytest.raises(SchemaError) as err:
        READERS[reader](str(path))
    assert str(err.value) == (f"{path}: column 'iid' appears 2 times in the file's columns ['sid', 'iid', 'iid', 'ts'], "
                              "so which one it is is unknown; rename or drop the others")


@pytest.mark.parametrize("marker", ["", "NA", "NaN", "null", "None"])
@pytest.mark.parametrize("reader", ["read_events", "scan_events", "ScoringStream"])
def test_every_reader_reads_the_same_markers_as_a_missing_id(tmp_path, reader, marker):
    """A session id written ``None`` or ``NaN`` among text ids is missing to the training readers; the scoring stream
    read it as a session named 'None' and scored it. Read as null, the refusal names the field's text."""
    rows = [[f"s{sid}", iid, ts] for sid, iid, ts in event_lines(12)]
    rows[9][0] = marker
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as err:
        READERS[reader](path)
    assert str(err.value) == f"{path}: column 'sid' has a missing id {marker!r} at row 9; drop or fill those rows"


MARKER_READERS = {name: ID_READERS[name] for name in ("read_events", "scan_events", "ScoringStream", "dask piece")}


@pytest.mark.parametrize("reader", list(MARKER_READERS))
@pytest.mark.parametrize("column", ["sid", "iid"])
@pytest.mark.parametrize("marker", ["N/A", "n/a", "#N/A", "NULL", "<NA>", "none", " NA ", "", "NA", "NaN", "null", "None"])
def test_a_missing_value_marker_in_an_id_column_is_refused_by_every_reader_naming_it(tmp_path, reader, column, marker):
    """``N/A`` among integer ids made the column text: the training readers read it as a session or an item named
    'N/A' and exited 0; refused naming the file, the column, the marker and its row, with integer or text ids."""
    for string_ids in (False, True):
        rows = event_lines(12) if not string_ids else [[f"s{s}", f"i{i}", t] for s, i, t in event_lines(12)]
        rows[9][["sid", "iid"].index(column)] = marker
        path = write_csv(tmp_path / f"events{int(string_ids)}.csv", rows)
        with pytest.raises(SchemaError) as err:
            if string_ids and reader != "dask piece":
                schema = Schema(session_id="sid", item_id="iid", timestamp="ts", string_ids=True)
                {"read_events": lambda: read_events(path, schema), "scan_events": lambda: list(scan_events(path, schema)),
                 "ScoringStream": lambda: list(ScoringStream(path, ItemVocab.fit(pa.array([f"i{i}" for i in range(1, 51)])),
                                                             schema))}[reader]()
            else:
                MARKER_READERS[reader](path)
        where = f"{path} (the lines from byte 0)" if reader == "dask piece" else str(path)
        assert str(err.value) == f"{where}: column {column!r} has a missing id {marker!r} at row 9; drop or fill those rows"


@pytest.mark.parametrize("reader", ["read_events", "scan_events", "ScoringStream"])
@pytest.mark.parametrize("marker", ["nan", "NaN", "-nan"])
def test_a_nan_among_integer_ids_is_refused_as_a_missing_id(tmp_path, reader, marker):
    rows = event_lines(12)
    rows[9][1] = marker
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as err:
        READERS[reader](path)
    assert str(err.value) == f"{path}: column 'iid' has a missing id {marker!r} at row 9; drop or fill those rows"


def test_missing_ids_of_a_parquet_file_are_refused_naming_the_row(tmp_path):
    path = tmp_path / "events.parquet"
    table = pa.table({"sid": [0, 0, 1, 1], "iid": [1.0, 2.0, float("nan"), 4.0], "ts": [1.7e9 + i for i in range(4)]})
    pq.write_table(table, path)
    with pytest.raises(SchemaError) as err:
        read_events(path, SCHEMA)
    assert str(err.value) == f"{path}: column 'iid' has a missing id (NaN) at row 2; drop or fill those rows"
    pq.write_table(table.set_column(0, "sid", pa.array(["a", "a", "N/A", "b"])).set_column(1, "iid", pa.array([1, 2, 3, 4])),
                   path)
    with pytest.raises(SchemaError) as err:
        read_events(path, SCHEMA)
    assert str(err.value) == f"{path}: column 'sid' has a missing id 'N/A' at row 2; drop or fill those rows"


def test_text_ids_that_merely_contain_a_marker_and_feature_codes_that_are_markers_still_load(tmp_path):
    path = tmp_path / "events.csv"
    path.write_text("sid,iid,ts,kind\n" + "".join(f"{s},{i},{1_700_000_000 + n},{k}\n" for n, (s, i, k) in enumerate([
        ("nana", "none1", "N/A"), ("nana", "NAN-7", "x"), ("null_s", "n/a/b", "y"), ("null_s", "i", "z")])))
    schema = Schema(session_id="sid", item_id="iid", timestamp="ts", features=[FeatureSpec("kind")])
    events = read_events(path, schema)
    assert events.column("sid").to_pylist() == ["nana", "nana", "null_s", "null_s"]
    assert events.column("iid").to_pylist() == ["none1", "NAN-7", "n/a/b", "i"]
    assert events.column("kind").to_pylist() == ["N/A", "x", "y", "z"]


def event_log_recipe(tmp_path, path, split: str = "test_fraction: 0.2"):
    """A tiny GRU4Rec recipe on the event log `path` (columns sid, iid, ts), logging under tmp_path/out."""
    from test_cli_config_errors import DATA, MODEL, TRAINER

    source = (f"{{class_path: sessrec.data.EventLogSource, init_args: {{path: {path}, {split}, "
              "schema: {session_id: sid, item_id: iid, timestamp: ts}}}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((TRAINER + MODEL + DATA).replace("OUT", str(tmp_path / "out"))
                      .replace(DATA.splitlines()[1].split(": ", 1)[1], source))
    return str(recipe)


def test_fit_on_a_csv_with_a_missing_item_id_marker_exits_naming_it_and_writes_no_model(tmp_path, sessrec_main):
    rows = event_lines(400)
    rows[201][1] = "#N/A"
    path = write_csv(tmp_path / "events.csv", rows)
    got = sessrec_main("fit", "--config", event_log_recipe(tmp_path, path))
    assert got == (f"sessrec fit: error: {path}: column 'iid' has a missing id '#N/A' at row 201; drop or fill those rows "
                   "(--traceback for details)"), got
    assert not (tmp_path / "out").exists()


def test_a_null_timestamp_given_on_the_command_line_means_no_time_column(tmp_path, sessrec_main):
    """The command line's parser gave a source's schema the time column 'None' for a null: the fit was refused for a
    column 'None' missing from the file."""
    path = write_csv(tmp_path / "events.csv", event_lines(400))
    got = sessrec_main("fit", "--config", event_log_recipe(tmp_path, path, "test_days: 0.01"),
                       "--data.source.init_args.schema", "{session_id: sid, item_id: iid, timestamp: null}")
    assert got == "sessrec fit: error: time_split needs a timestamp column; the schema has none (--traceback for details)"
    assert not (tmp_path / "out").exists()
    assert Schema(timestamp="None", order_by="None") == Schema(timestamp=None)


# ------------------------------------------------------------------------------ leave-one-out's least length
@pytest.mark.parametrize("min_length", [1, 2])
def test_a_user_sequence_min_length_below_leave_one_outs_three_is_refused(min_length):
    with pytest.raises(ValueError, match="^" + re.escape(
            f"UserSequenceSource: min_length must be >= 3, got {min_length}: leave-one-out holds out each user's last two "
            "items, so a user of fewer than 3 has none left to train on")):
        UserSequenceSource("users.txt", min_length=min_length)
    assert UserSequenceSource("users.txt", min_length=4).min_length == 4


@pytest.mark.parametrize("min_length", [0, -5])
def test_an_event_log_min_length_below_1_is_refused_not_read_as_1(tmp_path, min_length):
    """``min_length: 0`` or ``-5`` (a typo, a sign lost) kept every session with exit 0, as 1 would; refused naming it."""
    for source, what in (("EventLogSource", "product"), ("TimeWindowSource", "event")):
        with pytest.raises(ValueError, match="^" + re.escape(
                f"{source}: min_length must be >= 1 (a session has one {what} or more), got {min_length}") + "$"):
            if source == "EventLogSource":
                EventLogSource("events.csv", test_fraction=0.2, min_length=min_length)
            else:
                TimeWindowSource(["events.csv"], train_from=1.4e9, train_until=1.5e9, test_until=1.6e9, min_length=min_length)
    assert EventLogSource("events.csv", test_fraction=0.2, min_length=1).min_length == 1
    assert TimeWindowSource(["events.csv"], train_from=1.4e9, train_until=1.5e9, test_until=1.6e9, min_length=1).min_length == 1


# ------------------------------------------------------------------------------ one ISO time among numbers
def test_one_iso_time_among_epoch_seconds_is_named_at_its_row(tmp_path):
    rows = event_lines(100)
    rows[50][2] = "2023-11-14T22:00:00"
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as err:
        read_events(path, SCHEMA)
    assert str(err.value) == (
        f"{path}: column 'ts' has an unparsable timestamp '2023-11-14T22:00:00' at row 50; expected a number of "
        "seconds since the epoch (time_unit: s), as '1700000000' at row 0 is"
    )
    ms = Schema(session_id="sid", item_id="iid", timestamp="ts", time_unit="ms")
    with pytest.raises(SchemaError, match=re.escape("'2023-11-14T22:00:00' at row 50; expected a number of milliseconds "
                                                    "since the epoch (time_unit: ms)")):
        read_events(path, ms)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_integer_nanosecond_times_read_as_the_nearest_seconds_by_every_reader(tmp_path, suffix):
    """Integer times of nanoseconds lie beyond 2**53, the integers a float64 holds exactly: Arrow's cast to float64
    refused them (`read_events` raised Arrow's own error), where the streamed readers read them."""
    rows = event_lines(12)
    nanoseconds = [int(r[2]) * 10**9 + 123_456_789 for r in rows]
    table = pa.table({"sid": [int(r[0]) for r in rows], "iid": [int(r[1]) for r in rows], "ts": nanoseconds})
    path = tmp_path / f"events{suffix}"
    pq.write_table(table, path) if suffix == ".parquet" else pa.csv.write_csv(table, path)
    schema = Schema(session_id="sid", item_id="iid", timestamp="ts", time_unit="ns")
    times = read_events(path, schema).column("ts").to_numpy()
    assert np.array_equal(times, np.array(nanoseconds, dtype=np.float64) * 1e-9)
    assert pa.concat_tables(scan_events(path, schema)).column("ts").to_numpy().tolist() == times.tolist()


def test_numeric_text_times_of_a_parquet_file_read_in_the_time_unit_one_iso_among_them_named(tmp_path):
    rows = event_lines(100)
    table = pa.table({"sid": [int(r[0]) for r in rows], "iid": [int(r[1]) for r in rows], "ts": [r[2] for r in rows]})
    pq.write_table(table, tmp_path / "text.parquet")
    times = read_events(tmp_path / "text.parquet", SCHEMA).column("ts").to_numpy()
    assert np.array_equal(times, 1_700_000_000 + 37.0 * np.arange(100))
    stamps = [r[2] for r in rows]
    stamps[70] = "2023-11-14 22:00:00"
    pq.write_table(table.set_column(2, "ts", pa.array(stamps)), tmp_path / "mixed.parquet")
    with pytest.raises(SchemaError, match="^" + re.escape(
            f"{tmp_path / 'mixed.parquet'}: column 'ts' has an unparsable timestamp '2023-11-14 22:00:00' at row 70; "
            "expected a number of seconds since the epoch (time_unit: s)")):
        read_events(tmp_path / "mixed.parquet", SCHEMA)
    iso = Schema(session_id="sid", item_id="iid", timestamp="ts", time_unit="datetime")
    with pytest.raises(SchemaError, match=re.escape("unparsable timestamp '1700000000' at row 0; expected ISO-8601")):
        read_events(tmp_path / "text.parquet", iso)


# ------------------------------------------------------------------------------ empty evaluation splits
SYNTHETIC = {"class_path": "sessrec.data.SyntheticSource", "init_args": {"num_sessions": 300, "num_items": 40}}


def test_validating_on_a_split_of_no_pair_is_refused_in_one_line(tmp_path, sessrec_main):
    """A split whose sessions give no (prefix, next item) pair has no metric: `validate` says so instead of
    exiting 0 with nothing."""
    import yaml

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "trainer": {"logger": False, "enable_progress_bar": False},
        "model": {"class_path": "sessrec.tasks.BaselineTask",
                  "init_args": {"baseline": {"class_path": "sessrec.baselines.Popularity"}}},
        "data": {"source": SYNTHETIC},
    }))
    got = sessrec_main("validate", "--config", str(recipe), "--data.source", json.dumps(no_validation(tmp_path)))
    assert got == (f"sessrec validate: error: {tmp_path / 'srgnn'} (valid split): no (prefix, next item) pair to score: "
                   "its 0 sessions have none (a pair needs a session of two or more events); check the source's split "
                   "settings (SRGNNSource) (--traceback for details)")
    got = sessrec_main("validate", "--config", str(recipe), "--data.source.init_args.valid_days", "0.00001")
    assert got == ("sessrec validate: error: SyntheticSource: the validation split (valid_days 1e-05 of the 14 days "
                   "generated) holds none of the 298 sessions of two products or more; generate more sessions "
                   "(num_sessions 300) (--traceback for details)")


def no_validation(tmp_path: Path) -> dict:
    """An SR-GNN folder read without validation sessions (valid_fraction 0), as a recipe's source."""
    import pickle

    folder = tmp_path / "srgnn"
    folder.mkdir()
    (folder / "all_train_seq.txt").write_bytes(pickle.dumps([[1 + i % 7, 2 + i % 5, 3] for i in range(100)], protocol=3))
    (folder / "test.txt").write_bytes(pickle.dumps(([[1, 2], [3, 4]], [3, 5]), protocol=3))
    return {"class_path": "sessrec.data.SRGNNSource", "init_args": {"path": str(folder), "valid_fraction": 0.0}}


def test_a_pipeline_without_validation_pairs_is_refused_before_fitting_its_ranker(tmp_path, sessrec_main):
    import yaml

    recipe = tmp_path / "pipeline.yaml"
    recipe.write_text(yaml.safe_dump({"pipeline": {"data": {"source": no_validation(tmp_path)}, "covisitation": {},
                                                   "output": str(tmp_path / "pipeline")}}))
    got = sessrec_main("fit", "--config", str(recipe))
    assert got.startswith(f"sessrec fit: error: {tmp_path / 'srgnn'} (valid split): no (prefix, next item) pair to "
                          "score: its 0 sessions have none")
    assert not (tmp_path / "pipeline").exists()


# ------------------------------------------------------------------------------ targets unknown to a model's vocabulary
def other_items_log(tmp_path, known_every: int) -> str:
    """`event_lines(400)` with the items of every session but each `known_every`-th moved to ids 100.. (unknown to
    items 1..50), a session's first item aside."""
    rows = [[s, i if n % 4 == 0 or int(s) % known_every == 0 else str(100 + int(i)), t]
            for n, (s, i, t) in enumerate(event_lines(400))]
    return write_csv(tmp_path / "other.csv", rows)


def unknown_test_targets(path) -> tuple[int, int]:
    data = SessionDataModule(EventLogSource(path, test_days=0.01, schema=SCHEMA), max_length=8)
    targets = [items[-1] for items in data.splits.test.column("item_id").to_pylist()]
    return sum(t > 50 for t in targets), len(targets)


@pytest.mark.parametrize("known_every,refused", [(4, True), (2, False), (1, False)])
def test_a_test_split_mostly_unknown_to_the_models_vocabulary_is_refused_naming_the_share(
        tmp_path, caplog, known_every, refused):
    """Evaluated with a model's vocabulary on data of other items, every unknown target counted as a miss and the
    metrics came out without a word; above --data.max_unknown_targets the split is refused, below it said."""
    vocab = str(ItemVocab.fit(pa.array(np.arange(1, 51))).save(tmp_path / "vocab.parquet"))
    path = other_items_log(tmp_path, known_every)
    unknown, total = unknown_test_targets(path)
    data = SessionDataModule(EventLogSource(path, test_days=0.01, schema=SCHEMA), max_length=8, vocab_path=vocab)
    said = f"{path} (test split): {unknown} of {total} targets ({unknown / total:.1%}) are unknown to the model's vocabulary {vocab}"
    if refused:
        assert unknown / total > 0.5
        with pytest.raises(ValueError) as err:
            data.tensors("test")
        assert str(err.value) == (f"{said}, above --data.max_unknown_targets 0.5: each counts as a miss, so the metrics "
                                  "would not measure the model; evaluate it on data of the items it was trained on, or "
                                  "raise --data.max_unknown_targets")
        lenient = SessionDataModule(EventLogSource(path, test_days=0.01, schema=SCHEMA), max_length=8, vocab_path=vocab,
                                    max_unknown_targets=1.0)
        assert int((lenient.tensors("test")[1] == 1).sum()) == unknown  # OOV targets, each a miss
        return
    with caplog.at_level(logging.INFO):
        targets = data.tensors("test")[1]
    assert data.stats["test_unknown_targets"] == unknown == int((targets == 1).sum())
    assert (f"sessrec: {said}; each counts as a miss" in caplog.messages) == bool(unknown)


def test_unknown_targets_of_a_split_read_from_its_own_file_name_that_file(tmp_path):
    """A split given as a file of its own (rsc15's test_path) is named by that file, not the training file."""
    vocab = str(ItemVocab.fit(pa.array(np.arange(1, 51))).save(tmp_path / "vocab.parquet"))
    rows = [[s, str(100 + int(i)) if int(s) >= 90 and n % 4 else i, t]  # sessions 90..99: others, first items aside
            for n, (s, i, t) in enumerate(event_lines(400))]
    train = write_csv(tmp_path / "train.csv", [r for r in rows if int(r[0]) < 90])
    test = write_csv(tmp_path / "test.csv", [r for r in rows if int(r[0]) >= 90])
    data = SessionDataModule(EventLogSource(train, test_path=test, schema=SCHEMA), max_length=8, vocab_path=vocab)
    with pytest.raises(ValueError) as err:
        data.tensors("test")
    assert str(err.value) == (f"{test} (test split): 10 of 10 targets (100.0%) are unknown to the model's vocabulary "
                              f"{vocab}, above --data.max_unknown_targets 0.5: each counts as a miss, so the metrics "
                              "would not measure the model; evaluate it on data of the items it was trained on, or "
                              "raise --data.max_unknown_targets")
    none = write_csv(tmp_path / "none.csv", [[s, str(100 + int(i)), t] for s, i, t in event_lines(400)[360:]])
    data = SessionDataModule(EventLogSource(train, test_path=none, schema=SCHEMA), max_length=8, vocab_path=vocab)
    with pytest.raises(ValueError, match="^" + re.escape(f"{none}: none of the 40 items of the test split is in the "
                                                         f"vocabulary of {vocab} (")):
        data.tensors("test")


@pytest.mark.parametrize("share", [-0.1, 1.5, "half", True])
def test_a_max_unknown_targets_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="^" + re.escape(
            f"SessionDataModule max_unknown_targets must be a share in [0, 1], got {share!r}")):
        SessionDataModule(max_unknown_targets=share)


def test_sessrec_test_of_a_model_on_a_log_of_other_items_is_refused(tmp_path, sessrec_main):
    path = write_csv(tmp_path / "events.csv", event_lines(400))
    recipe = event_log_recipe(tmp_path, path, "test_days: 0.01")
    assert sessrec_main("fit", "--config", recipe) == ""
    model = next((tmp_path / "out").glob("**/model"))
    other = other_items_log(tmp_path, 4)
    unknown, total = unknown_test_targets(other)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "out").rglob("*"))
    got = sessrec_main("test", "--config", recipe, "--model_dir", str(model), "--data.source.init_args.path", other)
    assert got == (f"sessrec test: error: {other} (test split): {unknown} of {total} targets ({unknown / total:.1%}) are "
                   f"unknown to the model's vocabulary {model / 'vocab.parquet'}, above --data.max_unknown_targets 0.5: "
                   "each counts as a miss, so the metrics would not measure the model; evaluate it on data of the items "
                   "it was trained on, or raise --data.max_unknown_targets (--traceback for details)")
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "out").rglob("*")) == before  # no run folder of the test
    assert sessrec_main("test", "--config", recipe, "--model_dir", str(model), "--data.source.init_args.path", other,
                        "--data.max_unknown_targets", "1") == ""


# ------------------------------------------------------------------------------ the dask engine's rows of a CSV file
def pieces_read(path) -> list:
    """Every piece of `path` read as the dask engine reads it (`read_piece`), the time samples of those read."""
    from sessrec.data.prepared.cluster import pieces_of, read_piece

    types = pa.csv.open_csv(path).schema
    return [read_piece(piece, SCHEMA, None, types)[1] for piece in pieces_of(path)]


@pytest.mark.parametrize("written,expected", [
    ("1700000011100", "has the time 1700000011100 at row 300, read with time_unit: s as the year 55,840 (outside "
                      "1990..2100); fix or drop the rows, or set time_unit to the column's unit"),
    ("x", "has an unparsable timestamp 'x' at row 300; expected a number of seconds since the epoch (time_unit: s), as "
          "'1700008880' at row 240 is"),
])
def test_the_dask_engine_names_the_file_row_of_a_bad_time_in_a_later_piece(tmp_path, monkeypatch, written, expected):
    """A CSV file's later byte ranges numbered their rows from their own first line: a bad time was named at row 60 of
    "the lines from byte 4000"; it is named at its row of the file, as the other readers name it."""
    from sessrec.data.prepared import cluster

    monkeypatch.setattr(cluster, "PIECE_BYTES", 2000)
    rows = event_lines(400)
    rows[300][2] = written
    path = write_csv(tmp_path / "events.csv", rows)
    assert len(cluster.pieces_of(path)) > 3
    with pytest.raises(SchemaError) as err:
        pieces_read(path)
    assert str(err.value) == f"{path}: column 'ts' {expected}"
    with pytest.raises(SchemaError) as streamed:
        list(scan_events(path, SCHEMA, batch_rows=100))
    assert str(streamed.value).split(" at row ")[1].startswith("300")


def test_the_dask_engine_names_the_file_row_of_times_implausible_beside_other_pieces(tmp_path, monkeypatch):
    """Pieces each plausible on their own (epoch seconds in one, small relative times in another) are refused together;
    the refusal named the row of the piece (row 0) as a row of the file."""
    distributed = pytest.importorskip("distributed")
    from sessrec.data.prepared import cluster, prepare

    rows = [[s, i, t if n < 240 else str(1000 + n)] for n, (s, i, t) in enumerate(event_lines(400))]
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as local:
        list(scan_events(path, SCHEMA, batch_rows=100))
    expected = (f"{path}: column 'ts' has the time 1240 at row 240, read with time_unit: s as the year 1970 (outside "
                "1990..2100); fix or drop the rows, or set time_unit to the column's unit")
    assert str(local.value) == expected
    source = EventLogSource(path, schema=SCHEMA, test_fraction=0.2)
    out = tmp_path / "prepared"
    monkeypatch.setattr(cluster, "PIECE_BYTES", 2000)  # pieces each plausible on its own but the one holding row 240
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as dask:
        with pytest.raises(SchemaError) as err:
            prepare(source, str(out), engine="dask", scheduler=dask.scheduler_address, partitions=2)
    assert str(err.value) == expected
    assert not out.exists()


@pytest.mark.parametrize("marker", ["NA", "", "N/A"])
def test_the_dask_engine_names_the_file_row_and_text_of_a_missing_id_in_a_later_piece(tmp_path, monkeypatch, marker):
    from sessrec.data.prepared import cluster

    monkeypatch.setattr(cluster, "PIECE_BYTES", 2000)
    rows = event_lines(400)
    rows[300][1] = marker
    path = write_csv(tmp_path / "events.csv", rows)
    with pytest.raises(SchemaError) as err:
        pieces_read(path)
    assert str(err.value) == f"{path}: column 'iid' has a missing id {marker!r} at row 300; drop or fill those rows"


@pytest.mark.parametrize("engine", ["memory", "local"])
@pytest.mark.parametrize("marker", ["N/A", "NA"])
def test_prepare_refuses_a_missing_id_naming_it_and_writes_nothing(tmp_path, engine, marker):
    from sessrec.data.prepared import prepare

    rows = event_lines(400)
    rows[301][1] = marker
    path = write_csv(tmp_path / "events.csv", rows)
    out = tmp_path / "prepared"
    with pytest.raises(SchemaError) as err:
        prepare(EventLogSource(path, test_fraction=0.2, schema=SCHEMA), str(out), engine=engine)
    assert str(err.value) == f"{path}: column 'iid' has a missing id {marker!r} at row 301; drop or fill those rows"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv"]


# ------------------------------------------------------------------------------ users too short for leave-one-out
def test_users_too_short_for_leave_one_out_are_left_out_and_said(tmp_path, caplog):
    """A user of 1 or 2 interactions (JODIE's Wikipedia file has 4,269 of its 8,227) has nothing to train on after
    the two held out: left out, as `min_length` says, and the data module says how many; consecutive repeats are
    kept (an editor's edits of one page), and a sequence longer than max_length is cut to its latest items."""
    path = tmp_path / "pairs.txt"
    path.write_text("1 7\n2 8\n2 8\n3 5\n3 5\n3 5\n" + "".join(f"4 {i}\n" for i in range(1, 31)))
    data = SessionDataModule(UserSequenceSource(str(path)), max_length=4)
    with caplog.at_level(logging.INFO):
        splits = data.splits
    assert splits.train.column("session_id").to_pylist() == [3, 4]
    assert splits.train.column("item_id").to_pylist() == [[5], list(range(1, 29))]
    assert splits.test.column("item_id").to_pylist() == [[5, 5, 5], list(range(1, 31))]
    said = (f"sessrec: {path}: 2 of the 4 users have fewer than 3 interactions and are left out (min_length 3: "
            "leave-one-out holds out each user's last two)")
    assert [m for m in caplog.messages if "left out" in m] == [said]
    items, targets = data.tensors("test")
    assert items.shape == (2, 4)  # the latest max_length items before the held-out one (padding before a short user's)
    assert data.vocab.decode(items).to_pylist() == [None, None, 5, 5, 26, 27, 28, None]  # 29: only in validation, OOV
    assert data.vocab.decode(targets).to_pylist() == [5, None]  # 30: never trained on, an OOV target (a miss)
    caplog.clear()
    path.write_text("3 5\n3 5\n3 5\n")
    with caplog.at_level(logging.INFO):
        SessionDataModule(UserSequenceSource(str(path)), max_length=4).splits
    assert not [m for m in caplog.messages if "left out" in m]


def test_a_time_window_of_one_file_given_twice_is_refused_not_read_with_each_event_twice(tmp_path):
    """paths [a, a] (or a and ./a) read every event twice with exit 0: each session twice as long, each item counted twice."""
    path = write_csv(tmp_path / "events.csv", event_lines(400))
    window = {"train_from": 1_700_000_000, "train_until": 1_700_010_000, "test_until": 1_700_020_000}
    once = TimeWindowSource([str(path)], SCHEMA, **window).load()
    assert once.summary()["train_events"] == 4 * once.summary()["train_sessions"]  # sessions of 4 events
    for again in (str(path), str(tmp_path / "." / "events.csv"), f"{tmp_path}/../{tmp_path.name}/events.csv"):
        with pytest.raises(ValueError, match="^" + re.escape(
                f"TimeWindowSource: paths give one file twice ({str(path)!r} and {again!r}), which would read each of its "
                "events twice; list each file once") + "$"):
            TimeWindowSource([str(path), again], SCHEMA, **window)
    with pytest.raises(ValueError, match="^TimeWindowSource needs at least one event file in paths$"):
        TimeWindowSource([], SCHEMA, **window)


@pytest.mark.parametrize("source", ["EventLogSource", "UserSequenceSource"])
def test_a_delimiter_of_several_characters_is_refused_naming_the_setting(tmp_path, source, sessrec_main):
    """``delimiter: '\\t'`` (a tab in single quotes in YAML: a backslash and a t), ``tab`` or ``;;`` failed at the first
    read in Arrow's words, 'only single character unicode strings can be converted to Py_UCS4, got length 2'."""
    make = {"EventLogSource": lambda d: EventLogSource("events.tsv", SCHEMA, delimiter=d, test_fraction=0.2),
            "UserSequenceSource": lambda d: UserSequenceSource("events.tsv", layout="events", schema=SCHEMA, delimiter=d)}
    prefix = f"{source}: delimiter must be one character (or null to find it from the header line), got "
    backslash_t = "'\\\\t'; a tab is \"\\t\" in double quotes in YAML (in single quotes it is a backslash and a t)"
    for given, after in (("\\t", backslash_t), ("tab", "'tab'"), (";;", "';;'")):
        with pytest.raises(ValueError, match="^" + re.escape(prefix + after) + "$"):
            make[source](given)
    assert make[source]("\t").delimiter == "\t" and make[source](None).delimiter is None
    if source == "EventLogSource":  # as a recipe writes it
        rows = [[str(i // 4), str(1 + i % 50), str(1_700_000_000 + 37 * i)] for i in range(40)]
        path = tmp_path / "events.tsv"
        path.write_text("sid\tiid\tts\n" + "".join("\t".join(r) + "\n" for r in rows))
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"data:\n  source:\n    class_path: sessrec.data.EventLogSource\n    init_args:\n      path: {path}\n"
                          "      schema: {session_id: sid, item_id: iid, timestamp: ts}\n      test_fraction: 0.2\n"
                          "      delimiter: '\\t'\n")
        got = sessrec_main("prepare", "--config", str(recipe), "--out", str(tmp_path / "p"))
        assert got == f"sessrec prepare: error: {prefix}{backslash_t} (--traceback for details)"
        assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_text_file_is_refused_naming_its_encoding_by_every_reader(tmp_path, reader, encoding):
    """Excel's 'Unicode text' (UTF-16, tab-separated) was refused as 'CSV parse error: Expected 3 columns, got 1: \\x00'."""
    text = "sid\tiid\tts\n" + "".join(f"{s}\t{i}\t{t}\n" for s, i, t in event_lines(8))
    if reader == "read_user_sequences":
        text = "1 5 6 7\n2 5 8 9\n"
    path = tmp_path / "events.csv"
    path.write_bytes(codecs.BOM_UTF16_BE + text.encode("utf-16-be") if encoding == "utf-16-be" else text.encode(encoding))
    with pytest.raises(SchemaError) as err:
        READERS[reader](path)
    assert str(err.value) == (f"{path}: the file is UTF-16 text (it starts with a UTF-16 byte-order mark, as Excel's "
                              "'Unicode text' does); text files are read as UTF-8: re-encode it (iconv -f UTF-16 -t UTF-8)")
    path.write_text(text)  # the same text as UTF-8 reads
    READERS[reader](path)


@pytest.mark.parametrize("reader", ["read_events", "scan_events", "ScoringStream"])
@pytest.mark.parametrize("schema", ["text ids, no times", "text ids", "integer ids"])
def test_a_header_line_repeated_inside_the_file_is_refused_not_read_as_a_session(tmp_path, reader, schema):
    """Two CSV files concatenated with their header lines: read with text ids and no times, the second header was a
    session 'sid' of item 'iid', trained on with exit 0; past the first block of integer ids it was refused as a bad id."""
    rows = event_lines(400)
    lines = ["sid,iid,ts"] + [",".join(r) for r in rows[:200]] + ["sid,iid,ts"] + [",".join(r) for r in rows[200:]]
    if schema == "integer ids":  # the second header past the first mebibyte: the ids are read as integers
        lines = ["sid,iid,ts"] + [",".join(r) for r in event_lines(60_000)] + lines[1:]
    path = tmp_path / "events.csv"
    path.write_text("\n".join(lines) + "\n")
    s = {"text ids, no times": Schema(session_id="sid", item_id="iid", timestamp=None, string_ids=True),
         "text ids": replace(SCHEMA, string_ids=True), "integer ids": SCHEMA}[schema]
    read = {"read_events": lambda: read_events(path, s), "scan_events": lambda: list(scan_events(path, s)),
            "ScoringStream": lambda: list(ScoringStream(path, ItemVocab.fit(pa.array(["1", "2"] if s.string_ids else [1, 2])), s))}
    row = len(lines) - 202
    with pytest.raises(SchemaError) as err:
        read[reader]()
    holds = "column 'sid' holds 'sid'" + (", column 'iid' holds 'iid'" if schema != "integer ids" else "")
    assert str(err.value) == (f"{path}: row {row} repeats the header line ({holds}): files concatenated with their "
                              "header lines? drop that line")
