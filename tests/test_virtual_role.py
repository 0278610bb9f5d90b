"""The schema's virtual role (`VirtualSpec`): non-product events of any log kept as virtual items, or dropped with
the same sessions, split and evaluation pairs; honoured by `EventLogSource`, the synthetic source and Merlin's."""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from sessrec.data import (
    EventLogSource,
    FeatureSpec,
    MerlinSource,
    Schema,
    SchemaError,
    SyntheticSource,
    VirtualSpec,
    frame,
)
from sessrec.data.readers import read_events

ROLE = VirtualSpec("kind", ["search", "filter"], key=["kind", "page"])
SCHEMA = Schema(virtual=ROLE)


def log() -> pa.Table:
    """Four sessions: 1 ends with a search long after its last product, 2 has one product, 3 a filter in between."""
    return pa.table({
        "session_id": [1, 1, 1, 2, 2, 3, 3, 3, 4, 4],
        "item_id": [10, 11, None, 12, 7, 13, 99, 14, 15, 16],
        "timestamp": [100.0, 200.0, 9000.0, 300.0, 310.0, 400.0, 500.0, 600.0, 50.0, 60.0],
        "kind": ["product", "product", "search", "product", "search", "product", "filter", "product", "product", "product"],
        "page": [None, None, "paris", None, "rome", None, "4 stars", None, None, None],
    })


def test_validate_keys_the_marked_events_and_checks_only_the_products():
    events = SCHEMA.validate(log(), source="log.csv")
    assert events.column_names == ["session_id", "item_id", "timestamp", "virtual"]
    assert events.column("item_id").to_pylist() == ["10", "11", "search:paris", "12", "search:rome", "13",
                                                     "filter:4 stars", "14", "15", "16"]
    assert events.column("virtual").to_pylist() == [False, False, True, False, True, False, True, False, False, False]
    dropped = replace(SCHEMA, virtual=replace(ROLE, keep=False)).validate(log(), source="log.csv")
    assert dropped.column("item_id").to_pylist() == [10, 11, None, 12, None, 13, None, 14, 15, 16]  # the products' type
    alone = Schema(virtual=VirtualSpec("kind", ["search"])).validate(log(), source="log.csv")
    assert alone.column("item_id").to_pylist()[2] == "search"  # keyed by the marking column alone
    bad = log().set_column(1, "item_id", pa.array([10, 11, None, 12, 7, None, 99, 14, 15, 16]))
    with pytest.raises(SchemaError, match=r"^log.csv: column 'item_id' has a null id at row 5, where column 'kind' holds "
                                          r"'product', not one of virtual.values \['search', 'filter'\]; list that value"):
        SCHEMA.validate(bad, source="log.csv")
    negative = log().set_column(1, "item_id", pa.array([10, 11, None, 12, 7, 13, 99, -3, 15, 16]))
    with pytest.raises(SchemaError, match=r"^log.csv: column 'item_id' has a negative id -3 at row 7$"):  # the file's row
        SCHEMA.validate(negative, source="log.csv")


def test_bad_settings_are_refused_in_one_line_naming_file_column_and_value(tmp_path):
    with pytest.raises(SchemaError, match=r"^log.csv: column 'kind' is missing; the file has columns \['session_id', "):
        SCHEMA.validate(log().drop_columns(["kind"]), source="log.csv")
    listed = log().set_column(3, "kind", pa.array([[v] for v in log().column("kind").to_pylist()]))
    with pytest.raises(SchemaError, match=r"^log.csv: column 'kind' has dtype list<item: string>, which cannot mark"):
        SCHEMA.validate(listed, source="log.csv")
    with pytest.raises(ValueError, match=r"features\[0\] column is named 'virtual'"):
        Schema(features=[FeatureSpec("virtual")], virtual=ROLE)
    with pytest.raises(ValueError, match="VirtualSpec: values must name at least one value of column 'kind'"):
        VirtualSpec("kind", [])
    path = tmp_path / "log.csv"
    pacsv.write_csv(log(), path)
    typo = replace(SCHEMA, virtual=replace(ROLE, values=["serch"]))
    with pytest.raises(SchemaError, match=r"log.csv: column 'item_id' has a missing id '' at row 2, where column 'kind' holds "
                                          r"'search', not one of virtual.values \['serch'\]; .*$"):
        EventLogSource(str(path), schema=typo, test_fraction=0.3, valid_fraction=0.3).load()
    pacsv.write_csv(log().set_column(1, "item_id", pa.array(range(10))), path)
    with pytest.raises(ValueError, match=r"log.csv: column 'kind' never holds a value of the schema's virtual.values \['serch'\]"):
        EventLogSource(str(path), schema=typo, test_fraction=0.3, valid_fraction=0.3).load()
    every = replace(SCHEMA, virtual=replace(ROLE, values=["product", "search", "filter"]))
    with pytest.raises(ValueError, match=r"log.csv: every event is virtual \(column 'kind' holds one of .* on all 10 rows\)"):
        EventLogSource(str(path), schema=every, test_fraction=0.3, valid_fraction=0.3).load()


