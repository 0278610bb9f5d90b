"""Columnar operations on interaction logs: the one module that touches dataframes.

Every function works on whole columns (pyarrow compute + numpy index arithmetic), never on
Python rows. A session table is a `pyarrow.Table` with one row per session and list columns
(``item_id``, ``timestamp``, side features), as written to parquet. Jagged data is handled as
``values`` + ``offsets`` (``offsets[i]:offsets[i+1]`` are the events of session ``i``).

Shape letters: N sessions, E events, L padded length, P (prefix, target) pairs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.schema import VIRTUAL, Schema

SESSION = "session_id"
ITEMS = "item_id"
TIMES = "timestamp"
# VIRTUAL: optional list<bool> column, True where ``item_id`` holds a virtual (non-product) key (`Schema.virtual`)
TARGETABLE = "targetable"  # optional list<bool> column: False where an event is context only, never a target


def sort_events(events: pa.Table, schema: Schema) -> pa.Table:
    """Sort events by session, then time, then the tie-break column; stable for equal keys."""
    keys = [(schema.session_id, "ascending")]
    keys += [(c, "ascending") for c in (schema.timestamp, schema.order_by) if c is not None]
    return events.take(pc.sort_indices(events, sort_keys=keys))


def _boundaries(values: np.ndarray) -> np.ndarray:
    """Offsets (N + 1,) of runs of equal consecutive values in a 1-d array."""
    if len(values) == 0:
        return np.zeros(1, dtype=np.int64)  # no events: no sessions, not one empty session
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    return np.concatenate([[0], change, [len(values)]]).astype(np.int64)


def group_sessions(events: pa.Table, schema: Schema, drop_repeats: bool = False) -> pa.Table:
    """Group sorted events into one row per session with list columns.

    Args:
        events: validated, sorted events (see `sort_events`).
        schema: column roles.
        drop_repeats: remove an event whose item equals the previous event's item in the same
            session (consecutive repeats, e.g. page reloads); products only, so that the sessions are the same
            whether virtual events are kept or not (their ids are null when they are not).

    Returns:
        Table with ``session_id``, ``item_id`` (list), ``timestamp`` (list, if the schema has one),
        one list column per side feature, and ``virtual`` (list) when the schema marks virtual events.
    """
    sessions = events.column(schema.session_id).to_numpy(zero_copy_only=False)
    if drop_repeats:
        items = events.column(schema.item_id)  # compared in Arrow: int64 ids with nulls would be float64 in numpy
        repeat = np.zeros(len(items), dtype=bool)
        same = pc.equal(items.slice(1), items.slice(0, len(items) - 1)).fill_null(False)
        repeat[1:] = same.to_numpy(zero_copy_only=False) & (sessions[1:] == sessions[:-1])
        if schema.virtual is not None:
            flags = events.column(VIRTUAL).to_numpy(zero_copy_only=False)
            repeat[1:] &= ~flags[1:] & ~flags[:-1]
        events = events.filter(pa.array(~repeat))
        sessions = sessions[~repeat]
    offsets = _boundaries(sessions)
    off = pa.array(offsets, pa.int32() if offsets[-1] < 2**31 else pa.int64())
    cols = {SESSION: events.column(schema.session_id).take(pa.array(offsets[:-1]))}
    cols[ITEMS] = _list(off, events.column(schema.item_id))
    if schema.timestamp is not None:
        cols[TIMES] = _list(off, events.column(schema.timestamp))
    for feat in schema.features:
        cols[feat.name] = _list(off, events.column(feat.name))
    if schema.virtual is not None:
        cols[VIRTUAL] = _list(off, events.column(VIRTUAL))
    return pa.table(cols)


def _list(offsets: pa.Array, values: pa.ChunkedArray) -> pa.Array:
    flat = values.combine_chunks()
    if pa.types.is_int32(offsets.type):
        return pa.ListArray.from_arrays(offsets, flat)
    return pa.LargeListArray.from_arrays(offsets, flat)


def list_offsets(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Flat values and offsets (N + 1,) of a list column, without copying rows in Python."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if arr.offset != 0 or arr.null_count:
        arr = pa.concat_arrays([arr.fill_null([]) if arr.null_count else arr])
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(offsets[0], offsets[-1] - offsets[0])
    return values, offsets - offsets[0]


def session_lengths(sessions: pa.Table) -> np.ndarray:
    return pc.list_value_length(sessions.column(ITEMS)).to_numpy(zero_copy_only=False).astype(np.int64)


def product_lengths(sessions: pa.Table) -> np.ndarray:
    """(N,) product events of each session: its length less its virtual events."""
    lengths = session_lengths(sessions)
    virtual = virtual_flags(sessions)
    if virtual is None:
        return lengths
    session_of = np.repeat(np.arange(len(lengths)), lengths)
    return lengths - np.bincount(session_of[virtual], minlength=len(lengths))


def filter_events(sessions: pa.Table, keep: np.ndarray) -> pa.Table:
    """Keep the events where `keep` (E,) is True in every list column; sessions may become empty."""
    _, offsets = list_offsets(sessions.column(ITEMS))
    lengths = np.diff(offsets)
    session_of = np.repeat(np.arange(len(lengths)), lengths)
    new_offsets = np.concatenate([[0], np.cumsum(np.bincount(session_of[keep], minlength=len(lengths)))])
    mask, out = pa.array(keep), {}
    for name in sessions.column_names:
        col = sessions.column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values, _ = list_offsets(col)
            out[name] = pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values.filter(mask))
        else:
            out[name] = col
    return pa.table(out)


def drop_virtual(sessions: pa.Table) -> pa.Table:
    """The sessions without their virtual events and without the ``virtual`` column (unchanged without one)."""
    virtual = virtual_flags(sessions)
    if virtual is None:
        return sessions
    return filter_events(sessions, ~virtual).drop_columns([VIRTUAL])


def keep_recent(sessions: pa.Table, max_length: int) -> pa.Table:
    """Truncate every list column to the `max_length` most recent events of each session."""
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1 (the most recent events kept per session), got {max_length}")
    lengths = session_lengths(sessions)
    if lengths.size == 0 or lengths.max() <= max_length:
        return sessions
    _, offsets = list_offsets(sessions.column(ITEMS))
    session_of = np.repeat(np.arange(len(lengths)), lengths)
    from_end = offsets[1:][session_of] - np.arange(offsets[-1]) - 1
    keep = from_end < max_length
    new_offsets = np.concatenate([[0], np.cumsum(np.minimum(lengths, max_length))]).astype(np.int32)
    out = {}
    for name in sessions.column_names:
        col = sessions.column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values, _ = list_offsets(col)
            out[name] = pa.ListArray.from_arrays(pa.array(new_offsets), values.filter(pa.array(keep)))
        else:
            out[name] = col
    return pa.table(out)


def filter_lengths(sessions: pa.Table, min_length: int = 1, max_length: int | None = None) -> pa.Table:
    """Drop sessions of fewer than `min_length` product events (and, with virtual events, those of no product);
    keep the `max_length` most recent events (virtual ones included)."""
    if max_length is not None:
        sessions = keep_recent(sessions, max_length)
    least = max(min_length, 1) if VIRTUAL in sessions.column_names else min_length
    return sessions.filter(pa.array(product_lengths(sessions) >= least))


def time_split(
    sessions: pa.Table,
    test_days: float | None = None,
    valid_days: float | None = None,
    test_fraction: float | None = None,
    valid_fraction: float | None = None,
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Split sessions by the time of their last event into train / valid / test.

    Either give days (sessions ending in the last `test_days` are test, the `valid_days` before
    that are validation), or fractions of sessions ordered by end time. Every session lands in
    exactly one split, so no event of a held-out session is trained on. The rule is
    `time_labels`'s, the sessions' positions breaking ties of end times.
    """
    if TIMES not in sessions.column_names:
        time_labels(None, test_days, valid_days, test_fraction, valid_fraction)  # raises: no timestamp
    split = time_labels(last_times(sessions), test_days, valid_days, test_fraction, valid_fraction)
    return tuple(sessions.filter(pa.array(split == k)) for k in range(3))  # type: ignore[return-value]


