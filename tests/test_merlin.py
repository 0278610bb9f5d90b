"""`MerlinSource`: a Merlin / NVTabular dataset directory read by its schema's tags.

Two kinds of fixtures (tests/fixtures/merlin/README.md): directories written by merlin-core, NVTabular and
Transformers4Rec themselves (``make_fixtures.py``; the expected values below are read off their parquet files),
and files copied from the T4R and merlin-models wheels. The small directories built here by hand test the
split rules and the refusals.
"""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.data import MerlinSource, SchemaError, read_merlin_schema
from sessrec.data.merlin import MerlinColumn, merlin_tags
from sessrec.data.side import SideFeatures
from sessrec.features import SideFeatureTransform

torch.set_num_threads(1)
FIXTURES = Path(__file__).parent / "fixtures" / "merlin"
SEQUENCE = FIXTURES / "sequence_testing"  # transformers4rec 23.12's tabular_sequence_testing_data
BOOKING = FIXTURES / "booking_transformed_schema.pbtxt"  # merlin-models 23.12's Booking.com schema
TUTORIAL = FIXTURES / "t4r_tutorial"  # NVTabular 23.8: T4R's getting-started ETL, two part files
DAYS = FIXTURES / "t4r_day_folders"  # the same ETL cut into T4R's day folders, schema.pbtxt only
SYNTHETIC = FIXTURES / "synthetic_parts"  # merlin-models' generate_data("sequence-testing") via merlin-core
STRINGS = FIXTURES / "string_items"  # NVTabular's Groupby of string item ids
WRITTEN = [TUTORIAL, DAYS, SYNTHETIC, STRINGS]

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
    assert from_json.item_column() == MerlinColumn("item_id-list", "INT", ("categorical", "id", "item", "list"), True, 1, 99)
    assert [c.name for c in from_json.tagged("session_id")] == ["session_id"]
    assert [c.name for c in from_json.tagged("user_id")] == ["user_id"]
    assert [c.is_list for c in from_json.columns] == [False, True, True, True, False]


def test_compound_tags_resolve_as_merlin_resolves_them():
    """merlin-core's TagSet: its tags in lower case, item_id = item + id; select_by_tag(ITEM_ID) needs both parts."""
    assert merlin_tags(["ITEM_ID", "list", "MyTag"]) == ("item", "id", "list", "MyTag")
    assert merlin_tags(["item", "id", "item_id"]) == ("item", "id")
    assert MerlinColumn("a", tags=("item", "id")).has("item_id") and MerlinColumn("a", tags=("item", "id")).has("item")
    assert not MerlinColumn("b", tags=("user", "id")).has("item_id")
    assert not MerlinColumn("c", tags=("item", "categorical")).has("item_id")


def test_the_shipped_t4r_schema_reads_alike_as_json_and_pbtxt():
    """T4R's shipped schema.json, and its text form as merlin-core writes it."""
    from_json = read_merlin_schema(SEQUENCE / "schema.json")
    from_pbtxt = read_merlin_schema(SEQUENCE / "schema.pbtxt")
    assert from_json.columns == from_pbtxt.columns
    assert len(from_json.columns) == 14
    assert from_json.item_column() == MerlinColumn("item_id/list", "INT", ("categorical", "id", "item", "list"), True, 1, 51996)
    assert [c.name for c in from_json.tagged("continuous") if c.is_list][:2] == [
        "timestamp/age_days/LogOp/Normalize/list", "timestamp/hour/list"]


def test_the_shipped_nvtabular_pbtxt_reads_with_its_any_values():
    """merlin-models' Booking.com schema: NVTabular's text form, ``extra_metadata`` as ``type_url`` + bytes."""
    schema = read_merlin_schema(BOOKING)
    assert schema.item_column() == MerlinColumn("city_id", "INT", ("categorical", "id", "item"), True, None, 39902)
    assert [c.name for c in schema.tagged("session_id")] == ["session_id"]
    assert [c.name for c in schema.columns if c.is_list and c.has("categorical")] == [
        "booker_country", "hotel_country", "month", "is_weekend", "weekday_checkin", "weekday_checkout", "city_id"]


