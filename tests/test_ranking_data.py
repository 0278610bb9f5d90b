"""Trivago click-out ranking rows: hand-made log (labels, positions, price ranks, session context, no
leakage), the real file against SOURCE.md, the fitted vocabulary, the loaders, and bad inputs."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from sessrec.data.schema import SchemaError
from sessrec.datasets.clickout_rows import RankingLoader, RankingVocab, encode_rows
from sessrec.datasets.clickouts import (
    DENSE_FEATURES,
    ONE_HOT,
    SPARSE_FEATURES,
    build_clickout_rows,
    split_by_time,
)
from sessrec.tasks.clickout_data import ClickoutDataModule

torch.set_num_threads(1)
TRIVAGO = Path(__file__).resolve().parents[2] / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"

# (session, timestamp, step, action, reference, filters, impressions, prices)
EVENTS = [
    ("a", 100, 1, "interaction item image", "H2", None, None, None),
    ("a", 110, 2, "filter selection", "4 Star", "4 Star", None, None),
    ("a", 120, 3, "clickout item", "H2", "4 Star|Sort by Price", "H1|H2|H3", "100|50|75"),
    ("a", 130, 4, "interaction item image", "H3", None, None, None),
    ("a", 140, 5, "clickout item", "H3", None, "H3|H1|H2", "80|90|85"),
    ("b", 200, 1, "clickout item", "H1", None, "H1|H4", "10|10"),
    ("b", 210, 2, "interaction item info", "H4", None, None, None),  # after the click-out: must not leak
]


def log_table(events=EVENTS, order=None) -> pa.Table:
    events = [events[i] for i in order] if order is not None else events
    cols = list(zip(*events))
    n = len(events)
    return pa.table({
        "user_id": ["u"] * n,
        "session_id": list(cols[0]),
        "timestamp": pa.array(cols[1], pa.int64()),
        "step": pa.array(cols[2], pa.int64()),
        "action_type": list(cols[3]),
        "reference": list(cols[4]),
        "platform": ["DE"] * n,
        "city": ["Berlin, Germany"] * n,
        "device": ["mobile"] * n,
        "current_filters": pa.array(cols[5], pa.string()),
        "impressions": pa.array(cols[6], pa.string()),
        "prices": pa.array(cols[7], pa.string()),
    })


@pytest.fixture(scope="module")
def rows():
    return build_clickout_rows(log_table(order=[6, 3, 0, 5, 2, 4, 1]), "hand.parquet")  # shuffled input


def col(rows, name):
    return rows.column(name).to_pylist()


def test_one_row_per_shown_hotel_with_labels_and_positions(rows):
    assert col(rows, "query") == [0, 0, 0, 1, 1, 1, 2, 2]
    assert col(rows, "hotel") == ["H1", "H2", "H3", "H3", "H1", "H2", "H1", "H4"]
    assert col(rows, "position") == [0, 1, 2, 0, 1, 2, 0, 1]
    assert col(rows, "label") == [0, 1, 0, 1, 0, 0, 1, 0]
    assert col(rows, "num_impressions") == [3, 3, 3, 3, 3, 3, 2, 2]


def test_price_rank_within_the_list_ties_by_position(rows):
    assert col(rows, "price") == [100, 50, 75, 80, 90, 85, 10, 10]
    assert col(rows, "price_rank") == [2, 0, 1, 0, 2, 1, 0, 1]


def test_session_context_uses_only_earlier_events(rows):
    assert col(rows, "prior_actions") == [2, 2, 2, 4, 4, 4, 0, 0]
    assert col(rows, "last_action") == ["filter selection"] * 3 + ["interaction item image"] * 3 + ["<start>"] * 2
    # H2 in the second click-out: the image at t=100 and the click-out at t=120 (not the current one)
    assert col(rows, "interactions") == [0, 1, 0, 1, 0, 2, 0, 0]
    seconds = np.array(col(rows, "seconds_since"), dtype=float)
    np.testing.assert_array_equal(np.isnan(seconds), [1, 0, 1, 0, 1, 0, 1, 1])
    assert seconds[[1, 3, 5]].tolist() == [20.0, 10.0, 20.0]
    assert col(rows, "last_interacted") == [False, True, False, True, False, False, False, False]
    # the interaction with H4 comes after session b's click-out
    assert col(rows, "interactions")[7] == 0
    assert col(rows, "filters")[:3] == [["4 Star", "Sort by Price"]] * 3
    assert col(rows, "filters")[3:] == [[]] * 5


def test_split_by_time_and_vocab_fitted_on_train(rows, tmp_path):
    split = split_by_time(rows, end_of_log=210, test_hours=50 / 3600, valid_hours=30 / 3600)
    assert split.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]  # test: t > 160; valid: 130 < t <= 160
    train = rows.filter(pa.array(split == 0))
    vocab = RankingVocab.fit(train)
    assert vocab.cardinalities["hotel"] == 2 + 3 and vocab.cardinalities["filters"] == 2 + 2
    test = encode_rows(rows.filter(pa.array(split == 2)), vocab)
    hotel = test.one_hot[:, ONE_HOT.index("hotel")].tolist()
    assert hotel[1] == 1  # H4 was never shown in training: the unseen id
    assert test.labels.tolist() == [1.0, 0.0]
    assert test.baselines["position"].tolist() == [0.0, -1.0]
    # popularity: H2 was the one click in training; ties broken by position
    full = encode_rows(rows, vocab)
    assert full.baselines["popularity"].tolist() == pytest.approx([0, 0.99, -0.02, 0, -0.01, 0.98, 0, -0.01])
    path = vocab.save(tmp_path / "vocab.parquet")
    assert RankingVocab.load(path).cardinalities == vocab.cardinalities
    # no hotel shown twice in training: min_count 2 keeps none, and the vocabulary still saves and loads
    rare = RankingVocab.fit(train, min_count=2)
    assert RankingVocab.load(rare.save(tmp_path / "rare.parquet")).cardinalities == {**vocab.cardinalities, "hotel": 2}
    assert not list(tmp_path.glob(".*tmp*"))


def test_dense_features(rows):
    vocab = RankingVocab.fit(rows)
    t = encode_rows(rows, vocab)
    assert t.dense.shape == (8, len(DENSE_FEATURES))
    d = {name: t.dense[:, i] for i, name in enumerate(DENSE_FEATURES)}
    assert d["price_rank"].tolist() == pytest.approx([1, 0, 0.5, 0, 1, 0.5, 0, 1])
    assert d["log_price"][0] == pytest.approx(np.log1p(100))
    assert d["interacted_before"].tolist() == [0, 1, 0, 1, 0, 1, 0, 0]
    assert d["has_session_score"].sum() == 0
    assert torch.isfinite(t.dense).all()


def test_a_log_of_list_columns_gives_the_rows_of_its_text_form_and_a_null_in_a_list_is_refused():
    """impressions, prices and current_filters written as lists (a parquet file from lists) raised Arrow's
    'Unsupported cast from list<item: string> to utf8', naming neither file nor column."""
    text = log_table()
    split = lambda name, kind=str: pa.array([None if v is None else [kind(x) for x in v.split("|")]  # noqa: E731
                                             for v in text.column(name).to_pylist()])
    lists = text
    for name, kind in (("impressions", str), ("prices", float), ("current_filters", str)):
        lists = lists.set_column(lists.column_names.index(name), name, split(name, kind))
    got, want = build_clickout_rows(lists, "lists.parquet"), build_clickout_rows(text, "text.parquet")
    assert got.schema == want.schema and repr(got.to_pydict()) == repr(want.to_pydict())  # NaN as NaN
    held = lists.column("impressions").to_pylist()
    held[2] = ["H1", None, "H3"]
    with pytest.raises(SchemaError, match=r"^lists.parquet: column 'impressions' holds a null in the list \['H1', None, 'H3'\]"):
        build_clickout_rows(lists.set_column(lists.column_names.index("impressions"), "impressions", pa.array(held)),
                            "lists.parquet")
    nested = pa.array([None if v is None else [{"id": x} for x in v] for v in held])
    with pytest.raises(SchemaError, match=r"^lists.parquet: column 'impressions' holds lists of struct<id: string>, not of "
                                          r"ids or numbers$"):
        build_clickout_rows(lists.set_column(lists.column_names.index("impressions"), "impressions", nested), "lists.parquet")


def test_session_scores_hook(tmp_path):
    scores = pa.table({"session_id": ["a", "a"], "step": [3, 5], "item_id": ["H3", "H3"], "score": [0.5, 2.0]})
    rows = build_clickout_rows(log_table(), "hand", scores)
    got = np.array(rows.column("session_score").to_pylist(), dtype=float)
    assert got[2] == 0.5 and got[3] == 2.0 and np.isnan(got[[0, 1, 4, 5, 6, 7]]).all()
    with pytest.raises(SchemaError, match=r"^scores.parquet: session scores lack column 'score'"):
        build_clickout_rows(log_table(), "hand", scores.drop(["score"]), "scores.parquet")


def test_session_scores_of_a_log_whose_click_outs_share_a_step_are_refused():
    """Session a's two click-outs both at step 3: a score keyed (a, 3, H3) was joined to the rows of each, with exit 0."""
    log = _with(log_table(), "step", 4, 3)
    scores = pa.table({"session_id": ["a"], "step": [3], "item_id": ["H3"], "score": [0.5]})
    with pytest.raises(SchemaError, match=r"^hand.parquet: 2 click-outs of session 'a' have step 3: the session scores of "
                                          r"scores.parquet key a click-out by its session_id and step, which must tell "
                                          r"them apart$"):
        build_clickout_rows(log, "hand.parquet", scores, "scores.parquet")
    assert build_clickout_rows(log, "hand.parquet").num_rows == 8  # without scores, the steps are not read


