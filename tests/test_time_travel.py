"""No time travel: splits and retraining windows that go back in time, and empty or negative periods,
are refused in one line naming the files, the settings and the dates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_prepare import ROOMY

from sessrec.data import EventLogSource, SyntheticSource, prepare
from sessrec.data.sources import SessionSource, SessionSplits
from sessrec.lifecycle.gate import Gate, check_unseen
from sessrec.lifecycle.retrain import retrain
from sessrec.models import CausalLanguageModeling, GRU4RecEncoder
from sessrec.tasks import SessionDataModule

DAY = 86400.0
T0 = 1396310400.0  # 2014-04-01T00:00:00Z


def write_log(path: Path, days: list[float], first_id: int = 0, per_day: int = 10) -> str:
    """`per_day` sessions of 3 events (a minute apart) starting on each of `days` (days after T0), each
    session starting an hour after the one before; ids from `first_id`."""
    starts = np.array([T0 + d * DAY + k * 3600.0 for d in days for k in range(per_day)])
    sid = np.repeat(np.arange(first_id, first_id + len(starts)), 3)
    times = np.repeat(starts, 3) + np.tile([0.0, 60.0, 120.0], len(starts))
    items = (sid * 7 + np.tile([1, 2, 3], len(starts))) % 13 + 1
    pq.write_table(pa.table({"session_id": sid, "item_id": items, "timestamp": times}), path)
    return str(path)


def test_the_dates_are_iso_utc():
    from sessrec.data.periods import iso

    assert iso(T0) == "2014-04-01T00:00:00Z" and iso(T0 + 0.25) == "2014-04-01T00:00:00.250Z"


# ------------------------------------------------------------------------- separate split files
def test_a_test_file_older_than_the_training_file_is_refused_naming_both(tmp_path):
    train = write_log(tmp_path / "train.parquet", [5, 6, 7])
    test = write_log(tmp_path / "test.parquet", [1], first_id=100)
    with pytest.raises(ValueError) as err:
        EventLogSource(train, test_path=test).load()
    said = str(err.value)
    assert "\n" not in said and said.startswith(f"{test}: the test period starts before the training period ends")
    # its first session ends 2 minutes after 2014-04-02T00:00Z; the last training session (day 7, 9 h, minus the
    # validation tenth: the 27th of 30 sessions, day 7 at 6 h) ends at 06:02
    assert "its first session ends 2014-04-02T00:02:00Z" in said
    assert f"before the last training session (of {train}, training split) ends 2014-04-08T06:02:00Z" in said


def test_overlapping_files_are_refused_and_consecutive_ones_accepted(tmp_path):
    train = write_log(tmp_path / "train.parquet", [0, 1, 2])
    overlapping = write_log(tmp_path / "overlap.parquet", [2, 3], first_id=100)
    with pytest.raises(ValueError, match=re.escape(f"{overlapping}: the test period starts before the training period ends: "
                                                   "its first session ends 2014-04-03T00:02:00Z")):
        EventLogSource(train, test_path=overlapping, valid_fraction=0.1).load()
    after = write_log(tmp_path / "after.parquet", [3, 4], first_id=100)
    splits = EventLogSource(train, test_path=after, valid_fraction=0.1).load()
    assert (splits.train.num_rows, splits.valid.num_rows, splits.test.num_rows) == (27, 3, 20)


def test_a_file_of_relative_times_beside_one_of_dates_is_refused_naming_both(tmp_path):
    """Relative times (before 1990, counted from a start) all end before any date, so a training file of relative
    times beside a test file of dates passed the order check with exit 0, though nothing orders the two clocks."""
    train = write_log(tmp_path / "train.parquet", [0, 1, 2])
    relative = tmp_path / "relative.parquet"
    events = pq.read_table(write_log(tmp_path / "test.parquet", [3], first_id=100))
    pq.write_table(events.set_column(2, "timestamp", pa.compute.subtract(events.column("timestamp"), T0)), relative)
    with pytest.raises(ValueError) as err:
        EventLogSource(train, test_path=str(relative), valid_fraction=0.1).load()
    assert str(err.value) == (
        f"{relative}: the test sessions end at relative times (the last 291720 s, before 1990: counted from a start) and "
        f"the training sessions of {train}, training split at dates (the last 2014-04-03T06:02:00Z): the files keep "
        "no common clock, so their periods cannot be ordered; give every file's times in one frame")
    with pytest.raises(ValueError, match=f"{re.escape(str(relative))}, training split: the training sessions end at relative"):
        EventLogSource(str(relative), test_path=train, valid_fraction=0.1).load()


def test_a_test_file_may_start_before_training_ends_when_its_sessions_end_after(tmp_path):
    """The rule is on end times, as day splits assign sessions: a test session that starts before the
    last training session ends but ends after it is in the test period; equal end times are allowed."""
    train = write_log(tmp_path / "train.parquet", [0, 1], per_day=2)  # the last session ends day 1, 01:02
    t = T0 + DAY + 3600.0 + 120.0
    test = tmp_path / "test.parquet"
    pq.write_table(pa.table({"session_id": [100, 100, 101, 101], "item_id": [1, 2, 3, 4],
                             "timestamp": [t - 600.0, t, t - 30.0, t + 30.0]}), test)
    splits = EventLogSource(train, test_path=str(test), valid_fraction=0.25).load()
    assert splits.test.num_rows == 2 and splits.train.num_rows == 3


def test_a_validation_file_before_the_training_period_is_refused(tmp_path):
    train = write_log(tmp_path / "train.parquet", [3, 4])
    valid = write_log(tmp_path / "valid.parquet", [1], first_id=100)
    with pytest.raises(ValueError, match=re.escape(f"{valid}: the validation period starts before the training period "
                                                   "ends: its first session ends 2014-04-02T00:02:00Z, before the last "
                                                   f"training session (of {train}, training split) ends")):
        EventLogSource(train, valid_path=valid, test_days=1).load()


def test_a_test_file_before_the_validation_file_is_refused(tmp_path):
    train = write_log(tmp_path / "train.parquet", [0])
    test = write_log(tmp_path / "test.parquet", [1], first_id=100)
    valid = write_log(tmp_path / "valid.parquet", [2], first_id=200)
    with pytest.raises(ValueError, match=re.escape(f"{test}: the test period starts before the validation period ends: "
                                                   "its first session ends 2014-04-02T00:02:00Z, before the last "
                                                   f"validation session (of {valid}) ends 2014-04-03T09:02:00Z")):
        EventLogSource(train, test_path=test, valid_path=valid).load()


# ------------------------------------------------------------------------- negative and empty periods
@pytest.mark.parametrize("settings,message", [
    ({"test_days": 1, "valid_days": -1}, "EventLogSource: valid_days must be a positive number of days, got -1"),
    ({"test_days": 1, "valid_days": 0}, "EventLogSource: valid_days must be a positive number of days, got 0"),
    ({"test_days": 0}, "EventLogSource: test_days must be a positive number of days, got 0"),
    ({"test_days": -2.5}, "EventLogSource: test_days must be a positive number of days, got -2.5"),
    ({"test_fraction": 0.0}, "EventLogSource: test_fraction must be a share in (0, 1), got 0.0"),
    ({"test_fraction": 1.0}, "EventLogSource: test_fraction must be a share in (0, 1), got 1.0"),
    ({"test_days": 1, "valid_fraction": -0.1}, "EventLogSource: valid_fraction must be a share in (0, 1), got -0.1"),
    ({"test_days": 1, "valid_fraction": None}, "EventLogSource needs valid_path, valid_days or valid_fraction"),
    ({"test_days": 1, "test_fraction": 0.1}, "EventLogSource needs test_path, or one of test_days and test_fraction"),
    ({"test_days": None}, "EventLogSource needs test_path, or one of test_days and test_fraction"),
])
def test_negative_or_empty_periods_are_refused_when_configured(settings, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        EventLogSource("events.parquet", **settings)


@pytest.mark.parametrize("settings,message", [
    ({"valid_days": -1.0}, "SyntheticSource: valid_days must be a positive number of days, got -1.0"),
    ({"test_days": 0.0}, "SyntheticSource: test_days must be a positive number of days, got 0.0"),
    ({"test_days": 7.0, "valid_days": 7.0}, "SyntheticSource: test_days 7 and valid_days 7 leave no training day of the 14"),
])
def test_synthetic_periods_are_checked_alike(settings, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        SyntheticSource(**settings)


@pytest.mark.parametrize("settings,message", [
    ({"num_sessions": 0}, "SyntheticSource: num_sessions must be >= 1, got 0"),  # was 'synthetic: the file has no rows'
    ({"num_sessions": -5}, "SyntheticSource: num_sessions must be >= 1, got -5"),  # numpy's 'negative dimensions ...'
    ({"num_clusters": 0}, "SyntheticSource: num_clusters must be >= 1, got 0"),  # numpy's 'high <= 0'
    ({"num_items": 0, "num_clusters": 0}, "SyntheticSource: num_items must be >= 1, got 0"),
])
def test_synthetic_counts_below_1_are_refused_naming_them(settings, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        SyntheticSource(**settings)


def test_a_synthetic_split_left_empty_is_refused_not_trained_without_validation():
    """5 sessions over 14 days left the validation day empty: fit trained with no validation and kept its checkpoint
    as the best, with exit 0."""
    with pytest.raises(ValueError, match="^" + re.escape(
            "SyntheticSource: the validation split (valid_days 1 of the 14 days generated) holds none of the 5 sessions of "
            "two products or more; generate more sessions (num_sessions 5)") + "$"):
        SyntheticSource(num_sessions=5).load()
    splits = SyntheticSource(num_sessions=5, num_items=30, num_clusters=3).load()  # another draw: every split holds one
    assert [getattr(splits, s).num_rows for s in ("train", "valid", "test")] == [2, 1, 2]


def test_a_test_period_holding_every_session_names_its_dates(tmp_path):
    path = write_log(tmp_path / "events.parquet", [0, 1, 2])
    with pytest.raises(ValueError) as err:
        EventLogSource(path, test_days=5).load()
    assert str(err.value) == (
        f"{path}: no session is left for training: test_days 5 (30 sessions, ending from 2014-04-01T00:02:00Z) and "
        "valid_fraction 0.1 (0 sessions) hold out all its 30 sessions, which end from 2014-04-01T00:02:00Z to "
        "2014-04-03T09:02:00Z; shorten those periods"
    )


def test_a_fraction_that_rounds_to_no_session_names_it(tmp_path):
    path = write_log(tmp_path / "events.parquet", [0, 1, 2])
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: the test split is empty: test_fraction 0.01 of its 30 "
                                                         "sessions rounds to none; lengthen test_fraction")):
        EventLogSource(path, test_fraction=0.01).load()
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: the validation split is empty: valid_fraction 0.01 of "
                                                         "its 20 sessions rounds to none; lengthen valid_fraction")):
        EventLogSource(path, test_days=1, valid_fraction=0.01).load()


def test_periods_of_days_holding_every_session_name_both(tmp_path):
    path = write_log(tmp_path / "events.parquet", [0, 5])  # nothing ends on days 1 to 4
    with pytest.raises(ValueError, match="^" + re.escape(
            f"{path}: no session is left for training: test_days 2 (10 sessions, ending from 2014-04-06T00:02:00Z) and "
            "valid_days 1 (10 sessions, ending from 2014-04-01T00:02:00Z) hold out all its 20 sessions")):
        EventLogSource(path, test_days=2, valid_days=1).load()


class EmptyTraining(SessionSource):
    """A source that hands over an empty training split (as a hand-written source may)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> SessionSplits:
        sessions = EventLogSource(self.path, test_days=1).sessions(self.path)
        return SessionSplits(train=sessions.slice(0, 0), valid=sessions, test=sessions, source=self.path)


