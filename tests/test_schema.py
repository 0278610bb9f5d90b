"""`Schema` validation through `read_events`: each bad input is a `SchemaError` naming file, column, value."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sessrec.data.readers import read_events
from sessrec.data.schema import FeatureSpec, Schema, SchemaError

DEFAULT = Schema()  # session_id, item_id, timestamp in seconds
WITH_PRICE = Schema(features=[FeatureSpec("price", "continuous")])
ISO_TIME = Schema(time_unit="datetime")


def csv(text: str) -> tuple[str, str]:
    return "events.csv", text


def parquet(**columns: pa.Array) -> tuple[str, pa.Table]:
    return "events.parquet", pa.table(columns)


def write(tmp_path: Path, spec: tuple[str, object]) -> Path:
    name, content = spec
    path = tmp_path / name
    if isinstance(content, pa.Table):
        pq.write_table(content, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


# (case id, file, schema, pieces of the message besides the file name: column and value or row)
BAD_INPUTS = [
    ("missing-session", csv("sid,item_id,timestamp\n1,2,3\n"), DEFAULT, ["'session_id' is missing", "'sid'"]),
    ("missing-item", csv("session_id,item,timestamp\n1,2,3\n"), DEFAULT, ["'item_id' is missing", "'item'"]),
    (
        "missing-timestamp",
        csv("session_id,item_id,time\n1,2,3\n"),
        DEFAULT,
        ["'timestamp' is missing", "'time'"],
    ),
    (
        "float-item",
        csv("session_id,item_id,timestamp\n1,10,0\n1,2.5,1\n"),
        DEFAULT,
        ["'item_id'", "the id '2.5' at row 1, not an integer"],
    ),
    (
        "bool-item",
        csv("session_id,item_id,timestamp\n1,true,0\n1,false,1\n"),
        DEFAULT,
        ["'item_id'", "dtype bool", "True at row 0"],
    ),
    (
        "null-item",
        csv("session_id,item_id,timestamp\n1,10,0\n1,,1\n"),
        DEFAULT,
        ["'item_id'", "missing id '' at row 1"],
    ),
    (
        "negative-item",
        csv("session_id,item_id,timestamp\n1,10,0\n1,-5,1\n"),
        DEFAULT,
        ["'item_id'", "negative id -5 at row 1"],
    ),
    (
        "null-session",
        csv("session_id,item_id,timestamp\n1,10,0\nNA,11,1\n"),
        DEFAULT,
        ["'session_id'", "missing id 'NA' at row 1"],
    ),
    (
        "empty-string-item",
        parquet(session_id=pa.array([1, 1]), item_id=pa.array(["a", ""]), timestamp=pa.array([0, 1])),
        DEFAULT,
        ["'item_id'", "empty string id at row 1"],
    ),
    (
        "uint64-overflow",
        parquet(
            session_id=pa.array([1, 2**63], pa.uint64()), item_id=pa.array([1, 2]), timestamp=pa.array([0, 1])
        ),
        DEFAULT,
        ["'session_id'", f"{2**63} at row 1"],
    ),
    (
        "unparsable-time",
        csv("session_id,item_id,timestamp\n1,10,2016-05-09\n1,11,2016-13-45\n"),
        ISO_TIME,
        ["'timestamp'", "unparsable timestamp '2016-13-45' at row 1"],
    ),
    (
        "null-date",
        csv("session_id,item_id,timestamp\n1,10,2016-05-09\n1,11,\n"),
        ISO_TIME,
        ["'timestamp'", "missing timestamp None at row 1"],
    ),  # read as date32 by the CSV reader
    (
        "null-time-string",
        parquet(
            session_id=pa.array([1, 1]),
            item_id=pa.array([10, 11]),
            timestamp=pa.array(["2016-05-09T10:00:00Z", None]),
        ),
        ISO_TIME,
        ["'timestamp'", "missing timestamp None at row 1"],
    ),
    (
        "null-time-number",
        csv("session_id,item_id,timestamp\n1,10,100\n1,11,\n"),
        DEFAULT,
        ["'timestamp'", "missing timestamp None at row 1"],
    ),
    (
        "numeric-time-as-datetime",
        csv("session_id,item_id,timestamp\n1,10,1462752000\n"),
        ISO_TIME,
        ["'timestamp'", "1462752000 at row 0", "time_unit"],
    ),
    (
        "non-numeric-feature",
        csv("session_id,item_id,timestamp,price\n1,10,0,1.5\n1,11,1,\n1,12,2,cheap\n"),
        WITH_PRICE,
        ["'price'", "dtype string", "'cheap' at row 2"],
    ),
    (
        "nan-feature",
        parquet(
            session_id=pa.array([1, 1]),
            item_id=pa.array([10, 11]),
            timestamp=pa.array([0, 1]),
            price=pa.array([1.5, np.nan]),
        ),
        WITH_PRICE,
        ["'price'", "non-finite value nan at row 1"],
    ),
    (
        "null-feature",
        csv("session_id,item_id,timestamp,price\n1,10,0,1.5\n1,11,1,NA\n"),
        WITH_PRICE,
        ["'price'", "None at row 1"],
    ),
    (
        "column-twice",
        csv("session_id,item_id,timestamp,timestamp\n1,10,0,1462752000\n"),
        DEFAULT,
        ["column 'timestamp' appears 2 times", "['session_id', 'item_id', 'timestamp', 'timestamp']"],
    ),
    (
        "id-column-twice",
        csv("session_id,item_id,item_id,timestamp\n1,10,11,0\n"),
        DEFAULT,
        ["column 'item_id' appears 2 times"],
    ),
    ("header-only", csv("session_id,item_id,timestamp\n"), DEFAULT, ["has no rows"]),
    ("zero-bytes", ("events.csv", b""), DEFAULT, ["cannot be read as CSV", "Empty CSV file"]),
    (
        "corrupt-parquet",
        ("events.parquet", np.random.default_rng(0).bytes(256)),
        DEFAULT,
        ["cannot be read as parquet"],
    ),
    (
        "ragged-rows",
        csv("session_id,item_id,timestamp\n1,10,0\n1,11\n"),
        DEFAULT,
        ["cannot be read as CSV", "Expected 3 columns, got 2: 1,11"],
    ),
    (
        "not-gzip",
        ("events.csv.gz", b"session_id,item_id,timestamp\n1,2,3\n"),
        DEFAULT,
        ["cannot be read as CSV"],
    ),
]


@pytest.mark.parametrize(
    "spec, schema, pieces", [case[1:] for case in BAD_INPUTS], ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_input_names_file_column_and_value(tmp_path, spec, schema, pieces):
    path = write(tmp_path, spec)
    with pytest.raises(SchemaError) as err:
        read_events(path, schema)
    assert isinstance(err.value, ValueError)
    message = str(err.value)
    assert message.startswith(f"{path}:")
    for piece in pieces:
        assert piece in message


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        read_events(tmp_path / "nope.csv", DEFAULT)


def test_good_csv_is_normalized(tmp_path):
    path = write(tmp_path, csv("session_id;item_id;timestamp;price;shop\n7;10;1500;2;a\n7;11;2500;3.5;b\n"))
    table = read_events(
        path, Schema(time_unit="ms", features=[FeatureSpec("price", "continuous"), FeatureSpec("shop")])
    )
    assert table.schema.names == ["session_id", "item_id", "timestamp", "price", "shop"]
    assert table.schema.types == [pa.int64(), pa.int64(), pa.float64(), pa.float64(), pa.string()]
    assert table.to_pydict() == {
        "session_id": [7, 7],
        "item_id": [10, 11],
        "timestamp": [1.5, 2.5],
        "price": [2.0, 3.5],
        "shop": ["a", "b"],
    }


def test_iso_strings_keep_fractional_seconds(tmp_path):
    # YOOCHOOSE's raw clicks: session 1 at 10:51:09.277Z and 10:54:46.998Z (see rsc15_100k/SOURCE.md)
    path = write(
        tmp_path,
        csv(
            "session_id,item_id,timestamp\n"
            "1,214536502,2014-04-07T10:51:09.277Z\n"
            "1,214536506,2014-04-07T10:54:46.998Z\n"
            "2,214577561,2014-04-07 13:56:37.6+00:00\n"
            "2,214662742,2014-04-07\n"
        ),
    )
    times = read_events(path, ISO_TIME)["timestamp"].to_numpy()
    day = datetime(2014, 4, 7, tzinfo=timezone.utc).timestamp()
    np.testing.assert_allclose(
        times,
        [
            day + 10 * 3600 + 51 * 60 + 9.277,
            day + 10 * 3600 + 54 * 60 + 46.998,
            day + 13 * 3600 + 56 * 60 + 37.6,
            day,
        ],
        rtol=0,
        atol=1e-6,
    )


def assert_iso_times_read_alike(tmp_path, stamps: list[str], expected: list[float]) -> None:
    """Four events whose times are the text `stamps` read as `expected` seconds from a CSV file and from a parquet
    text column alike."""
    text = write(tmp_path, parquet(session_id=pa.array([1, 1, 2, 2]), item_id=pa.array([5, 6, 7, 8]),
                                   timestamp=pa.array(stamps)))
    lines = write(tmp_path, csv("session_id,item_id,timestamp\n" + "".join(
        f"{s},{i},{t}\n" for s, i, t in zip([1, 1, 2, 2], [5, 6, 7, 8], stamps))))
    for path in (lines, text):
        np.testing.assert_allclose(read_events(path, ISO_TIME)["timestamp"].to_numpy(), expected, rtol=0, atol=1e-6)


def test_iso_strings_with_utc_offsets_read_as_utc_alike_from_csv_and_parquet_text(tmp_path):
    """``10:51:09+02:00`` is 08:51:09Z: a parquet text column reads it so, as a CSV file does (Arrow parses the offsets
    of a CSV column itself); fractions of seconds kept, ``Z`` and ``+00:00`` as before."""
    stamps = ["2014-04-07T10:51:09+02:00", "2014-04-07T10:54:46.998-01:30", "2014-04-07 13:56:37+0530",
              "2014-04-07T13:56:38.5Z"]
    day = datetime(2014, 4, 7, tzinfo=timezone.utc).timestamp()
    expected = [day + 8 * 3600 + 51 * 60 + 9, day + 12 * 3600 + 24 * 60 + 46.998, day + 8 * 3600 + 26 * 60 + 37,
                day + 13 * 3600 + 56 * 60 + 38.5]
    assert_iso_times_read_alike(tmp_path, stamps, expected)


def test_iso_strings_to_the_minute_or_hour_read_alike_from_csv_and_parquet_text(tmp_path):
    """The ISO-8601 forms Arrow's CSV reader takes (a time to the minute or the hour, an offset of hours) are read
    from a parquet text column too, to the same times."""
    stamps = ["2014-04-07T10:51", "2014-04-07 11", "2014-04-07T12:00:00+01", "2014-04-07T13:30-00:30"]
    day = datetime(2014, 4, 7, tzinfo=timezone.utc).timestamp()
    expected = [day + 10 * 3600 + 51 * 60, day + 11 * 3600, day + 11 * 3600, day + 14 * 3600]
    assert_iso_times_read_alike(tmp_path, stamps, expected)


@pytest.mark.parametrize(
    "column, unit, expected",
    [
        (pa.array([1_500, 2_000], pa.int64()), "ms", [1.5, 2.0]),
        (pa.array([1_500_000, 2_000_000], pa.int64()), "us", [1.5, 2.0]),
        (pa.array([1.5e18, 2e18]), "ns", [1.5e9, 2e9]),
        (pa.array([0, 1_500_000], pa.timestamp("us", tz="Europe/Berlin")), "datetime", [0.0, 1.5]),
        (pa.array([0, 1], pa.date32()), "datetime", [0.0, 86_400.0]),
        (pa.array([1_500_000_001, 2_000_000_000], pa.timestamp("ns")), "datetime", [1.500000001, 2.0]),  # below a us
        (pa.array([86_400_000, 0], pa.date64()), "datetime", [86_400.0, 0.0]),
    ],
)
def test_time_units_to_seconds(tmp_path, column, unit, expected):
    path = write(tmp_path, parquet(session_id=pa.array([1, 1]), item_id=pa.array([3, 4]), timestamp=column))
    np.testing.assert_allclose(read_events(path, Schema(time_unit=unit))["timestamp"].to_numpy(), expected, rtol=1e-15,
                               atol=0)


def test_dictionary_and_string_ids(tmp_path):
    items = pa.array(["x", "y", "x"]).dictionary_encode()
    path = write(
        tmp_path,
        parquet(session_id=pa.array(["s1", "s1", "s2"]), item_id=items, timestamp=pa.array([0, 1, 2])),
    )
    table = read_events(path, DEFAULT)
    assert table.schema.types[:2] == [pa.string(), pa.string()]
    assert table["item_id"].to_pylist() == ["x", "y", "x"]


def test_validate_without_file_names_table():
    with pytest.raises(SchemaError, match=r"^<table>: column 'item_id' has a negative id -1 at row 0"):
        Schema(timestamp=None).validate(pa.table({"session_id": [1], "item_id": [-1]}))