@pytest.mark.parametrize("marker", ["NA", ""])
def test_a_missing_product_id_of_a_csv_file_is_named_by_its_field_text_by_every_reader(tmp_path, marker):
    """An unmarked event's missing id was refused as "a null id", without the field's text that the other
    refusals of a missing id name."""
    from sessrec.data import ItemVocab, ScoringStream
    from sessrec.data.prepared import prepare
    from sessrec.data.readers import scan_events

    path = tmp_path / "log.csv"
    pacsv.write_csv(log().set_column(1, "item_id", pa.array([10, 11, None, 12, 7, 0, 99, 14, 15, 16])), path)
    path.write_text(path.read_text().replace(",0,", f",{marker},"))  # row 5, of kind 'product'
    vocab = ItemVocab.fit(pa.array(["10", "11", "12", "14", "15", "16"]))
    message = (f"{path}: column 'item_id' has a missing id {marker!r} at row 5, where column 'kind' holds 'product', "
               "not one of virtual.values ['search', 'filter']; list that value to mark the event virtual, or drop or "
               "fill the row")
    source = EventLogSource(str(path), schema=SCHEMA, test_fraction=0.3, valid_fraction=0.3)
    for name, read in (("read_events", lambda: read_events(path, SCHEMA)),
                       ("scan_events", lambda: list(scan_events(path, SCHEMA))),
                       ("ScoringStream", lambda: list(ScoringStream(path, vocab, schema=SCHEMA, max_length=4))),
                       ("prepare", lambda: prepare(source, str(tmp_path / "prepared")))):
        with pytest.raises(SchemaError) as err:
            read()
        assert str(err.value) == message, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.csv"]  # prepare wrote nothing


