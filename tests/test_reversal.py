"""Sequence reversal (Booking.com WSDM'21): reversed copies of the training sessions, in training only."""

import numpy as np
import pyarrow as pa
import torch

from sessrec.data import SessionSplits, SideFeatures, frame
from sessrec.data.sources import SessionSource
from sessrec.tasks import SessionDataModule


class Source(SessionSource):
    def load(self) -> SessionSplits:
        def table(sessions, first):
            return pa.table(
                {
                    "session_id": list(range(first, first + len(sessions))),
                    "item_id": pa.array(sessions, pa.list_(pa.int64())),
                    # a side feature equal to the raw item id, to follow the events
                    "tag": pa.array([[str(i) for i in s] for s in sessions], pa.list_(pa.string())),
                    "timestamp": pa.array([[float(10 * k) for k in range(len(s))] for s in sessions], pa.list_(pa.float64())),
                }
            )

        train = [[10, 11, 12], [13], [14, 10, 15, 11, 12, 13, 14], [12, 13]]
        held_out = [[10, 11, 12], [14, 15]]
        return SessionSplits(train=table(train, 0), valid=table(held_out, 100), test=table(held_out, 200))


def rows(items: torch.Tensor) -> list[list[int]]:
    return [[i for i in row if i] for row in items.tolist()]


def test_training_gets_exactly_the_reversed_sessions():
    plain = SessionDataModule(source=Source(), max_length=5)
    aug = SessionDataModule(source=Source(), max_length=5, augment_reversed=True)
    base, _ = plain.tensors("train")
    both, _ = aug.tensors("train")
    assert plain.vocab == aug.vocab  # fitted on the original sessions only
    encoded = [aug.vocab.encode(pa.array(s)).ids.tolist() for s in Source().load().train.column("item_id").to_pylist()]
    expected_original = [s[-5:] for s in encoded]
    expected_reversed = [s[::-1][-5:] for s in encoded if len(s) >= 2]  # a one-item session reversed is itself
    assert rows(both) == expected_original + expected_reversed
    assert torch.equal(both[: len(base)], base)
    assert aug.stats["train_reversed"] == 3
    # the reversed 7-item session keeps its *first* five items, latest (the original first) last
    assert rows(both)[-2] == encoded[2][::-1][-5:] == encoded[2][:5][::-1]