def test_an_empty_training_split_is_named_before_a_model_is_built(tmp_path):
    path = write_log(tmp_path / "events.parquet", [0, 1, 2])
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: no session is left for training: test_days 9")):
        _ = SessionDataModule(EventLogSource(path, test_days=9), max_length=5).num_items
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: the training split holds no session, so there is no "
                                                         "item to fit the vocabulary on")):
        _ = SessionDataModule(EmptyTraining(path), max_length=5).num_items


@pytest.mark.parametrize("engine", ["memory", "local"])
def test_prepare_refuses_time_travel_and_empty_splits_before_writing(tmp_path, engine):
    train = write_log(tmp_path / "train.parquet", [5, 6])
    test = write_log(tmp_path / "test.parquet", [1], first_id=100)
    out = tmp_path / "prepared"
    with pytest.raises(ValueError, match="^" + re.escape(f"{test}: the test period starts before the training period ends")):
        prepare(EventLogSource(train, test_path=test), str(out), engine=engine, memory_budget=ROOMY)
    with pytest.raises(ValueError, match="^" + re.escape(f"{train}: no session is left for training: test_days 3")):
        prepare(EventLogSource(train, test_days=3), str(out), engine=engine, memory_budget=ROOMY)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["test.parquet", "train.parquet"]