def test_merlin_core_json_and_its_pbtxt_any_form_read_alike():
    """What merlin-core 23.8 writes beside a workflow's output: ``.merlin/schema.json`` (``extraMetadata`` as bare
    Struct values) and ``schema.pbtxt`` (``[type.googleapis.com/google.protobuf.Struct] { ... }``)."""
    assert "[type.googleapis.com/google.protobuf.Struct]" in (TUTORIAL / "schema.pbtxt").read_text()
    from_json = read_merlin_schema(TUTORIAL / ".merlin" / "schema.json")
    assert from_json.columns == read_merlin_schema(TUTORIAL / "schema.pbtxt").columns
    assert from_json.columns == read_merlin_schema(DAYS / "schema.pbtxt").columns
    assert [(c.name, c.dtype, c.tags, c.is_list) for c in from_json.columns] == [
        ("session_id", "INT", (), False),
        ("day-first", "INT", ("categorical",), False),
        ("item_id-list", "INT", ("categorical", "id", "item", "list"), True),
        ("category-list", "INT", ("categorical", "list"), True),
        ("age_days-list", "FLOAT", ("continuous", "list"), True),
        ("weekday_sin-list", "FLOAT", ("continuous", "list"), True),
    ]
    assert from_json.item_column().int_max == 42  # Categorify's largest id
    synthetic = read_merlin_schema(SYNTHETIC / ".merlin" / "schema.json")
    assert synthetic.item_column().name == "item_id_seq" and [c.name for c in synthetic.tagged("user_id")] == ["test_user_id"]
    assert synthetic.columns == read_merlin_schema(SYNTHETIC / "schema.pbtxt").columns


def test_the_schema_files_are_read_in_merlin_cores_order(tmp_path):
    """``.merlin/schema.json`` first (the others may be stale), then ``schema.json``, then ``schema.pbtxt``."""
    path = tmp_path / "data"
    shutil.copytree(TUTORIAL, path)
    (path / "schema.pbtxt").write_text("not a schema")
    assert MerlinSource(str(path)).schema().path == str(path / ".merlin" / "schema.json")
    shutil.rmtree(path / ".merlin")
    (path / "schema.json").write_text(json.dumps(SCHEMA_JSON))
    assert MerlinSource(str(path)).schema().path == str(path / "schema.json")
    (path / "schema.json").unlink()
    shutil.copy(TUTORIAL / "schema.pbtxt", path / "schema.pbtxt")
    assert MerlinSource(str(path)).schema().item_column().name == "item_id-list"


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
    """T4R's day folders: ``<day>/train.parquet`` ... read in day order (2 before 10); the last day's test files
    are the test set, the earlier days' held-out files train (they precede it), validation the latest training."""
    path = directory(tmp_path, {
        "10/train.parquet": sessions(100, [[1, 2]]),
        "2/train.parquet": sessions(20, [[3, 4]]),
        "2/valid.parquet": sessions(21, [[5, 6]]),
        "2/test.parquet": sessions(22, [[7, 8]]),
        "10/test.parquet": sessions(101, [[9, 10]]),
    }, schema="json")
    source = MerlinSource(str(path), features=["price-list"], valid_fraction=0.25)
    assert {k: [p.relative_to(path).as_posix() for p in v] for k, v in source.files().items()} == {
        "train": ["2/test.parquet", "2/train.parquet", "2/valid.parquet", "10/train.parquet"], "test": ["10/test.parquet"]}
    splits = source.load()
    assert splits.train.column_names == ["session_id", "item_id", "price-list"]
    assert rows(splits.train, "session_id", "item_id") == [(22, [7, 8]), (20, [3, 4]), (21, [5, 6])]
    assert rows(splits.valid, "session_id") == [(100,)]
    assert rows(splits.test, "session_id", "item_id") == [(101, [9, 10])]


