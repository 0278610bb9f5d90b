"""Readers and sources on the real shared datasets, checked against the counts in each SOURCE.md.

Every dataset is read once per module (module-scoped fixtures); the largest SR-GNN pickle takes
about a second.
"""

from __future__ import annotations

import gzip
import os
import pickle
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.data import frame
from sessrec.data.readers import read_events, read_user_sequences
from sessrec.data.schema import FeatureSpec, Schema, SchemaError, VirtualSpec
from sessrec.data.sources import EventLogSource, SRGNNSource, SyntheticSource, UserSequenceSource
from sessrec.data.srgnn import load_pickle, read_srgnn
from sessrec.data.synthetic import generate_sessions


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def n_distinct(column: pa.ChunkedArray) -> int:
    return pc.count_distinct(column).as_py()


def lengths_of(lists: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)


# --------------------------------------------------------------------------- rsc15 (YOOCHOOSE sample)

RSC15 = Schema(session_id="SessionId", item_id="ItemId", timestamp="Time", time_unit="s")


@pytest.fixture(scope="module")
def rsc15(shared_data) -> dict[str, pa.Table]:
    folder = shared_data("rsc15_100k")
    return {
        split: read_events(folder / f"yoochoose-clicks-100k_{split}.txt.gz", RSC15)
        for split in ("train_full", "test")
    }


@pytest.mark.parametrize(
    "split, rows, sessions, items, first, last",
    [
        ("train_full", 70_278, 17_794, 2_933, "2014-04-01 01:02:21", "2014-04-07 00:43:12"),
        ("test", 13_568, 3_416, 1_771, "2014-04-07 00:49:53", "2014-04-08 00:50:01"),
    ],
)
def test_read_events_rsc15_counts(rsc15, split, rows, sessions, items, first, last):
    events = rsc15[split]
    assert events.column_names == ["SessionId", "ItemId", "Time"]
    assert events.schema.types == [pa.int64(), pa.int64(), pa.float64()]
    assert events.num_rows == rows
    assert n_distinct(events["SessionId"]) == sessions
    assert n_distinct(events["ItemId"]) == items
    times = events["Time"].to_numpy()
    assert np.floor(times.min()) == utc(first)
    assert np.floor(times.max()) == utc(last)


def test_read_events_rsc15_first_rows_and_split(rsc15):
    head = rsc15["train_full"].slice(0, 5).to_pydict()
    assert head["SessionId"] == [3, 3, 6, 6, 7]
    assert head["ItemId"] == [214716935, 214832672, 214701242, 214826623, 214826835]
    np.testing.assert_allclose(
        head["Time"], [1396437466.94, 1396438212.318, 1396796300.848, 1396796546.976, 1396413533.104]
    )
    union = pa.concat_tables([rsc15["train_full"], rsc15["test"]])
    assert (union.num_rows, n_distinct(union["SessionId"]), n_distinct(union["ItemId"])) == (
        83_846,
        21_210,
        2_933,
    )
    shared = pc.is_in(rsc15["test"]["SessionId"], value_set=rsc15["train_full"]["SessionId"].combine_chunks())
    assert not pc.any(shared).as_py()


def test_rsc15_session_lengths(rsc15):
    events = frame.sort_events(rsc15["train_full"], RSC15)
    lengths = frame.session_lengths(frame.group_sessions(events, RSC15))
    assert (lengths.size, lengths.sum(), lengths.min(), lengths.max()) == (17_794, 70_278, 2, 58)


# --------------------------------------------------------------------------- DIGINETICA sample

DIGINETICA = Schema(
    session_id="session_id",
    item_id="item_id",
    timestamp="eventdate",
    time_unit="datetime",
    order_by="timeframe",
)


@pytest.fixture(scope="module")
def diginetica(shared_data) -> pa.Table:
    return read_events(shared_data("diginetica_sample") / "sample_train-item-views.csv.gz", DIGINETICA)


def test_read_events_diginetica_sample(diginetica):
    assert diginetica.column_names == ["session_id", "item_id", "eventdate", "timeframe"]
    assert diginetica.num_rows == 12_391
    assert n_distinct(diginetica["session_id"]) == 2_986
    assert n_distinct(diginetica["item_id"]) == 7_139
    days = diginetica["eventdate"].to_numpy()
    assert (days.min(), days.max()) == (utc("2016-01-03"), utc("2016-06-01"))
    head = diginetica.slice(0, 5).to_pydict()
    assert head["item_id"] == [81766, 31331, 32118, 9654, 32627]
    assert head["eventdate"] == [utc("2016-05-09")] * 5
    assert head["timeframe"] == [526309, 1031018, 243569, 75848, 1112408]


def test_diginetica_sample_sessions_ordered_by_timeframe(diginetica):
    sessions = frame.group_sessions(frame.sort_events(diginetica, DIGINETICA), DIGINETICA)
    lengths = frame.session_lengths(sessions)
    assert (lengths.size, lengths.min(), lengths.max(), int((lengths == 1).sum())) == (2_986, 1, 54, 933)
    assert round(lengths.mean(), 2) == 4.15
    # session 1's views come out in timeframe order (the file lists them as 526309, 1031018, 243569, ...)
    rows = diginetica.filter(pc.equal(diginetica["session_id"], 1))
    order = np.argsort(rows["timeframe"].to_numpy(), kind="stable")
    first = sessions.slice(0, 1).to_pylist()[0]
    assert first["session_id"] == 1
    assert first["item_id"] == rows["item_id"].to_numpy()[order].tolist()
    assert first["item_id"][0] == 9654  # timeframe 75848 in the SOURCE.md sample