# ------------------------------------------------------------------------- retraining
def served_model(root: Path, train_end: float | None) -> Path:
    """An (untrained) GRU4Rec model directory over items 1..13 whose training data ends at `train_end`."""
    from sessrec.data import ItemVocab
    from sessrec.tasks import NextItemTask

    torch.manual_seed(0)
    vocab = ItemVocab.fit(pa.array(np.arange(1, 14)))
    task = NextItemTask(num_items=len(vocab), max_length=5, encoder=GRU4RecEncoder(d_model=8),
                        objective=CausalLanguageModeling())
    task.vocab = vocab
    recommender = task.recommender()
    recommender.train_end = train_end
    recommender.save_pretrained(root)
    return root


def retrain_args(tmp_path: Path, log: str, **window: str) -> dict:
    return {"paths": [log], "out": str(tmp_path / "candidate"), "gate": Gate("recall@20", tolerance=0.99, min_pairs=5),
            "max_epochs": 1, "batch_size": 16, **window}


def test_the_recorded_end_round_trips_and_a_bad_one_is_refused(tmp_path):
    from sessrec.artifacts import SessionRecommender
    from sessrec.artifacts.model_directory import read_train_end

    root = served_model(tmp_path / "model", T0 + 3 * DAY + 0.5)
    assert SessionRecommender.from_pretrained(root).train_end == T0 + 3 * DAY + 0.5
    assert json.loads((root / "config.json").read_text())["train_end"] == T0 + 3 * DAY + 0.5
    assert read_train_end({}, "m/config.json") is None
    for bad in ("2014-04-04", True, float("nan")):
        with pytest.raises(ValueError, match="^" + re.escape(f"m/config.json: train_end: expected the epoch seconds of the "
                                                             f"training data's last event, got {bad!r}")):
            read_train_end({"train_end": bad}, "m/config.json")