def test_the_last_days_valid_files_validate_when_it_has_test_files(tmp_path):
    path = directory(tmp_path, {
        "1/train.parquet": sessions(10, [[1, 2]]),
        "1/valid.parquet": sessions(11, [[3, 4]]),
        "2/train.parquet": sessions(20, [[5, 6]]),
        "2/valid.parquet": sessions(21, [[7, 8]]),
        "2/test.parquet": sessions(22, [[9, 10]]),
    })
    splits = MerlinSource(str(path)).load()
    assert [rows(s, "session_id") for s in (splits.train, splits.valid, splits.test)] == [[(10,), (11,), (20,)], [(21,)], [(22,)]]
    no_test = directory(tmp_path / "no_test", {
        "1/train.parquet": sessions(10, [[1, 2]]),
        "1/valid.parquet": sessions(11, [[3, 4]]),
        "2/train.parquet": sessions(20, [[5, 6]]),
        "2/valid.parquet": sessions(21, [[7, 8]]),
    })
    splits = MerlinSource(str(no_test), valid_fraction=0.34).load()  # day 2's valid files are the test set
    assert [rows(s, "session_id") for s in (splits.train, splits.valid, splits.test)] == [[(10,), (11,)], [(20,)], [(21,)]]


@pytest.mark.parametrize("parts, message", [
    ({"1/train.parquet": [[1, 2]], "1/test.parquet": [[3, 4]], "2/train.parquet": [[5, 6]]},
     "the last day folder 2 has no valid or test files"),
    ({"1/train.parquet": [[1, 2]], "1/valid.parquet": [[3, 4]], "test/part_0.parquet": [[5, 6]]},
     "is in day folder 1 while"),
])
def test_day_folders_without_a_last_held_out_day_are_refused(tmp_path, parts, message):
    path = directory(tmp_path, {rel: sessions(10 * i, items) for i, (rel, items) in enumerate(parts.items())})
    with pytest.raises(SchemaError, match=message) as err:
        MerlinSource(str(path)).load()
    assert "\n" not in str(err.value) and str(path) in str(err.value)


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


# -- directories written by merlin-core / NVTabular / T4R ---------------------------------------


def test_the_t4r_tutorial_output():
    """NVTabular's two part files: 200 sessions in file order (no session_id tag: row numbers), split 160 / 20 / 20;
    ListSlice's doubles read as int64 ids, its padding (0) dropped with the side values; normalised ages kept."""
    source = MerlinSource(str(TUTORIAL))
    assert [p.name for p in source.files()["all"]] == ["part_0.parquet", "part_1.parquet"]
    assert pq.read_schema(TUTORIAL / "part_0.parquet").field("item_id-list").type == pa.list_(pa.field("element", pa.float64()))
    splits = source.load()
    assert splits.summary() == {"train_sessions": 160, "train_events": 934, "valid_sessions": 20,
                                "valid_events": 118, "test_sessions": 20, "test_events": 127}
    assert splits.train.column_names == ["session_id", "item_id", "category-list", "age_days-list", "weekday_sin-list"]
    assert splits.train.schema.field("item_id").type == pa.list_(pa.int64())
    assert rows(splits.train.slice(1, 1), "session_id", "item_id", "category-list") == [
        (1, [22, 16, 12, 4, 6, 21, 17], [6, 5, 6, 4, 4, 6, 6])]  # part_0 row 1: [22.0, ..., 17.0, 0.0]
    assert rows(splits.test.slice(0, 1), "session_id", "item_id") == [(180, [4, 26, 37, 6, 26, 27, 34, 37])]  # part_1 row 80
    assert splits.train.column("age_days-list")[1].as_py()[:2] == pytest.approx([-0.5050210, -1.7811394])
    side = source.side_features()
    assert side.categorical == ["category-list"] and side.continuous == ["age_days-list", "weekday_sin-list"]
    chosen = MerlinSource(str(TUTORIAL), item_column="item_id-list").load()  # the item + id column, named
    assert chosen.test.column("item_id").equals(splits.test.column("item_id"))


