"""A catalogue of bad inputs: each gets one clear line naming the file, the column and the value.

Every case feeds one wrong input through a public entry point and checks the message (file,
column, value or row, and the fix where there is one) and, for the paths that write, that no
output is left behind. Valid inputs that used to be refused (or silently misread) are checked
to read right. Sections: readers, schema, sources, data module, predict stream, vocabulary,
pipeline; later sections (CLI, export, serve) are appended below them.
"""

from __future__ import annotations

import codecs
import decimal
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import pytorch_lightning as pl
import torch

from sessrec.baselines import Popularity
from sessrec.data import (
    EventLogSource,
    FeatureSpec,
    ItemVocab,
    Schema,
    SchemaError,
    SessionSource,
    SessionSplits,
    SRGNNSource,
    UserSequenceSource,
    frame,
    read_events,
    read_srgnn,
    read_user_sequences,
)
from sessrec.data.stream import ScoringStream
from sessrec.tasks import BaselineTask, Evaluation, SessionDataModule
from sessrec.tasks.callbacks import TopKWriter

torch.set_num_threads(1)
HEADER = "session_id,item_id,timestamp\n"
BIG = "12345678901234567890"  # 20 digits: beyond int64


def write(path: Path, content: str | bytes | pa.Table) -> Path:
    if isinstance(content, pa.Table):
        pq.write_table(content, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def pickled(path: Path, obj: object) -> Path:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=3)
    return path


# --------------------------------------------------------------------------- readers

# (case id, file name, content, schema, error, regex after the file name)
READ_EVENTS = [
    ("folder", "events.csv", None, Schema(), SchemaError, "is a folder, expected a CSV/TSV or parquet file"),
    ("csv-named-parquet", "events.parquet", HEADER + "1,2,3\n", Schema(), SchemaError, "cannot be read as parquet"),
    ("zero-bytes", "events.csv", b"", Schema(), SchemaError, "cannot be read as CSV.*Empty CSV file"),
    ("header-only", "events.csv", HEADER, Schema(), SchemaError, "the file has no rows"),
    ("missing-column", "events.csv", "session_id,item,timestamp\n1,2,3\n", Schema(), SchemaError,
     r"column 'item_id' is missing; the file has columns \['session_id', 'item', 'timestamp'\]\. Set the schema's "
     r"column names to match the file\.$"),
    ("space-separated", "events.csv", "session_id item_id timestamp\n1 2 3\n", Schema(), SchemaError,
     r"column 'session_id' is missing; the file has columns \['session_id item_id timestamp'\]\. The file reads as one "
     r"column, 'session_id item_id timestamp': its separator is not the one it was read with"),
    ("no-header-line", "events.csv", "1,2,3\n1,3,4\n", Schema(), SchemaError,
     r"column 'session_id' is missing; the file has columns \['1', '2', '3'\]\. The file's first line holds values, "
     r"not column names: the file needs a header line naming its columns\.$"),
    ("nan-timestamp", "events.parquet",
     pa.table({"session_id": [1, 1], "item_id": [2, 3], "timestamp": [1.0, float("nan")]}), Schema(), SchemaError,
     "column 'timestamp' has a missing timestamp nan at row 1"),
    ("negative-timestamp", "events.csv", HEADER + "1,2,100\n1,3,-1\n", Schema(), SchemaError,
     r"column 'timestamp' has a negative timestamp -1 at row 1 \(before 1970\)"),
    ("fractional-id", "events.csv", HEADER + "1,2,0\n1,2.5,1\n", Schema(), SchemaError,
     "column 'item_id' has the id '2.5' at row 1, not an integer as the column's first ids are; fix the row"),
    ("decimals-beside-integers", "events.csv", HEADER + "1,10,0\n1,11,1\n2,12,2\n2,3.0,3\n", Schema(), SchemaError,
     "column 'item_id' has the id '3.0' at row 3, not an integer as the column's first ids are; fix the row"),
    ("decimal-ids", "events.csv", HEADER + "1,10.0,0\n1,11.0,1\n", Schema(), SchemaError,
     "column 'item_id' has the id '10.0' at row 0, not an integer; fix the row"),
    ("null-session", "events.csv", HEADER + "1,2,0\n,3,1\n", Schema(), SchemaError,
     "column 'session_id' has a missing id '' at row 1; drop or fill those rows"),
    ("20-digit-ids-csv", "events.csv", HEADER + f"1,2,0\n1,{BIG},1\n", Schema(), SchemaError,
     (rf"column 'item_id' holds ids that do not fit int64 \(e.g. {BIG} at row 1\); "
      r"read the column as strings \(Schema\(string_ids=True\)")),
    ("20-digit-ids-decimal", "events.parquet",
     pa.table({"session_id": pa.array([decimal.Decimal(BIG)], pa.decimal128(20, 0)), "item_id": [2], "timestamp": [0]}),
     Schema(), SchemaError, f"column 'session_id' holds ids that do not fit int64 \\(e.g. {BIG} at row 0"),
    ("uint64-beyond-int64", "events.parquet",
     pa.table({"session_id": [1, 1], "item_id": pa.array([2, 2**64 - 1], pa.uint64()), "timestamp": [0, 1]}),
     Schema(), SchemaError, f"column 'item_id' holds ids that do not fit int64 \\(e.g. {2**64 - 1} at row 1\\)"),
    ("non-utf8-id", "events.csv", (HEADER + "1,abc,0\n1,caf\xe9,1\n").encode("latin-1"), Schema(), SchemaError,
     r"column 'item_id' is not valid UTF-8 text: value b'caf\\xe9' at row 1; re-encode the file as UTF-8"),
    ("non-utf8-time", "events.csv", (HEADER + "1,2,2016-05-09\n1,3,2016-05-09\xa0\n").encode("latin-1"),
     Schema(time_unit="datetime"), SchemaError, "column 'timestamp' is not valid UTF-8 text: value .* at row 1"),
    ("time-of-wrong-type", "events.parquet",
     pa.table({"session_id": [1], "item_id": [2], "timestamp": pa.array([[1.0]])}), Schema(), SchemaError,
     r"column 'timestamp' has dtype list<element: double> \(e.g. \[1.0\] at row 0\), which is not a timestamp"),
]


