"""`MerlinSource`: a Merlin / NVTabular dataset directory read by its schema's tags.

The fixtures in tests/fixtures/merlin are copied from the transformers4rec and merlin-models wheels
(Apache-2.0, see their README); the small directories here are written by hand, their expected
sessions and side values read off the tables below.
"""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.data import MerlinSource, SchemaError, read_merlin_schema
from sessrec.data.merlin import MerlinColumn, parse_pbtxt
from sessrec.features import SideFeatureTransform

torch.set_num_threads(1)
FIXTURES = Path(__file__).parent / "fixtures" / "merlin"
SEQUENCE = FIXTURES / "sequence_testing"  # transformers4rec 23.12's tabular_sequence_testing_data
BOOKING = FIXTURES / "booking_transformed_schema.pbtxt"  # merlin-models 23.12's Booking.com schema

SCHEMA_PBTXT = """\
# a hand-written schema in NVTabular's text form
feature {
  name: "session_id"
  type: INT
  annotation { tag: "session_id" tag: "categorical" }
}
feature {
  name: "item_id-list"
  type: INT
  value_count { min: 1 max: 5 }
  int_domain { name: "item_id" min: 1 max: 99 is_categorical: true }
  annotation { tag: "item_id" tag: "list" tag: "categorical" }
}
feature {
  name: "category-list"
  type: INT
  value_count { min: 1 max: 5 }
  annotation { tag: "list" tag: "categorical" }
}
feature {
  name: "price-list"
  type: FLOAT
  value_count { min: 1 max: 5 }
  annotation { tag: "list" tag: "continuous" }
}
feature {
  name: "user_id"
  type: INT
  annotation { tag: "user_id" tag: "categorical" }
}
"""

SCHEMA_JSON = {
    "feature": [
        {"name": "session_id", "type": "INT", "annotation": {"tag": ["session_id", "categorical"]}},
        {
            "name": "item_id-list", "type": "INT", "valueCount": {"min": "1", "max": "5"},
            "intDomain": {"name": "item_id", "min": "1", "max": "99", "isCategorical": True},
            "annotation": {"tag": ["item_id", "list", "categorical"]},
        },
        {"name": "category-list", "type": "INT", "valueCount": {"min": "1", "max": "5"}, "annotation": {"tag": ["list", "categorical"]}},
        {"name": "price-list", "type": "FLOAT", "valueCount": {"min": "1", "max": "5"}, "annotation": {"tag": ["list", "continuous"]}},
        {"name": "user_id", "type": "INT", "annotation": {"tag": ["user_id", "categorical"]}},
    ]
}