def test_validation_and_test_are_never_reversed():
    plain = SessionDataModule(source=Source(), max_length=5)
    aug = SessionDataModule(source=Source(), max_length=5, augment_reversed=True)
    for split in ("valid", "test"):
        a, b = plain.tensors(split), aug.tensors(split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert len(aug.val_dataloader().items) == 2


def test_side_features_are_reversed_with_their_events():
    side = SideFeatures(categorical=["tag"], time=["since_prev"], position=8)
    dm = SessionDataModule(source=Source(), max_length=5, augment_reversed=True, side_features=side)
    items, _ = dm.tensors("train")
    feats = dm.feature_tensors("train")
    assert torch.equal(feats["tag"], items)  # Categorify and ItemVocab number values alike
    n = 4
    original_pos, reversed_pos = feats["position"][:n], feats["position"][n:]
    # the 3-item session: positions 1, 2, 3 forwards, 3, 2, 1 in its reversed copy
    assert original_pos[0, -3:].tolist() == [1, 2, 3] and reversed_pos[0, -3:].tolist() == [3, 2, 1]
    lengths = (items != 0).sum(dim=1)
    for f in feats.values():
        assert ((f != 0).sum(dim=1) <= lengths).all()  # padding stays padding
    np.testing.assert_array_equal(frame.mirror_index(np.array([0, 3, 4, 7])), [2, 1, 0, 3, 6, 5, 4])


def test_train_prefixes_gives_every_prefix_with_its_next_event():
    plain = SessionDataModule(source=Source(), max_length=5)
    pre = SessionDataModule(source=Source(), max_length=5, train_prefixes=True)
    encoded = [pre.vocab.encode(pa.array(s)).ids.tolist() for s in Source().load().train.column("item_id").to_pylist()]
    expected = [s[: k + 1][-5:] for s in encoded for k in range(1, len(s))]  # 2..n events, shortest first
    got, targets = pre.tensors("train")
    assert targets is None and rows(got) == expected
    assert pre.stats["train_prefix_rows"] == 2 + 6 + 1 == len(expected)
    for split in ("valid", "test"):  # evaluation untouched
        a, b = plain.tensors(split), pre.tensors(split)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_train_prefixes_after_reversal():
    dm = SessionDataModule(source=Source(), max_length=5, train_prefixes=True, augment_reversed=True)
    encoded = [dm.vocab.encode(pa.array(s)).ids.tolist() for s in Source().load().train.column("item_id").to_pylist()]
    sessions = encoded + [s[::-1] for s in encoded if len(s) >= 2]
    assert rows(dm.tensors("train")[0]) == [s[: k + 1][-5:] for s in sessions for k in range(1, len(s))]


def test_prefix_rows_skip_virtual_ends():
    starts, ends = np.array([0, 4, 5]), np.array([4, 5, 8])  # rows of 4, 1 and 3 events
    targetable = np.array([1, 1, 0, 1, 1, 1, 0, 1], dtype=bool)  # events 2 and 6 are virtual
    s, e, r = frame.prefix_rows(starts, ends, targetable)
    assert s.tolist() == [0, 0, 5] and e.tolist() == [2, 4, 8] and r.tolist() == [0, 0, 2]  # ending at 2 and 6: gone
    s, e, r = frame.prefix_rows(starts, ends)
    assert s.tolist() == [0, 0, 0, 5, 5] and e.tolist() == [2, 3, 4, 7, 8] and r.tolist() == [0, 0, 0, 2, 2]


class Stamped(Source):
    """`Source`, with event j of training session r at 1e9 + 100 r + j seconds."""

    def load(self) -> SessionSplits:
        splits = super().load()
        train = splits.train
        stamps = [[1e9 + 100 * r + j for j in range(len(s))] for r, s in enumerate(train.column("item_id").to_pylist())]
        train = train.set_column(train.column_names.index("timestamp"), "timestamp", pa.array(stamps, pa.list_(pa.float64())))
        return SessionSplits(train=train, valid=splits.valid, test=splits.test)


def test_event_times_follow_reversed_copies_and_prefixes():
    t = lambda r, j: 1e9 + 100 * r + j
    dm = SessionDataModule(source=Stamped(), max_length=5, augment_reversed=True, times=True)
    items, times = dm.tensors("train")[0], dm.time_tensor("train")
    assert times.dtype == torch.float64 and torch.equal(times != 0, items != 0)
    assert times[0].tolist() == [0, 0, t(0, 0), t(0, 1), t(0, 2)]
    assert times[2].tolist() == [t(2, j) for j in range(2, 7)]  # the 7-event session's latest five
    # the reversed copies (rows 4, 5, 6) hold their events' times in reversed order; the 7-event one its first five
    assert times[4].tolist() == [0, 0, t(0, 2), t(0, 1), t(0, 0)]
    assert times[5].tolist() == [t(2, j) for j in (4, 3, 2, 1, 0)]
    # prefixes, shortest first: session 0 -> rows 0-1, session 2 -> 2-7, session 3 -> 8, reversed copies from 9 on
    pre = SessionDataModule(source=Stamped(), max_length=5, augment_reversed=True, train_prefixes=True, times=True)
    items, times = pre.tensors("train")[0], pre.time_tensor("train")
    assert len(times) == 18 and torch.equal(times != 0, items != 0)
    assert times[0].tolist() == [0, 0, 0, t(0, 0), t(0, 1)]
    assert times[7].tolist() == [t(2, j) for j in range(2, 7)]
    assert times[10].tolist() == [0, 0, t(0, 2), t(0, 1), t(0, 0)]
    assert times[11].tolist() == [0, 0, 0, t(2, 6), t(2, 5)]
    assert dm.time_tensor("valid").tolist()[0] == [0, 0, 0, 0.0, 10.0]  # held out: never reversed ([10, 11] -> 12)