@pytest.mark.parametrize(
    "name, content, schema, error, message", [c[1:] for c in READ_EVENTS], ids=[c[0] for c in READ_EVENTS]
)
def test_read_events_refuses(tmp_path, name, content, schema, error, message):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        write(path, content)
    with pytest.raises(error, match=f"^{path}: {message}"):
        read_events(path, schema)


def test_read_events_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'nope.csv'}: no such file"):
        read_events(tmp_path / "nope.csv", Schema())


def test_20_digit_ids_read_exactly_as_strings(tmp_path):
    path = write(tmp_path / "events.csv", HEADER + f"{BIG},2,0\n{BIG},{BIG},1\n")
    table = read_events(path, Schema(string_ids=True))
    assert table["session_id"].to_pylist() == [BIG, BIG] and table["item_id"].to_pylist() == ["2", BIG]


def test_read_srgnn_missing_test_file(tmp_path):
    pickled(tmp_path / "all_train_seq.txt", [[1, 2]])
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path}: no test.txt or test.txt.gz"):
        read_srgnn(tmp_path)


def test_read_srgnn_text_file_is_not_a_pickle(tmp_path):
    write(tmp_path / "all_train_seq.txt", "1 2 3\n")
    pickled(tmp_path / "test.txt", ([[1]], [2]))
    with pytest.raises(SchemaError, match=f"^{tmp_path / 'all_train_seq.txt'}: not a plain SR-GNN pickle"):
        read_srgnn(tmp_path)


def test_read_srgnn_empty_prefix(tmp_path):
    pickled(tmp_path / "all_train_seq.txt", [[1, 2]])
    pickled(tmp_path / "test.txt", ([[1], []], [2, 3]))
    with pytest.raises(SchemaError, match=f"^{tmp_path / 'test.txt'}: test pair 1 has an empty prefix \\(label 3\\)"):
        read_srgnn(tmp_path).test_sessions()


def test_srgnn_release_without_length_1_prefixes_evaluates_exactly_its_pairs(tmp_path):
    """Later releases ship prefixes of length >= 2 only: the test split gives back exactly those pairs."""
    sessions = [[5, 6, 7, 8], [9, 5, 6], [7, 8, 9, 5, 6]]
    pairs = [(s[:n], s[n]) for s in sessions for n in range(len(s) - 1, 1, -1)]  # longest first, n >= 2
    pickled(tmp_path / "all_train_seq.txt", sessions)
    pickled(tmp_path / "test.txt", ([p for p, _ in pairs], [t for _, t in pairs]))
    dm = SessionDataModule(source=SRGNNSource(str(tmp_path), valid_fraction=0.0), max_length=5, eval_protocol="all_prefixes")
    items, targets = dm.tensors("test")
    decode = lambda ids: dm.vocab.decode(ids[ids != 0].numpy()).to_pylist()
    assert [(decode(row), t) for row, t in zip(items, decode(targets))] == pairs


def test_read_user_sequences_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'seq.txt'}: no such file"):
        read_user_sequences(tmp_path / "seq.txt")


@pytest.mark.parametrize(
    "content, layout, message",
    [
        (b"1 5 6\n2 7 \xe9\n", "lines", r"line 2 is not valid UTF-8 text \(invalid continuation byte at byte 10\)"),
        (b"1 5 6\n2 7 x\n", "lines", r"line 2: 'x' is not a non-negative integer id"),
        (b"3 5 6\n2 7 8\n4 1 2\n2 9 3\n3 4 4\n", "lines",
         r"column 'user' \(the first id of a line\): line 4 repeats user 2 of line 2 \(expected one line per user\)$"),
        (b"1 5\n2 7\n2 7\n2 9\n", "lines",
         r"column 'user' \(the first id of a line\): line 3 repeats user 2 of line 2 \(expected one line per user\); "
         r"every line is one 'user item' pair: read the file with layout 'pairs'$"),
        (b"1 5\n2 x\n", "pairs", r"line 2: '2 x' is not a 'user item' pair: expected two non-negative integer ids "
                                 r"separated by one space$"),
        (b"1 5\n1 6\n2 7 8\n", "pairs", r"line 3: '2 7 8' is not a 'user item' pair: 3 fields; layout 'pairs' reads one "
                                       r"'user item' pair a line \(a 'user item item \.\.\.' file is layout 'lines'\)$"),
        (b"1\t5\n1\t6\n", "pairs", r"line 1: '1\\t5' is not a 'user item' pair: the line is separated by tabs; layout "
                                  r"'pairs' reads one space between the ids$"),
        (b"1 5\n1 6\n2,7\n", "pairs", r"line 3: '2,7' is not a 'user item' pair: the line is separated by commas"),
        (b"user item\n1 5\n", "pairs", r"line 1: 'user item' is not a 'user item' pair: a header line\? layout 'pairs' "
                                     r"reads files without one: remove it, or read the file with layout 'events'"),
    ],
    ids=["lines-non-utf8", "lines-non-integer", "lines-user-twice", "lines-of-pairs", "pairs-non-integer", "pairs-three-columns",
         "pairs-tabs", "pairs-commas", "pairs-header"],
)
def test_read_user_sequences_refuses(tmp_path, content, layout, message):
    path = write(tmp_path / "seq.txt", content)
    with pytest.raises(SchemaError, match=f"^{path}: {message}"):
        read_user_sequences(path, layout)