# --------------------------------------------------------------------------- trivago RecSys'19

TRIVAGO = Schema(
    session_id="session_id",
    item_id="reference",
    timestamp="timestamp",
    time_unit="s",
    order_by="step",
    features=[FeatureSpec("action_type")],
)
ITEM_ACTIONS = [
    "clickout item",
    "interaction item image",
    "interaction item info",
    "interaction item rating",
    "interaction item deals",
    "search for item",
]


@pytest.fixture(scope="module", params=["trivago_val_100k.parquet.snappy", "trivago_val_100k.derived.csv.gz"])
def trivago(request, shared_data) -> pa.Table:
    return read_events(shared_data("trivago_rsc19_100k") / request.param, TRIVAGO)


def test_read_events_trivago_string_ids(trivago):
    # `reference` is a hotel id only for item actions (else a city, POI, filter...): read as string ids
    assert trivago.schema.field("session_id").type == pa.string()
    assert trivago.schema.field("reference").type == pa.string()
    assert trivago.num_rows == 100_003
    assert n_distinct(trivago["session_id"]) == 7_612
    times = trivago["timestamp"].to_numpy()
    assert (times.min(), times.max()) == (utc("2018-11-07 00:02:19"), utc("2018-11-08 23:59:42"))
    head = trivago.slice(0, 3).to_pydict()
    assert head["session_id"] == ["82cafdca18b3c"] * 3
    assert head["reference"] == ["5967314"] * 3
    assert head["step"] == [1, 2, 3]
    counts = pc.value_counts(trivago["action_type"]).to_pylist()
    counts = {row["values"]: row["counts"] for row in counts}
    assert counts["interaction item image"] == 68_538
    assert counts["clickout item"] == 13_597
    assert counts["search for destination"] == 3_060


def test_trivago_item_actions(trivago):
    items = trivago.filter(pc.is_in(trivago["action_type"], value_set=pa.array(ITEM_ACTIONS)))
    assert items.num_rows == 87_612
    assert n_distinct(items["reference"]) == 13_950
    # SOURCE.md's 13,950 counts the placeholder 'unknown' (4 'interaction item info' rows), then hotels
    hotel = pc.match_substring_regex(items["reference"], r"^\d+$")
    assert items.filter(pc.invert(hotel))["reference"].to_pylist() == ["unknown"] * 4
    assert n_distinct(pc.cast(items.filter(hotel)["reference"], pa.int64())) == 13_949
    clicks = trivago.filter(pc.equal(trivago["action_type"], "clickout item"))
    assert (clicks.num_rows, n_distinct(clicks["reference"])) == (13_597, 10_436)


def test_trivago_sessions_ordered_by_step(trivago):
    events = frame.sort_events(trivago, TRIVAGO)
    sessions = frame.group_sessions(events, TRIVAGO)
    lengths = frame.session_lengths(sessions)
    assert (lengths.size, lengths.sum(), lengths.min(), lengths.max()) == (7_612, 100_003, 1, 894)
    times, steps = events["timestamp"].to_numpy(), events["step"].to_numpy()
    ids = events["session_id"].to_numpy(zero_copy_only=False)
    same = ids[1:] == ids[:-1]
    assert np.all(times[1:][same] >= times[:-1][same])
    tie = same & (times[1:] == times[:-1])
    assert tie.sum() > 1000 and np.all(steps[1:][tie] > steps[:-1][tie])  # `step` breaks timestamp ties
    # one real quirk: session 2a181b2125efe is logged twice (steps 1.. restart a day earlier); time order wins
    restart = np.flatnonzero(same & (steps[1:] <= steps[:-1]))
    assert ids[restart].tolist() == ["2a181b2125efe"]


# --------------------------------------------------------------------------- SR-GNN pickles

SRGNN = {
    # name: (train sessions, train events, max train length, test pairs, test sessions, max item id)
    "diginetica_srgnn": (186_670, 906_140, 70, 60_858, 15_963, 43_097),
    "yoochoose164_srgnn": (116_167, 486_026, 146, 55_898, 15_324, 37_483),
    "tmall_srgnn": (65_286, 416_554, 40, 25_898, 1_027, 40_727),
    "nowplaying_srgnn": (128_077, 953_381, 30, 89_824, 14_479, 60_416),
}
AUGMENTED_PAIRS = {
    "diginetica_srgnn": 719_470,
    "yoochoose164_srgnn": 369_859,
    "tmall_srgnn": 351_268,
    "nowplaying_srgnn": 825_304,
}


@pytest.fixture(scope="module", params=list(SRGNN))
def srgnn(request, shared_data):
    folder = shared_data(request.param)
    return request.param, folder, read_srgnn(folder)


@pytest.mark.slow
def test_read_srgnn_counts(srgnn):
    name, _, data = srgnn
    n_train, n_events, max_len, n_pairs, n_sessions, max_item = SRGNN[name]
    lengths = lengths_of(data.train)
    assert (len(data.train), lengths.sum(), lengths.min(), lengths.max()) == (n_train, n_events, 2, max_len)
    assert (lengths - 1).sum() == AUGMENTED_PAIRS[name]
    assert len(data.test_prefixes) == len(data.test_labels) == n_pairs
    assert data.test_labels.dtype == np.int64
    items = np.concatenate(
        [data.train.values.to_numpy(), data.test_prefixes.values.to_numpy(), data.test_labels]
    )
    assert (items.min(), items.max()) == (1, max_item)
    sessions = data.test_sessions()
    assert len(sessions) == n_sessions
    assert lengths_of(sessions).sum() == n_pairs + n_sessions  # a session of n items gives n - 1 pairs