def test_retrain_on_a_window_older_than_the_served_model_is_refused(tmp_path):
    log = write_log(tmp_path / "events.parquet", list(range(8)))
    root = served_model(tmp_path / "model", T0 + 5 * DAY + 7200.0)  # trained until 2014-04-06T02:00Z
    with pytest.raises(ValueError) as err:
        retrain(str(root), **retrain_args(tmp_path, log, train_from="2014-04-01", train_until="2014-04-04",
                                          test_until="2014-04-05"))
    assert str(err.value) == (
        "the training window ends 2014-04-04T00:00:00Z, before reaching the last event the current model trained on "
        f"(2014-04-06T02:00:00Z, train_end in {root}/config.json): retrain on a later window, or pass --backfill true to "
        "train on an older one"
    )
    assert not (tmp_path / "candidate").exists() and not (root / "promotions.jsonl").exists()


def test_a_warm_turn_on_sessions_the_served_model_trained_on_all_of_is_refused(tmp_path):
    """Days 0-2 of 10 sessions, the latest 3 validating: a served model whose training data ends with the 27th session
    (06:02 on the 3rd, as a turn on that window leaves it) is not trained on the same sessions again."""
    log = write_log(tmp_path / "events.parquet", list(range(8)))
    root = served_model(tmp_path / "model", T0 + 2 * DAY + 6 * 3600.0 + 120.0)
    window = {"train_from": "2014-04-01", "train_until": "2014-04-04", "test_until": "2014-04-06"}
    with pytest.raises(ValueError) as err:
        retrain(str(root), **retrain_args(tmp_path, log, **window))
    assert str(err.value) == (
        "the training window's training sessions (2014-04-01 .. 2014-04-04) end 2014-04-03T06:02:00Z, not after the last "
        f"event the current model trained on (2014-04-03T06:02:00Z, train_end in {root}/config.json): a warm start would "
        "train it again on sessions it trained on; retrain on a later window, or pass --backfill true")
    assert not (tmp_path / "candidate").exists() and not (root / "promotions.jsonl").exists()