@pytest.mark.parametrize("column, values, match", [
    # a NaN was read as a row with no score, and an infinite or past-float32 one made the dense input inf
    ("score", [0.5, float("nan")], r"column 'score' holds nan at row 1; a session score must be a finite float32"),
    ("score", [float("-inf"), 2.0], r"column 'score' holds -inf at row 0; a session score must be a finite float32"),
    ("score", [0.5, 1e39], r"column 'score' holds 1e\+39 at row 1; a session score must be a finite float32"),
    ("score", pa.array([0.5, None], pa.float64()), r"column 'score' has a null value at row 1"),
    ("score", ["0.5", "high"], r"column 'score' holds 'high' at row 1, not a number"),
    ("step", [3.0, 5.5], r"column 'step' holds 5.5 at row 1, not of the type of the log's step \(int64\)"),
    ("item_id", pa.array(["H3", None]), r"column 'item_id' has a null value at row 1"),
    ("item_id", ["H1", "H1"], r"session scores hold 2 scores for session_id 'a', step 3, item_id 'H1'; one each"),
    # ids of another log: the feature was absent on every row, with exit 0
    ("item_id", [3, 3], r"none of its 2 session scores is of a hotel shown on a click-out of hand \(its first: "
                        r"session_id 'a', step 3, item_id '3'\)"),
])
def test_session_scores_that_cannot_be_read_as_given_are_refused_naming_file_column_value_and_row(column, values, match):
    scores = {"session_id": ["a", "a"], "step": [3, 5], "item_id": ["H3", "H3"], "score": [0.5, 2.0], column: values}
    if column == "item_id" and values == ["H1", "H1"]:
        scores["step"] = [3, 3]
    with pytest.raises(SchemaError, match="^scores.parquet: " + match):
        build_clickout_rows(log_table(), "hand", pa.table(scores), "scores.parquet")