def test_the_t4r_day_folders():
    """T4R's day folders (1/, 2/, 3/: train, valid, test), read in day order with the schema.pbtxt beside them: day 3's
    test files are the test set and its valid files validate; days 1 and 2's held-out files train, so no test session
    is from an earlier day than a training session."""
    source = MerlinSource(str(DAYS))
    files = source.files()
    assert {k: [p.relative_to(DAYS).as_posix() for p in v] for k, v in files.items()} == {
        "train": [f"{day}/{split}.parquet" for day in (1, 2) for split in ("test", "train", "valid")] + ["3/train.parquet"],
        "valid": ["3/valid.parquet"], "test": ["3/test.parquet"]}
    day = {split: {d for p in paths for d in pq.read_table(p, columns=["day-first"]).column(0).to_pylist()} for split, paths in files.items()}
    assert max(day["train"]) <= min(day["test"]) == 3
    assert source.schema().path == str(DAYS / "schema.pbtxt")
    splits = source.load()
    assert splits.summary() == {"train_sessions": 190, "train_events": 1111, "valid_sessions": 6,
                                "valid_events": 31, "test_sessions": 4, "test_events": 24}
    assert rows(splits.test.slice(0, 2), "item_id") == [([33, 9, 5, 18, 22, 3, 19, 24],), ([28, 25, 35, 32, 31, 29, 17, 24],)]
    assert splits.test.column("category-list")[0].as_py() == [3, 4, 3, 3, 5, 3, 4, 4]


def test_generate_data_written_by_merlin_core():
    """merlin-models' generate_data("sequence-testing"): items are ``item_id_seq`` (categorical + item + id), per-user
    columns (``test_user_id`` tagged user_id, ``user_country``, ``user_age``) are not read."""
    source = MerlinSource(str(SYNTHETIC))
    splits = source.load()
    assert splits.summary() == {"train_sessions": 32, "train_events": 128, "valid_sessions": 4,
                                "valid_events": 16, "test_sessions": 4, "test_events": 16}
    assert rows(splits.test.slice(0, 1), "session_id", "item_id", "categories") == [(36, [7, 13, 19, 29], [66, 83, 90, 102])]
    side = source.side_features()
    assert side.categorical == ["categories"]
    assert side.continuous == ["item_age_days_norm", "event_hour_sin", "event_hour_cos", "event_weekday_sin", "event_weekday_cos"]


def test_string_item_ids_are_read_and_encoded():
    """NVTabular's Groupby of string ids (no Categorify): the session key tagged session (+ id) is the session id,
    the strings are the items; no padding is looked for among strings; the vocabulary maps them."""
    from sessrec.data.vocab import ItemVocab

    splits = MerlinSource(str(STRINGS)).load()
    assert splits.summary()["train_sessions"] == 160 and splits.test.num_rows == 20
    assert rows(splits.test.slice(0, 1), "session_id", "item_id") == [(1180, ["sku-22", "sku-23", "sku-24", "sku-25", "sku-26", "sku-27"])]
    vocab = ItemVocab.fit(splits.train.column("item_id").combine_chunks().flatten())
    assert len(vocab.raw_ids) == 40 and vocab.decode(vocab.encode(pa.array(["sku-22", "sku-7"])).ids).to_pylist() == ["sku-22", "sku-7"]


def test_normalised_continuous_features_are_used_as_given():
    """NVTabular's Normalize writes negative values: log-normalisation refuses them with a hint, ``normalized`` takes them."""
    splits = MerlinSource(str(TUTORIAL)).load()
    with pytest.raises(SchemaError, match=r"column 'age_days-list' has a negative value -2.02\d* at event 0 of session 0; .*side_features.normalized"):
        SideFeatureTransform(SideFeatures(continuous=["age_days-list"])).fit(splits.train)
    side = SideFeatures(categorical=["category-list"], continuous=["age_days-list", "weekday_sin-list"],
                        normalized=["age_days-list", "weekday_sin-list"])
    features = SideFeatureTransform(side).fit(splits.train).transform(splits.test)
    for name in side.normalized:
        flat = np.concatenate([np.asarray(a) for a in splits.test.column(name).to_pylist()])
        assert len(flat) == 127 and flat.min() < 0
        np.testing.assert_array_equal(features[name], flat.astype(np.float32))
    # categories 4, 4, 6, 4, 4, 3, 6, 6; training counts 3: 248, 4: 246, 5: 208, 6: 205, 7: 27 give ids 2, 3, 4, 5, 6
    assert features["category-list"][:8].tolist() == [3, 3, 5, 3, 3, 2, 5, 5]
    with pytest.raises(ValueError, match=r"normalized names 'price', which is not a continuous side feature"):
        SideFeatures(continuous=["age_days-list"], normalized=["price"])


