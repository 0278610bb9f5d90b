"""One ``/recommend`` request: its bounds, its parsing and checks, and its encoding, done alone.

A request is checked and encoded by itself before it joins a batch (`prepare`), so a bad request
fails with its own 4xx and costs nothing to the requests scored with it. Every refusal is a
`RequestError`: an HTTP status and a one-line message naming the field and the value.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.clock import check_seconds
from sessrec.saved.registry import check_integers
from sessrec.serving.recommender import Recommender

OnUnknown = Literal["oov", "error"]
_FIELDS = {"session", "sessions", "k", "on_unknown", "now", "times"}
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """Bounds on one request, checked before it reaches the model.

    Args:
        max_request_bytes: largest body, counted on the bytes received (with or without Content-Length).
        max_sessions_per_request: most sessions in one request.
        max_items_per_session: most item ids in one session (the model reads only the most recent ones).
        k_max: largest ``k``.
    """

    max_request_bytes: int = 1 << 20
    max_sessions_per_request: int = 256
    max_items_per_session: int = 1_000
    k_max: int = 100

    def __post_init__(self) -> None:
        check_integers(asdict(self))


class RequestError(Exception):
    """A request refused with an HTTP status and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, " ".join(message.split())


@dataclass
class Query:
    """One parsed request: its sessions and settings.

    Args:
        sessions: each session's raw item ids, oldest first.
        k: recommendations per session.
        on_unknown: what an unknown id becomes.
        now: the request's ``now`` (seconds since the epoch), or None when it gave none (its
            arrival time then, `prepare`).
        times: per session its events' times in seconds, aligned with its item ids, or None.
    """

    sessions: list[list[Any]]
    k: int = 20
    on_unknown: OnUnknown = "oov"
    now: float | None = None
    times: list[list[Any]] | None = None


def parse_request(body: bytes, limits: Limits) -> Query:
    """Check a ``/recommend`` body and return its `Query`; raise `RequestError` naming the problem."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise RequestError(400, f"body is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise RequestError(422, f"body must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - _FIELDS)
    if unknown:
        raise RequestError(422, f"unknown field(s) {unknown}; the fields are {sorted(_FIELDS)}")
    if ("session" in payload) == ("sessions" in payload):
        raise RequestError(422, 'give either "sessions" (a list of sessions) or "session" (one list of item ids)')
    sessions = payload["sessions"] if "sessions" in payload else [payload["session"]]
    if not isinstance(sessions, list) or not sessions:
        raise RequestError(422, '"sessions" must be a non-empty list of sessions, each a list of item ids')
    if len(sessions) > limits.max_sessions_per_request:
        raise RequestError(
            413, f"{len(sessions)} sessions in one request; the limit is {limits.max_sessions_per_request}"
        )
    for row, session in enumerate(sessions):
        _check_session(row, session, limits)
    k = payload.get("k", 20)
    if type(k) is not int or not 1 <= k <= limits.k_max:
        raise RequestError(422, f'"k" must be an integer in [1, {limits.k_max}], got {k!r}')
    on_unknown = payload.get("on_unknown", "oov")
    if on_unknown not in ("oov", "error"):
        raise RequestError(422, f'"on_unknown" must be "oov" or "error", got {on_unknown!r}')
    return Query(sessions, k, on_unknown, _now(payload), _times(payload))


def _now(payload: dict[str, Any]) -> float | None:
    """The request's ``now``: a number of seconds since the epoch, or None when absent."""
    if "now" not in payload:
        return None
    now = payload["now"]
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        raise RequestError(422, f'"now" must be a number of seconds since the epoch, got {now!r}')
    try:
        return float(check_seconds(now, '"now"'))
    except (ValueError, OverflowError) as err:
        raise RequestError(422, str(err)) from None


def _times(payload: dict[str, Any]) -> list[list[Any]] | None:
    """The request's ``times``: one list of event times per session (one list for ``"session"``)."""
    if "times" not in payload:
        return None
    times = payload["times"]
    if "session" in payload:
        if not isinstance(times, list):
            raise RequestError(
                422, f'"times" must be a list of event times (seconds) for "session", got {type(times).__name__}'
            )
        return [times]
    if not isinstance(times, list) or not all(isinstance(t, list) for t in times):
        raise RequestError(422, '"times" must be a list with, per session, a list of its events\' times in seconds')
    return times


def _check_session(row: int, session: Any, limits: Limits) -> None:
    if not isinstance(session, list):
        raise RequestError(422, f"session {row} must be a list of item ids, got {type(session).__name__}")
    if not session:
        raise RequestError(422, f"session {row} is empty: give at least one item id")
    if len(session) > limits.max_items_per_session:
        raise RequestError(
            413, f"session {row} has {len(session)} items; the limit is {limits.max_items_per_session} per session"
        )
    kinds = {type(item) for item in session}
    if not kinds <= {str, int}:  # bool and float are not ids; the vocabulary casts str <-> int itself
        bad = next(item for item in session if type(item) not in (str, int))
        raise RequestError(422, f"session {row}: item ids must be strings or integers, got {bad!r}")
    if int in kinds:
        ints = [item for item in session if type(item) is int]
        low, high = min(ints), max(ints)
        if low < -_INT64_MAX - 1 or high > _INT64_MAX:
            bad = high if high > _INT64_MAX else low
            raise RequestError(422, f"session {row}: item id {bad} does not fit in a 64-bit integer")


def prepare(
    body: bytes, recommender: Recommender, limits: Limits, arrival: float | None = None
) -> tuple[Query, RequestSessions]:
    """Parse, check and encode one request alone: its `Query` and its encoded sessions.

    Args:
        body: the request's body.
        recommender: the model whose vocabulary encodes it.
        limits: the bounds on one request.
        arrival: when the request arrived (seconds since the epoch), its time when it gives no
            ``now``; None: the clock now.

    Raises `RequestError` (4xx) for what the request got wrong, the encoder's ValueError and
    TypeError included (an unknown id under ``on_unknown="error"``, an id the vocabulary cannot read,
    event times that do not fit their sessions, no ``times`` for a ranker fitted with time features).
    """
    query = parse_request(body, limits)
    now = query.now if query.now is not None else (arrival if arrival is not None else time.time())
    try:
        return query, recommender.encode(query.sessions, query.on_unknown, now=now, times=query.times)
    except (ValueError, TypeError) as err:
        raise RequestError(422, str(err)) from None