def sessions(first: int, items: list[list[int]]) -> pa.Table:
    """Sessions ``first, first + 1, ...``: category = item // 10, price = item / 2, user 7."""
    return pa.table({
        "session_id": list(range(first, first + len(items))),
        "item_id-list": items,
        "category-list": [[i // 10 for i in s] for s in items],
        "price-list": pa.array([[i / 2 for i in s] for s in items], pa.list_(pa.float32())),
        "user_id": [7] * len(items),
    })


def directory(tmp_path: Path, parts: dict[str, pa.Table], schema: str = "pbtxt") -> Path:
    for rel, table in parts.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp_path / rel)
    if schema == "pbtxt":
        (tmp_path / "schema.pbtxt").write_text(SCHEMA_PBTXT)
    else:
        (tmp_path / "schema.json").write_text(json.dumps(SCHEMA_JSON))
    return tmp_path


def rows(table: pa.Table, *columns: str) -> list[tuple]:
    return list(zip(*(table.column(c).to_pylist() for c in columns)))


# -- schemas -----------------------------------------------------------------------------------


def test_pbtxt_and_json_read_to_the_same_schema(tmp_path):
    json_path, pbtxt_path = tmp_path / "schema.json", tmp_path / "schema.pbtxt"
    json_path.write_text(json.dumps(SCHEMA_JSON))
    pbtxt_path.write_text(SCHEMA_PBTXT)
    from_json, from_pbtxt = read_merlin_schema(json_path), read_merlin_schema(pbtxt_path)
    assert from_json.columns == from_pbtxt.columns
    assert from_json.item_column() == MerlinColumn("item_id-list", "INT", ("item_id", "list", "categorical"), True, 1, 99)
    assert [c.name for c in from_json.tagged("session_id")] == ["session_id"]
    assert [c.is_list for c in from_json.columns] == [False, True, True, True, False]


def test_the_shipped_t4r_schema_reads_alike_as_json_and_pbtxt():
    """T4R's shipped schema.json, and its text form as merlin-core writes it."""
    from_json = read_merlin_schema(SEQUENCE / "schema.json")
    from_pbtxt = read_merlin_schema(SEQUENCE / "schema.pbtxt")
    assert from_json.columns == from_pbtxt.columns
    assert len(from_json.columns) == 14
    assert from_json.item_column() == MerlinColumn("item_id/list", "INT", ("item_id", "list", "categorical", "item"), True, 1, 51996)
    assert [c.name for c in from_json.tagged("continuous") if c.is_list][:2] == [
        "timestamp/age_days/LogOp/Normalize/list", "timestamp/hour/list"]


def test_the_shipped_nvtabular_pbtxt_reads_with_its_escaped_metadata():
    """merlin-models' Booking.com schema: NVTabular's text form, with binary ``extra_metadata`` strings."""
    schema = read_merlin_schema(BOOKING)
    assert schema.item_column() == MerlinColumn("city_id", "INT", ("item_id", "item", "categorical", "id"), True, None, 39902)
    assert [c.name for c in schema.tagged("session_id")] == ["session_id"]
    assert [c.name for c in schema.columns if c.is_list and "categorical" in c.tags] == [
        "booker_country", "hotel_country", "month", "is_weekend", "weekday_checkin", "weekday_checkout", "city_id"]
    device = parse_pbtxt(BOOKING.read_text())["feature"][3]
    assert device["name"] == ["device_class"]
    assert device["annotation"][0]["extra_metadata"][0]["value"][0].startswith(
        "\n\x18\n\x0bstart_index\x12\t\x11\x00\x00\x00\x00\x00\x00\xf0?\n\x0f\n\tis_ragged")  # \030 \013 ... \360 in the file


def test_pbtxt_syntax():
    parsed = parse_pbtxt('a: 1 b { c: "x" "y" d: [1, 2.5, E] } b: < c: \'q\\"\\101\' > # comment\n e: true;')
    assert parsed == {"a": [1], "b": [{"c": ["xy"], "d": [1, 2.5, "E"]}, {"c": ['q"A']}], "e": ["true"]}


# -- sessions ----------------------------------------------------------------------------------


def test_train_valid_folders_split_and_side_features(tmp_path):
    """train/ and valid/ folders: valid/ is the test set, the latest training sessions validate; padding
    (item 0) is dropped with its side values, then sessions of one item."""
    path = directory(tmp_path, {
        "train/part_0.parquet": sessions(10, [[3, 4, 0, 5], [6], [21, 22]]),
        "train/part_1.parquet": sessions(13, [[31, 32, 33], [41, 0, 42]]),
        "valid/part_0.parquet": sessions(20, [[3, 21], [0, 5]]),
    })
    source = MerlinSource(str(path), valid_fraction=0.5)
    splits = source.load()
    columns = ["session_id", "item_id", "category-list", "price-list"]
    assert splits.train.column_names == columns
    assert rows(splits.train, *columns) == [(10, [3, 4, 5], [0, 0, 0], [1.5, 2.0, 2.5]), (12, [21, 22], [2, 2], [10.5, 11.0])]
    assert rows(splits.valid, *columns) == [(13, [31, 32, 33], [3, 3, 3], [15.5, 16.0, 16.5]), (14, [41, 42], [4, 4], [20.5, 21.0])]
    assert rows(splits.test, "session_id", "item_id") == [(20, [3, 21])]
    side = source.side_features(min_count=1)
    assert side.categorical == ["category-list"] and side.continuous == ["price-list"]
    features = SideFeatureTransform(side).fit(splits.train).transform(splits.test)
    assert features["category-list"].tolist()[0] == SideFeatureTransform(side).fit(splits.train).transform(splits.train)["category-list"].tolist()[0]
    assert features["price-list"].shape == (2,)


def test_test_folder_and_day_folders(tmp_path):
    """T4R's day folders: ``<day>/train.parquet`` ... read in day order (2 before 10)."""
    path = directory(tmp_path, {
        "10/train.parquet": sessions(100, [[1, 2]]),
        "2/train.parquet": sessions(20, [[3, 4]]),
        "2/valid.parquet": sessions(21, [[5, 6]]),
        "2/test.parquet": sessions(22, [[7, 8]]),
        "10/test.parquet": sessions(101, [[9, 10]]),
    }, schema="json")
    source = MerlinSource(str(path), features=["price-list"])
    assert {k: [p.relative_to(path).as_posix() for p in v] for k, v in source.files().items()} == {
        "train": ["2/train.parquet", "10/train.parquet"], "valid": ["2/valid.parquet"],
        "test": ["2/test.parquet", "10/test.parquet"]}
    splits = source.load()
    assert splits.train.column_names == ["session_id", "item_id", "price-list"]
    assert rows(splits.train, "session_id", "item_id") == [(20, [3, 4]), (100, [1, 2])]
    assert rows(splits.valid, "session_id") == [(21,)]
    assert rows(splits.test, "session_id", "item_id") == [(22, [7, 8]), (101, [9, 10])]


def test_a_directory_without_a_split_is_split_at_its_end(tmp_path):
    path = directory(tmp_path, {"data.parquet": sessions(0, [[i, i + 1] for i in range(1, 11)])})
    splits = MerlinSource(str(path), valid_fraction=0.2, test_fraction=0.3).load()
    assert [splits.train.num_rows, splits.valid.num_rows, splits.test.num_rows] == [5, 2, 3]
    assert splits.valid.column("session_id").to_pylist() == [5, 6]
    assert splits.test.column("item_id").to_pylist() == [[8, 9], [9, 10], [10, 11]]


def test_the_shipped_t4r_dataset():
    """T4R's 1,000 sessions (no session_id tag: row numbers), split 800 / 100 / 100 in file order."""
    source = MerlinSource(str(SEQUENCE))
    splits = source.load()
    assert splits.summary() == {"train_sessions": 800, "train_events": 3041, "valid_sessions": 100,
                                "valid_events": 455, "test_sessions": 100, "test_events": 430}
    raw = pq.read_table(SEQUENCE / "data.parquet", columns=["item_id/list", "category/list"])
    assert splits.test.column("session_id")[0].as_py() == 900
    assert splits.test.column("item_id")[0].as_py() == raw.column("item_id/list")[900].as_py() == [5684, 15449, 26069, 39281, 26069]
    assert splits.test.column("category/list")[0].as_py() == raw.column("category/list")[900].as_py()
    side = source.side_features()
    assert side.categorical == ["category/list"] and len(side.continuous) == 10


# -- bad schemas: one line naming the file -------------------------------------------------------


def replace_in_pbtxt(old: str, new: str):
    def edit(path: Path) -> None:
        text = (path / "schema.pbtxt").read_text()
        assert old in text
        (path / "schema.pbtxt").write_text(text.replace(old, new, 1))
    return edit


BAD = {
    "no item_id tag": (replace_in_pbtxt('tag: "item_id" ', ""), "schema.pbtxt: no column is tagged item_id"),
    "two item_id tags": (replace_in_pbtxt('annotation { tag: "list" tag: "categorical" }', 'annotation { tag: "item_id" tag: "list" }'),
                         "schema.pbtxt: 2 columns are tagged item_id (['item_id-list', 'category-list'])"),
    "two session_id tags": (replace_in_pbtxt('tag: "user_id"', 'tag: "session_id"'), "schema.pbtxt: 2 columns are tagged session_id"),
    "tagged column missing from the parquet": (
        replace_in_pbtxt('name: "price-list"', 'name: "cost-list"'), "part.parquet: column 'cost-list', tagged in"),
    "non-list item column": (
        lambda p: pq.write_table(sessions(0, [[1, 2]]).set_column(1, "item_id-list", pa.array([1])), p / "train" / "part.parquet"),
        "part.parquet: the item_id column 'item_id-list' has dtype int64, expected a list of items per session"),
    "side feature not aligned with the items": (
        lambda p: pq.write_table(sessions(0, [[1, 2]]).set_column(2, "category-list", pa.array([[1]])), p / "train" / "part.parquet"),
        "part.parquet: side feature 'category-list' has 1 values in row 0, where 'item_id-list' has 2 items"),
    "pbtxt syntax": (replace_in_pbtxt('name: "user_id"', 'name "user_id"'), "schema.pbtxt:27: expected ':' or '{' after 'name', got '\"user_id\"'"),
    "corrupt parquet": (lambda p: (p / "train" / "part.parquet").write_bytes(b"PAR1 not really"), "part.parquet: cannot be read as parquet"),
    "no schema": (lambda p: (p / "schema.pbtxt").unlink(), "no schema.json or schema.pbtxt in the directory"),
    "bad json": (lambda p: (p / "schema.json").write_text("{feature: "), "schema.json: not valid JSON (line 1"),
    "no parquet": (lambda p: [f.unlink() for f in p.rglob("*.parquet")], "no parquet file in the dataset directory"),
    "no held-out files": (lambda p: (p / "valid" / "part.parquet").unlink(), "training files but no valid or test files"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_schema_gets_one_line(tmp_path, case):
    edit, message = BAD[case]
    path = directory(tmp_path, {"train/part.parquet": sessions(0, [[1, 2]]), "valid/part.parquet": sessions(5, [[3, 4]])})
    edit(path)
    with pytest.raises((SchemaError, FileNotFoundError)) as err:
        MerlinSource(str(path)).load()
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert str(path) in str(err.value)


def test_unknown_feature_and_item_column_are_named(tmp_path):
    path = directory(tmp_path, {"train/part.parquet": sessions(0, [[1, 2]]), "valid/part.parquet": sessions(5, [[3, 4]])})
    with pytest.raises(SchemaError, match=r"feature 'color' is not in the schema"):
        MerlinSource(str(path), features=["color"]).load()
    with pytest.raises(SchemaError, match=r"item_column 'category-list' is not tagged item_id"):
        MerlinSource(str(path), item_column="category-list").load()
    with pytest.raises(ValueError, match="valid_fraction"):
        MerlinSource(str(path), valid_fraction=0.5, test_fraction=0.5)


def test_fit_with_side_features_on_the_t4r_data(tmp_path, monkeypatch):
    """The data fragment with the tagged side features, one training and one validation batch."""
    from sessrec.cli import cli

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    run = cli(["fit", "--config", str(root / "recipes/data/merlin.yaml"), "--config", str(root / "recipes/model/xlnet_mlm.yaml"),
               "--data.source.init_args.path", str(SEQUENCE), "--data.side_features.categorical", "[category/list]",
               "--data.side_features.continuous", "[timestamp/hour/sin/list]", "--trainer.fast_dev_run", "true",
               "--trainer.enable_progress_bar", "false"])
    assert run.trainer.state.finished
    assert set(run.datamodule.side_info.categorical) == {"category/list"}
    assert np.isfinite(float(run.trainer.callback_metrics["train/loss"]))
    assert "val/recall@20" in run.trainer.callback_metrics
