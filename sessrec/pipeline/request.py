"""`check_request`: what every way in checks of a recommendation request, with the same one-line messages;
`encode_raw`: a checked request's raw ids as the model ids of a vocabulary.

The server (``POST /recommend``, which answers a refusal with 422 and its message),
`Pipeline.recommend`, the session model's `recommend` (`sessrec.serving.SessionModelService`) and
``sessrec recommend`` (its ``k`` and ``now``) call it, so that one request is accepted by all of
them or refused by all of them with the same words. It checks what needs no model: the shape and
types of the sessions, ``k``, ``on_unknown``, and the two times (`sessrec.pipeline.clock`). What
needs the model's vocabulary (an id it cannot read, an unknown id under ``on_unknown="error"``) and
its ranker (event times for time features) is checked when the request is encoded (`encode_raw` for the ids,
which the pipeline and the session model's service both call).

The rules:

- ``sessions``: a non-empty list of sessions, each a non-empty list of item ids, oldest first; an
  id is a string (text: no unpaired surrogate) or an integer that fits in 64 bits (not a bool, a float,
  None or a list);
- ``k``: an integer of 1 or more (not a bool, not a float);
- ``on_unknown``: ``"oov"`` (unknown ids scored as the out-of-vocabulary item) or ``"error"``;
- ``now``: None, a number of seconds since the epoch, or one per session, each plausible
  (`clock.check_seconds`); with ``times``, at most `clock.CLOCK_SKEW` before each session's last event;
- ``times``: None, or per session a list of its events' times in seconds, one per item id, plausible
  and oldest first (`clock.check_times`).

Examples:
    >>> check_request([["a", 7]], k=3).k
    3
    >>> check_request("ab")
    Traceback (most recent call last):
    ...
    ValueError: sessions must be a non-empty list of sessions, each a list of item ids, got str
    >>> check_request([[1, None]])
    Traceback (most recent call last):
    ...
    ValueError: session 0: item ids must be strings or integers, got None
    >>> check_request([[1]], k=0)
    Traceback (most recent call last):
    ...
    ValueError: k must be an integer of 1 or more, got 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from sessrec.data import frame
from sessrec.pipeline import clock

if TYPE_CHECKING:
    from sessrec.data.vocab import ItemVocab

__all__ = ["CANONICAL_INT", "Request", "check_k", "check_request", "encode_raw", "is_text"]

_INT64 = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class Request:
    """A request that `check_request` accepted.

    Args:
        sessions: each session's raw item ids, oldest first.
        k: recommendations per session.
        on_unknown: ``oov`` or ``error``.
        now: (B,) float64 seconds each session is served at, or None when the request gave none.
        times: (E,) float64 seconds of every event, session after session, or None when the request gave none.
    """

    sessions: list[list[Any]]
    k: int = 20
    on_unknown: str = "oov"
    now: np.ndarray | None = None
    times: np.ndarray | None = None

    @property
    def lengths(self) -> list[int]:
        """(B,) item ids of each session."""
        return [len(s) for s in self.sessions]


def check_request(
    sessions: Any, k: Any = 20, on_unknown: Any = "oov", now: Any = None, times: Any = None
) -> Request:
    """The request checked by the rules of the module docstring.

    Every refusal is a ValueError, a wrong type included: the server answers it with 422 and its text.

    Raises:
        ValueError: one line naming the field and the value, for the first rule broken (in the
            order of the module docstring).
    """
    if not isinstance(sessions, (list, tuple)) or not sessions:
        got = "an empty list" if isinstance(sessions, (list, tuple)) else type(sessions).__name__
        raise ValueError(f"sessions must be a non-empty list of sessions, each a list of item ids, got {got}")
    for row, session in enumerate(sessions):
        _check_session(row, session)
    k = check_k(k)
    if not isinstance(on_unknown, str) or on_unknown not in ("oov", "error"):
        raise ValueError(f'on_unknown must be "oov" or "error", got {clock.short(on_unknown)}')
    checked_now = clock.check_now(now, len(sessions))
    checked_times = None if times is None else clock.check_times(times, [len(s) for s in sessions])
    if checked_now is not None and checked_times is not None:
        clock.check_served_after(checked_now, checked_times[np.cumsum([len(s) for s in sessions]) - 1])
    return Request([list(s) for s in sessions], k, on_unknown, checked_now, checked_times)


def check_k(k: Any) -> int:
    """`k`, the number of recommendations per session, checked: an integer of 1 or more.

    Raises:
        ValueError: ``k must be an integer of 1 or more, got ...``.
    """
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be an integer of 1 or more, got {clock.short(k)}")
    return int(k)


def _check_session(row: int, session: Any) -> None:
    if not isinstance(session, (list, tuple)):
        raise ValueError(f"session {row} must be a list of item ids, got {type(session).__name__}")  # noqa: TRY004
    if not session:
        raise ValueError(f"session {row} is empty: give at least one item id")
    if not set(map(type, session)) <= {str, int}:  # else: plain ids; bool, float, None and lists are not ids
        at = next((at for at, item in enumerate(session) if not _is_id(item)), None)
        if at is not None:
            raise ValueError(f"session {row}: item ids must be strings or integers, got {clock.short(session[at])}")
    texts = [i for i in session if isinstance(i, str)]
    if texts and not is_text("".join(texts)):  # an unpaired surrogate, which JSON can write: no id, and no text
        at = next(at for at, item in enumerate(session) if isinstance(item, str) and not is_text(item))
        raise ValueError(f"session {row}, position {at}: item id {clock.short(session[at])} is not text (an unpaired "
                         "surrogate)")
    ints = [int(i) for i in session if not isinstance(i, str)]
    if ints and (min(ints) < _INT64[0] or max(ints) > _INT64[1]):
        bad = max(ints) if max(ints) > _INT64[1] else min(ints)
        raise ValueError(f"session {row}: item id {clock.short(bad)} does not fit in a 64-bit integer")


def is_text(value: str) -> bool:
    """Whether `value` encodes as UTF-8 (holds no unpaired surrogate)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _is_id(item: Any) -> bool:
    """A string, or an integer that is not a bool (numpy integers included)."""
    return isinstance(item, str) or (isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)))