@pytest.mark.parametrize("layout, content", [("lines", b"1 5 6 7\n2 5 8 9\n"), ("pairs", b"1 5\n1 6\n1 7\n2 5\n2 8\n2 9\n")])
def test_a_user_sequence_file_that_starts_with_a_byte_order_mark_reads_as_without_it(tmp_path, layout, content):
    """A file saved with a UTF-8 byte-order mark (Windows editors): both layouts read it as the CSV readers do, its first
    user 1 (the lines layout refused its first id as '\\ufeff1'); a bad byte is still named at its byte of the file."""
    plain = read_user_sequences(write(tmp_path / "plain.txt", content), layout)
    marked = read_user_sequences(write(tmp_path / "marked.txt", codecs.BOM_UTF8 + content), layout)
    assert marked.equals(plain)
    assert marked.column("session_id").to_pylist() == [1, 1, 1, 2, 2, 2]
    assert marked.column("item_id").to_pylist() == [5, 6, 7, 5, 8, 9]
    bad = write(tmp_path / "bad.txt", codecs.BOM_UTF8 + b"1 5 6\n2 7 \xe9\n")
    with pytest.raises(SchemaError, match=rf"^{bad}: line 2 is not valid UTF-8 text \(invalid continuation byte at byte 13\)$"):
        read_user_sequences(bad, "lines")


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"session_id": "item_id"}, "column 'item_id' is given two roles, session_id and item_id"),
        ({"timestamp": "item_id"}, "column 'item_id' is given two roles, item_id and timestamp"),
        ({"order_by": "timestamp"}, "column 'timestamp' is given two roles, timestamp and order_by"),
        ({"features": [FeatureSpec("session_id")]}, r"column 'session_id' is given two roles, session_id and features\[0\]"),
        ({"time_unit": "minutes"}, r"time_unit must be one of \['s', 'ms', 'us', 'ns', 'datetime'\], got 'minutes'"),
        ({"item_id": ""}, "item_id must be a column name, got ''"),
    ],
    ids=["session-is-item", "time-is-item", "order-by-is-time", "feature-is-session", "unknown-time-unit", "empty-name"],
)
def test_schema_refuses_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=f"^Schema: {message}"):
        Schema(**kwargs)


def test_feature_spec_refuses_unknown_kind():
    with pytest.raises(ValueError, match=r"feature 'price': kind must be one of \['categorical', 'continuous'\], got 'numeric'"):
        FeatureSpec("price", "numeric")


# --------------------------------------------------------------------------- sources


def one_event_sessions(tmp_path: Path, n: int = 30) -> Path:
    table = pa.table({"session_id": np.arange(n), "item_id": np.arange(n) % 5, "timestamp": np.arange(n) * 60.0})
    return write(tmp_path / "events.parquet", table)


def test_event_log_with_only_one_event_sessions(tmp_path):
    path = one_event_sessions(tmp_path)
    with pytest.raises(ValueError, match=f"^{path}: no session has 2 or more events \\(the 30 sessions have at most 1\\)"):
        EventLogSource(str(path), test_fraction=0.2).load()


@pytest.mark.parametrize("max_length", [0, 1])
def test_event_log_max_length_below_two(max_length):
    with pytest.raises(ValueError, match=f"max_length must be >= 2 and >= min_length \\(2\\), got {max_length}"):
        EventLogSource("events.parquet", test_fraction=0.2, max_length=max_length)


def test_event_log_without_a_test_set():
    with pytest.raises(ValueError, match="needs test_path, or one of test_days and test_fraction"):
        EventLogSource("events.parquet")


def test_user_sequences_too_short_for_leave_one_out(tmp_path):
    path = write(tmp_path / "seq.txt", "1 5\n1 6\n2 7\n")
    with pytest.raises(ValueError, match=f"^{path}: no user has 3 or more interactions \\(the 2 users have at most 2\\)"):
        UserSequenceSource(str(path)).load()


# --------------------------------------------------------------------------- data module


class TinySource(SessionSource):
    """Fixed sessions of raw ids 1..9 (train), the same for valid and test."""

    def __init__(self, sessions: list[list[int]] | None = None) -> None:
        self.sessions = sessions or [[1, 2, 3], [4, 5], [6, 7, 8, 9], [1, 3, 5, 7, 9]]

    def load(self) -> SessionSplits:
        table = pa.table({frame.SESSION: np.arange(len(self.sessions)), frame.ITEMS: self.sessions})
        return SessionSplits(train=table, valid=table, test=table, source="tiny")


@pytest.mark.parametrize("max_length", [0, 1])
def test_data_module_max_length_below_two(max_length):
    with pytest.raises(ValueError, match=f"max_length must be >= 2 \\(the most recent items .*got {max_length}$"):
        SessionDataModule(source=TinySource(), max_length=max_length)


def test_data_module_with_only_one_event_sessions():
    dm = SessionDataModule(source=TinySource([[1], [2], [3]]), max_length=5)
    with pytest.raises(ValueError, match=r"^tiny \(train split\): no session has two or more events \(all 3 have one\)"):
        dm.setup("fit")


@pytest.mark.parametrize("num_items", [8, 20])
def test_a_task_scoring_another_number_of_ids_than_its_data_vocabulary_is_refused_before_training(tmp_path, num_items):
    """TinySource's vocabulary has 11 ids: a task built by hand for 20 trained and ranked 9 ids the data never
    holds among the candidates (its metrics off, its recommender refused only when saved), one for 8 failed
    deep in the embedding."""
    from sessrec.models import GRU4RecEncoder
    from sessrec.tasks import NextItemTask

    dm = SessionDataModule(source=TinySource(), max_length=5, batch_size=2)
    task = NextItemTask(num_items=num_items, max_length=5, encoder=GRU4RecEncoder(d_model=8),
                        objective={"class_path": "sessrec.models.CausalLanguageModeling"})
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path)
    message = (f"the data module's vocabulary has 11 ids (0 virtual) where the model scores {num_items} (0 virtual): "
               "build the task with num_items=datamodule.num_items and num_virtual=datamodule.num_virtual")
    for run in (trainer.fit, trainer.test):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            run(task, datamodule=dm)