def test_loaders_slice_whole_queries_and_gather_multi_hot(rows):
    vocab = RankingVocab.fit(rows)
    t = encode_rows(rows, vocab)
    evaluation = list(RankingLoader(t, batch_size=4))
    assert [b.groups.tolist() for b in evaluation] == [[0, 0, 0], [1, 1, 1], [2, 2]]
    first = evaluation[0].sparse
    assert first.keys == SPARSE_FEATURES and first.lengths.tolist()[-3:] == [2, 2, 2]
    rows_idx = torch.tensor([4, 0, 7, 2])
    picked = t.batch(rows_idx)
    assert picked.sparse.lengths.view(len(SPARSE_FEATURES), -1)[-1].tolist() == [0, 2, 0, 2]
    ids = vocab.vocabs["filters"].encode(pa.array(["4 Star", "Sort by Price"])).ids.tolist()
    assert picked.sparse.values[-4:].tolist() == ids * 2
    assert picked.labels.tolist() == [0, 0, 0, 0] and picked.groups.tolist() == [1, 0, 2, 0]
    train = RankingLoader(t, batch_size=3, shuffle=True, seed=1)
    seen = torch.cat([b.groups for b in train])
    assert len(train) == 3 and sorted(seen.tolist()) == sorted(t.groups.tolist())


