"""One ``/recommend`` request: its bounds, its parsing and checks, and its encoding, done alone.

A request is checked (`parse_request`) and encoded (`encode`) by itself before it joins a batch, so a bad request
fails with its own 4xx and costs nothing to the requests scored with it. Every refusal is a
`RequestError`: an HTTP status and a one-line message naming the field and the value. The values
are checked by `sessrec.pipeline.request.check_request`, as `Pipeline.recommend` and the session
model's `recommend` check theirs: a request the server refuses with 422 is refused by them with
the same message, and one it accepts they accept.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson

from sessrec.pipeline.candidates import RequestSessions
from sessrec.pipeline.clock import short
from sessrec.pipeline.request import Request, check_request, is_text
from sessrec.saved.registry import check_integers
from sessrec.serving.recommender import Recommender

_FIELDS = {"session", "sessions", "k", "on_unknown", "now", "times", "session_ids"}
_QUOTED_FIELDS = [f'"{name}"'.encode() for name in sorted(_FIELDS)]
_ESCAPED_NAME_CHAR = re.compile(rb"\\u00[4-7][0-9a-fA-F]")  # an escape that may spell a letter of a field's name
_LONG_NUMBER = re.compile(rb"\d{19}")  # where an integer may be past 64 bits (|x| >= 10**18 has 19 digits)
_QUERY_INTEGER = re.compile(r"-?[0-9]{1,19}")  # a query value shown as a JSON integer
_TOO_DEEP = "body nests arrays or objects too deeply to be read; a request nests them 3 deep at most"


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


def parse_request(body: bytes, limits: Limits) -> tuple[Request, list[str] | None]:
    """Check a ``/recommend`` body and return its checked `Request` and its ``session_ids`` (the client's
    id of each session, as text, which only the served log reads; None when not given); raise
    `RequestError` naming the problem.

    The body's structure and the server's bounds are checked here; its values by `check_request`,
    the rules and messages of every entry point (a refusal is a 422 with its message). The body is
    parsed by orjson, which reads JSON as Python's json does, except integers past 64 bits (which
    it reads as floats), ``NaN`` and ``Infinity``: a body with a run of 19 digits or more, or one
    orjson refuses, is parsed by Python's json, which reads them (`check_request` then refuses an
    id past 64 bits by name) and words the 400 of a body that is not JSON; a body nested deeper than
    both read, or so deep (about 1,000 levels) that no message can show its value, is a 400 too. A key
    given twice in one object (``{"k": 3, "k": 5}``), which orjson reads as its last value, is refused
    with 422 naming it and its values: a body where a field's quoted name occurs twice, or with an escape in a
    string, is read by Python's json too, which sees every key.
    """
    if not body.strip():  # a POST without a body (curl -X POST): the parser's message would be "Expecting value"
        raise RequestError(400, 'body is empty: send a JSON object, such as {"session": [item ids], "k": 20}')
    try:
        if _LONG_NUMBER.search(body) is not None:  # orjson reads integers past 64 bits as floats
            raise orjson.JSONDecodeError("", "", 0)
        payload = orjson.loads(body)
        if _may_repeat_a_field(body):  # orjson keeps the last value of a repeated key: the standard parser names it
            _standard_loads(body)
    except orjson.JSONDecodeError:  # the standard parser decides: the request is read, or refused with its message
        payload = _standard_loads(body)
    try:
        return _checked(payload, limits)
    except RecursionError:  # a value nested about 1,000 deep, which orjson reads (1,024 levels) and repr() cannot show
        raise RequestError(400, _TOO_DEEP) from None


def _checked(payload: Any, limits: Limits) -> tuple[Request, list[str] | None]:
    """`parse_request` of a parsed body."""
    if not isinstance(payload, dict):
        raise RequestError(422, f"body must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - _FIELDS)
    if unknown:
        given = ", ".join(f"{_cut(json.dumps(name))}: {short(payload[name])}" for name in unknown[:3])
        more = f", and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise RequestError(422, f"unknown field(s) {short(unknown)}; the fields are {sorted(_FIELDS)}; got {given}{more}")
    if ("session" in payload) == ("sessions" in payload):
        raise RequestError(422, 'give either "sessions" (a list of sessions) or "session" (one list of item ids)')
    one = "session" in payload  # one session, and its times as one list
    sessions = [payload["session"]] if one else payload["sessions"]
    if isinstance(sessions, list):  # the server's bounds; the values are check_request's
        if len(sessions) > limits.max_sessions_per_request:
            raise RequestError(
                413, f"{len(sessions)} sessions in one request; the limit is {limits.max_sessions_per_request}"
            )
        for row, session in enumerate(sessions):
            if isinstance(session, list) and len(session) > limits.max_items_per_session:
                raise RequestError(
                    413, f"session {row} has {len(session)} items; the limit is {limits.max_items_per_session} per session"
                )
    times = payload.get("times")
    if one and isinstance(times, list) and times and all(isinstance(t, list) for t in times):
        raise RequestError(422, f'times {short(times)}: with "session" (one session), times is one list of seconds, one '
                                'per item id; a list per session goes with "sessions"')
    try:
        request = check_request(sessions, payload.get("k", 20), payload.get("on_unknown", "oov"), payload.get("now"),
                                [times] if one and times is not None else times)
    except ValueError as err:
        raise RequestError(422, str(err)) from None
    if request.k > limits.k_max:
        raise RequestError(422, f"k {short(request.k)} is more than this server's limit of {limits.k_max} (k_max)")
    return request, _session_ids(payload.get("session_ids"), len(request.sessions), one)


def _standard_loads(body: bytes) -> Any:
    """The body parsed by Python's json; a key given twice in one object is refused (422 naming it and its values),
    a body that is not JSON or nests too deeply is a 400."""
    try:
        return json.loads(body, object_pairs_hook=_once_each, parse_int=_parse_int)
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise RequestError(400, f"body is not valid JSON: {err}") from None
    except RecursionError:  # past orjson's 1024 levels, and Python's recursion limit
        raise RequestError(400, _TOO_DEEP) from None


def _parse_int(text: str) -> int:
    """A JSON integer; one of more digits than Python's int() reads (4,300 by default) is refused by its size (422):
    no field takes one, and the standard parser's message would call the body invalid JSON."""
    try:
        return int(text)
    except ValueError:
        raise RequestError(422, f"body holds an integer of {len(text.lstrip('-'))} digits ({text[:12]}...); no field "
                                "of a request takes one: item ids fit in 64 bits") from None