def copy_with(tmp_path: Path, source: Path, rel: str, column: str, values: pa.Array) -> Path:
    """A copy of a fixture directory whose file `rel` has `column` replaced."""
    path = tmp_path / source.name
    shutil.copytree(source, path)
    table = pq.read_table(path / rel)
    pq.write_table(table.set_column(table.column_names.index(column), column, values), path / rel)
    return path


@pytest.mark.parametrize("column", ["item_id-list", "category-list"])
def test_a_non_integer_double_in_an_int_column_is_refused(tmp_path, column):
    table = pq.read_table(TUTORIAL / "part_1.parquet")
    values = table.column(column).to_pylist()
    values[3][1] = 2.5
    path = copy_with(tmp_path, TUTORIAL, "part_1.parquet", column, pa.array(values))
    with pytest.raises(SchemaError) as err:
        MerlinSource(str(path)).load()
    assert str(err.value) == (f"{path / 'part_1.parquet'}: column {column!r} holds 2.5, not an integer, where "
                              f"{path / '.merlin' / 'schema.json'} declares it INT; write integer codes (e.g. Categorify before ListSlice)")


def test_an_int_column_written_as_doubles_past_2_53_is_refused(tmp_path):
    """2^53 + 1 is no double: ids that large, written as doubles, may have been rounded onto their neighbours."""
    values = pq.read_table(TUTORIAL / "part_1.parquet").column("item_id-list").to_pylist()
    values[3][1] = float(2**53 + 2)
    path = copy_with(tmp_path, TUTORIAL, "part_1.parquet", "item_id-list", pa.array(values))
    with pytest.raises(SchemaError) as err:
        MerlinSource(str(path)).load()
    assert str(err.value) == (f"{path / 'part_1.parquet'}: column 'item_id-list' holds 9007199254740994 as a double, where "
                              f"{path / '.merlin' / 'schema.json'} declares it INT: doubles hold every integer only below "
                              "2^53, so ids written as doubles may have been rounded onto one another; write the column as int64")


def test_a_nan_in_a_padded_int_list_is_a_missing_value(tmp_path):
    """NaN in a double list the schema declares INT: a null item is refused with its row, a null category is missing."""
    values = pq.read_table(TUTORIAL / "part_0.parquet").column("item_id-list").to_pylist()
    values[4][2] = float("nan")
    path = copy_with(tmp_path, TUTORIAL, "part_0.parquet", "item_id-list", pa.array(values))
    with pytest.raises(SchemaError, match=r"part_0.parquet: column 'item_id-list' has a null item id \(None\) in row 4; fill or drop it$"):
        MerlinSource(str(path)).load()
    categories = pq.read_table(TUTORIAL / "part_0.parquet").column("category-list").to_pylist()
    categories[1][0] = float("nan")
    path = copy_with(tmp_path / "c", TUTORIAL, "part_0.parquet", "category-list", pa.array(categories))
    assert MerlinSource(str(path)).load().train.column("category-list")[1].as_py() == [None, 5, 6, 4, 4, 6, 6]


def test_a_null_string_item_is_refused_naming_file_column_and_row(tmp_path):
    values = pq.read_table(STRINGS / "part_0.parquet").column("item_id-list").to_pylist()
    values[5][0] = None
    path = copy_with(tmp_path, STRINGS, "part_0.parquet", "item_id-list", pa.array(values))
    with pytest.raises(SchemaError, match=r"part_0.parquet: column 'item_id-list' has a null item id \(None\) in row 5; fill or drop it$"):
        MerlinSource(str(path)).load()


def test_float_item_ids_where_the_schema_says_float_are_refused(tmp_path):
    path = tmp_path / "float_items"
    shutil.copytree(TUTORIAL, path)
    text = (path / "schema.pbtxt").read_text()
    (path / "schema.pbtxt").write_text(text.replace('name: "item_id-list"\n  value_count {\n    min: 8\n    max: 8\n  }\n  type: INT', 'name: "item_id-list"\n  value_count {\n    min: 8\n    max: 8\n  }\n  type: FLOAT'))
    shutil.rmtree(path / ".merlin")
    assert read_merlin_schema(path / "schema.pbtxt").item_column().dtype == "FLOAT"
    with pytest.raises(SchemaError, match=r"part_0.parquet: column 'item_id-list' holds double item ids \(e.g. 42.0\); item ids are integers or strings"):
        MerlinSource(str(path)).load()