def test_srgnn_test_sessions_reproduce_shipped_pairs(srgnn):
    _, _, data = srgnn
    values, offsets = frame.list_offsets(data.test_sessions())
    values = values.to_numpy()
    session, target = frame.expand_prefixes(offsets, "all_prefixes")
    np.testing.assert_array_equal(values[target], data.test_labels)
    prefix_len = target - offsets[session]
    np.testing.assert_array_equal(prefix_len, lengths_of(data.test_prefixes))
    # flat index of every prefix item, pair by pair
    start = np.repeat(offsets[session], prefix_len)
    within = np.arange(prefix_len.sum()) - np.repeat(np.cumsum(prefix_len) - prefix_len, prefix_len)
    shipped, _ = frame.list_offsets(data.test_prefixes)
    np.testing.assert_array_equal(values[start + within], shipped.to_numpy())


def test_srgnn_pickles_match_derived_text(srgnn):
    """The reader's pairs equal the independent plain-text copy ``test_pairs.derived.tsv.gz``."""
    _, folder, data = srgnn
    pairs = pacsv.read_csv(
        folder / "test_pairs.derived.tsv.gz",
        read_options=pacsv.ReadOptions(column_names=["prefix", "label"]),
        parse_options=pacsv.ParseOptions(delimiter="\t"),
        convert_options=pacsv.ConvertOptions(column_types={"prefix": pa.string(), "label": pa.int64()}),
    )
    np.testing.assert_array_equal(pairs["label"].to_numpy(), data.test_labels)
    prefixes = pc.split_pattern(pairs["prefix"].combine_chunks(), " ")
    np.testing.assert_array_equal(lengths_of(prefixes), lengths_of(data.test_prefixes))
    np.testing.assert_array_equal(
        pc.cast(prefixes.flatten(), pa.int64()).to_numpy(),
        frame.list_offsets(data.test_prefixes)[0].to_numpy(),
    )