def encode_raw(vocab: ItemVocab, sessions: Sequence[Sequence[Any]], max_width: int, on_unknown: str = "oov") -> torch.Tensor:
    """Raw-id sessions of a checked request (`check_request`: none empty), oldest first -> (B, W)
    right-aligned int64 model ids, W <= `max_width` (the latest events).

    Ids of another type than the vocabulary's (``"214536502"`` for an int64 vocabulary) are cast;
    unknown ids become the OOV id, or raise with ``on_unknown="error"``. A text id of an int64
    vocabulary is read only as the decimal the model writes its ids in (`CANONICAL_INT`): ``"01050"``,
    ``"+1050"`` and ``" 1050"`` are refused (ValueError naming the session, the position and the id), so
    that the id a request gives is the id the model answers with, the served log stores and the
    event logs read.
    """
    lengths = np.array([len(s) for s in sessions], dtype=np.int64)
    flat = [item for s in sessions for item in s]
    if vocab.raw_ids.type == pa.int64() and flat and all(type(item) is int and _INT64[0] <= item <= _INT64[1]
                                                         for item in flat):
        encoded = vocab.encode_ints(np.array(flat, dtype=np.int64))  # a request's ints: no Arrow arrays
    else:
        try:  # ids of another type (e.g. "214536502" for an int64 vocabulary) are cast by the vocabulary
            raw = pa.array(flat) if flat else pa.array([], type=vocab.raw_ids.type)
            if pa.types.is_integer(vocab.raw_ids.type) and pa.types.is_string(raw.type):
                _check_canonical_ints(raw, lengths)
            encoded = vocab.encode(raw)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as err:
            first = type(flat[0])
            other = next((i for i, item in enumerate(flat) if type(item) is not first), None)
            if other is not None:  # Arrow's message names neither the session nor the position
                session, position = _place(lengths, other)
                raise TypeError(
                    f"item ids of the request mix types: session {session}, position {position} holds "
                    f"{clock.short(flat[other])} ({type(flat[other]).__name__}) where the first id "
                    f"{clock.short(flat[0])} is {first.__name__}; "
                    "give every id of a request as the same type"
                ) from err
            raise TypeError(
                f"item ids of the request cannot be read as the vocabulary's {vocab.raw_ids.type} ids: {err}"
            ) from err
    if on_unknown == "error" and encoded.num_unknown:
        bad = flat[int(np.flatnonzero(encoded.ids == 1)[0])]
        raise ValueError(f"item id {clock.short(bad)} is not in the model's vocabulary")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    width = int(min(max(lengths.max(initial=1), 1), max_width))
    items = frame.pad_sessions(encoded.ids, offsets[:-1], offsets[1:], width, np.int64)
    return torch.from_numpy(np.ascontiguousarray(items))


CANONICAL_INT = r"^(0|-?[1-9][0-9]*)$"  # an integer as str(int) writes it: no sign '+', leading zeros or spaces
_INTEGER_TEXT = r"^\s*[+-]?[0-9]+\s*$"  # text Arrow or Python may read as an integer


def _check_canonical_ints(raw: pa.Array, lengths: np.ndarray) -> None:
    """Refuse a text id (of flat `raw`, sessions of `lengths`) written as an integer but not as the model writes its
    int64 ids (``"01050"``, ``"+1050"``, ``" 1050"``): one line naming the session, the position and the id."""
    canonical = pc.match_substring_regex(raw, CANONICAL_INT)
    if pc.all(canonical).as_py() is not False:
        return
    integer = pc.match_substring_regex(raw, _INTEGER_TEXT)
    bad = np.flatnonzero(pc.and_(pc.invert(canonical), integer).to_numpy(zero_copy_only=False))
    if len(bad):  # other text ("x") is the cast's to refuse
        at = int(bad[0])
        session, position = _place(lengths, at)
        value = raw[at].as_py()
        digits = value.strip().lstrip("+-").lstrip("0") or "0"  # int() of over 4,300 digits raises
        number = int(("-" if value.strip().startswith("-") else "") + digits) if len(digits) <= 19 else None
        hint = f"give {str(number)!r} or {number}" if number is not None else "and it does not fit in 64 bits"
        raise ValueError(f"session {session}, position {position}: item id {clock.short(value)} is not written as the "
                         f"model's int64 ids are (no leading zeros, '+' or spaces): {hint}")


def _place(lengths: np.ndarray, at: int) -> tuple[int, int]:
    """The session and the position in it of the `at`-th id of a request's flat ids (sessions of `lengths`)."""
    session = int(np.searchsorted(np.cumsum(lengths), at, side="right"))
    return session, at - int(lengths[:session].sum())
