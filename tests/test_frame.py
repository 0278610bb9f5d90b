"""Columnar session operations on small hand-computed cases."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sessrec.data import frame
from sessrec.data.schema import FeatureSpec, Schema

SCHEMA = Schema(order_by="step", features=[FeatureSpec("price", "continuous")])
DAY = 86_400.0


def events() -> pa.Table:
    """Unsorted events of sessions 2 and 1; session 2 has a timestamp tie broken by `step`."""
    return pa.table(
        {
            "session_id": [2, 1, 2, 1, 2, 2, 1],
            "item_id": [30, 10, 31, 11, 31, 32, 11],
            "timestamp": [5.0, 3.0, 5.0, 1.0, 7.0, 6.0, 4.0],
            "step": [2.0, 3.0, 1.0, 1.0, 4.0, 3.0, 4.0],
            "price": [0.3, 0.1, 0.31, 0.11, 0.312, 0.32, 0.111],
        }
    )


def sessions_of(rows: list[tuple[int, list[int], list[float]]]) -> pa.Table:
    return pa.table(
        {
            "session_id": [r[0] for r in rows],
            "item_id": pa.array([r[1] for r in rows], pa.list_(pa.int64())),
            "timestamp": pa.array([r[2] for r in rows], pa.list_(pa.float64())),
        }
    )


def test_sort_events_session_time_then_tie_break():
    out = frame.sort_events(events(), SCHEMA)
    assert out["session_id"].to_pylist() == [1, 1, 1, 2, 2, 2, 2]
    assert out["timestamp"].to_pylist() == [1.0, 3.0, 4.0, 5.0, 5.0, 6.0, 7.0]
    assert out["step"].to_pylist() == [1.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]  # the 5.0 tie: step 1 before 2
    assert out["item_id"].to_pylist() == [11, 10, 11, 31, 30, 32, 31]


def test_sort_events_stable_without_tie_break():
    table = pa.table({"session_id": [1, 1, 1], "item_id": [7, 8, 9], "timestamp": [2.0, 2.0, 1.0]})
    assert frame.sort_events(table, Schema())["item_id"].to_pylist() == [
        9,
        7,
        8,
    ]  # equal times keep file order


def test_group_sessions_lists_every_column():
    out = frame.group_sessions(frame.sort_events(events(), SCHEMA), SCHEMA)
    assert out.column_names == ["session_id", "item_id", "timestamp", "price"]
    assert out.to_pydict() == {
        "session_id": [1, 2],
        "item_id": [[11, 10, 11], [31, 30, 32, 31]],
        "timestamp": [[1.0, 3.0, 4.0], [5.0, 5.0, 6.0, 7.0]],
        "price": [[0.11, 0.1, 0.111], [0.31, 0.3, 0.32, 0.312]],
    }


def test_group_sessions_drop_repeats_only_consecutive_within_session():
    table = pa.table(
        {
            "session_id": [1, 1, 1, 1, 2, 2, 3],
            "item_id": [5, 5, 6, 5, 5, 5, 9],
            "timestamp": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0],
        }
    )
    kept = frame.group_sessions(table, Schema(), drop_repeats=True)
    assert kept["item_id"].to_pylist() == [
        [5, 6, 5],
        [5],
        [9],
    ]  # session 2's first 5 follows session 1's last 5
    assert kept["timestamp"].to_pylist() == [[1.0, 3.0, 4.0], [5.0], [7.0]]  # the first event of a run stays
    assert frame.group_sessions(table, Schema())["item_id"].to_pylist() == [[5, 5, 6, 5], [5, 5], [9]]


def test_group_sessions_string_ids_and_empty():
    table = pa.table({"session_id": ["a", "a", "b"], "item_id": ["x", "y", "x"]})
    out = frame.group_sessions(table, Schema(timestamp=None))
    assert out.to_pydict() == {"session_id": ["a", "b"], "item_id": [["x", "y"], ["x"]]}
    assert frame.group_sessions(table.slice(0, 0), Schema(timestamp=None)).num_rows == 0


def test_keep_recent_keeps_most_recent_events_of_every_list_column():
    sessions = sessions_of([(1, [1, 2, 3, 4], [1, 2, 3, 4]), (2, [5], [5]), (3, [6, 7, 8], [6, 7, 8])])
    out = frame.keep_recent(sessions, 2)
    assert out.to_pydict() == {
        "session_id": [1, 2, 3],
        "item_id": [[3, 4], [5], [7, 8]],
        "timestamp": [[3.0, 4.0], [5.0], [7.0, 8.0]],
    }
    assert frame.keep_recent(sessions, 4) is sessions  # nothing to cut


def test_keep_recent_on_a_sliced_table():
    sessions = sessions_of([(1, [1, 2, 3], [1, 2, 3]), (2, [4, 5, 6], [4, 5, 6]), (3, [7], [7])]).slice(1)
    assert frame.keep_recent(sessions, 1)["item_id"].to_pylist() == [[6], [7]]


def test_filter_lengths_drops_short_after_truncating():
    sessions = sessions_of([(1, [1], [1]), (2, [2, 3], [2, 3]), (3, [4, 5, 6, 7], [4, 5, 6, 7])])
    out = frame.filter_lengths(sessions, min_length=2, max_length=3)
    assert out["session_id"].to_pylist() == [2, 3]
    assert out["item_id"].to_pylist() == [[2, 3], [5, 6, 7]]
    assert frame.filter_lengths(sessions, min_length=3)["session_id"].to_pylist() == [3]


def _split_ids(splits) -> list[list[int]]:
    return [part["session_id"].to_pylist() for part in splits]


def test_time_split_by_days():
    # last-event times in days: 0.5, 1.2, 2.0, 2.5, 3.0 (t_max); test = ends > 2.0 days, valid = (1.0, 2.0]
    ends = [0.5, 1.2, 2.0, 2.5, 3.0]
    sessions = sessions_of([(i, [i, i], [0.0, e * DAY]) for i, e in enumerate(ends)])
    train, valid, test = _split_ids(frame.time_split(sessions, test_days=1.0, valid_days=1.0))
    assert (train, valid, test) == ([0], [1, 2], [3, 4])
    train, valid, test = _split_ids(frame.time_split(sessions, test_days=1.0))
    assert (train, valid, test) == ([0, 1, 2], [], [3, 4])


def test_time_split_by_fraction_orders_by_last_event():
    # sessions listed out of time order; by end time: 3, 0, 4, 1, 2
    ends = [2.0, 4.0, 5.0, 1.0, 3.0]
    sessions = sessions_of([(i, [i], [e]) for i, e in enumerate(ends)])
    train, valid, test = _split_ids(frame.time_split(sessions, test_fraction=0.4, valid_fraction=0.2))
    assert (train, valid, test) == ([0, 3], [4], [1, 2])
    assert sorted(train + valid + test) == list(range(5))


def test_time_split_every_session_in_one_split():
    rng = np.random.default_rng(0)
    ends = rng.uniform(0, 10 * DAY, 200)
    sessions = sessions_of([(i, [i], [e]) for i, e in enumerate(ends)])
    for kwargs in ({"test_days": 2.0, "valid_days": 1.5}, {"test_fraction": 0.15, "valid_fraction": 0.1}):
        train, valid, test = _split_ids(frame.time_split(sessions, **kwargs))
        assert sorted(train + valid + test) == list(range(200))
        assert ends[train].max() <= ends[valid].min() and ends[valid].max() <= ends[test].min()
    assert len(_split_ids(frame.time_split(sessions, test_fraction=0.15, valid_fraction=0.1))[2]) == 30


def test_time_split_arguments():
    sessions = sessions_of([(1, [1], [1.0])])
    with pytest.raises(ValueError, match="exactly one of test_days or test_fraction"):
        frame.time_split(sessions, test_days=1.0, test_fraction=0.1)
    with pytest.raises(ValueError, match="needs a timestamp column"):
        frame.time_split(sessions.select(["session_id", "item_id"]), test_days=1.0)
    empty = [part.num_rows for part in frame.time_split(sessions.slice(0, 0), test_days=1.0)]
    assert empty == [0, 0, 0]


def test_pad_sessions_right_aligned_and_truncated():
    values = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    starts, ends = np.array([0, 2, 3, 8]), np.array([2, 3, 8, 8])
    expected = [[0, 0, 1, 2], [0, 0, 0, 3], [5, 6, 7, 8], [0, 0, 0, 0]]  # the last row is an empty session
    np.testing.assert_array_equal(frame.pad_sessions(values, starts, ends, 4), expected)
    assert frame.pad_sessions(values, starts, ends, 4).dtype == np.int64
    np.testing.assert_array_equal(
        frame.pad_sessions(np.array([], dtype=np.int64), np.array([0]), np.array([0]), 2), [[0, 0]]
    )


def test_expand_prefixes_last():
    offsets = np.array([0, 3, 4, 6])  # lengths 3, 1, 2: a single-item session has no target
    session, target = frame.expand_prefixes(offsets, "last")
    np.testing.assert_array_equal(session, [0, 2])
    np.testing.assert_array_equal(target, [2, 5])


def test_expand_prefixes_all_prefixes_longest_first():
    offsets = np.array([0, 3, 4, 6])
    session, target = frame.expand_prefixes(offsets, "all_prefixes")
    np.testing.assert_array_equal(session, [0, 0, 2])
    np.testing.assert_array_equal(target, [2, 1, 5])  # [a b] -> c, then [a] -> b; session 2: [d] -> e
    # prefix length = target - start: longest first, as SR-GNN writes its test pairs
    np.testing.assert_array_equal(target - offsets[session], [2, 1, 1])


def test_expand_prefixes_empty_and_unknown():
    for protocol in ("last", "all_prefixes"):
        session, target = frame.expand_prefixes(np.array([0]), protocol)
        assert session.size == target.size == 0
    with pytest.raises(ValueError, match="unknown evaluation protocol 'first'"):
        frame.expand_prefixes(np.array([0, 2]), "first")


def test_list_offsets_on_slices():
    sessions = sessions_of([(1, [10, 11], [1, 2]), (2, [12], [3]), (3, [13, 14, 15], [4, 5, 6])])
    values, offsets = frame.list_offsets(sessions["item_id"].combine_chunks().slice(1))
    assert values.to_pylist() == [12, 13, 14, 15]
    np.testing.assert_array_equal(offsets, [0, 1, 4])
