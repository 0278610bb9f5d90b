"""When each split's sessions happened: the rules that keep training, validation and test in time order.

`SplitPeriods` gathers each split's sessions file by file (their counts and first and last end times,
`split_spans`) and refuses a split that is empty or starts before the split it follows ends; the
in-memory sources and every `sessrec prepare` engine feed it alike. `first_shared` and
`check_id_types` find a session with events in two files, and ids of two kinds (`3` and `'3'`) in two
files. `iso` and `to_seconds` write and read the times these rules and the retraining windows name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.times import PLAUSIBLE_SECONDS


def check_id_types(path: str, ids: pa.DataType, other_path: str, other: pa.DataType, role: str = "session") -> None:
    """Refuse the `role` ids (``session`` or ``item``) of file `path` (of type `ids`: integers or text, as
    `Schema.validate` gives them) when those of an earlier file `other_path` are of the other kind: session 3 and
    session '3' may be one session, which `first_shared` cannot tell, and item 3 and item '3' one item."""
    text = pa.types.is_string(ids) or pa.types.is_large_string(ids)
    if text != (pa.types.is_string(other) or pa.types.is_large_string(other)):
        kinds = ("text", "integers") if text else ("integers", "text")
        why = ("whether a session has events in both files" if role == "session"
               else "whether an item of one file is an item of the other")
        raise ValueError(
            f"{path}: its {role} ids are {kinds[0]}, those of {other_path} {kinds[1]}, so {why} cannot be told; give "
            f"the files {role} ids of one type, or read them as text (the schema's string_ids: true)"
        )


def first_shared(path: str, ids: pa.ChunkedArray, earlier: list[tuple[str, pa.ChunkedArray]]) -> tuple[object, str] | None:
    """The least of file `path`'s session ids `ids` that an earlier file's ids also hold, and the first of the
    `earlier` files (path, session ids) that holds it; None when they share none. Ids of another kind than an
    earlier file's are refused (`check_id_types`)."""
    found: tuple[object, str] | None = None
    for other_path, other in earlier:
        check_id_types(path, ids.type, other_path, other.type)
        shared = pc.min(ids.filter(pc.is_in(ids, value_set=other.combine_chunks()))).as_py()
        if shared is not None and (found is None or shared < found[0]):
            found = (shared, other_path)
    return found


SPLIT_LABELS = {"train": 0, "valid": 1, "test": 2}
NAMES = {"train": "training", "valid": "validation", "test": "test"}
Span = tuple[int, float | None, float | None]
"""A split's sessions of one file: their number, and the first and the last of their end times (None without
timestamps or sessions)."""


def split_spans(splits: tuple[str, ...], labels: np.ndarray, end: np.ndarray | None) -> dict[str, Span]:
    """The `Span` of each of `splits` among sessions of `labels` (N,) (`SPLIT_LABELS`) and end times `end` (N,)."""
    spans = {}
    for split in splits:
        chosen = labels == SPLIT_LABELS[split]
        ends = None if end is None else end[chosen]
        spans[split] = (int(chosen.sum()), None if ends is None or not ends.size else float(ends.min()),
                        None if ends is None or not ends.size else float(ends.max()))
    return spans


def iso(seconds: float) -> str:
    """Epoch seconds as an ISO-8601 UTC time: ``2014-04-05T23:59:59Z`` (with its fraction when it has one)."""
    moment = datetime.fromtimestamp(float(seconds), timezone.utc)
    return moment.isoformat(timespec="seconds" if moment.microsecond == 0 else "milliseconds").replace("+00:00", "Z")


class SplitPeriods:
    """The splits of a source in time, gathered as its files are split, refused when they travel in time.

    Each split's sessions are added with the file they came from (`add`): a split of no session is
    refused, naming the setting that emptied it, and so is one that starts before a split it follows
    ends. The splits follow each other as training, validation, test; a session belongs to the period
    of its **last** event, so the rule is on end times: every validation session ends at or after the
    last training session ends, every test session at or after the last training and validation
    sessions end. A session may start before that (as in a day split of one file); two sessions
    ending at the same moment may fall on either side.
    """

    def __init__(self) -> None:
        self.spans: dict[str, tuple[float, float, str]] = {}  # split -> (first end, last end, where it comes from)

    def add(self, split: str, count: int, first: float | None, last: float | None, where: str,
            emptied: Callable[[], str]) -> None:
        """The `count` sessions of `split` from `where` (a file, with the setting that chose them), ending from
        `first` to `last` (None: without timestamps, nothing to order); `emptied` says why when there is none."""
        if count == 0:
            raise ValueError(emptied())
        if first is None or last is None:
            return
        rank = SPLIT_LABELS[split]
        for other, (o_first, o_last, o_where) in self.spans.items():
            if (last < PLAUSIBLE_SECONDS[0]) != (o_last < PLAUSIBLE_SECONDS[0]):  # relative times beside dates
                (rel, rel_where, rel_last), (dated, dated_where, dated_last) = sorted(
                    [(split, where, last), (other, o_where, o_last)], key=lambda s: s[2])
                raise ValueError(
                    f"{rel_where}: the {NAMES[rel]} sessions end at relative times (the last {rel_last:.0f} s, before "
                    f"1990: counted from a start) and the {NAMES[dated]} sessions of {dated_where} at dates (the last "
                    f"{iso(dated_last)}): the files keep no common clock, so their periods cannot be ordered; give "
                    "every file's times in one frame"
                )
            if SPLIT_LABELS[other] < rank and first < o_last:
                self.refuse(split, first, where, other, o_last, o_where)
            if SPLIT_LABELS[other] > rank and o_first < last:
                self.refuse(other, o_first, o_where, split, last, where)
        self.spans[split] = (first, last, where)

    @staticmethod
    def refuse(later: str, first: float, where: str, earlier: str, last: float, earlier_where: str) -> None:
        raise ValueError(
            f"{where}: the {NAMES[later]} period starts before the {NAMES[earlier]} period ends: its first session ends "
            f"{iso(first)}, before the last {NAMES[earlier]} session (of {earlier_where}) ends {iso(last)}; a session "
            f"belongs to the period of its last event, and the {NAMES[later]} sessions must end at or after the "
            f"{NAMES[earlier]} ones"
        )


def to_seconds(value: str | float, name: str) -> float:
    """An ISO-8601 date or time (UTC unless it says otherwise) or epoch seconds, as epoch seconds; a time after
    2100 (milliseconds given for seconds, a mistyped year) or a number that is no finite one is refused naming
    `name`."""
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if math.isnan(seconds) or seconds == -math.inf:
            raise ValueError(f"{name}: {value!r} is no time; give epoch seconds or an ISO-8601 date or time")
        if seconds >= PLAUSIBLE_SECONDS[1]:
            raise ValueError(f"{name}: {value!r} seconds since the epoch fall after 2100; give seconds (not milliseconds) "
                             "or an ISO-8601 date or time")
        return seconds
    try:
        moment = datetime.fromisoformat(value)
    except ValueError as err:
        raise ValueError(f"{name}: {value!r} is neither an ISO-8601 date/time nor epoch seconds") from err
    seconds = (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()
    if seconds >= PLAUSIBLE_SECONDS[1]:
        raise ValueError(f"{name}: {value!r} falls after 2100; give the date or time of the window you mean")
    return seconds