def test_a_training_loader_resumed_mid_epoch_hands_out_the_rest_of_that_epochs_batches(rows):
    """RankingLoader kept no state: a fit resumed from a mid-epoch checkpoint started the epoch over, training its
    first batches twice and its last never, with exit 0 (Lightning only warned)."""
    tensors = encode_rows(rows, RankingVocab.fit(rows))
    uninterrupted = RankingLoader(tensors, batch_size=2, shuffle=True, seed=3)
    uninterrupted.set_epoch(1)
    whole = [b.groups.tolist() + b.labels.tolist() for b in uninterrupted]
    killed = RankingLoader(tensors, batch_size=2, shuffle=True, seed=3)
    killed.set_epoch(1)
    batches = iter(killed)
    next(batches)
    state = killed.state_dict()
    assert state == {"epoch": 1, "position": 1, "seed": 3, "rows": 8, "batch_size": 2, "world_size": 1}
    resumed = RankingLoader(tensors, batch_size=2, shuffle=True, seed=3)
    resumed.load_state_dict(state)
    assert [b.groups.tolist() + b.labels.tolist() for b in resumed] == whole[1:]
    assert len([*resumed]) == len(whole)  # the next epoch whole
    with pytest.raises(ValueError, match=r"^the saved loader state was shuffled with seed 3, this loader with 4: resume with "
                                         r"the --data.init_args.seed it was trained with$"):
        RankingLoader(tensors, batch_size=2, shuffle=True, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match=r"^the saved loader state stands 1 batches into epoch 1 with "
                                         r"--data.init_args.batch_size 2, this loader with 4: resume mid-epoch"):
        RankingLoader(tensors, batch_size=4, shuffle=True, seed=3).load_state_dict(state)
    RankingLoader(tensors, batch_size=4, shuffle=True, seed=3).load_state_dict({**state, "position": 0})  # an epoch's end


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda t: t.drop(["prices"]), r"hand.parquet: column 'prices' is missing"),
        (lambda t: _with(t, "prices", 2, "100|50"), r"'impressions' and 'prices' differ.*session 'a', step 3.*'100\|50'"),
        (lambda t: _with(t, "prices", 2, "100|cheap|75"), r"column 'prices' holds a value that is not a number"),
        (lambda t: _with(t, "prices", 2, "100|-5|75"), r"column 'prices' holds '-5'"),
        (lambda t: _with(t, "impressions", 5, None), r"column 'impressions' is empty on a click-out \(session 'b', step 1\)"),
        # a hotel shown twice: which place was clicked is unknown, and the click-out would count twice in MRR
        (lambda t: _with(_with(t, "impressions", 2, "H1|H2|H2"), "prices", 2, "100|50|50"),
         r"column 'impressions' shows hotel 'H2' twice on a click-out \(session 'a', step 3: 'H1\|H2\|H2'\)"),
        # an empty hotel id would be ranked as a hotel '' (and learned as one)
        (lambda t: _with(t, "impressions", 2, "H1||H3"),
         r"column 'impressions' holds an empty hotel id on a click-out \(session 'a', step 3: 'H1\|\|H3'\)"),
        (lambda t: _with(t, "impressions", 5, "H1|H4|"),
         r"column 'impressions' holds an empty hotel id on a click-out \(session 'b', step 1: 'H1\|H4\|'\)"),
        # a click-out of no clicked hotel would be learned as all its hotels unclicked and left out of MRR
        (lambda t: _with(t, "reference", 2, None),
         r"column 'reference' is empty on a click-out \(session 'a', step 3\); every click-out needs the hotel clicked"),
        (lambda t: _with(t, "reference", 5, ""), r"column 'reference' is empty on a click-out \(session 'b', step 1\)"),
        (lambda t: _with(t, "session_id", 1, None), r"column 'session_id' has a null value at row 1"),
        # bytes that are not UTF-8 raised Arrow's "Invalid UTF8 payload"
        (lambda t: t.set_column(7, "city", pa.array([b"Berlin"] * 3 + [b"\xff\xfe"] + [b"Berlin"] * 3)),
         r"hand.parquet: column 'city' is not valid UTF-8 text: value b'\\xff\\xfe' at row 3; re-encode the file as UTF-8"),
        # references written otherwise than the impressions: every row a negative, trained on with exit 0
        (lambda t: t.set_column(5, "reference", pa.array([None if v is None else v + ".0" for v in t.column("reference").to_pylist()])),
         r"hand.parquet: no click-out's 'reference' is one of its 'impressions' \(session 'a', step 3: reference 'H2.0', "
         r"impressions 'H1\|H2\|H3'\); the clicked hotel's id must be written as the shown ones are"),
        # a click-out of no city was refused as "item ids hold 1 nulls", naming neither file nor column
        (lambda t: _with(t, "city", 4, None), r"hand.parquet: column 'city' is null on a click-out \(session 'a', step 5\)"),
        (lambda t: _with(t, "device", 5, None), r"hand.parquet: column 'device' is null on a click-out \(session 'b', step 1\)"),
        (lambda t: t.set_column(2, "timestamp", pa.array(["x"] * t.num_rows)), r"column 'timestamp' must be numeric"),
        # milliseconds read as seconds would make the test hours a few seconds long
        (lambda t: t.set_column(2, "timestamp", pa.array([(1_541_548_939 + s) * 1000 for s in t.column("timestamp").to_pylist()])),
         r"column 'timestamp' has the time 1541549039000 at row 0, read with time_unit: s as the year 50,8.*set time_unit: ms"),
        (lambda t: _with(t.set_column(2, "timestamp", t.column("timestamp").cast(pa.float64())), "timestamp", 1, float("nan")),
         r"column 'timestamp' has a missing timestamp nan at row 1"),
    ],
)
def test_bad_input_names_file_column_and_value(change, match):
    with pytest.raises(SchemaError, match=match):
        build_clickout_rows(change(log_table()), "hand.parquet")


