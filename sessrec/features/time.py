"""Per-event time features: lags and positions within a session, cyclic hour and weekday.

Stateless `FeatureOp`s (nothing to fit) on events sorted by session and time. Array code on
the array API standard, as in `sessrec.features.ops`.

Shape letters: E events (rows), N sessions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sessrec.features.backend import (
    Array,
    check_nulls,
    device,
    finite_floats,
    first_bad,
    get_column,
    integer_values,
    namespace,
    on_backend_of,
    value_at,
)
from sessrec.features.ops import _SECONDS, FeatureOp, TimeUnit, _Keys


@dataclass
class SessionTimes:
    """Per-event session features (E,): times in seconds, positions 0-based."""

    since_prev: Array  # time since the previous event of the session; 0 for the first
    elapsed: Array  # time since the session's first event
    position: Array  # index from the start
    position_from_end: Array  # index from the end: 0 for the last event


def session_offsets(session_ids: Array) -> Array:
    """Offsets (N + 1,) of runs of equal consecutive session ids (rows sorted by session)."""
    xp = namespace(session_ids)
    n = session_ids.shape[0]
    change = xp.nonzero(session_ids[1:] != session_ids[:-1])[0] + 1
    ends = xp.asarray([0, n] if n else [0], dtype=xp.int64, device=device(session_ids))
    return xp.concat([ends[:1], xp.astype(change, xp.int64), ends[1:]])


def session_times(times: Array, offsets: Array) -> SessionTimes:
    """`SessionTimes` of float times (E,) sorted by session and time; sessions are `offsets` (N + 1,)."""
    xp = namespace(times, offsets)
    row = xp.arange(times.shape[0], dtype=xp.int64, device=device(times))
    session = xp.searchsorted(offsets[1:], row, side="right")  # (E,) session of each row
    start, end = xp.take(offsets[:-1], session), xp.take(offsets[1:], session)
    position = row - start
    prev = xp.concat([times[:1], times[:-1]])
    since = xp.where(position > 0, times - prev, 0.0)
    elapsed = times - xp.take(times, start) if times.shape[0] else times
    return SessionTimes(since, elapsed, position, end - 1 - row)


class SessionTimeFeatures(FeatureOp):
    """Lagged/positional features of events sorted by session then time (`SessionTimes`); stateless.

    Rows of a session must be adjacent and their times non-decreasing (`frame.sort_events`
    orders an event log so); both are checked.

    Args:
        session: session id column.
        timestamp: event time column (numbers).
        time_unit: ``s`` or ``ms``; outputs are in seconds.
    """

    def __init__(
        self, session: str = "session_id", timestamp: str = "timestamp", time_unit: TimeUnit = "s"
    ) -> None:
        self.session, self.timestamp, self.time_unit = session, timestamp, time_unit

    def transform(self, frame: Any) -> SessionTimes:
        tcol = get_column(frame, self.timestamp)
        times = finite_floats(tcol, "session time features") * _SECONDS[self.time_unit]
        xp = namespace(times)
        scol = get_column(frame, self.session)
        check_nulls(scol, "error", "a session column without nulls")
        if scol.is_text:
            ids = _Keys.fit(scol).lookup(scol, like=times)
        else:
            ids = on_backend_of(integer_values(scol), times)
        offsets = session_offsets(ids)
        starts = offsets[:-1]
        order = xp.argsort(xp.take(ids, starts), stable=True)
        run_ids = xp.take(ids, xp.take(starts, order))  # first id of each run, sorted by id
        again = xp.take(starts, order)[1:][run_ids[1:] == run_ids[:-1]]  # later runs of a session
        if again.shape[0]:
            row = int(xp.min(again))
            raise ValueError(
                f"column {self.session!r}: the rows of session {value_at(scol, row)!r} are not adjacent "
                f"(again at row {row}); sort events by session and time first (frame.sort_events)"
            )
        out = session_times(times, offsets)
        back = (out.position > 0) & (out.since_prev < 0)
        if bool(xp.any(back)):
            value, row = first_bad(tcol, back)
            raise ValueError(
                f"column {self.timestamp!r} goes back in time within a session: {value!r} at row {row}; "
                "sort events by session and time first (frame.sort_events)"
            )
        return out


@dataclass
class CyclicTimes:
    """Hour of day and day of week (UTC) on the unit circle (E,) each."""

    hour_sin: Array
    hour_cos: Array
    weekday_sin: Array
    weekday_cos: Array


class CyclicTime(FeatureOp):
    """Hour of day and day of week as sin/cos, in UTC; stateless.

    The hour is fractional (``(t mod 86400) / 3600``, so 06:30 is 6.5) and the angle is
    ``2 pi hour / 24``; the weekday is whole (Monday 0 .. Sunday 6; 1970-01-01 was a
    Thursday) and the angle ``2 pi weekday / 7``.

    Args:
        timestamp: event time column, seconds or milliseconds since the epoch.
        time_unit: ``s`` or ``ms``.
    """

    def __init__(self, timestamp: str = "timestamp", time_unit: TimeUnit = "s") -> None:
        self.timestamp, self.time_unit = timestamp, time_unit

    def transform(self, frame: Any) -> CyclicTimes:
        t = finite_floats(get_column(frame, self.timestamp), "cyclic time features")
        t = t * _SECONDS[self.time_unit]
        xp = namespace(t)
        hour = xp.remainder(t, 86400.0) / 3600.0
        weekday = xp.remainder(xp.floor(t / 86400.0) + 3.0, 7.0)
        a, b = hour * (2 * math.pi / 24), weekday * (2 * math.pi / 7)
        return CyclicTimes(xp.sin(a), xp.cos(a), xp.sin(b), xp.cos(b))