@pytest.mark.parametrize("bad,message", [
    (None, "has a null id at row 1; drop or fill those rows"),
    (-3, "has a negative id -3 at row 1"),
    (1.5, "has dtype double, expected integer or string ids (example value 1.5 at row 1)"),
    (float("nan"), "has a missing id (NaN) at row 1; drop or fill those rows"),
])
def test_a_session_id_that_is_no_id_is_refused_naming_file_column_and_row(tmp_path, bad, message):
    """A session id column holding a null, a negative or a fraction was read as it was: sessions without an id, or with
    one that no event log's reader would give, under which their recommendations were written."""
    table = sessions(10, [[3, 4], [6, 7], [21, 22]])
    ids = pa.array([10, bad, 12], pa.float64() if isinstance(bad, float) else pa.int64())
    path = directory(tmp_path, {"train/part_0.parquet": table.set_column(0, "session_id", ids),
                                "valid/part_0.parquet": sessions(20, [[3, 21]])})
    with pytest.raises(SchemaError) as err:
        MerlinSource(str(path)).load()
    assert str(err.value) == f"{path / 'train' / 'part_0.parquet'}: column 'session_id' {message}"


def test_a_negative_item_id_is_refused_unless_it_is_the_padding(tmp_path):
    """Item -1 (a placeholder for a missing item) was trained on and recommended as an item: refused as an event log's
    reader refuses it, naming file, column and row; a source whose padding it is drops it."""
    path = directory(tmp_path, {"train/part_0.parquet": sessions(10, [[3, 4], [6, -1, 7], [21, 22]]),
                                "valid/part_0.parquet": sessions(20, [[3, 21]])})
    with pytest.raises(SchemaError) as err:
        MerlinSource(str(path)).load()
    assert str(err.value) == f"{path / 'train' / 'part_0.parquet'}: column 'item_id-list' has a negative id -1 at row 1"
    assert MerlinSource(str(path), padding_id=-1, valid_fraction=0.34).load().train.column("item_id")[1].as_py() == [6, 7]


def test_a_session_id_on_two_rows_is_refused_naming_both(tmp_path):
    """A session id on two rows (of one file, of two files of a split, or of two splits) was read as two sessions of one
    id: trained on, or tested, twice, and recommendations written twice under it. Refused naming the file(s) and rows."""
    path = directory(tmp_path / "one", {
        "train/part_0.parquet": sessions(10, [[3, 4], [6, 7], [21, 22]]).set_column(0, "session_id", pa.array([10, 11, 10])),
        "valid/part_0.parquet": sessions(20, [[3, 21]])})
    with pytest.raises(SchemaError) as err:
        MerlinSource(str(path)).load()
    assert str(err.value).startswith(
        f"{path / 'train' / 'part_0.parquet'}: column 'session_id' has session 10 in rows 0 and 2; each session needs one row")
    path = directory(tmp_path / "two", {"train/part_0.parquet": sessions(10, [[3, 4], [6, 7]]),
                                        "train/part_1.parquet": sessions(12, [[5, 6], [8, 9]]),
                                        "valid/part_0.parquet": sessions(11, [[3, 21]])})
    with pytest.raises(SchemaError) as err:
        MerlinSource(str(path)).load()
    assert str(err.value).startswith(
        f"{path / 'valid' / 'part_0.parquet'}: column 'session_id' has session 11 in row 0, "
        f"and in row 1 of {path / 'train' / 'part_0.parquet'}; each session needs one row")
    text = sessions(20, [[3, 21]]).set_column(0, "session_id", pa.array(["12"]))
    path = directory(tmp_path / "kinds", {"train/part_0.parquet": sessions(10, [[3, 4], [6, 7], [8, 9]]),
                                          "valid/part_0.parquet": text})
    with pytest.raises(SchemaError, match=r"valid/part_0.parquet: column 'session_id' has session '12' in row 0, and in row 2 of"):
        MerlinSource(str(path)).load()