def test_the_gate_refuses_to_compare_on_sessions_the_served_model_trained_on(tmp_path):
    log = write_log(tmp_path / "events.parquet", list(range(8)))
    root = served_model(tmp_path / "model", T0 + 5 * DAY + 7200.0)
    window = {"train_from": "2014-04-01", "train_until": "2014-04-04", "test_from": "2014-04-06", "test_until": "2014-04-08"}
    with pytest.raises(ValueError, match="^" + re.escape(  # a backfill whose test window starts before 02:00 on the 6th
            "the test window (--test_from, default --train_until) starts 2014-04-06T00:00:00Z, not after the last event "
            f"the current model trained on (2014-04-06T02:00:00Z, train_end in {root}/config.json): the gate would "
            "compare on sessions it trained on; start the window after 2014-04-06T02:00:00Z")):
        retrain(str(root), backfill=True, **retrain_args(tmp_path, log, **window))
    assert not (tmp_path / "candidate").exists()


def test_the_gate_refuses_a_window_the_best_promoted_trained_on():
    """After a rollback the best promoted may have trained on later sessions than the current model."""
    trained = [("the current model", T0, "current/config.json"), ("the best promoted", T0 + DAY, "v2/config.json")]
    check_unseen("the test window", T0 + DAY + 1, trained)
    with pytest.raises(ValueError, match="^" + re.escape(
            "the test window starts 2014-04-02T00:00:00Z, not after the last event the best promoted trained on "
            "(2014-04-02T00:00:00Z, train_end in v2/config.json)")):
        check_unseen("the test window", T0 + DAY, trained)


def test_a_served_model_that_records_no_training_end_is_refused(tmp_path):
    log = write_log(tmp_path / "events.parquet", list(range(8)))
    root = served_model(tmp_path / "model", None)
    with pytest.raises(ValueError, match="^" + re.escape(f"{root}/config.json: the current model records no train_end")):
        retrain(str(root), **retrain_args(tmp_path, log, train_from="2014-04-01", train_until="2014-04-07",
                                          test_until="2014-04-09"))