@pytest.mark.parametrize(("settings", "message"), [
    ({"max_vocab_size": -1}, "SessionDataModule max_vocab_size must be an integer >= 1, got -1"),
    ({"max_vocab_size": 0}, "SessionDataModule max_vocab_size must be an integer >= 1, got 0"),
    ({"min_item_count": 0}, "SessionDataModule min_item_count must be an integer >= 1, got 0"),
])
def test_data_module_vocabulary_settings_out_of_range_are_refused(settings, message):
    """max_vocab_size -1 kept every item but the rarest (a slice's end), exit 0."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        SessionDataModule(source=TinySource(), **settings)


def test_a_min_item_count_that_keeps_no_item_is_refused_naming_it():
    """It failed later as 'num_items must count padding, OOV, at least one item ...; got 2', naming neither."""
    dm = SessionDataModule(source=TinySource(), max_length=5, min_item_count=4)
    with pytest.raises(ValueError, match="^" + re.escape(
            "tiny: min_item_count 4 keeps no item of the training split (none occurs 4 times), so there is nothing "
            "to recommend; lower min_item_count") + "$"):
        dm.vocab


def test_data_module_predict_without_path():
    with pytest.raises(ValueError, match="set --data.predict_path"):
        SessionDataModule(source=TinySource()).predict_dataloader()


# --------------------------------------------------------------------------- predict stream

VOCAB = ItemVocab.fit(pa.array(np.arange(1, 10)))


def predict(tmp_path: Path, src: Path, **schema) -> Path:
    """``sessrec predict``'s path in process: the data module's stream, a popularity model, `TopKWriter`."""
    dm = SessionDataModule(source=TinySource(), max_length=5, eval_batch_size=2, predict_path=str(src),
                           predict_schema=Schema(**schema))
    out = tmp_path / "recs.parquet"
    trainer = pl.Trainer(callbacks=[TopKWriter(str(out))], logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False)
    task = BaselineTask(baseline=Popularity(), num_items=dm.num_items, evaluation=Evaluation(top_k=3))
    trainer.predict(task, datamodule=dm, return_predictions=False)
    return out


def scored_sessions(path: Path, **kwargs) -> list[tuple[object, list[int]]]:
    """(session id, model ids) per session, as the stream batches them."""
    out = []
    for batch in ScoringStream(path, VOCAB, **kwargs):
        out += [(key, [i for i in row if i]) for key, row in zip(batch.keys.to_pylist(), batch.items.tolist())]
    return out


# (case id, file name, content, stream options, regex after the file name)
STREAM = [
    ("duplicate-session-row", "s.parquet", pa.table({"session_id": [1, 2, 1], "item_id": [[1, 2], [3], [4]]}), {},
     "column 'session_id' has session 1 again at row 2; each session needs one row"),
    ("duplicate-session-next-chunk", "s.parquet", pa.table({"session_id": ["a", "b", "a"], "item_id": [[1], [2], [3]]}),
     {"chunk_rows": 1}, "column 'session_id' has session 'a' again at row 2"),
    ("null-session-row", "s.parquet", pa.table({"session_id": [1, None], "item_id": [[1, 2], [3]]}), {},
     "column 'session_id' has a null id at row 1; drop or fill those rows"),
    ("null-inside-list", "s.parquet", pa.table({"session_id": [1, 2, 3], "item_id": [[1, 2], [3, 4, 5], [6, None]]}), {},
     "column 'item_id' has a null id at row 2; drop or fill those rows"),
    ("empty-list", "s.parquet", pa.table({"session_id": ["a", "b"], "item_id": pa.array([[1], []], pa.list_(pa.int64()))}),
     {}, r"column 'item_id': session 'b' \(row 1\) has no items"),
    ("events-session-apart", "e.csv", "session_id,item_id\n1,1\n2,2\n1,3\n", {},
     r"column 'session_id': session 1 comes again at row 2 after rows of other sessions"),
    ("events-session-back-in-later-chunk", "e.parquet",
     pa.table({"session_id": [1, 1, 2, 2, 1], "item_id": [1, 2, 3, 4, 5]}), {"chunk_rows": 2},
     "column 'session_id' has session 1 again at row 4"),
    ("events-null-item-in-later-chunk", "e.parquet",
     pa.table({"session_id": [1, 1, 2, 2], "item_id": [1, 2, 3, None]}), {"chunk_rows": 2},
     "column 'item_id' has a null id at row 3"),
    ("header-only", "e.csv", "session_id,item_id\n", {}, "the file has no rows"),
    ("not-parquet", "e.parquet", "session_id,item_id\n1,2\n", {}, "cannot be read"),
    ("time-list-length", "s.parquet",
     pa.table({"session_id": [1, 2], "item_id": [[1, 2], [3, 4]], "timestamp": [[1.0, 2.0], [3.0]]}), {},
     "column 'timestamp' has 1 times for the 2 items of column 'item_id' at row 1"),
    ("negative-time-in-list", "s.parquet",
     pa.table({"session_id": [1, 2], "item_id": [[1, 2], [3, 4]], "timestamp": [[1.0, 2.0], [3.0, -1.0]]}), {},
     "column 'timestamp' has a negative timestamp -1.0 at row 1"),
    ("string-ids-int-vocab", "s.parquet", pa.table({"session_id": [1], "item_id": [["7", "hotel-3"]]}), {},
     ("column 'item_id': item ids of type string cannot be matched with a vocabulary of int64: 'hotel-3' is not a "
      "valid int64 id")),
]


@pytest.mark.parametrize("name, content, options, message", [c[1:] for c in STREAM], ids=[c[0] for c in STREAM])
def test_scoring_stream_refuses(tmp_path, name, content, options, message):
    src = write(tmp_path / name, content)
    with pytest.raises((SchemaError, TypeError), match=f"^{src}: {message}"):
        scored_sessions(src, **options)


@pytest.mark.parametrize("layout", ["events", "lists"])
@pytest.mark.parametrize("chunk_rows", [1, 100])
def test_text_session_ids_that_differ_by_a_trailing_nul_are_two_sessions_to_score(tmp_path, layout, chunk_rows):
    """Sessions 's' and 's\\x00' were refused as one session seen twice (fixed-width text drops trailing NULs)."""
    if layout == "events":
        table = pa.table({"session_id": ["s", "s", "s\x00", "s\x00"], "item_id": [1, 2, 2, 1]})
    else:
        table = pa.table({"session_id": ["s", "s\x00"], "item_id": [[1, 2], [2, 1]]})
    src = write(tmp_path / "s.parquet", table)
    assert scored_sessions(src, chunk_rows=chunk_rows) == [("s", [2, 3]), ("s\x00", [3, 2])]  # the model ids of 1, 2
    assert [p.sessions for p in ScoringStream(src, VOCAB, chunk_rows=chunk_rows).partitions(1)] == [1, 1]


def test_a_file_cut_into_partitions_where_a_chunk_starts_no_session(tmp_path):
    """A chunk of rows inside one session (a session longer than chunk_rows) made `partitions` (predict --engine dask)
    fail in an IndexError traceback at the next session; the file is cut as it is with larger chunks."""
    src = write(tmp_path / "e.parquet", pa.table({"session_id": [1, 1, 1, 2, 2, 3], "item_id": [1, 2, 3, 2, 1, 4]}))
    for chunk_rows in (1, 2, 100):
        stream = ScoringStream(src, VOCAB, chunk_rows=chunk_rows)
        assert stream.partitions(1) == [(0, 3, 1), (3, 5, 1), (5, 6, 1)]
        assert stream.partitions(2) == [(0, 5, 2), (5, 6, 1)]
    again = write(tmp_path / "again.parquet", pa.table({"session_id": [1, 1, 1, 2, 1], "item_id": [1, 2, 3, 2, 1]}))
    with pytest.raises(SchemaError, match=f"^{again}: column 'session_id' has session 1 again at row 4"):
        ScoringStream(again, VOCAB, chunk_rows=1).partitions(1)


@pytest.mark.parametrize("content, hint", [
    ("user,item\n1,2\n1,3\n", "Name the file's columns with --data.predict_schema '{session_id: <its session column>, "
                              "item_id: <its item column>}'."),
    ("1,2\n1,3\n", "The file's first line holds values, not column names: the file needs a header line naming its "
                   "columns."),
], ids=["other-names", "no-header-line"])
def test_predict_names_the_setting_of_the_columns_of_a_file_without_them(tmp_path, content, hint):
    """`sessrec predict` on a file of other column names says which setting names them (`--data.predict_schema`), not
    the schema's; on a file without a header line, that its first line holds values. Nothing is written."""
    src = write(tmp_path / "sessions.csv", content)
    names = ["user", "item"] if content.startswith("user") else ["1", "2"]
    with pytest.raises(SchemaError) as err:
        predict(tmp_path, src)
    assert str(err.value) == f"{src}: column 'session_id' is missing; the file has columns {names}. {hint}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sessions.csv"]
    out = predict(tmp_path, src, session_id="user", item_id="item") if names[0] == "user" else None
    assert out is None or pq.read_table(out).column("session_id").to_pylist() == [1]