class _RunsCommand:
    """A pickle of this object asks the unpickler to call ``os.system``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Plain:
    pass


def _write_pickle(path: Path, obj: object) -> Path:
    with gzip.open(path, "wb") if path.suffix == ".gz" else open(path, "wb") as f:
        pickle.dump(obj, f, protocol=3)
    return path


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(lambda marker: _RunsCommand(f"touch {marker}"), id="os.system-call"),
        pytest.param(lambda marker: [[1, 2], os.system], id="function-reference"),
        pytest.param(lambda marker: [_Plain()], id="class-instance"),
    ],
)
def test_load_pickle_refuses_globals(tmp_path, payload):
    marker = tmp_path / "executed"
    path = _write_pickle(tmp_path / "all_train_seq.txt", payload(marker))
    with pytest.raises(SchemaError, match="is not allowed") as err:
        load_pickle(path)
    assert str(path) in str(err.value)
    assert not marker.exists()


def test_read_srgnn_refuses_hostile_folder(tmp_path):
    marker = tmp_path / "executed"
    _write_pickle(tmp_path / "all_train_seq.txt.gz", [[1, 2, 3]])
    _write_pickle(tmp_path / "test.txt.gz", ([[1]], _RunsCommand(f"touch {marker}")))
    with pytest.raises(
        SchemaError, match=r"test\.txt\.gz.*global posix\.system|test\.txt\.gz.*global os\.system"
    ):
        read_srgnn(tmp_path)
    assert not marker.exists()


def test_load_pickle_corrupt_bytes_are_schema_errors(tmp_path):
    good = pickle.dumps(([[1, 2, 3], [4, 5]] * 5, [7, 8] * 5), protocol=3)
    rng = np.random.default_rng(0)
    path = tmp_path / "test.txt"
    for _ in range(200):
        broken = bytearray(good)
        broken[rng.integers(len(broken))] = rng.integers(256)
        path.write_bytes(bytes(broken[: rng.integers(1, len(broken) + 1)]))
        try:
            load_pickle(path)
        except SchemaError as err:
            assert str(path) in str(err)


@pytest.mark.parametrize(
    "train, test, message",
    [
        (
            [[1, 2], [3, 1.5]],
            ([[1]], [2]),
            r"all_train_seq should hold lists of integer item ids, got list<item: double>",
        ),
        ([[1, 2], [3, -4]], ([[1]], [2]), r"all_train_seq holds a negative item id -4"),
        ([[1, 2], [3, None]], ([[1]], [2]), r"all_train_seq holds a null"),
        ([1, 2, 3], ([[1]], [2]), r"all_train_seq should hold lists of integer item ids, got int64"),
        ([[1, 2]], ([[1]], [2.5]), r"test labels should hold integer item ids, got double"),
        ([[1, 2]], ([[1]], [-2]), r"test labels hold a negative item id -2"),
        ([[1, 2]], ([[1], [2]], [2]), r"2 prefixes but \(1,\) labels"),
        ([[1, 2]], [[1]], r"expected a \(prefixes, labels\) pair"),
    ],
)
def test_read_srgnn_bad_contents(tmp_path, train, test, message):
    _write_pickle(tmp_path / "all_train_seq.txt", train)
    _write_pickle(tmp_path / "test.txt", test)
    with pytest.raises(SchemaError, match=message) as err:
        read_srgnn(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_srgnn_test_sessions_hand_case(tmp_path):
    # sessions [5, 6, 7] and [8, 9] expanded longest prefix first
    _write_pickle(tmp_path / "all_train_seq.txt", [[1, 2]])
    _write_pickle(tmp_path / "test.txt", ([[5, 6], [5], [8]], [7, 6, 9]))
    assert read_srgnn(tmp_path).test_sessions().to_pylist() == [[5, 6, 7], [8, 9]]


def test_srgnn_other_expansions_are_read_pair_for_pair(tmp_path):
    """Pairs that do not continue a longest-prefix-first run each become a session of their own,
    with only the shipped target marked: evaluation sees exactly the shipped pairs."""
    _write_pickle(tmp_path / "all_train_seq.txt", [[1, 2]])
    _write_pickle(tmp_path / "test.txt", ([[5, 6, 7], [5], [8]], [7, 6, 9]))  # a length-2 prefix is missing
    data = read_srgnn(tmp_path)
    assert data.test_sessions().to_pylist() == [[5, 6, 7, 7], [5, 6], [8, 9]]
    assert np.flatnonzero(data.test_targets()).tolist() == [3, 5, 7]
    _write_pickle(tmp_path / "test.txt", ([[5], [5, 6]], [6, 7]))  # shortest prefix first
    data = read_srgnn(tmp_path)
    assert data.test_sessions().to_pylist() == [[5, 6], [5, 6, 7]]
    assert np.flatnonzero(data.test_targets()).tolist() == [1, 4]
    _write_pickle(tmp_path / "test.txt", ([[5, 6], [5]], [7, 6]))  # the original layout: every prefix is a pair
    assert read_srgnn(tmp_path).test_targets() is None


# --------------------------------------------------------------------------- one sequence per user

USER_SEQUENCES = {
    # (folder, file, layout): (users, interactions, items, min length, max length, first user's first items)
    ("sasrec_amazon_games", "Video.txt.gz", "pairs"): (
        31_013,
        287_107,
        23_715,
        1,
        860,
        [6393, 13504, 14087, 15116, 13755],
    ),
    ("bert4rec_amazon_beauty", "beauty.txt.gz", "pairs"): (40_226, 353_962, 54_542, 5, 293, [1, 2, 3, 4, 5]),
    ("s3rec_seq", "Beauty.txt.gz", "lines"): (22_363, 198_502, 12_101, 5, 204, [1, 2, 3, 4, 5]),
}


@pytest.fixture(scope="module", params=list(USER_SEQUENCES), ids=lambda key: key[0])
def user_sequences(request, shared_data):
    folder, name, layout = request.param
    path = shared_data(folder) / name
    return request.param, path, read_user_sequences(path, layout)


def test_read_user_sequences_counts(user_sequences):
    key, _, events = user_sequences
    users, interactions, items, min_len, max_len, head = USER_SEQUENCES[key]
    assert events.column_names == ["session_id", "item_id", "position"]
    assert events.schema.types == [pa.int64()] * 3
    assert events.num_rows == interactions
    assert n_distinct(events["session_id"]) == users
    assert n_distinct(events["item_id"]) == items
    item_ids = events["item_id"].to_numpy()
    assert (item_ids.min(), item_ids.max()) == (1, items)  # re-indexed from 1
    schema = Schema(timestamp=None, order_by="position")
    lengths = frame.session_lengths(frame.group_sessions(events, schema))
    assert (lengths.min(), lengths.max()) == (min_len, max_len)
    assert events.slice(0, 5)["item_id"].to_pylist() == head
    # position counts 0, 1, 2, ... within each user
    position = events["position"].to_numpy()
    _, offsets = frame.list_offsets(frame.group_sessions(events, schema).column("item_id"))
    assert np.array_equal(position[offsets[:-1]], np.zeros(users))
    assert position.max() == max_len - 1


def test_read_user_sequences_lines_hand_case(tmp_path):
    path = tmp_path / "seq.txt"
    path.write_text("1 10 11 12\n2 13\n3 12 10\n")
    events = read_user_sequences(path, "lines")
    assert events.to_pydict() == {
        "session_id": [1, 1, 1, 2, 3, 3],
        "item_id": [10, 11, 12, 13, 12, 10],
        "position": [0, 1, 2, 0, 0, 1],
    }


def test_the_pairs_layout_reads_users_grouped_in_any_order_as_the_lines_layout_does(tmp_path):
    (tmp_path / "pairs.txt").write_text("5 10\n5 11\n3 12\n3 10\n3 13\n")
    (tmp_path / "lines.txt").write_text("5 10 11\n3 12 10 13\n")
    pairs, lines = read_user_sequences(tmp_path / "pairs.txt", "pairs"), read_user_sequences(tmp_path / "lines.txt", "lines")
    assert pairs.to_pydict() == lines.to_pydict() == {
        "session_id": [5, 5, 3, 3, 3], "item_id": [10, 11, 12, 10, 13], "position": [0, 1, 0, 1, 2]}


@pytest.mark.parametrize(
    "text, layout, message",
    [
        ("1 5\n2 6\n1 7\n", "pairs", r"column 'user' \(the first id of a line\) is not grouped by user: line 3 has "
                                   r"user 1 again, whose lines began at line 1 and were followed by another user's "
                                   r"\(expected each user's lines together, in time order\)$"),
        ("3 5\n3 6\n2 6\n4 1\n2 7\n", "pairs", r"line 5 has user 2 again, whose lines began at line 3"),
        ("1 5\n2 x\n", "pairs", r"line 2: '2 x' is not a 'user item' pair"),
        ("1 5 6\n2\n", "lines", r"line 2 has no items: '2'"),
        ("1 5 6\n2 7 x\n", "lines", r"line 2: 'x' is not a non-negative integer id"),
        ("", "lines", r"the file has no rows"),
        ("", "pairs", r"Empty CSV file"),
        ("1 5\n2 -6\n", "pairs", r"column 'item_id' has a negative id -6 at row 1"),
    ],
)
def test_read_user_sequences_bad_files(tmp_path, text, layout, message):
    path = tmp_path / "seq.txt"
    path.write_text(text)
    with pytest.raises(SchemaError, match=message) as err:
        read_user_sequences(path, layout)
    assert str(path) in str(err.value)


# --------------------------------------------------------------------------- sources


def _session_sets(splits) -> list[set]:
    return [set(getattr(splits, name)["session_id"].to_pylist()) for name in ("train", "valid", "test")]


def test_srgnn_source(shared_data):
    splits = SRGNNSource(str(shared_data("tmall_srgnn")), valid_fraction=0.1).load()
    # 65,286 training sessions; round(6,528.6) = 6,529 most recent held out for validation
    assert splits.summary() == {
        "train_sessions": 58_757,
        "train_events": 416_554 - lengths_of(splits.valid["item_id"]).sum(),
        "valid_sessions": 6_529,
        "valid_events": int(lengths_of(splits.valid["item_id"]).sum()),
        "test_sessions": 1_027,
        "test_events": 25_898 + 1_027,
    }
    train, valid, test = _session_sets(splits)
    assert not (train & valid or train & test or valid & test)
    assert splits.train["session_id"].to_pylist() == list(range(58_757))  # file order kept: valid is the tail


def test_event_log_source_rsc15(shared_data):
    folder = shared_data("rsc15_100k")
    source = EventLogSource(
        str(folder / "yoochoose-clicks-100k_train_full.txt.gz"),
        schema=RSC15,
        test_path=str(folder / "yoochoose-clicks-100k_test.txt.gz"),
        valid_fraction=0.1,
    )
    splits = source.load()
    summary = splits.summary()
    # 17,794 training sessions, the latest round(1,779.4) = 1,779 (by last event) for validation
    assert (summary["train_sessions"], summary["valid_sessions"], summary["test_sessions"]) == (
        16_015,
        1_779,
        3_416,
    )
    assert summary["train_events"] + summary["valid_events"] == 70_278
    assert summary["test_events"] == 13_568
    train, valid, test = _session_sets(splits)
    assert not (train & valid or train & test or valid & test)
    last = {name: frame.last_times(getattr(splits, name)) for name in ("train", "valid")}
    assert last["train"].max() <= last["valid"].min()


def test_user_sequence_source_leave_one_out(user_sequences):
    key, path, events = user_sequences
    splits = UserSequenceSource(str(path), layout=key[2]).load()
    lengths = frame.session_lengths(frame.group_sessions(events, Schema(timestamp=None, order_by="position")))
    users, kept = int((lengths >= 3).sum()), lengths[lengths >= 3]
    assert [splits.train.num_rows, splits.valid.num_rows, splits.test.num_rows] == [users] * 3
    assert frame.session_lengths(splits.test).sum() == kept.sum()
    full, offsets = frame.list_offsets(splits.test["item_id"])
    full, length = full.to_numpy(), np.diff(offsets)
    from_end = np.repeat(offsets[1:], length) - np.arange(offsets[-1])  # 1 for the last item of each user
    for name, drop in (("train", 2), ("valid", 1)):
        cut = getattr(splits, name)
        np.testing.assert_array_equal(frame.session_lengths(cut), length - drop)
        np.testing.assert_array_equal(frame.list_offsets(cut["item_id"])[0].to_numpy(), full[from_end > drop])
        assert cut["session_id"].equals(splits.test["session_id"])
    if key[0] == "s3rec_seq":  # every user has >= 5 items: 198,502 - 2 * 22,363 training events
        assert frame.session_lengths(splits.train).sum() == 153_776
        first = [getattr(splits, name)["item_id"][0].as_py() for name in ("train", "valid", "test")]
        assert first == [[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4, 5]]


def test_user_sequence_source_reads_an_event_log_in_time_order(tmp_path):
    """layout 'events': any event log, each user's events ordered by time (the file's order is not), the times and
    side features cut with the items; a user of fewer than min_length events is dropped."""
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n"
                    "1,10,4.0,300\n1,11,3.5,100\n1,12,5.0,200\n1,13,1.0,400\n"
                    "2,20,2.0,50\n2,10,3.0,60\n"
                    "3,30,4.5,9\n3,31,4.0,7\n3,32,3.0,8\n")
    schema = Schema(session_id="userId", item_id="movieId", timestamp="timestamp", time_unit="s",
                    features=[FeatureSpec("rating", "continuous")])
    splits = UserSequenceSource(str(path), layout="events", schema=schema).load()
    assert splits.test.to_pylist() == [
        {"session_id": 1, "item_id": [11, 12, 10, 13], "timestamp": [100.0, 200.0, 300.0, 400.0],
         "rating": [3.5, 5.0, 4.0, 1.0], "targetable": [False, False, False, True]},
        {"session_id": 3, "item_id": [31, 32, 30], "timestamp": [7.0, 8.0, 9.0],
         "rating": [4.0, 3.0, 4.5], "targetable": [False, False, True]},
    ]
    assert splits.valid.to_pylist()[0] == {"session_id": 1, "item_id": [11, 12, 10], "timestamp": [100.0, 200.0, 300.0],
                                           "rating": [3.5, 5.0, 4.0], "targetable": [False, False, True]}
    assert splits.train.to_pylist() == [
        {"session_id": 1, "item_id": [11, 12], "timestamp": [100.0, 200.0], "rating": [3.5, 5.0]},
        {"session_id": 3, "item_id": [31], "timestamp": [7.0], "rating": [4.0]},
    ]
    assert splits.source == str(path)


def test_user_sequence_source_refuses_what_its_layout_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="layout 'pairs' has fixed columns"):
        UserSequenceSource("x.txt", schema=Schema(session_id="user"))
    with pytest.raises(ValueError, match="layout must be 'pairs', 'lines' or 'events', got 'csv'"):
        UserSequenceSource("x.csv", layout="csv")
    with pytest.raises(ValueError, match="virtual events"):
        UserSequenceSource("x.csv", layout="events",
                           schema=Schema(virtual=VirtualSpec(column="action", values=["search"])))
    path = tmp_path / "events.csv"
    path.write_text("session_id,item_id,timestamp\n1,5,1\n1,6,2\n2,5,3\n")
    with pytest.raises(ValueError, match=r"events.csv: no user has 3 or more interactions \(the 2 users have at most 2\)"):
        UserSequenceSource(str(path), layout="events").load()


def test_synthetic_source_splits_by_day():
    kwargs = {"num_sessions": 2_000, "num_items": 200, "num_clusters": 10, "days": 7.0, "seed": 3}
    splits = SyntheticSource(**kwargs).load()
    again = SyntheticSource(**kwargs).load()
    assert splits.train.equals(again.train) and splits.test.equals(again.test)
    events = generate_sessions(**kwargs)
    product = events.filter(pc.equal(events["event_type"], "product"))
    counts = pc.value_counts(product["session_id"]).field("counts").to_numpy()
    summary = splits.summary()
    assert summary["train_sessions"] + summary["valid_sessions"] + summary["test_sessions"] == int(
        (counts >= 2).sum()
    )
    assert summary["train_events"] + summary["valid_events"] + summary["test_events"] == int(
        counts[counts >= 2].sum()
    )
    train, valid, test = _session_sets(splits)
    assert not (train & valid or train & test or valid & test)
    ends = {name: frame.last_times(getattr(splits, name)) for name in ("train", "valid", "test")}
    t_max = ends["test"].max()
    assert ends["test"].min() > t_max - 86_400
    assert t_max - 2 * 86_400 < ends["valid"].min() and ends["valid"].max() <= t_max - 86_400
    assert ends["train"].max() <= t_max - 2 * 86_400
    assert min(summary.values()) > 0


# --------------------------------------------------------------------------- implausible times

EVENTS_AT = [1_396_437_466, 1_396_438_212, 1_396_796_300]  # 2014-04-02 .. 2014-04-06 in seconds


def _events_file(tmp_path: Path, times: list[float]) -> Path:
    path = tmp_path / "clicks.csv"
    pacsv.write_csv(pa.table({"session_id": [1, 1, 2], "item_id": [5, 6, 7], "timestamp": times}), path)
    return path


@pytest.mark.parametrize(
    "times, unit, message",
    [
        ([t * 1000 for t in EVENTS_AT], "s",
         r"clicks.csv: column 'timestamp' has the time 1396437466000 at row 0, read with time_unit: s as the year "
         r"46,221 \(outside 1990..2100\); it looks like ms; set time_unit: ms"),
        (EVENTS_AT, "ms",
         r"has the time 1396437466 at row 0, read with time_unit: ms as the year 1970 .* it looks like s; set time_unit: s"),
        ([t * 10**6 for t in EVENTS_AT], "ms", r"as the year 46,221 .* it looks like us; set time_unit: us"),
        ([EVENTS_AT[0], 0, EVENTS_AT[2]], "s",
         r"has the time 0 at row 1, read with time_unit: s as the year 1970 .* fix or drop the rows"),
        ([EVENTS_AT[0], EVENTS_AT[1], 5e9], "s", r"has the time 5000000000 at row 2, .* as the year 2128"),
    ],
)
def test_read_events_refuses_times_outside_1990_to_2100(tmp_path, times, unit, message):
    path = _events_file(tmp_path, times)
    with pytest.raises(SchemaError, match=message):
        read_events(path, Schema(time_unit=unit))
    with pytest.raises(SchemaError, match=message):  # the source a recipe reads refuses it too
        EventLogSource(str(path), schema=Schema(time_unit=unit), test_fraction=0.5).load()


def test_dates_written_as_yyyymmdd_numbers_are_refused_not_read_as_relative_seconds(tmp_path):
    """20140402 is 2014-04-02, not 20,140,402 seconds from a start: read so, the next day was one second later and the
    time splits cut by seconds; a column all of whose numbers are such dates is refused, in any unit."""
    path = _events_file(tmp_path, [20140402, 20140402, 20140406])
    message = (r"clicks.csv: column 'timestamp' has the time 20140402 at row 0, and every time of it is a date written "
               r"as digits \(YYYYMMDD\), which time_unit: s reads as seconds from a start; give the dates as text")
    with pytest.raises(SchemaError, match=message):
        read_events(path, Schema())
    with pytest.raises(SchemaError, match=message):
        EventLogSource(str(path), schema=Schema(), test_fraction=0.5).load()
    with pytest.raises(SchemaError, match="which time_unit: ms reads as milliseconds from a start"):
        read_events(path, Schema(time_unit="ms"))
    # relative seconds that are no dates in every row (a month 13, a day 32, a fraction) are read as they are
    for times in ([20140402, 20141302, 20140406], [20140402, 20140432, 20140406], [20140402.5, 20140402, 20140406]):
        assert read_events(_events_file(tmp_path, times), Schema())["timestamp"].to_pylist() == [float(t) for t in times]


def test_read_events_takes_relative_times_and_right_units(tmp_path):
    relative = read_events(_events_file(tmp_path, [0.0, 30.0, 5.0]), Schema())  # seconds from a start: no unit fits
    assert relative["timestamp"].to_pylist() == [0.0, 30.0, 5.0]
    ms = read_events(_events_file(tmp_path, [t * 1000 for t in EVENTS_AT]), Schema(time_unit="ms"))
    assert ms["timestamp"].to_pylist() == [float(t) for t in EVENTS_AT]


@pytest.mark.parametrize(
    "column, message",
    [
        (pa.array([EVENTS_AT[0], -2_208_988_800, EVENTS_AT[2]], pa.timestamp("s")),  # 1900-01-01: a placeholder
         r"has a negative timestamp '1900-01-01 00:00:00(\.000)?' at row 1 \(before 1970\)"),
        (pa.array([d * 10**9 for d in (EVENTS_AT[0], EVENTS_AT[1], 9_200_000_000)], pa.timestamp("ns", tz="UTC")),
         r"has the time '2261-07-15 11:33:20.000000000Z' at row 2, in the year 2261 \(outside 1990..2100\); fix or drop"),
        (pa.array([EVENTS_AT[0], 3_600, EVENTS_AT[2]], pa.timestamp("s")),
         r"has the time '1970-01-01 01:00:00(\.000)?' at row 1, in the year 1970 \(outside 1990..2100\)"),
        (pa.array(["2014-04-02T11:17:46Z", "2999-04-02T11:17:46Z", "2014-04-06T14:58:20Z"]),
         r"has the time '2999-04-02T11:17:46Z' at row 1, in the year 2999"),
        (pa.array([datetime(2014, 4, 2).date(), datetime(1900, 1, 1).date(), datetime(2014, 4, 6).date()]),
         r"has a negative timestamp '1900-01-01' at row 1"),
    ],
    ids=["timestamp-1900", "timestamp-2262", "timestamp-1970-beside-2014", "iso-2999", "date-1900"],
)
def test_read_events_refuses_timestamps_and_dates_outside_1990_to_2100(tmp_path, column, message):
    """A timestamp, date or ISO-8601 column is held to the numbers' rule: before 1970, after 2100, or before 1990
    beside times in 1990..2100, it is refused (a 1900 placeholder sorted its event first in its session, exit 0)."""
    from sessrec.data.readers import scan_events

    path = tmp_path / "clicks.parquet"
    pq.write_table(pa.table({"session_id": [1, 1, 2], "item_id": [5, 6, 7], "timestamp": column}), path)
    schema = Schema(time_unit="datetime")
    with pytest.raises(SchemaError, match=message):
        read_events(path, schema)
    with pytest.raises(SchemaError, match=message):  # a batch at a time
        list(scan_events(path, schema, batch_rows=1))
    numbers = pa.array([str(t * 1000) for t in EVENTS_AT])  # numbers as text, batch by batch too
    pq.write_table(pa.table({"session_id": [1, 1, 2], "item_id": [5, 6, 7], "timestamp": numbers}), path)
    assert pa.concat_tables(scan_events(path, Schema(time_unit="ms"), batch_rows=1))["timestamp"].to_pylist() == EVENTS_AT
    relative = pa.array([0, 30, 5], pa.timestamp("s"))  # times from a start, as numbers from a start, pass
    pq.write_table(pa.table({"session_id": [1, 1, 2], "item_id": [5, 6, 7], "timestamp": relative}), path)
    assert read_events(path, schema)["timestamp"].to_pylist() == [0.0, 30.0, 5.0]


def test_a_text_time_column_of_iso_and_numbers_is_refused_whole_and_batch_by_batch(tmp_path):
    """Batch by batch, a batch of ISO-8601 text and one of numbers each read (the second in time_unit ms), so the
    file read whole and read a batch at a time gave two answers (the batches with exit 0)."""
    from sessrec.data.readers import scan_events

    path = tmp_path / "clicks.parquet"
    times = ["2014-04-02T11:17:46Z", "2014-04-02T11:30:12Z", str(EVENTS_AT[2] * 1000)]
    pq.write_table(pa.table({"session_id": [1, 1, 2], "item_id": [5, 6, 7], "timestamp": times}), path)
    with pytest.raises(SchemaError, match=r"unparsable timestamp '1396796300000' at row 2"):
        read_events(path, Schema(time_unit="ms"))
    with pytest.raises(SchemaError, match=(
            r"clicks.parquet: column 'timestamp' holds times of two forms: '2014-04-02T11:17:46Z' at row 0 \(ISO-8601\) "
            r"and '1396796300000' at row 2 \(milliseconds since the epoch, time_unit: ms\); give the column one form")):
        list(scan_events(path, Schema(time_unit="ms"), batch_rows=2))


@pytest.mark.parametrize("suffix, codec", [(".gz", "gzip"), (".bz2", "bz2"), (".zst", "zstd"), (".lz4", "lz4")])
def test_a_compressed_text_file_reads_as_the_plain_one_by_every_reader(tmp_path, suffix, codec, monkeypatch):
    """Arrow's CSV readers decompress by the extension; the delimiter is sniffed on the decompressed text (on the
    compressed bytes, a tab-separated .bz2 file was refused as 'column sid is missing'), the dask engine reads such a
    file whole, and the one-line-per-user layout decompresses it too."""
    from sessrec.data import ItemVocab
    from sessrec.data.prepared import cluster
    from sessrec.data.readers import scan_events
    from sessrec.data.stream import ScoringStream

    text = "sid\titem\tts\n" + "".join(f"{i // 4}\t{1 + i % 50}\t{1_700_000_000 + 37 * i}\n" for i in range(400))
    plain, packed = tmp_path / "events.tsv", tmp_path / f"events.tsv{suffix}"
    plain.write_text(text)
    with pa.output_stream(str(packed), compression=codec) as f:
        f.write(text.encode())
    schema = Schema(session_id="sid", item_id="item", timestamp="ts")
    assert read_events(packed, schema).equals(read_events(plain, schema))
    assert pa.concat_tables(scan_events(packed, schema)).equals(pa.concat_tables(scan_events(plain, schema)))
    vocab = ItemVocab.fit(pa.array(np.arange(1, 51)))
    streamed = [torch_batch.items for torch_batch in ScoringStream(str(packed), vocab, schema)]
    assert all((a == b).all() for a, b in zip(streamed, [b.items for b in ScoringStream(str(plain), vocab, schema)]))
    monkeypatch.setattr(cluster, "PIECE_BYTES", 1024)  # the plain file in byte ranges, the compressed one whole
    assert len(cluster.pieces_of(str(plain))) > 1
    assert [(p.start, p.end) for p in cluster.pieces_of(str(packed))] == [(0, None)]
    lines, packed_lines = tmp_path / "users.txt", tmp_path / f"users.txt{suffix}"
    lines.write_text("1 5 6 7\n2 8 9 10 11\n")
    with pa.output_stream(str(packed_lines), compression=codec) as f:
        f.write(lines.read_bytes())
    assert read_user_sequences(packed_lines, "lines").equals(read_user_sequences(lines, "lines"))


@pytest.mark.parametrize("suffix, codec", [(".gz", "gzip"), (".bz2", "bz2"), (".zst", "zstd"), (".lz4", "lz4")])
def test_a_compressed_file_named_as_plain_text_is_refused_naming_its_extension_by_every_reader(tmp_path, suffix, codec):
    """A gzipped log named ``events.csv`` was parsed as text: refused with the compressed bytes in the message (or, for
    some bytes, read as rows of garbage); every reader now names the extension to give it."""
    from sessrec.data import ItemVocab
    from sessrec.data.readers import scan_events
    from sessrec.data.stream import ScoringStream

    path = tmp_path / "events.csv"
    with pa.output_stream(str(path), compression=codec) as f:
        f.write(("sid,item,ts\n" + "".join(f"{i // 4},{1 + i % 50},{1_700_000_000 + 37 * i}\n" for i in range(400))).encode())
    schema = Schema(session_id="sid", item_id="item", timestamp="ts")
    message = (f"^{path}: the file is compressed \\({suffix}\\) but its name does not end in {suffix}, so it would be read "
               f"as plain text; rename it events.csv{suffix}$")
    with pytest.raises(SchemaError, match=message):
        read_events(path, schema)
    with pytest.raises(SchemaError, match=message):
        read_events(path, schema, delimiter=",")
    with pytest.raises(SchemaError, match=message):
        next(scan_events(path, schema, delimiter=","))
    with pytest.raises(SchemaError, match=message):
        list(ScoringStream(str(path), ItemVocab.fit(pa.array(np.arange(1, 51))), schema))


def test_a_model_of_text_ids_scores_a_csv_file_of_leading_zeros_and_ids_beyond_int64_as_text(tmp_path):
    """A model trained with string_ids (its vocabulary of text ids) refused ``002`` in a file to score as 'reads as the
    integer 2' and a 20-digit id as 'does not fit int64', though the file holds its own ids; they now read as its text."""
    from sessrec.data import ItemVocab
    from sessrec.data.stream import ScoringStream

    big = "18446744073709551617"
    path = tmp_path / "sessions.csv"
    path.write_text(f"sid,item\n1,002\n1,2\n2,{big}\n2,002\n")
    vocab = ItemVocab.fit(pa.array(["002", "002", "2", big]))
    stream = ScoringStream(str(path), vocab, Schema(session_id="sid", item_id="item", timestamp=None))
    items = torch.cat([batch.items for batch in stream])
    expected = [vocab.encode(pa.array(ids)).ids.tolist() for ids in (["002", "2"], [big, "002"])]
    assert items.tolist() == expected and min(min(e) for e in expected) > 1
    assert stream.num_unknown == 0


@pytest.mark.parametrize("name", ["events.jsonl", "events.json", "events.ndjson.gz"])
def test_a_json_file_is_refused_naming_it_not_read_as_a_csv_of_no_rows(tmp_path, name):
    path = tmp_path / name
    with pa.output_stream(str(path), compression="gzip" if name.endswith(".gz") else None) as f:
        f.write(b'{"sid": 1, "iid": 2, "ts": 1700000000}\n{"sid": 1, "iid": 3, "ts": 1700000060}\n')
    with pytest.raises(SchemaError, match=f"^{path}: a JSON file; event logs are read from CSV/TSV files"):
        read_events(path, Schema(session_id="sid", item_id="iid", timestamp="ts"))
