"""The two times of a request: when its events happened and when it is served, and the one rule between them.

- ``times`` (B, L): each event's time, right-aligned with the items (0 on padding). Everything the
  ranker computes from time reads them and nothing else: the session's duration and the hour and
  weekday of its last event (`CandidateFeatures`). A session scores the same whenever, and through
  whichever entry point, it is scored: the server, `Pipeline.recommend`, ``sessrec recommend`` and
  the evaluation (`evaluate_pipeline`). A ranker fitted with time features refuses sessions without
  times; it never takes them from a clock.
- ``now`` (B,): the time at which each session is served, read only by the validity windows of the
  allow/deny tables (`ItemTableFilter`). Given by the caller (one time, or one per session), else
  each session's last event where the request gives ``times`` (`request_now`), else the clock at
  the request: the server's arrival, the call of `Pipeline.recommend`, the start of a ``sessrec
  recommend`` run.

All times are float64 seconds since the epoch (UTC). A time is plausible when it is finite, not
negative and before the year 3000 (`LATEST`): a larger number is almost always milliseconds given
where seconds are expected, which would put every request centuries past every validity window.
An event time is held to the data readers' bounds (`sessrec.data.times.PLAUSIBLE_SECONDS`): before
2100, and a session's times all in 1990..2100 or all before 1990 (relative times), never both.
A session is served after its events: a ``now`` given may precede the session's last event by at
most `CLOCK_SKEW` (the caller's clock may run a little ahead of the events' clock); more is
refused by every entry point with the same message (`check_served_after`).

Shape letters: B sessions, W positions of the widest session (at most the width asked for), E events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from sessrec.data import frame
from sessrec.data.times import PLAUSIBLE_SECONDS

__all__ = ["CLOCK_SKEW", "LATEST", "check_now", "check_seconds", "check_served_after", "check_times", "pad_times",
           "request_now", "short"]

LATEST = 32_503_680_000.0  # 3000-01-01T00:00:00Z in seconds since the epoch
CLOCK_SKEW = 300.0  # seconds a session's last event may lie after its request time (the two clocks differ)
_LATE = "after the year 3000 (milliseconds? give seconds)"


def _problem(value: float) -> str:
    """Why `value` is not a plausible time in seconds."""
    if math.isnan(value):
        return "not a number"
    if math.isinf(value):
        return "infinite"
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
    """A time for a message: whole seconds as an integer (shortened past 24 digits: `_digits`), else every digit
    float64 keeps."""
    value = float(value)
    return _digits(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


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


def check_now(now: Any, n: int) -> np.ndarray | None:
    """A request's ``now``, checked: (n,) float64 seconds, or None when it gives none.

    Args:
        now: one time for every session, one per session (a list, an array, a tensor), or None.
        n: sessions in the request.

    Raises:
        ValueError: not a number nor a list of numbers, a list of another length than `n`, or an
            implausible time (`check_seconds`); one line naming ``now`` and the value.
    """
    if now is None:
        return None
    if isinstance(now, torch.Tensor):
        now = now.detach().cpu().numpy()
    flat = now.tolist() if isinstance(now, (np.ndarray, np.generic)) else now
    numbers = flat if isinstance(flat, (list, tuple)) else [flat]
    if not all(map(_is_number, numbers)) or isinstance(flat, (list, tuple)) and not flat:
        raise ValueError(f"now must be seconds since the epoch (a number, or one per session), got {short(now)}")
    seconds = check_seconds(flat, "now")
    if seconds.ndim == 1 and len(seconds) != n:
        raise ValueError(f"now holds {seconds.size} times for {n} sessions: give one time, or one per session")
    return np.ascontiguousarray(np.broadcast_to(seconds, (n,)))


def check_times(times: Any, lengths: Sequence[int]) -> np.ndarray:
    """A request's ``times``, checked: (E,) float64 seconds, the events of each session in turn.

    Args:
        times: per session its events' times in seconds, oldest first, one per item id.
        lengths: (B,) item ids of each session.

    Raises:
        ValueError: not a list of lists of numbers, another number of sessions or of times than of
            item ids, an implausible time (`check_seconds`), or times that go back within a
            session; one line naming the session and the value.
    """
    if not isinstance(times, (list, tuple)):
        got = type(times).__name__
        raise ValueError(f"times must be a list with, per session, a list of its events' times in seconds, got {got}")  # noqa: TRY004
    if len(times) != len(lengths):
        raise ValueError(f"times has {len(times)} lists for {len(lengths)} sessions: give one list per session")
    for row, (session, length) in enumerate(zip(times, lengths)):
        if not isinstance(session, (list, tuple)):
            raise ValueError(f"times of session {row} must be a list of numbers, got {type(session).__name__}")  # noqa: TRY004
        if len(session) != length:
            raise ValueError(f"times of session {row} has {len(session)} values for its {length} item ids")
        if not all(map(_is_number, session)):
            bad = next(t for t in session if not _is_number(t))
            raise ValueError(f"times of session {row} must be numbers (seconds since the epoch), got {short(bad)}")
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
    late = np.flatnonzero(flat >= PLAUSIBLE_SECONDS[1])
    if len(late):
        at = int(late[0])
        raise ValueError(f"session {int(row_of[at])}'s event time {_shown(flat[at])} is after 2100: give seconds since "
                         "the epoch, as the data readers take an event log's")
    early = flat < PLAUSIBLE_SECONDS[0]  # ascending within a session: its early times come first
    mixed = np.flatnonzero(early[:-1] & ~early[1:] & (row_of[1:] == row_of[:-1]))
    if len(mixed):
        at = int(mixed[0])
        row = int(row_of[at])
        raise ValueError(
            f"times of session {row} hold {_shown(flat[at])}, before 1990, beside {_shown(flat[at + 1])}: give every "
            "event's time in seconds since the epoch (or all relative to one start)"
        )
    return flat


def check_served_after(now: np.ndarray | torch.Tensor, last: np.ndarray | torch.Tensor,
                       names: Callable[[int], str] = lambda row: f"session {row}") -> None:
    """Refuse sessions served more than `CLOCK_SKEW` before their last event.

    Args:
        now: (B,) the times the sessions are served at.
        last: (B,) the times of their last events.
        names: how the message names the session of a row (``session 3``, ``session 'a7'``).

    Raises:
        ValueError: ``now T is D s before the last event of session S (L): a session is served after
            its events``, for the first such session.
    """
    now, last = np.asarray(now, dtype=np.float64), np.asarray(last, dtype=np.float64)
    early = np.flatnonzero(now + CLOCK_SKEW < last)
    if len(early):
        row = int(early[0])
        raise ValueError(f"now {_shown(now[row])} is {_shown(last[row] - now[row])} s before the last event of "
                         f"{names(row)} ({_shown(last[row])}): a session is served after its events")


def pad_times(flat: np.ndarray, lengths: Sequence[int], width: int) -> torch.Tensor:
    """(B, W) float64 event times of `check_times`, right-aligned as the items are (0 on padding), the
    last `width` of each session kept."""
    offsets = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    padded = frame.pad_sessions(flat, offsets[:-1], offsets[1:], width, np.float64)
    return torch.from_numpy(np.ascontiguousarray(padded))


def request_now(now: np.ndarray | None, n: int, times: torch.Tensor | None = None,
                arrival: float | None = None) -> torch.Tensor:
    """(n,) float64: the times `n` sessions are served at, by the rule of the module docstring.

    Args:
        now: (n,) the request's times (`check_now`), or None when it gives none.
        n: sessions in the request.
        times: (n, W) their event times, right-aligned (`pad_times`), or None.
        arrival: the clock's reading at the request (the server's arrival); None: `time.time()`.
    """
    if now is not None:
        return torch.from_numpy(np.asarray(now, dtype=np.float64).copy())
    if times is not None:
        return times[:, -1].to(torch.float64).clone()
    return torch.full((n,), time.time() if arrival is None else arrival, dtype=torch.float64)


def _is_number(value: Any) -> bool:
    """An int or a float (numpy's float64 included), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def short(value: Any) -> str:
    """`value` for a one-line message, cut to 60 characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."