@pytest.mark.parametrize("case", ["duplicate-session-row", "null-inside-list", "string-ids-int-vocab"])
def test_predict_leaves_no_output(tmp_path, case):
    _, name, content, _, message = next(c for c in STREAM if c[0] == case)
    src = write(tmp_path / name, content)
    with pytest.raises((SchemaError, TypeError), match=message):
        predict(tmp_path, src)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_scoring_stream_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"^{tmp_path / 'nope.parquet'}: no such file to score"):
        ScoringStream(tmp_path / "nope.parquet", VOCAB)


def test_scoring_stream_max_length_zero(tmp_path):
    src = write(tmp_path / "s.parquet", pa.table({"session_id": [1], "item_id": [[1]]}))
    with pytest.raises(ValueError, match="max_length must be >= 1, got 0"):
        ScoringStream(src, VOCAB, max_length=0)


ORDERED = {"session_id": [7, 7, 7, 3, 3], "item_id": [1, 2, 3, 4, 5], "timestamp": [10.0, 20.0, 30.0, 5.0, 6.0]}
SHUFFLED = {"session_id": [7, 7, 7, 3, 3], "item_id": [3, 1, 2, 5, 4], "timestamp": [30.0, 10.0, 20.0, 6.0, 5.0]}


@pytest.mark.parametrize("layout", ["events-csv", "events-parquet", "lists"])
def test_predict_orders_events_by_timestamp(tmp_path, layout):
    """Shuffled rows (or list items) with a timestamp column score as the ordered ones."""
    paths = []
    for name, columns in (("ordered", ORDERED), ("shuffled", SHUFFLED)):
        table = pa.table(columns)
        if layout == "lists":
            table = frame.group_sessions(table, Schema())  # list columns of items and of times
        path = tmp_path / f"{name}.{'csv' if layout == 'events-csv' else 'parquet'}"
        pacsv.write_csv(table, path) if layout == "events-csv" else pq.write_table(table, path)
        paths.append(path)
    assert scored_sessions(paths[1]) == scored_sessions(paths[0]) == [(7, [2, 3, 4]), (3, [5, 6])]
    assert scored_sessions(paths[1], schema=Schema(timestamp=None)) == [(7, [4, 2, 3]), (3, [6, 5])]  # file order
    # `sessrec predict`'s data module (default predict schema) streams the same ordered sessions
    dm = SessionDataModule(source=TinySource(), vocab_path=str(VOCAB.save(tmp_path / "vocab.parquet")),
                           predict_path=str(paths[1]))
    rows = [[i for i in row if i] for batch in dm.predict_dataloader() for row in batch.items.tolist()]
    assert rows == [[2, 3, 4], [5, 6]]


def test_predict_without_timestamp_column_keeps_file_order(tmp_path):
    src = write(tmp_path / "e.parquet", pa.table({"session_id": [1, 1, 1], "item_id": [3, 1, 2]}))
    assert scored_sessions(src) == [(1, [4, 2, 3])]


# --------------------------------------------------------------------------- vocabulary


def test_vocab_encode_names_value_and_types():
    with pytest.raises(TypeError, match=r"^f.csv: column 'item_id': item ids of type string cannot be matched with a "
                                        r"vocabulary of int64: 'x' is not a valid int64 id"):
        VOCAB.encode(pa.array(["1", "2", "x"]), source="f.csv: column 'item_id'")
    with pytest.raises(TypeError, match="item ids of type double .* 2.5 is not a valid int64 id"):
        VOCAB.encode(pa.array([1.0, 2.5]))