def _may_repeat_a_field(body: bytes) -> bool:
    """Whether a body may give a field twice: one of the fields' quoted names occurs twice, or a string holds an escape
    of an ASCII letter or ``_`` (``\\u006b``, which may spell a name; ids escaped as non-ASCII text do not). Bodies
    without either are taken as orjson read them."""
    return _ESCAPED_NAME_CHAR.search(body) is not None or any(body.count(quoted) > 1 for quoted in _QUOTED_FIELDS)


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The JSON object of `pairs`; a key given more than once is refused with its values, in order (JSON leaves
    which one counts to the reader: the request would be answered for one of them)."""
    found = dict(pairs)
    if len(found) == len(pairs):
        return found
    counts: dict[str, int] = {}
    for key, _ in pairs:
        counts[key] = counts.get(key, 0) + 1
    key = next(key for key, _ in pairs if counts[key] > 1)
    given = [value for name, value in pairs if name == key]
    values = ", then ".join(short(value) for value in given[:3]) + (f", then {len(given) - 3} more" if len(given) > 3 else "")
    times = "twice" if counts[key] == 2 else f"{counts[key]} times"
    raise RequestError(422, f"field {_cut(json.dumps(key))} is given {times} ({values}); give each field once")


def check_query(query_string: bytes, route: str = "/recommend") -> None:
    """Refuse a query string on a POST route (``/recommend?k=3``): its settings are the JSON body's fields,
    and a query parameter would go unread. A 422 naming the first parameter and where it goes."""
    if not query_string:
        return
    params = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    name, value = params[0] if params else (query_string.decode("latin-1"), "")
    shown = json.dumps(int(value) if _QUERY_INTEGER.fullmatch(value) else value)  # not int() of "²" or 5,000 digits
    raise RequestError(
        422, f"query parameter {short(name)} of POST {route}?{_cut(query_string.decode('latin-1'))} is not read: the "
             f"settings are fields of the JSON body ({_cut(json.dumps(name))}: {_cut(shown)}); the fields are "
             f"{sorted(_FIELDS)}")


def _cut(text: str) -> str:
    """`text` for a one-line message, cut to 60 characters (`short` of text that is no repr)."""
    return text if len(text) <= 60 else text[:57] + "..."


def _session_ids(ids: Any, sessions: int, one: bool) -> list[str] | None:
    """The ``session_ids`` field as text: one id (a string or an integer) per session, no two alike as text (``7`` and
    ``"7"`` are one id); with ``session``, one id or a list of one. A string that is no UTF-8 text (an unpaired surrogate, which JSON can write) is
    refused: the canary hashes the ids' UTF-8 bytes and the served log writes them."""
    if ids is None:
        return None
    if one and not isinstance(ids, list):
        ids = [ids]
    if not isinstance(ids, list) or len(ids) != sessions:
        raise RequestError(422, f"session_ids must be a list of one id per session ({sessions}), got {short(ids)}")
    for row, value in enumerate(ids):
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise RequestError(422, f"session_ids[{row}] must be a string or an integer, got {short(value)}")
        if isinstance(value, str) and not is_text(value):
            raise RequestError(422, f"session_ids[{row}] must be text or an integer, got {short(value)} "
                                    "(an unpaired surrogate)")
    texts = [str(value) for value in ids]
    first: dict[str, int] = {}
    for row, text in enumerate(texts):
        if text in first:  # the served log joins a session to its later events by its id
            raise RequestError(422, f"session_ids: id {short(ids[row])} is given twice, to session {first[text]} "
                                    f"({short(ids[first[text]])}) and session {row}; each session needs its own id")
        first[text] = row
    return texts



def encode(request: Request, recommender: Recommender, arrival: float | None = None) -> RequestSessions:
    """A checked request's sessions encoded by `recommender`'s vocabulary (its ``encode``).

    Args:
        request: the request (`parse_request`), or the part of its sessions one version answers.
        recommender: the model whose vocabulary encodes it.
        arrival: when the request arrived (seconds since the epoch): its ``now`` when it gives
            neither ``now`` nor ``times`` (`sessrec.pipeline.clock.request_now`); None: the clock now.

    Raises `RequestError` (422) for the encoder's ValueError and TypeError (an unknown id under
    ``on_unknown="error"``, an id the vocabulary cannot read, no ``times`` for a ranker fitted with
    time features).
    """
    try:
        return recommender.encode(request, arrival)
    except (ValueError, TypeError) as err:
        raise RequestError(422, str(err)) from None