def test_backfill_trains_an_older_window_and_gates_it_on_unseen_sessions(tmp_path):
    from sessrec.artifacts import SessionRecommender

    log = write_log(tmp_path / "events.parquet", list(range(8)))
    root = served_model(tmp_path / "model", T0 + 5 * DAY + 7200.0)
    decision = retrain(str(root), backfill=True, warm_start=False, **retrain_args(
        tmp_path, log, train_from="2014-04-01", train_until="2014-04-05", test_from="2014-04-07", test_until="2014-04-09"))
    assert decision["backfill"] and decision["test_window"] == ["2014-04-07", "2014-04-09"]
    assert decision["current_train_end"] == "2014-04-06T02:00:00Z"
    assert decision["train_sessions"] == 36 and decision["test_sessions"] == 20  # days 0-3 (a tenth validates); 6-7
    candidate = SessionRecommender.from_pretrained(tmp_path / "candidate" / "model")
    assert candidate.train_end == T0 + 3 * DAY + 5 * 3600.0 + 120.0  # the 36th session, 05:02 on the 4th
    assert decision["promoted"]  # a tolerance of 0.99: its recorded end is what the next turn reads
    assert SessionRecommender.from_pretrained(root).train_end == candidate.train_end


def test_a_streamed_training_split_ends_where_the_in_memory_one_does(tmp_path):
    from sessrec.data import PreparedSource
    from sessrec.data.streaming import StreamedSplits

    log = write_log(tmp_path / "events.parquet", list(range(6)))
    source = EventLogSource(log, test_days=1, valid_days=1)
    out = prepare(source, str(tmp_path / "prepared"), engine="local", memory_budget=ROOMY, part_sessions=7, row_group_sessions=3)
    streamed = StreamedSplits(out, PreparedSource(str(out)).manifest)
    assert len(streamed.train_files) == 6  # 40 sessions in parts of 7: the maximum is over every part's row groups
    assert streamed.train_end() == source.load().train_end() == T0 + 3 * DAY + 9 * 3600.0 + 120.0


def test_a_training_split_ends_at_its_last_event_virtual_ones_included_streamed_or_not(tmp_path):
    """A kept page view after a session's last product is an event the model read: in memory the training split
    ended at the last product (17 minutes earlier than the streamed split of the same preparation, so one log gave
    a model directory two train_ends, as it was fitted streamed or not)."""
    from sessrec.data import PreparedSource
    from sessrec.data.schema import Schema, VirtualSpec
    from sessrec.data.streaming import StreamedSplits

    events = pq.read_table(write_log(tmp_path / "products.parquet", list(range(6))))
    events = events.append_column("kind", pa.array(["product"] * events.num_rows))
    last = events.slice(4 * 10 * 3 - 1, 1)  # the last training session (day 3, 9 h; ends 09:02): a page view after it
    view = pa.table({"session_id": last["session_id"], "item_id": pa.array([999]),
                     "timestamp": pa.array([last["timestamp"][0].as_py() + 17 * 60.0]), "kind": pa.array(["view"])})
    log = tmp_path / "events.parquet"
    pq.write_table(pa.concat_tables([events, view]), log)
    schema = Schema(virtual=VirtualSpec("kind", ["view"], keep=True))
    source = EventLogSource(str(log), schema=schema, test_days=1, valid_days=1)
    splits = source.load()
    assert view["session_id"][0].as_py() in splits.train.column("session_id").to_pylist()
    out = prepare(source, str(tmp_path / "prepared"), engine="local", memory_budget=ROOMY)
    streamed = StreamedSplits(out, PreparedSource(str(out)).manifest)
    assert splits.train_end() == streamed.train_end() == max(max(t) for t in splits.train.column("timestamp").to_pylist())


TRIVAGO = Path(__file__).resolve().parents[2] / "shared" / "data" / "trivago_rsc19_100k" / "trivago_val_100k.parquet.snappy"