def _with(table: pa.Table, name: str, row: int, value) -> pa.Table:
    values = table.column(name).to_pylist()
    values[row] = value
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, table.schema.field(name).type))


def test_a_checkpoints_vocabulary_of_another_log_is_refused_even_of_the_same_sizes(tmp_path):
    """Only the sizes were compared: a resume on a log of other hotels, as many of each feature, went on with exit 0,
    each hotel of the new log read as unseen."""
    renamed = [tuple(v.replace("H1", "H9") if isinstance(v, str) else v for v in event) for event in EVENTS]
    settings = dict(test_hours=50 / 3600, valid_hours=30 / 3600, min_count=1)
    for name, events in (("log.parquet", EVENTS), ("other.parquet", renamed)):
        pq.write_table(log_table(events), tmp_path / name)
    saved = ClickoutDataModule(str(tmp_path / "log.parquet"), **settings)
    same = ClickoutDataModule(str(tmp_path / "log.parquet"), **settings)
    assert same.cardinalities == saved.cardinalities
    same.load_state_dict(saved.state_dict())  # the run's own log: taken
    other = ClickoutDataModule(str(tmp_path / "other.parquet"), **settings)
    assert other.cardinalities == saved.cardinalities
    with pytest.raises(ValueError, match=(
            rf"^the checkpoint's ranking vocabulary differs from the one this data module uses \({tmp_path / 'other.parquet'}\): "
            r"feature 'hotel': both have 5 ids, but 3 of them stand for other items: id 2 is item 'H1' in the checkpoint, "
            r"'H2' here; resume with the data settings of the run it continues$")):
        other.load_state_dict(saved.state_dict())


def test_a_vocabulary_of_another_log_is_refused_when_none_of_the_shown_hotels_is_in_it(tmp_path):
    """--data.init_args.vocab_path of another log (a fit, or sessrec test --model_dir of another data set) read every
    hotel as unseen, with exit 0."""
    renamed = [tuple(v.replace("H", "X") if isinstance(v, str) else v for v in event) for event in EVENTS]
    settings = dict(test_hours=50 / 3600, valid_hours=30 / 3600, min_count=1)
    pq.write_table(log_table(), tmp_path / "log.parquet")
    pq.write_table(log_table(renamed), tmp_path / "other.parquet")
    vocab = ClickoutDataModule(str(tmp_path / "log.parquet"), **settings).vocab.save(tmp_path / "vocab.parquet")
    ClickoutDataModule(str(tmp_path / "log.parquet"), vocab_path=str(vocab), **settings).setup("fit")  # its own log
    other = ClickoutDataModule(str(tmp_path / "other.parquet"), vocab_path=str(vocab), **settings)
    with pytest.raises(ValueError, match=(
            rf"^{tmp_path / 'other.parquet'}: none of the 3 shown hotels of the train split is in the vocabulary of {vocab} "
            r"\(3 hotels, e.g. 'H1'; the log's first 'X1'\): the log and the vocabulary do not belong together$")):
        other.setup("fit")


