"""When a request is served and when its events happened: the times the pipeline reads.

Two times enter the pipeline with a batch of sessions (`RequestSessions`):

- ``now`` (B,): the time at which each session is served. The validity windows of rule tables
  (`ItemTableFilter`) are applied at it. Every entry point sets it: `Pipeline.recommend` and the
  server take it from the caller or from the clock at the call, ``sessrec recommend`` from each
  session's last event or from the time the run starts.
- ``times`` (B, L): each event's time, right-aligned with the items (0 on padding), from which the
  ranker's time features are built (hour and weekday of the last event, session duration).

All times are float64 seconds since the epoch (UTC). A time is plausible when it is finite, not
negative and before the year 3000 (`LATEST`): a larger number is almost always milliseconds given
where seconds are expected, which would put every request centuries past every validity window.
A session is served after its events: its request time may precede its last event by at most
`CLOCK_SKEW` (the caller's clock may run a little ahead of the server's).

Shape letters: B sessions, W positions of the widest session (at most the width asked for).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sessrec.data import frame

__all__ = ["CLOCK_SKEW", "LATEST", "check_seconds", "event_times", "request_now"]

LATEST = 32_503_680_000.0  # 3000-01-01T00:00:00Z in seconds since the epoch
CLOCK_SKEW = 300.0  # seconds a session's last event may lie after its request time (the two clocks differ)
_LATE = "after the year 3000 (milliseconds? give seconds)"


def _problem(value: float) -> str:
    """Why `value` is not a plausible time in seconds."""
    if math.isnan(value):
        return "not a number"
    if value < 0:
        return "before 1970 (negative)"
    return _LATE


def _floats(values: Any, what: str) -> np.ndarray:
    """`values` as float64; an integer too large for a float is refused as a time after the year 3000."""
    try:
        return np.asarray(values, dtype=np.float64)
    except OverflowError:
        flat = values if isinstance(values, Sequence) else [values]
        big = next(v for v in flat if isinstance(v, int) and abs(v) >= LATEST)
        raise ValueError(f"{what} {_digits(big)} is not a time in seconds since the epoch: {_LATE}") from None


def _shown(value: float) -> str:
    """A time for a message: whole seconds as an integer, else every digit float64 keeps."""
    value = float(value)
    return repr(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


def _digits(value: int) -> str:
    """A huge integer, shortened for a one-line message."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def check_seconds(values: np.ndarray | Sequence[float] | float, what: str) -> np.ndarray:
    """The values as float64 seconds, checked: finite, >= 0 and before the year 3000.

    Args:
        values: one time or an array of times.
        what: how the message names them (``"now"``, ``"session 3's event time"``).

    Returns:
        The values as a float64 array (a 0-d array for one time).

    Raises:
        ValueError: one line naming `what`, the first implausible value and why.
    """
    seconds = _floats(values, what)
    bad = ~(np.isfinite(seconds) & (seconds >= 0) & (seconds < LATEST))
    if bad.any():
        value = float(seconds.reshape(-1)[int(np.flatnonzero(bad.reshape(-1))[0])])
        raise ValueError(f"{what} {_shown(value)} is not a time in seconds since the epoch: {_problem(value)}")
    return seconds


def request_now(
    now: float | Sequence[float] | np.ndarray | torch.Tensor | None, n: int, times: torch.Tensor | None = None
) -> torch.Tensor:
    """(n,) float64 request times: one for all sessions, one per session, or the clock's now.

    Args:
        now: seconds since the epoch for every session, or one per session; None: the wall clock
            at the call (`time.time()`), the same for every session.
        n: sessions in the request.
        times: (n, W) their event times, right-aligned (`event_times`), or None. A session's last
            event may follow its request time by at most `CLOCK_SKEW` (the events' times come from
            the caller's clock, which may run a little ahead of the server's).

    Raises:
        TypeError: `now` is neither a number nor a sequence of numbers.
        ValueError: a sequence of another length than `n`, an implausible time (`check_seconds`),
            or a request time more than `CLOCK_SKEW` before the session's last event.
    """
    out = torch.full((n,), time.time(), dtype=torch.float64) if now is None else _given_now(now, n)
    if times is not None and times.shape[0] == n and times.shape[-1] > 0:
        last = times[:, -1].to(torch.float64).cpu()
        early = torch.nonzero(out + CLOCK_SKEW < last).flatten()
        if len(early):
            row = int(early[0])
            raise ValueError(f"now {_shown(out[row])} is {_shown(last[row] - out[row])} s before the last event of "
                             f"session {row} ({_shown(last[row])}): a session is served after its events")
    return out