def test_text_ids_of_an_int_vocabulary_are_read_only_as_their_decimals(tmp_path):
    """``"01050"`` and ``"0x2"`` cast to 1050 and 2: refused naming the id, as a served request refuses them, so that
    `sessrec predict` on a file of text ids scores no other item than the one it names."""
    with pytest.raises(TypeError) as err:
        VOCAB.encode(pa.array(["1", "01050"]), source="f.parquet: column 'item_id'")
    assert str(err.value) == ("f.parquet: column 'item_id': item ids of type string cannot be matched with a vocabulary "
                              "of int64: '01050' is not written as the vocabulary's int64 ids are (no leading zeros, '+' "
                              "or spaces); give '1050' or 1050")
    assert VOCAB.encode(pa.array(["1", "9", "10"])).ids.tolist() == VOCAB.encode(pa.array([1, 9, 10])).ids.tolist()
    src = write(tmp_path / "e.parquet", pa.table({"session_id": [1, 1], "item_id": ["1", "0x2"]}))
    with pytest.raises(TypeError, match=f"^{src}: column 'item_id': .* '0x2' is not written as the vocabulary's int64 ids"):
        scored_sessions(src)


def test_vocab_fit_refuses_nulls():
    with pytest.raises(ValueError, match="item ids hold 1 nulls"):
        ItemVocab.fit(pa.array([1, None, 2]))


def test_vocab_load_of_another_parquet(tmp_path):
    path = write(tmp_path / "v.parquet", pa.table({"item": [1], "n": [2]}))
    with pytest.raises(ValueError, match=f"^{path}: not a sessrec vocabulary \\(columns \\['item', 'n'\\]\\)"):
        ItemVocab.load(path)


# --------------------------------------------------------------------------- pipeline


@pytest.fixture(scope="module")
def pipeline():
    from sessrec.pipeline.pipeline import Pipeline
    from sessrec.pipeline.retrieval.covisitation import CoVisitation

    sessions = torch.tensor([[0, 2, 3, 4], [5, 6, 7, 8], [2, 4, 6, 8]])
    return Pipeline(VOCAB, {"covis": (CoVisitation().fit(sessions, len(VOCAB)), 5)}, max_length=4, history_length=4)


def test_pipeline_recommend_refuses_text_ids_for_int_vocab(pipeline):
    with pytest.raises(TypeError, match="item ids of type string cannot be matched with a vocabulary of int64: "
                                        "'hotel-3' is not a valid int64 id"):
        pipeline.recommend([["1", "hotel-3"]], k=3)