def test_data_module_on_a_file_and_its_errors(tmp_path):
    path = tmp_path / "log.parquet"
    pq.write_table(log_table(), path)
    dm = ClickoutDataModule(str(path), test_hours=50 / 3600, valid_hours=30 / 3600, batch_size=2, eval_batch_size=4)
    dm.setup("fit")
    assert dm.stats["train_clickouts"] == 1 and dm.stats["test_rows"] == 2
    assert dm.num_dense == len(DENSE_FEATURES) and set(dm.cardinalities) == set(SPARSE_FEATURES)
    batch = next(iter(dm.train_dataloader()))
    assert batch.dense.shape == (2, len(DENSE_FEATURES)) and batch.sparse.batch_size == 2
    with pytest.raises(ValueError, match="test_hours > 0"):
        ClickoutDataModule(str(path), test_hours=0)
    # an `end` after the log leaves nothing to validate or test on: refused, not an evaluation of no click-out
    late = ClickoutDataModule(str(path), test_hours=50 / 3600, valid_hours=30 / 3600, end=1000)
    with pytest.raises(ValueError, match=r"log.parquet: no click-outs in the test split \(after 1970-01-01T00:15:50Z, "
                                         r"until 1970-01-01T00:16:40Z\); the log's click-outs run from 1970-01-01T00:02:00Z "
                                         r"to 1970-01-01T00:03:20Z"):
        late.setup("test")
    with pytest.raises(ValueError, match=r"no click-outs in the validation split \(after 1970-01-01T00:15:20Z"):
        late.setup("fit")
    # a saved model's vocabulary needs no training click-outs, but a log of no click-out at all is refused
    pq.write_table(log_table([e for e in EVENTS if e[3] != "clickout item"]), tmp_path / "none.parquet")
    vocab = RankingVocab.fit(build_clickout_rows(log_table())).save(tmp_path / "vocab.parquet")
    none = ClickoutDataModule(str(tmp_path / "none.parquet"), test_hours=50 / 3600, vocab_path=str(vocab))
    with pytest.raises(ValueError, match=r"none.parquet: no click-outs in the test split \(after 1970-01-01T00:02:40Z, "
                                         r"until 1970-01-01T00:03:30Z\); the log holds no click-out$"):
        none.setup("test")
    # an event of no time is refused, not dropped as one after `end`
    timeless = log_table().set_column(2, "timestamp", pa.array([100, 110, 120, 130, float("nan"), 200, 210]))
    pq.write_table(timeless, tmp_path / "timeless.parquet")
    with pytest.raises(SchemaError, match=r"timeless.parquet: column 'timestamp' has a missing timestamp nan"):
        ClickoutDataModule(str(tmp_path / "timeless.parquet"), test_hours=50 / 3600, valid_hours=30 / 3600, end=205).rows
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        ClickoutDataModule(str(tmp_path / "nope.parquet")).setup("fit")


ONE_HOTEL_CSV = (  # every list one hotel long: a CSV reader types `impressions` and `prices` as numbers, not text
    "session_id,timestamp,step,action_type,reference,platform,city,device,current_filters,impressions,prices\n"
    "a,100,1,interaction item image,7,DE,Berlin,mobile,,,\n"
    "a,120,2,clickout item,7,DE,Berlin,mobile,,7,60.5\n"
    "b,200,1,clickout item,8,DE,Berlin,mobile,,9,70\n"
)


def test_csv_of_one_hotel_lists_reads_them_as_ids(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text(ONE_HOTEL_CSV)
    dm = ClickoutDataModule(str(path), test_hours=50 / 3600, valid_hours=30 / 3600)
    rows = pa.concat_tables(dm.rows.values())
    assert col(rows, "hotel") == ["7", "9"] and col(rows, "price") == [60.5, 70.0]
    assert col(rows, "label") == [1, 0] and col(rows, "interactions") == [1, 0]


@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_real_trivago_file_matches_source_md():
    dm = ClickoutDataModule(str(TRIVAGO))
    rows = pa.concat_tables(dm.rows.values())
    # SOURCE.md: 13,597 click-outs; every one has its impressions
    assert len(np.unique(rows.column("query").to_numpy())) == 13_597
    assert sum(dm.stats[f"{s}_clickouts"] for s in ("train", "valid", "test")) == 13_597
    assert rows.num_rows == 312_539
    # one click per click-out, except one whose clicked hotel was not among those shown
    assert int(np.sum(rows.column("label").to_numpy())) == 13_596
    assert rows.column("position").to_numpy().max() == 24
    t_test = rows.filter(pa.array(split_by_time(rows, 1541721582, 8, 8) == 2))
    assert t_test.num_rows == dm.stats["test_rows"]