def _given_now(now: float | Sequence[float] | np.ndarray | torch.Tensor, n: int) -> torch.Tensor:
    """(n,) float64: the caller's request time(s), checked (`request_now`)."""
    if isinstance(now, torch.Tensor):
        now = now.detach().cpu().numpy()
    if isinstance(now, (bool, str, bytes)):
        raise TypeError(f"now must be seconds since the epoch (a number, or one per session), got {now!r}")
    try:
        seconds = _floats(now, "now")
    except (TypeError, ValueError) as err:
        if "is not a time" in str(err):
            raise
        raise TypeError(f"now must be seconds since the epoch (a number, or one per session), got {now!r}") from None
    if seconds.ndim > 1 or (seconds.ndim == 1 and len(seconds) != n):
        raise ValueError(f"now holds {seconds.size} times for {n} sessions: give one time, or one per session")
    check_seconds(seconds, "now")
    return torch.from_numpy(np.broadcast_to(seconds, (n,)).copy())


def event_times(times: Sequence[Sequence[Any]], lengths: Sequence[int], width: int) -> torch.Tensor:
    """(B, W) float64 event times, right-aligned as the items are (0 on padding), the last `width` kept.

    Args:
        times: per session its events' times in seconds, oldest first, one per item id.
        lengths: (B,) item ids of each session.
        width: W, the width of the encoded items (their latest `width` events).

    Raises:
        TypeError: `times` is not a list of lists of numbers.
        ValueError: another number of sessions or of times than of item ids, an implausible time
            (`check_seconds`), or times that go back within a session. The message names the session.
    """
    if isinstance(times, (str, bytes)) or not isinstance(times, Sequence):
        raise TypeError("times must be a list with, per session, a list of its events' times in seconds")
    if len(times) != len(lengths):
        raise ValueError(f"times has {len(times)} lists for {len(lengths)} sessions: give one list per session")
    for row, (session, length) in enumerate(zip(times, lengths)):
        if isinstance(session, (str, bytes)) or not isinstance(session, Sequence):
            raise TypeError(f"times of session {row} must be a list of numbers, got {type(session).__name__}")
        if len(session) != length:
            raise ValueError(f"times of session {row} has {len(session)} values for its {length} item ids")
        bad = next((t for t in session if isinstance(t, bool) or not isinstance(t, (int, float))), None)
        if bad is not None:
            raise TypeError(f"times of session {row} must be numbers (seconds since the epoch), got {bad!r}")
    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    row_of = np.repeat(np.arange(len(lengths)), np.diff(offsets))
    values = [t for session in times for t in session]
    try:
        flat = np.array(values, dtype=np.float64)
    except OverflowError:
        at = next(i for i, t in enumerate(values) if abs(t) >= LATEST)
        raise ValueError(f"session {int(row_of[at])}'s event time {_digits(values[at])} is not a time in seconds since "
                         f"the epoch: {_LATE}") from None
    bad = ~(np.isfinite(flat) & (flat >= 0) & (flat < LATEST))
    if bad.any():
        at = int(np.flatnonzero(bad)[0])
        check_seconds(flat[at], f"session {int(row_of[at])}'s event time")
    back = np.flatnonzero((np.diff(flat) < 0) & (row_of[1:] == row_of[:-1]))
    if len(back):
        at = int(back[0]) + 1
        row = int(row_of[at])
        raise ValueError(
            f"times of session {row} go back at position {at - int(offsets[row])} ({_shown(flat[at])} after "
            f"{_shown(flat[at - 1])}): give each session's events oldest first"
        )
    padded = frame.pad_sessions(flat, offsets[:-1], offsets[1:], width, np.float64)
    return torch.from_numpy(np.ascontiguousarray(padded))