def served_ranker(folder: Path, window: dict) -> str:
    """A DLRM of growing tables saved in `folder` as a turn ending 2018-11-08T00:00 leaves it: trained on the
    click-outs until 14:00 on the 7th; returns its train_end in ISO."""
    from sessrec.artifacts import ClickRanker
    from sessrec.data.periods import iso
    from sessrec.embeddings import DynamicTables
    from sessrec.tasks import ClickoutDataModule, DLRMTask

    data = ClickoutDataModule(str(TRIVAGO), end="2018-11-08T00:00", **window)  # trains on click-outs until 14:00 on the 7th
    torch.manual_seed(0)
    task = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense, sparse=DynamicTables(),
                    network={"embedding_dim": 4, "dense_layers": [8, 4], "over_layers": [8]})
    task.vocab = data.vocab
    ranker = task.ranker()
    ranker.train_end = data.train_end()
    ranker.save_pretrained(folder)
    assert ClickRanker.from_pretrained(folder).train_end == ranker.train_end
    return iso(ranker.train_end)


@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_a_dlrm_turn_on_older_click_outs_is_refused(tmp_path):
    from sessrec.lifecycle.retrain import retrain_dlrm

    window = {"test_hours": 6.0, "valid_hours": 4.0}
    seen = served_ranker(tmp_path / "current", window)
    assert "2018-11-07T13:00:00Z" < seen <= "2018-11-07T14:00:00Z"
    with pytest.raises(ValueError, match="^" + re.escape(
            "the training window (before the --valid_hours and --test_hours that end at --end) ends 2018-11-07T08:00:00Z, "
            f"before reaching the last event the current model trained on ({seen}, train_end in ")):
        retrain_dlrm(str(tmp_path / "current"), path=str(TRIVAGO), end="2018-11-07T18:00", out=str(tmp_path / "c"), **window)
    with pytest.raises(ValueError, match="^" + re.escape(
            "the test window (the --test_hours before --end) starts 2018-11-07T12:00:00Z, not after the last event the "
            f"current model trained on ({seen}")):
        retrain_dlrm(str(tmp_path / "current"), path=str(TRIVAGO), end="2018-11-07T18:00", out=str(tmp_path / "c"),
                     backfill=True, **window)
    assert not (tmp_path / "c").exists()


@pytest.mark.skipif(not TRIVAGO.exists(), reason="trivago_rsc19_100k is not available here")
def test_a_warm_dlrm_turn_on_the_click_outs_the_served_ranker_trained_on_all_of_is_refused(tmp_path):
    """The turn that made the served ranker, run again (--end 2018-11-08T00:00): its training click-outs end where the
    ranker's do, so it would train it again on them."""
    from sessrec.lifecycle.retrain import retrain_dlrm

    window = {"test_hours": 6.0, "valid_hours": 4.0}
    seen = served_ranker(tmp_path / "current", window)
    with pytest.raises(ValueError) as err:
        retrain_dlrm(str(tmp_path / "current"), path=str(TRIVAGO), end="2018-11-08T00:00", out=str(tmp_path / "c"), **window)
    assert str(err.value) == (
        f"the training window's training click-outs (before 2018-11-07T14:00:00Z) end {seen}, not after the last "
        f"event the current model trained on ({seen}, train_end in {tmp_path / 'current'}/config.json): a warm start "
        "would train it again on click-outs it trained on; retrain on a later window, or pass --backfill true")
    assert not (tmp_path / "c").exists() and not (tmp_path / "current" / "promotions.jsonl").exists()


def saved_click_ranker(log: Path, model: Path) -> None:
    """A DLRM click ranker of the recipe's network over `log` (its last 50 seconds the test period, the 30 before validation),
    untrained, saved to `model` with the train_end sessrec fit records."""
    from sessrec.embeddings import FusedTables
    from sessrec.tasks import ClickoutDataModule, DLRMTask

    data = ClickoutDataModule(str(log), test_hours=50 / 3600, valid_hours=30 / 3600)
    task = DLRMTask(cardinalities=data.cardinalities, num_dense=data.num_dense,  # the recipe's network
                    network={"embedding_dim": 16, "dense_layers": [64, 16], "over_layers": [128, 64]},
                    sparse=FusedTables(optimizer="adagrad_rowwise", lr=0.003))
    task.vocab = data.vocab
    ranker = task.ranker()
    ranker.train_end = data.train_end()
    ranker.save_pretrained(model)