# -- bad schemas: one line naming the file -------------------------------------------------------


def replace_in_pbtxt(old: str, new: str):
    def edit(path: Path) -> None:
        text = (path / "schema.pbtxt").read_text()
        assert old in text
        (path / "schema.pbtxt").write_text(text.replace(old, new, 1))
    return edit


BAD = {
    "no item_id tag": (replace_in_pbtxt('tag: "item_id" ', ""), "schema.pbtxt: no column is tagged item_id (or item + id)"),
    "item without id": (replace_in_pbtxt('tag: "item_id" ', 'tag: "item" '), "schema.pbtxt: no column is tagged item_id (or item + id)"),
    "two item_id tags": (replace_in_pbtxt('annotation { tag: "list" tag: "categorical" }', 'annotation { tag: "item_id" tag: "list" }'),
                         "schema.pbtxt: 2 columns are tagged item_id (['item_id-list', 'category-list'])"),
    "two session_id tags": (replace_in_pbtxt('tag: "user_id"', 'tag: "session_id"'), "schema.pbtxt: 2 columns are tagged session_id"),
    "tagged column missing from the parquet": (
        replace_in_pbtxt('name: "price-list"', 'name: "cost-list"'), "part.parquet: column 'cost-list', tagged in"),
    "non-list item column": (
        lambda p: pq.write_table(sessions(0, [[1, 2]]).set_column(1, "item_id-list", pa.array([1])), p / "train" / "part.parquet"),
        "part.parquet: the item_id column 'item_id-list' has dtype int64 (e.g. 1), expected a list of items per session"),
    "side feature not aligned with the items": (
        lambda p: pq.write_table(sessions(0, [[1, 2]]).set_column(2, "category-list", pa.array([[1]])), p / "train" / "part.parquet"),
        "part.parquet: side feature 'category-list' has 1 values in row 0, where 'item_id-list' has 2 items"),
    "pbtxt syntax": (replace_in_pbtxt('name: "user_id"', 'name "user_id"'), "schema.pbtxt: not a TensorFlow-Metadata schema: 27:8 : ' name \"user_id\"': Expected \":\"."),
    "pbtxt unknown field": (replace_in_pbtxt('name: "user_id"', 'name: "user_id" colour: 3'),
                            "schema.pbtxt: not a TensorFlow-Metadata schema: 27:19 : Message type \"tensorflow.metadata.v0.Feature\" has no field named \"colour\"."),
    "corrupt parquet": (lambda p: (p / "train" / "part.parquet").write_bytes(b"PAR1 not really"), "part.parquet: cannot be read as parquet"),
    "no schema": (lambda p: (p / "schema.pbtxt").unlink(), "no .merlin/schema.json, schema.json, schema.pbtxt in the directory"),
    "bad json": (lambda p: (p / "schema.json").write_text("{feature: "), "schema.json: not valid JSON (line 1"),
    "binary schema": (lambda p: (p / "schema.pbtxt").write_bytes(b"\n\x8f\x01feature"), "schema.pbtxt: not UTF-8 text (byte 1)"),
    "json of another proto": (lambda p: (p / "schema.json").write_text('{"feature": [{"name": "x", "colour": 3}]}'),
                              "schema.json: not a TensorFlow-Metadata schema: Failed to parse feature field: Message type \"tensorflow.metadata.v0.Feature\" has no field named \"colour\" at \"Schema.feature[0]\""),
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
    with pytest.raises(SchemaError, match=r"item_column 'category-list' is not tagged item_id \(or item \+ id\)"):
        MerlinSource(str(path), item_column="category-list").load()
    with pytest.raises(ValueError, match="valid_fraction"):
        MerlinSource(str(path), valid_fraction=0.5, test_fraction=0.5)


def fit(tmp_path: Path, monkeypatch, path: Path, *extra: str):
    from sessrec.cli import cli

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    return cli(["fit", "--config", str(root / "recipes/data/merlin.yaml"), "--config", str(root / "recipes/model/xlnet_mlm.yaml"),
                "--data.source.init_args.path", str(path), *extra, "--trainer.fast_dev_run", "true",
                "--trainer.enable_progress_bar", "false"])


def test_fit_with_normalised_side_features_on_the_nvtabular_output(tmp_path, monkeypatch):
    """The data fragment on the T4R tutorial's output with its tagged side features, the normalised ones as given."""
    run = fit(tmp_path, monkeypatch, TUTORIAL, "--data.side_features.categorical", "[category-list]",
              "--data.side_features.continuous", "[age_days-list, weekday_sin-list]",
              "--data.side_features.normalized", "[age_days-list, weekday_sin-list]")
    assert run.trainer.state.finished
    assert set(run.datamodule.side_info.categorical) == {"category-list"}
    assert run.datamodule.side_info.continuous == ["age_days-list", "weekday_sin-list"]
    assert np.isfinite(float(run.trainer.callback_metrics["train/loss"]))
    assert "val/recall@20" in run.trainer.callback_metrics


@pytest.mark.slow
@pytest.mark.parametrize("path", [SEQUENCE, *WRITTEN], ids=lambda p: p.name)
def test_every_fixture_directory_trains_as_written(tmp_path, monkeypatch, path):
    """``sessrec fit --config recipes/data/merlin.yaml --config recipes/model/xlnet_mlm.yaml --data.source.init_args.path <dir>``."""
    run = fit(tmp_path, monkeypatch, path)
    assert run.trainer.state.finished
    splits = MerlinSource(str(path)).load()
    assert run.datamodule.vocab.num_products == pc.count_distinct(splits.train.column("item_id").combine_chunks().flatten()).as_py()
    assert np.isfinite(float(run.trainer.callback_metrics["train/loss"]))


def test_dictionary_encoded_item_and_feature_lists_read_as_the_values_they_encode(tmp_path):
    """A pandas categorical written to parquet comes back as dictionary-encoded lists: read as their text, the same
    sessions as the plain text columns give (not refused as ids of another type)."""
    encoded = pa.list_(pa.dictionary(pa.int32(), pa.string()))

    def as_text(table: pa.Table, kind: pa.DataType) -> pa.Table:
        for name in ("item_id-list", "category-list"):
            text = [[f"{name[0]}{v}" for v in s] for s in table.column(name).to_pylist()]
            table = table.set_column(table.column_names.index(name), name, pa.array(text, kind))
        return table

    train, test = sessions(0, [[1, 2, 3], [4, 5], [6, 7, 8], [1, 4]] * 3), sessions(100, [[1, 2], [3, 4]])
    read = {kind: MerlinSource(str(directory(tmp_path / str(i), {"train/part.parquet": as_text(train, kind),
                                                                   "test/part.parquet": as_text(test, kind)}))).load()
            for i, kind in enumerate([encoded, pa.list_(pa.string())])}
    got, plain = read[encoded], read[pa.list_(pa.string())]
    assert got.train.schema.field("item_id").type == pa.list_(pa.string())
    assert got.test.column("item_id").to_pylist() == [["i1", "i2"], ["i3", "i4"]]
    assert got.test.column("category-list").to_pylist() == [["c0", "c0"], ["c0", "c0"]]
    for split in ("train", "valid", "test"):
        assert getattr(got, split).equals(getattr(plain, split))


def test_a_merlin_valid_fraction_that_rounds_to_no_session_is_refused(tmp_path):
    """valid_fraction 0.1 of 4 training sessions kept none: fit trained without validation, with exit 0."""
    path = directory(tmp_path, {"train/part.parquet": sessions(0, [[1, 2], [3, 4], [5, 6], [7, 8]]),
                                "test/part.parquet": sessions(10, [[1, 3]])})
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{path}: the validation split is empty: valid_fraction 0.1 of the 4 sessions it is cut from rounds to none; "
            "lengthen valid_fraction (0 trains without validation)") + "$"):
        MerlinSource(str(path)).load()
    assert MerlinSource(str(path), valid_fraction=0.0).load().valid.num_rows == 0
    assert MerlinSource(str(path), valid_fraction=0.25).load().valid.column("session_id").to_pylist() == [3]