@pytest.mark.parametrize(
    "sessions, kwargs, message",
    [
        ([[1], []], {}, "session 1 is empty: give at least one item id"),
        ([[1, 99]], {"on_unknown": "error"}, "item id 99 is not in the model's vocabulary"),
        ("1 2 3", {}, "sessions must be a non-empty list of sessions, each a list of item ids, got str"),
    ],
    ids=["empty-session", "unknown-item", "not-a-list"],
)
def test_pipeline_recommend_refuses(pipeline, sessions, kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        pipeline.recommend(sessions, k=3, **kwargs)


# --------------------------------------------------------------------------- CLI: fit / test / predict / export / serve / retrain
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.max_epochs", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
        "--data.source.init_args.num_sessions", "1000", "--data.source.init_args.num_items", "100",
        "--model.encoder.init_args.d_model", "16", "--model.encoder.init_args.n_head", "2",
        "--model.encoder.init_args.n_layer", "1"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny quickstart fit: its best checkpoint (and model directory beside it)."""
    from sessrec.cli import cli

    run = tmp_path_factory.mktemp("fitted")
    cli(["fit", *TINY, "--trainer.default_root_dir", str(run)])
    return next(run.glob("**/checkpoints/best.ckpt"))


def test_cli_test_without_checkpoint(monkeypatch, tmp_path, sessrec_main):
    monkeypatch.chdir(tmp_path)
    message = sessrec_main("test", *TINY)
    assert "test needs --model_dir" in message and "random weights" in message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("content, message", [
    (bytes(range(256)) * 40, "not a readable PyTorch checkpoint"),
    (b"", "not a readable PyTorch checkpoint"),
], ids=["random-bytes", "empty"])
def test_cli_fit_resuming_an_unreadable_checkpoint(tmp_path, content, message, sessrec_main):
    bad = write(tmp_path / "bad.ckpt", content)
    assert message in sessrec_main("fit", *TINY, "--ckpt_path", str(bad))


@pytest.mark.slow
def test_cli_fit_resuming_a_truncated_checkpoint(tmp_path, checkpoint, sessrec_main):
    cut = write(tmp_path / "cut.ckpt", checkpoint.read_bytes()[:4000])
    assert f"{cut}: not a readable PyTorch checkpoint, truncated or corrupt" in sessrec_main(
        "fit", *TINY, "--ckpt_path", str(cut))


@pytest.mark.parametrize("sub", ["test", "validate", "predict"])
def test_cli_evaluating_a_checkpoint_names_the_model_directory(tmp_path, sub, sessrec_main):
    bad = write(tmp_path / "best.ckpt", b"never read")
    assert sessrec_main(sub, *TINY, "--ckpt_path", str(bad)) == (
        f"sessrec {sub}: error: sessrec {sub} takes the model directory that sessrec fit writes: --model_dir "
        "runs/<name>/model (checkpoints only resume fit) (--traceback for details)")


def test_cli_fit_refuses_a_model_directory(tmp_path, sessrec_main):
    assert sessrec_main("fit", *TINY, "--model_dir", str(tmp_path)) == (
        "sessrec fit: error: sessrec fit trains the recipe's model: --model_dir is for validate, test and predict "
        "(--ckpt_path resumes a fit) (--traceback for details)")


def test_cli_test_of_a_folder_that_is_no_model_directory(tmp_path, sessrec_main):
    assert f"{tmp_path}: not a saved model directory (no config.json)" in sessrec_main("test", *TINY, "--model_dir", str(tmp_path))


class Foreign:
    """A class a weights-only load refuses to build."""


def test_checkpoint_with_pickled_objects_is_not_unpickled(tmp_path):
    from sessrec.saved.checkpoint import read_checkpoint

    path = tmp_path / "objects.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"thing": Foreign()}}, path)
    with pytest.raises(ValueError, match="holds a pickled .*Foreign object, which sessrec does not load"):
        read_checkpoint(path)


def flipped_checkpoint(path: Path) -> Path:
    """A Lightning-like checkpoint whose one tensor has a byte changed in the archive (its CRC-32 left as written)."""
    import struct
    import zipfile

    torch.save({"state_dict": {"w": torch.arange(256, dtype=torch.float32)}, "hyper_parameters": {}}, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        entry = next(i for i in archive.infolist() if "/data/" in i.filename)
    name, extra = struct.unpack("<HH", data[entry.header_offset + 26:entry.header_offset + 30])
    data[entry.header_offset + 30 + name + extra + 41] ^= 0x40  # a byte of w[10]
    path.write_bytes(bytes(data))
    return path


def test_a_checkpoint_with_a_changed_byte_is_refused_not_read_as_another_weight(tmp_path, sessrec_main):
    """torch.load reads the changed byte as a weight, without a check: a fit resumed from it went on from a weight the
    run never had, with exit 0."""
    from sessrec.saved.checkpoint import read_checkpoint

    bad = flipped_checkpoint(tmp_path / "last.ckpt")
    assert torch.load(bad, weights_only=True)["state_dict"]["w"][10] != 10  # what torch.load alone gives
    message = f"{bad}: not a readable PyTorch checkpoint, truncated or corrupt (its entry last/data/0 fails its CRC-32 check)"
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        read_checkpoint(bad)
    assert sessrec_main("fit", *TINY, "--trainer.max_epochs", "2", "--ckpt_path", str(bad)) == (
        f"sessrec fit: error: {message} (--traceback for details)")


def test_checkpoint_of_another_configuration(checkpoint):
    from sessrec.models import XLNetEncoder
    from sessrec.tasks import NextItemTask

    with pytest.raises(ValueError, match=r"holds weights of another configuration: model\.\w+ is \(16,?.*\) there and \(32"):
        NextItemTask.load_from_checkpoint(checkpoint, encoder=XLNetEncoder(d_model=32, n_head=2, n_layer=1))


def test_cli_test_refuses_a_recipe_of_another_network_than_the_models(checkpoint, sessrec_main):
    """A recipe of another width is refused, never silently replaced by the model directory's network."""
    model = checkpoint.parent.parent / "model"
    assert sessrec_main(
        "test", *TINY, "--model.encoder.init_args.d_model", "32", "--model_dir", str(model)) == (
        f"sessrec test: error: --model.encoder.init_args.d_model 32 differs from the model's 16 ({model}): the "
        "network (its shape and what it computes) is fixed by training; evaluate the model as it was trained "
        "(--traceback for details)"
    )


def test_cli_fit_max_length_zero(monkeypatch, tmp_path, sessrec_main):
    monkeypatch.chdir(tmp_path)
    message = sessrec_main("fit", *TINY, "--data.max_length", "0")
    assert "max_length must be >= 2" in message and "got 0" in message


@pytest.mark.slow
def test_cli_predict_duplicate_sessions_leave_no_output(tmp_path, checkpoint, sessrec_main):
    sessions = write(tmp_path / "s.parquet", pa.table({"session_id": [1, 1], "item_id": [[5, 6], [7, 8]]}))
    out = tmp_path / "recs.parquet"
    message = sessrec_main("predict", *TINY, "--model_dir", str(checkpoint.parent.parent / "model"), "--data.predict_path",
                           str(sessions), "--scoring.output", str(out))
    assert "session_id" in message and "1" in message
    assert not out.exists() and not list(tmp_path.glob(".recs*"))


def test_cli_export_refuses_unknown_format(tmp_path, checkpoint, sessrec_main):
    message = sessrec_main(
        "export", "--model_dir", str(checkpoint.parent.parent / "model"), "--format", "pmml", "--out", str(tmp_path / "x"))
    assert message == ("sessrec export: error: --format: expected one of 'onnx', 'torchscript', 'triton', got 'pmml' "
                       "(--traceback for details)")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("fmt", [[], ["--format", "onnx"], ["--format=torchscript"]])
@pytest.mark.parametrize("flag", [["--name", "../evil"], ["--max_batch_size", "8"]])
def test_cli_export_refuses_triton_settings_for_a_model_file(tmp_path, checkpoint, sessrec_main, fmt, flag):
    message = sessrec_main("export", "--model_dir", str(checkpoint.parent.parent / "model"), *fmt, *flag,
                           "--out", str(tmp_path / "x"))
    shown = (fmt[-1].partition("=")[2] or fmt[-1]) if fmt else "onnx"
    assert message == (f"sessrec export: error: {flag[0]}: a setting of a Triton model repository (--format triton); "
                       f"--format {shown} writes one model file, without a name or a batch limit (--traceback for details)")
    assert not (tmp_path / "x").exists()


def test_cli_export_of_a_broken_model_directory_writes_nothing(tmp_path, sessrec_main):
    (tmp_path / "bad").mkdir()
    write(tmp_path / "bad" / "config.json", "{not json")
    assert f"{tmp_path / 'bad' / 'config.json'}: not valid JSON" in sessrec_main(
        "export", "--model_dir", str(tmp_path / "bad"), "--out", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_export_gru4rec_to_onnx_names_the_reason(tmp_path):
    pytest.importorskip("onnxruntime")
    from sessrec.data import ItemVocab
    from sessrec.lifecycle.export import export_session_model
    from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
    from sessrec.tasks import NextItemTask

    task = NextItemTask(num_items=20, max_length=5, encoder=GRU4RecEncoder(d_model=8), objective=CausalLanguageModeling())
    task.vocab = ItemVocab(pa.array(range(18)), np.ones(18, dtype=np.int64))
    with pytest.raises(ValueError, match="GRU4RecEncoder.*onnx"):
        export_session_model(task.recommender(), tmp_path / "out", "onnx")
    assert not list((tmp_path / "out").glob("model.*")) if (tmp_path / "out").exists() else True


def test_cli_serve_a_directory_without_a_model(tmp_path, sessrec_main):
    pytest.importorskip("fastapi")
    assert "neither a saved pipeline (pipeline.json) nor a model directory (config.json)" in sessrec_main(
        "serve", "--model_dir", str(tmp_path))


def test_cli_serve_a_click_rankers_directory_says_what_the_server_serves(tmp_path, sessrec_main):
    pytest.importorskip("fastapi")
    from test_export import dlrm_task

    model_dir = dlrm_task().ranker().save_pretrained(tmp_path / "model")
    got = sessrec_main("serve", "--model_dir", str(model_dir))
    assert got == (f"sessrec serve: error: {model_dir / 'config.json'}: holds a click ranker (a DLRM that scores the "
                   "candidates it is given), which the server does not serve: it answers sessions with a session model's "
                   "or a pipeline's next items; score clicks with ClickRanker.from_pretrained (--traceback for details)")


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"format": "something.else", "version": 1}', "format 'something.else' version 1 is not 'sessrec.model'"),
], ids=["broken-json", "foreign-format"])
def test_model_directory_with_a_bad_config(tmp_path, content, message):
    from sessrec.artifacts import SessionRecommender

    write(tmp_path / "config.json", content)
    with pytest.raises(ValueError, match=message):
        SessionRecommender.from_pretrained(tmp_path)