def test_event_log_sessions_count_products_and_end_at_their_last_product(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(log(), path)
    days = {"test_days": 300 / 86400, "valid_days": 100 / 86400}  # test: ending after 300 s; valid: after 100 s
    kept = EventLogSource(str(path), schema=SCHEMA, **days).load()
    dropped = EventLogSource(str(path), schema=replace(SCHEMA, virtual=replace(ROLE, keep=False)), **days).load()
    # session 2 has one product (its search does not count); session 1 ends at 200 (its last product), not 9000
    assert [getattr(kept, n).column("session_id").to_pylist() for n in ("train", "valid", "test")] == [[4], [1], [3]]
    assert kept.valid.column("item_id").to_pylist() == [["10", "11", "search:paris"]]
    assert kept.test.column("virtual").to_pylist() == [[False, True, False]]
    assert frame.end_times(kept.valid).tolist() == [200.0]
    for name in ("train", "valid", "test"):
        a, b = getattr(kept, name), getattr(dropped, name)
        assert a.column("session_id").equals(b.column("session_id"))
        assert "virtual" not in b.column_names
        products = frame.drop_virtual(a).column("item_id").to_pylist()
        assert products == [[str(i) for i in s] for s in b.column("item_id").to_pylist()]


def test_synthetic_page_views_become_virtual_items_of_the_same_sessions():
    with_views = SyntheticSource(num_sessions=400, num_items=50, num_clusters=5, seed=3, page_views=True).load()
    without = SyntheticSource(num_sessions=400, num_items=50, num_clusters=5, seed=3).load()
    for name in ("train", "valid", "test"):
        a, b = getattr(with_views, name), getattr(without, name)
        assert a.column("session_id").equals(b.column("session_id"))
        assert frame.drop_virtual(a).column("item_id").to_pylist() == [[str(i) for i in s] for s in b.column("item_id").to_pylist()]
    values, _ = frame.list_offsets(with_views.train.column("item_id"))
    keys = set(values.filter(pa.array(frame.virtual_flags(with_views.train))).to_pylist())
    assert {"search", "filter", "home"} <= keys and {k for k in keys if k.startswith("category ")} <= {f"category {c}" for c in range(5)}
    assert 0.05 < frame.virtual_flags(with_views.train).mean() < 0.15  # page_view_share 0.1, never a first event


def test_merlin_marks_virtual_events_by_a_list_column():
    path = "tests/fixtures/merlin/t4r_tutorial"
    plain = MerlinSource(path).load()
    spec = VirtualSpec("category-list", ["6"])
    kept = MerlinSource(path, virtual=spec).load()
    dropped = MerlinSource(path, virtual=replace(spec, keep=False)).load()
    raw = pq.read_table(f"{path}/part_0.parquet")
    items = [int(i) for i in raw.column("item_id-list")[0].as_py()]
    category = [str(int(c)) for c in raw.column("category-list")[0].as_py()]
    first = kept.train.slice(0, 1)
    assert first.column("item_id").to_pylist()[0] == [c if c == "6" else str(i) for i, c in zip(items, category) if i != 0 or c == "6"]
    assert first.column("virtual").to_pylist()[0] == [c == "6" for i, c in zip(items, category) if i != 0 or c == "6"]
    assert frame.virtual_flags(kept.train).sum() > 0
    assert "virtual" not in dropped.train.column_names
    assert dropped.train.num_rows <= plain.train.num_rows
    with pytest.raises(SchemaError, match=r"t4r_tutorial: column 'category-list' never holds a value of virtual.values \['66'\]"):
        MerlinSource(path, virtual=replace(spec, values=["66"])).load()
    with pytest.raises(SchemaError, match=r"part_0.parquet: column 'kind', named by the source's virtual setting, is missing"):
        MerlinSource(path, virtual=VirtualSpec("kind", ["search"])).load()
    with pytest.raises(SchemaError, match=r"part_0.parquet: column 'day-first' \(virtual\) has dtype int64 .*expected a list"):
        MerlinSource(path, virtual=VirtualSpec("day-first", ["1"])).load()


def test_drop_repeats_drops_repeated_products_only():
    events = pa.table({"session_id": [1] * 6, "item_id": ["a", "a", "a", "a", "b", "b"], "timestamp": [1.0, 2, 3, 4, 5, 6],
                       "kind": ["search", "search", "product", "product", "product", "product"]})
    schema = Schema(virtual=VirtualSpec("kind", ["search"], key=["item_id"]))
    sessions = frame.group_sessions(schema.validate(events, "e"), schema, drop_repeats=True)
    assert sessions.column("item_id").to_pylist() == [["a", "a", "a", "b"]]
    assert sessions.column("virtual").to_pylist() == [[True, True, False, False]]
    assert np.array_equal(frame.product_lengths(sessions), [2])


@pytest.mark.parametrize("keep", [True, False])
def test_drop_repeats_keeps_products_whose_int64_ids_differ_beyond_float_precision(keep):
    """1234567890123456789 and ...790 are one float64: two products all the same, whether the virtual events (null
    ids when they are not kept) are kept or not."""
    big = 1234567890123456789
    events = pa.table({"session_id": [1] * 5, "item_id": pa.array([big, big + 1, None, big + 1, big + 7], pa.int64()),
                       "timestamp": [1.0, 2, 3, 4, 5], "kind": ["product", "product", "search", "product", "product"]})
    schema = Schema(virtual=VirtualSpec("kind", ["search"], keep=keep))
    sessions = frame.group_sessions(schema.validate(events, "e"), schema, drop_repeats=True)
    products = [item for item in sessions.column("item_id")[0].as_py() if item not in (None, "search")]
    assert products == [str(i) if keep else i for i in (big, big + 1, big + 1, big + 7)]


def test_a_csv_item_column_holds_virtual_keys_after_a_first_block_of_integer_ids(tmp_path):
    """The item column of a log with the virtual role may hold a virtual event's key text (trivago's ``reference``)
    anywhere, also after a first block of integer product ids: read as text, the key kept."""
    path = tmp_path / "events.csv"
    rows = [f"{i // 4},{1 + i % 50},{1_700_000_000 + i},product\n" for i in range(100_000)]  # 2.9 MB of products
    path.write_text("sid,iid,ts,kind\n" + "".join(rows) + "25000,red shoes,1700100000,search\n25000,5,1700100001,product\n")
    schema = Schema(session_id="sid", item_id="iid", timestamp="ts", virtual=VirtualSpec("kind", ["search"], key=["kind", "iid"]))
    events = read_events(path, schema)
    assert events.column("iid")[-3:].to_pylist() == ["50", "search:red shoes", "5"]
    assert events.column("virtual")[-2:].to_pylist() == [True, False]


def test_a_scoring_stream_marks_virtual_events_with_the_schema_role(tmp_path):
    from sessrec.data import ItemVocab, ScoringStream

    items = pa.array(["10", "11", "12", "search:paris", "filter:4 stars"])
    vocab = ItemVocab.fit(items, virtual=np.array([False, False, False, True, True]))
    path = tmp_path / "sessions.csv"
    pacsv.write_csv(log(), path)
    batch = next(iter(ScoringStream(path, vocab, schema=SCHEMA, max_length=4)))
    ids = {raw: vocab.encode(pa.array([raw]), virtual=np.array([raw[0].isalpha()])).ids[0] for raw in items.to_pylist()}
    assert batch.items.tolist() == [
        [ids["10"], ids["11"], ids["search:paris"]],  # session 1, ending with its search
        [0, ids["12"], 1],  # session 2: an unknown virtual key is OOV
        [1, ids["filter:4 stars"], 1],  # session 3: unknown products 13, 14 are OOV
        [0, 1, 1],
    ]
    dropped = replace(SCHEMA, virtual=replace(ROLE, keep=False))
    only_virtual = log().slice(2, 1).set_column(0, "session_id", pa.array([5]))
    pacsv.write_csv(pa.concat_tables([log(), only_virtual]), path)
    with pytest.raises(SchemaError, match=r"sessions.csv: session 5 is made only of virtual events \(column 'kind' holds"):
        list(ScoringStream(path, vocab, schema=dropped, max_length=4))
    pacsv.write_csv(log(), path)
    batch = next(iter(ScoringStream(path, vocab, schema=dropped, max_length=4)))
    assert batch.items.tolist() == [[ids["10"], ids["11"]], [0, ids["12"]], [1, 1], [1, 1]]


def test_a_time_window_source_keeps_or_drops_the_virtual_events_of_the_same_sessions(tmp_path):
    from sessrec.data import TimeWindowSource

    path = tmp_path / "log.parquet"
    pq.write_table(log(), path)
    window = {"train_from": 0.0, "train_until": 250.0, "test_until": 1000.0, "valid_fraction": 0.5}
    kept = TimeWindowSource([str(path)], schema=SCHEMA, **window).load()
    dropped = TimeWindowSource([str(path)], schema=replace(SCHEMA, virtual=replace(ROLE, keep=False)), **window).load()
    # session 1 ends at its last product (200): in the training window, though its search comes at 9000
    assert [kept.train.column("session_id").to_pylist(), kept.valid.column("session_id").to_pylist()] == [[4], [1]]
    assert kept.valid.column("item_id").to_pylist() == [["10", "11", "search:paris"]]
    assert dropped.valid.column("item_id").to_pylist() == [[10, 11]] and "virtual" not in dropped.test.column_names
    assert kept.test.column("session_id").equals(dropped.test.column("session_id"))