def test_a_click_ranker_is_not_evaluated_on_click_outs_it_trained_on(tmp_path, sessrec_main):
    from test_ranking_data import EVENTS, log_table

    path = tmp_path / "log.parquet"  # click-outs at 50, 120, 140 and 200 seconds
    pq.write_table(log_table([("c", 50, 1, "clickout item", "H1", None, "H1|H2", "5|6"), *EVENTS]), path)
    hours = lambda seconds: str(seconds / 3600)
    saved_click_ranker(path, tmp_path / "model")  # trained on 50 and 120
    flags = ["--config", str(Path(__file__).resolve().parents[1] / "recipes" / "dlrm_trivago.yaml"),
             "--data.init_args.path", str(path), "--model_dir", str(tmp_path / "model"), "--trainer.enable_progress_bar", "false"]
    # the recipe's own periods pass; a test period of 100 seconds holds the click-out at 120, which it trained on
    assert sessrec_main("test", *flags, "--data.init_args.test_hours", hours(50), "--data.init_args.valid_hours", hours(30)) == ""
    got = sessrec_main("test", *flags, "--data.init_args.test_hours", hours(100), "--data.init_args.valid_hours", hours(30))
    assert got == (
        f"sessrec test: error: {path}: the test split starts with a click-out at 1970-01-01T00:02:00Z, not after the last "
        f"one {tmp_path / 'model'} trained on (1970-01-01T00:02:00Z): it would be scored on click-outs it learned; "
        "evaluate it on a later period (set end, test_hours and valid_hours) (--traceback for details)")


def test_a_saved_click_ranker_is_tested_on_a_log_of_its_test_period_alone(tmp_path, sessrec_main):
    """The vocabulary comes from the model directory: testing needs no training click-outs, and the check of the
    model's train_end holds all the same."""
    from test_ranking_data import EVENTS, log_table

    from sessrec.tasks import ClickoutDataModule

    full = tmp_path / "log.parquet"  # click-outs at 120, 140 and 200 seconds
    pq.write_table(log_table(), full)
    saved_click_ranker(full, tmp_path / "model")  # trained on 120
    hours = lambda seconds: str(seconds / 3600)
    flags = ["--config", str(Path(__file__).resolve().parents[1] / "recipes" / "dlrm_trivago.yaml"),
             "--model_dir", str(tmp_path / "model"), "--trainer.enable_progress_bar", "false",
             "--data.init_args.valid_hours", hours(30)]
    late = tmp_path / "late.parquet"  # the validation (140) and test (200) click-outs only
    pq.write_table(log_table([e for e in EVENTS if e[1] > 130]), late)
    for command in ("test", "validate"):
        assert sessrec_main(command, *flags, "--data.init_args.path", str(late), "--data.init_args.test_hours", hours(50)) == ""
    since = tmp_path / "since.parquet"  # from the click-out at 120 on, the last the model trained on
    pq.write_table(log_table([e for e in EVENTS if e[1] >= 120]), since)
    got = sessrec_main("test", *flags, "--data.init_args.path", str(since), "--data.init_args.test_hours", hours(100))
    assert got == (
        f"sessrec test: error: {since}: the test split starts with a click-out at 1970-01-01T00:02:00Z, not after the last "
        f"one {tmp_path / 'model'} trained on (1970-01-01T00:02:00Z): it would be scored on click-outs it learned; "
        "evaluate it on a later period (set end, test_hours and valid_hours) (--traceback for details)")
    # training still needs click-outs before the validation and test hours
    with pytest.raises(ValueError, match=r"late.parquet: no click-outs before the last 0.0222"):
        ClickoutDataModule(str(late), test_hours=50 / 3600, valid_hours=30 / 3600).setup("fit")