def test_model_directory_without_weights(tmp_path, checkpoint):
    import shutil

    from sessrec.artifacts import SessionRecommender

    model = shutil.copytree(checkpoint.parent.parent / "model", tmp_path / "model")
    (model / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="directory lacks model.safetensors"):
        SessionRecommender.from_pretrained(model)


def test_cli_retrain_window_without_sessions(tmp_path, checkpoint, sessrec_main):
    later = 4e9  # 2096: after the model's training data (its train_end)
    events = write(tmp_path / "e.parquet", pa.table({"session_id": [1, 1], "item_id": [5, 6],
                                                     "timestamp": [later + 10.0, later + 20.0]}))
    message = sessrec_main("retrain", "--model_dir", str(checkpoint.parent.parent / "model"), "--paths", f"[{events}]",
                           "--train_from", str(later), "--train_until", str(later + 100), "--test_until", str(later + 200),
                           "--out", str(tmp_path / "cand"))
    assert "no session of 2+ events ends in the test window" in message


def test_cli_retrain_without_a_current_model(tmp_path, sessrec_main):
    message = sessrec_main("retrain", "--model_dir", str(tmp_path / "nothing"), "--paths", "[x.parquet]",
                           "--train_from", "0", "--train_until", "1", "--test_until", "2", "--out", str(tmp_path / "c"))
    assert f"{tmp_path / 'nothing'}: no such model directory" in message


def test_cli_recommend_without_a_pipeline_recipe(sessrec_main):
    assert "--config must name a pipeline recipe" in sessrec_main(
        "recommend", "--config", str(ROOT / "recipes" / "quickstart.yaml"))


def test_cli_predict_of_a_click_ranker_says_what_scores_click_outs(tmp_path, sessrec_main):
    from test_ranking_data import log_table

    from sessrec.embeddings import FusedTables
    from sessrec.tasks import ClickoutDataModule, DLRMTask

    pq.write_table(log_table(), tmp_path / "log.parquet")
    data = ClickoutDataModule(str(tmp_path / "log.parquet"), test_hours=50 / 3600, valid_hours=30 / 3600)
    task = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense,  # the recipe's network
                    network={"embedding_dim": 16, "dense_layers": [64, 16], "over_layers": [128, 64]},
                    sparse=FusedTables(optimizer="adagrad_rowwise", lr=0.003))
    task.vocab = data.vocab
    model_dir = task.ranker().save_pretrained(tmp_path / "model")
    got = sessrec_main("predict", "--config", str(Path(__file__).resolve().parents[1] / "recipes" / "dlrm_trivago.yaml"),
                       "--data.init_args.path", str(tmp_path / "log.parquet"), "--model_dir", str(model_dir),
                       "--data.init_args.test_hours", str(50 / 3600), "--data.init_args.valid_hours", str(30 / 3600))
    assert got == ("sessrec predict: error: sessrec predict writes a session model's next items; a DLRMTask on click-outs "
                   "(sessrec.tasks.ClickoutDataModule) has none: sessrec test ranks each click-out's hotels, sessrec export "
                   "writes the scorer (--traceback for details)")


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5, float("nan")])
def test_an_srgnn_valid_fraction_outside_0_1_is_refused_naming_it(fraction):
    """-0.1 trained without validation with exit 0; 1.5 failed in an IndexError traceback, NaN in int()'s words."""
    with pytest.raises(ValueError, match="^" + re.escape(
            f"SRGNNSource: valid_fraction must be a share in [0, 1) (0: no validation), got {fraction}") + "$"):
        SRGNNSource("srgnn", valid_fraction=fraction)


def test_a_valid_fraction_that_rounds_to_no_session_is_refused_not_trained_without_validation(tmp_path):
    """SRGNNSource and MerlinSource kept no validation session for a share of too few sessions (0.001 of 100), and fit
    trained without validation and kept its checkpoint as the best; 0 still means no validation."""
    sessions = [[1 + i % 7, 2 + i % 5, 3] for i in range(100)]
    pickled(tmp_path / "all_train_seq.txt", sessions)
    pickled(tmp_path / "test.txt", ([[1, 2]], [3]))
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{tmp_path}: the validation split is empty: valid_fraction 0.001 of the 100 sessions it is cut from rounds "
            "to none; lengthen valid_fraction (0 trains without validation)") + "$"):
        SRGNNSource(str(tmp_path), valid_fraction=0.001).load()
    assert SRGNNSource(str(tmp_path), valid_fraction=0.0).load().valid.num_rows == 0
    assert SRGNNSource(str(tmp_path), valid_fraction=0.01).load().valid.num_rows == 1