def time_labels(
    end: np.ndarray | None,
    test_days: float | None = None,
    valid_days: float | None = None,
    test_fraction: float | None = None,
    valid_fraction: float | None = None,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """(N,) split of each session from the time of its last event: 0 train, 1 valid, 2 test.

    Args:
        end: (N,) end time of each session; None when the sessions carry no timestamps (refused).
        test_days: sessions ending in the last `test_days` of the latest end time (after `day_cut`)
            are test, those ending in the `valid_days` before that validation.
        test_fraction: instead of days, the latest `test_fraction` of the sessions (by end time)
            are test, the `valid_fraction` before them validation (counts rounded).
        order: (N,) distinct keys that order sessions with equal end times for the fractions (a
            later key ranks later); None: the sessions' positions. A session table sorted by
            session id ranks the same with its positions and with its session ids' ranks.

    A period is given positive (`check_periods`); None leaves out the validation period. Days and fractions
    do not mix: a `valid_fraction` with `test_days` (or `valid_days` with `test_fraction`) is refused.
    """
    if (test_days is None) == (test_fraction is None):
        raise ValueError("give exactly one of test_days or test_fraction")
    if (test_days is not None and valid_fraction is not None) or (test_fraction is not None and valid_days is not None):
        given = f"test_days {test_days:g}" if test_days is not None else f"test_fraction {test_fraction:g}"
        other = f"valid_fraction {valid_fraction:g}" if test_days is not None else f"valid_days {valid_days:g}"
        raise ValueError(f"time_split: give days (test_days, valid_days) or fractions (test_fraction, valid_fraction), "
                         f"not both; got {given} and {other}, which would be ignored")
    check_periods("time_split", test_days=test_days, valid_days=valid_days, test_fraction=test_fraction, valid_fraction=valid_fraction)
    if end is None:
        raise ValueError("time_split needs a timestamp column; the schema has none")
    if test_days is not None:
        t_test = day_cut(end, test_days)
        t_valid = t_test - (valid_days or 0.0) * DAY
        return np.where(end > t_test, 2, np.where(end > t_valid, 1, 0))
    by = np.argsort(end, kind="stable") if order is None else np.lexsort((order, end))
    rank = np.empty(len(end), dtype=np.int64)
    rank[by] = np.arange(len(end))
    n_test = int(round(len(end) * test_fraction))
    n_valid = int(round(len(end) * (valid_fraction or 0.0)))
    return np.where(rank >= len(end) - n_test, 2, np.where(rank >= len(end) - n_test - n_valid, 1, 0))


DAY = 86400.0  # seconds


def day_cut(end: np.ndarray, days: float) -> float:
    """The time after which a session ends in the last `days` of `end` (the latest end time minus the days)."""
    return (float(end.max()) if end.size else 0.0) - days * DAY


def check_periods(owner: str, **periods: float | None) -> None:
    """Refuse a negative or empty period of `owner` (who is given it) in one line: days (``*_days``) must
    be positive, fractions (``*_fraction``) in (0, 1); None is a period not given."""
    for name, value in periods.items():
        if value is None:
            continue
        if name.endswith("_fraction") and not 0.0 < value < 1.0:
            raise ValueError(f"{owner}: {name} must be a share in (0, 1), got {value}: a period of no session (or of all) holds "
                             "nothing out")
        if name.endswith("_days") and not value > 0.0:
            raise ValueError(f"{owner}: {name} must be a positive number of days, got {value}: that period would hold no session")


def end_times(sessions: pa.Table) -> np.ndarray | None:
    """(N,) time of each session's last event (`last_times`), or None when the sessions carry no timestamps."""
    if TIMES not in sessions.column_names or sessions.num_rows == 0:
        return None
    return last_times(sessions)


def end_events(sessions: pa.Table) -> np.ndarray:
    """(N,) flat index of the event that ends each session: its last product (its last event when it has
    no virtual events, or no product)."""
    _, offsets = list_offsets(sessions.column(ITEMS))
    last = offsets[1:] - 1
    virtual = virtual_flags(sessions)
    if virtual is None:
        return last
    products = np.flatnonzero(~virtual)
    at = np.searchsorted(products, offsets[1:], side="left") - 1  # the last product before each session's end
    found = at >= 0
    found[found] = products[at[found]] >= offsets[:-1][found]
    return np.where(found, products[np.maximum(at, 0)] if len(products) else last, last)


def event_times(sessions: pa.Table) -> np.ndarray | None:
    """(E,) float64 time of every event, flat in session order (as `list_offsets` of ``item_id``),
    or None when the sessions carry no timestamps."""
    if TIMES not in sessions.column_names:
        return None
    values, _ = list_offsets(sessions.column(TIMES))
    if values.null_count:
        raise ValueError(f"the sessions' {TIMES!r} column has {values.null_count} missing event times")
    return values.to_numpy(zero_copy_only=False).astype(np.float64)


def last_times(sessions: pa.Table) -> np.ndarray:
    """(N,) time of each session's end event (`end_events`: its last product)."""
    values, _ = list_offsets(sessions.column(TIMES))
    return values.to_numpy(zero_copy_only=False)[end_events(sessions)]


def pad_sessions(
    values: np.ndarray, starts: np.ndarray, ends: np.ndarray, max_length: int, dtype: np.dtype | None = None
) -> np.ndarray:
    """Right-aligned padded matrix (N, L) from jagged values.

    Row ``i`` holds ``values[starts[i]:ends[i]]``, or its last `max_length` entries when longer,
    right-aligned with 0 as padding on the left: the most recent event is in the last column of
    every row, whatever the session length. Integer values come out as int64, floating-point
    values (continuous side features) as float32, unless `dtype` says otherwise.
    """
    if dtype is None:
        dtype = np.float32 if np.issubdtype(values.dtype, np.floating) else np.int64
    col = np.arange(max_length)[None, :]  # (1, L)
    src = ends[:, None] - max_length + col  # (N, L) flat index of each cell
    valid = src >= starts[:, None]
    if len(values) == 0:
        return np.zeros((len(starts), max_length), dtype=dtype)
    return np.where(valid, values[np.clip(src, 0, len(values) - 1)], 0).astype(dtype)


def prefix_rows(
    starts: np.ndarray, ends: np.ndarray, targetable: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every prefix of each ``[start, end)`` row that ends at a targetable event after its first.

    Args:
        starts: (N,) first event of each row (session) in a flat event array.
        ends: (N,) one past each row's last event.
        targetable: optional (E,) bool over that array, False for events that may be inputs but
            never targets (virtual items); all events are targetable when None.

    Returns:
        (starts, ends, row) of the prefix rows, (P,) each: row by row, shortest prefix first; ``row``
        is the input row each comes from. A row of n events gives the prefixes ending at its events
        2..n (the targetable ones).
    """
    n = np.maximum(ends - starts - 1, 0)  # (N,) prefixes of each row
    row = np.repeat(np.arange(len(starts)), n)
    rank = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)  # 0 = the two-event prefix
    new_starts, new_ends = starts[row], starts[row] + 2 + rank
    if targetable is not None:
        keep = np.asarray(targetable, dtype=bool)[new_ends - 1]
        new_starts, new_ends, row = new_starts[keep], new_ends[keep], row[keep]
    return new_starts, new_ends, row


def virtual_flags(sessions: pa.Table) -> np.ndarray | None:
    """(E,) bool flags of the virtual events of a session table (its ``virtual`` column), or None when it has none."""
    if VIRTUAL not in sessions.column_names:
        return None
    values, _ = list_offsets(sessions.column(VIRTUAL))
    return values.to_numpy(zero_copy_only=False).astype(bool)


def target_flags(sessions: pa.Table, virtual: np.ndarray | None = None) -> np.ndarray | None:
    """(E,) bool: the events of a session table that may be evaluation targets, or None for all.

    A virtual event (`virtual`, (E,) bool) is never a target; nor is one that the optional
    ``targetable`` column marks False (the events before an SR-GNN release's shortest prefix).
    """
    flags = None if virtual is None else ~np.asarray(virtual, dtype=bool)
    if TARGETABLE in sessions.column_names:
        marked = list_offsets(sessions.column(TARGETABLE))[0].to_numpy(zero_copy_only=False).astype(bool)
        flags = marked if flags is None else flags & marked
    return flags


def expand_prefixes(
    offsets: np.ndarray, protocol: str, targetable: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(prefix end, target index) pairs over jagged sessions for an evaluation protocol.

    Args:
        offsets: (N + 1,) session offsets.
        protocol: ``last`` (the last targetable event of each session is the target) or
            ``all_prefixes`` (every prefix predicts its next targetable event: the SR-GNN
            protocol, longest prefix first).
        targetable: optional (E,) bool, False for events that may be inputs but never targets
            (virtual items); all events are targetable when None. A target always has at least
            one event before it.

    Returns:
        session index (P,) and target flat index (P,); the prefix is the events before the target.
    """
    if protocol not in ("last", "all_prefixes"):
        raise ValueError(f"unknown evaluation protocol {protocol!r}; use 'last' or 'all_prefixes'")
    lengths = np.diff(offsets)
    if targetable is None:
        if protocol == "last":
            keep = np.flatnonzero(lengths >= 2)
            return keep, offsets[1:][keep] - 1
        n_pairs = np.maximum(lengths - 1, 0)
        session = np.repeat(np.arange(len(lengths)), n_pairs)
        first = np.cumsum(n_pairs) - n_pairs
        rank = np.arange(n_pairs.sum()) - np.repeat(first, n_pairs)  # 0 = longest prefix
        return session, offsets[1:][session] - 1 - rank
    targetable = np.asarray(targetable, dtype=bool)
    if targetable.shape != (offsets[-1],):
        raise ValueError(f"targetable must be ({offsets[-1]},) like the events, got {targetable.shape}")
    session_of = np.repeat(np.arange(len(lengths)), lengths)  # (E,)
    index = np.arange(offsets[-1])
    candidate = targetable & (index > offsets[:-1][session_of])  # something precedes it in its session
    if protocol == "all_prefixes":
        at = np.flatnonzero(candidate)[::-1]  # latest first: longest prefix first within a session ...
        session = session_of[at]
        order = np.argsort(session, kind="stable")  # ... and sessions in their order
        return session[order], at[order]
    last = np.full(len(lengths), -1, dtype=np.int64)
    np.maximum.at(last, session_of[candidate], index[candidate])
    keep = np.flatnonzero(last >= 0)
    return keep, last[keep]


def mirror_index(offsets: np.ndarray) -> np.ndarray:
    """(E,) gather index that reverses the events of every session in place.

    ``values[mirror_index(offsets)]`` holds each session backwards, at the same offsets.
    """
    lengths = np.diff(offsets)
    session_of = np.repeat(np.arange(len(lengths)), lengths)
    return offsets[:-1][session_of] + offsets[1:][session_of] - 1 - np.arange(offsets[-1])
