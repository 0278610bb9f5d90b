"""Where sessions come from: each source turns files into train / valid / test session tables.

A source is chosen in a recipe by class path (``class_path: sessrec.data.SRGNNSource``) and
configured by its typed constructor. Every source returns `SessionSplits` of raw item ids; the
data module fits the vocabulary on the training split only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sessrec.data import frame
from sessrec.data.periods import (
    NAMES,
    Span,
    SplitPeriods,
    check_id_types,
    first_shared,
    iso,
    split_spans,
    to_seconds,
)
from sessrec.data.readers import check_delimiter, read_events, read_user_sequences
from sessrec.data.schema import Schema, SchemaError, VirtualSpec
from sessrec.data.srgnn import read_srgnn
from sessrec.data.synthetic import generate_sessions
from sessrec.saved.atomic import atomic_path
from sessrec.saved.registry import Configurable


@dataclass
class SessionSplits:
    """Session tables (one row per session, list columns of raw ids) for each split.

    ``source`` names where they came from (a file path), for error messages; ``notes`` say what the source
    left out of it (the data module logs them when it reads the splits).
    """

    train: pa.Table
    valid: pa.Table
    test: pa.Table
    source: str = "<sessions>"
    notes: tuple[str, ...] = ()

    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``train/valid/test.parquet`` (each via a temporary name, then rename)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("train", "valid", "test"):
            with atomic_path(directory / f"{name}.parquet") as tmp:
                pq.write_table(getattr(self, name), tmp)
        return directory

    def train_end(self) -> float | None:
        """Time (epoch seconds) of the training split's last event (a kept virtual event after a session's last
        product included: the model reads it), the end of the period a model trained on it has seen; None when its
        sessions carry no timestamps."""
        if frame.TIMES not in self.train.column_names or self.train.num_rows == 0:
            return None
        return float(pc.max(frame.list_offsets(self.train.column(frame.TIMES))[0]).as_py())

    def summary(self) -> dict[str, int]:
        return {
            f"{name}_{what}": int(n)
            for name in ("train", "valid", "test")
            for what, n in (
                ("sessions", getattr(self, name).num_rows),
                ("events", frame.session_lengths(getattr(self, name)).sum()),
            )
        }


class SessionSource(Configurable):
    """Base class: `load()` returns the splits. Subclasses are configured by their constructor, which
    each instance records (`Configurable`): a model directory's ``data`` section names the source its
    model was trained on, and the registry rebuilds it from there (every subclass registers itself)."""

    def load(self) -> SessionSplits:
        raise NotImplementedError


def _session_table(lists: pa.ListArray, first_id: int = 0) -> pa.Table:
    return pa.table({frame.SESSION: pa.array(np.arange(first_id, first_id + len(lists))), frame.ITEMS: lists})


def _tail_split(sessions: pa.Table, fraction: float, source: str | None = None,
                setting: str = "") -> tuple[pa.Table, pa.Table]:
    """The sessions without their latest `fraction`, and those. With `source` (a validation split cut by `setting`, in
    words), a fraction above 0 that rounds to no session is refused: the run would select nothing on no validation."""
    n_valid = int(round(sessions.num_rows * fraction))
    if source is not None and fraction > 0 and n_valid == 0:
        raise ValueError(f"{source}: the validation split is empty: {setting} of the {sessions.num_rows} sessions it is cut "
                         "from rounds to none; lengthen valid_fraction (0 trains without validation)")
    cut = sessions.num_rows - n_valid
    return sessions.slice(0, cut), sessions.slice(cut)


class SRGNNSource(SessionSource):
    """An SR-GNN/GCE-GNN benchmark folder (diginetica, yoochoose 1/64, Tmall, Nowplaying).

    Training sessions come from ``all_train_seq.txt``; the test sessions are reassembled from
    ``test.txt`` so that the ``all_prefixes`` protocol reproduces the shipped test pairs exactly:
    where a release ships no length-1 prefixes, a ``targetable`` column marks the shipped targets.

    Args:
        path: folder with ``all_train_seq.txt[.gz]`` and ``test.txt[.gz]``.
        valid_fraction: the most recent share of training sessions (the files are in time
            order) held out for validation and checkpoint selection.
    """

    def __init__(self, path: str, valid_fraction: float = 0.1) -> None:
        if not 0.0 <= valid_fraction < 1.0:  # NaN too
            raise ValueError(f"SRGNNSource: valid_fraction must be a share in [0, 1) (0: no validation), got {valid_fraction}")
        self.path = path
        self.valid_fraction = valid_fraction

    def load(self) -> SessionSplits:
        data = read_srgnn(self.path)
        train, valid = _tail_split(_session_table(data.train), self.valid_fraction, str(self.path),
                                   f"valid_fraction {self.valid_fraction:g}")
        sessions = data.test_sessions()
        test = _session_table(sessions, first_id=len(data.train))
        targets = data.test_targets()
        if targets is not None:
            flags = pa.ListArray.from_arrays(sessions.offsets, pa.array(targets))
            test = test.append_column(frame.TARGETABLE, flags)
        return SessionSplits(train=train, valid=valid, test=test, source=str(self.path))


VALID_FRACTION = 0.1  # `EventLogSource`'s validation share when neither valid_path nor valid_days is given


class EventLogSource(SessionSource):
    """An event log file (CSV/TSV/parquet), sessionized and split by time.

    Give `test_path` (and optionally `valid_path`) when the dataset ships its own split, as
    session-rec's ``*_train_full`` / ``*_test`` files do; otherwise the sessions of the last
    `test_days` (or the latest `test_fraction`) become the test set. Validation is taken from
    the end of the training period the same way. A file given wins over the days and fractions of its
    split; the periods never go back in time and none is empty (`SplitPeriods`, docs/data.md), and a session
    has its events in one of the files (`check_shared`).

    Args:
        path: training events (or all events when `test_path` is None).
        schema: column roles of the file.
        test_path: optional events of the test period.
        valid_path: optional events of the validation period.
        delimiter: text-file separator; sniffed when None.
        min_length: drop sessions with fewer product events (after removing repeats; with the schema's
            `VirtualSpec`, virtual events do not count).
        max_length: keep the most recent events (virtual ones included) of longer sessions.
        drop_repeats: remove consecutive repeats of the same item.
        test_days: held-out test period in days, the last of the log (used when `test_path` is None).
        test_fraction: instead of `test_days`, the latest share of sessions held out for testing.
        valid_days: validation period in days, before the test period (when `valid_path` is None).
        valid_fraction: instead of `valid_days`, the latest share of the remaining sessions; given with
            `valid_days` (another value than its default), refused like `test_days` with `test_fraction`.
    """

    def __init__(
        self,
        path: str,
        schema: Schema = Schema(),
        test_path: str | None = None,
        valid_path: str | None = None,
        delimiter: str | None = None,
        min_length: int = 2,
        max_length: int | None = None,
        drop_repeats: bool = False,
        test_days: float | None = None,
        test_fraction: float | None = None,
        valid_days: float | None = None,
        valid_fraction: float | None = VALID_FRACTION,
    ) -> None:
        self.path, self.schema, self.test_path, self.valid_path = path, schema, test_path, valid_path
        check_delimiter(delimiter, "EventLogSource")
        self.delimiter = delimiter
        self.min_length, self.max_length, self.drop_repeats = min_length, max_length, drop_repeats
        self.test_days, self.test_fraction = test_days, test_fraction
        self.valid_days, self.valid_fraction = valid_days, valid_fraction
        if test_path is None and (test_days is None) == (test_fraction is None):
            raise ValueError("EventLogSource needs test_path, or one of test_days and test_fraction, to hold out a test "
                             f"set; got test_days {test_days}, test_fraction {test_fraction}")
        if valid_path is None and valid_days is None and valid_fraction is None:
            raise ValueError("EventLogSource needs valid_path, valid_days or valid_fraction to hold out validation sessions")
        # every period given is checked, used or not; valid_fraction's default gives way to valid_days, any other
        # value with valid_days would be ignored: refused (a recorded default, 0.1, cannot be told from one given)
        frame.check_periods("EventLogSource", test_days=test_days, test_fraction=test_fraction, valid_days=valid_days,
                            valid_fraction=valid_fraction)
        if valid_path is None and valid_days is not None and valid_fraction not in (None, VALID_FRACTION):
            raise ValueError("EventLogSource takes one of valid_days and valid_fraction to hold out validation sessions, "
                             f"not both; got valid_days {valid_days:g}, valid_fraction {valid_fraction:g}")
        if min_length < 1:
            raise ValueError(f"EventLogSource: min_length must be >= 1 (a session has one product or more), got {min_length}")
        if max_length is not None and max_length < max(min_length, 2):
            raise ValueError(
                f"EventLogSource: max_length must be >= 2 and >= min_length ({min_length}), got {max_length}: "
                "sessions cut shorter give no (prefix, next item) pair"
            )

    def sessions(self, path: str) -> pa.Table:
        """The sessions of one file with at least `min_length` products; raises when none is left."""
        kept, count, longest, virtual = self.sessionize(read_events(path, self.schema, self.delimiter))
        self.check_kept(path, kept.num_rows, count, longest, virtual)
        return kept

    def sessionize(self, events: pa.Table) -> tuple[pa.Table, int, int, int]:
        """Validated events (all events of a session among them) as sessions, by session id: those with at
        least `min_length` products (`frame.filter_lengths`), without their virtual events when the schema's
        `VirtualSpec` does not keep them; and the number and greatest product count of the sessions before
        that filter, and the number of virtual events."""
        events = frame.sort_events(events, self.schema)
        sessions = frame.group_sessions(events, self.schema, drop_repeats=self.drop_repeats)
        lengths = frame.product_lengths(sessions)
        kept = frame.filter_lengths(sessions, self.min_length, self.max_length)
        virtual = 0
        if self.schema.virtual is not None:
            virtual = int(pc.sum(events.column(frame.VIRTUAL)).as_py() or 0)
            kept = kept if self.schema.virtual.keep else frame.drop_virtual(kept)
        return kept, len(lengths), int(lengths.max(initial=0)), virtual

    def check_kept(self, path: str, kept: int, count: int, longest: int, virtual: int = 0) -> None:
        """Refuse a file of which no session is kept (`kept` of `count` sessions, the longest of `longest`
        products), or whose events the schema's `VirtualSpec` marks all of, or (the main file) none of (`virtual` marked)."""
        spec = self.schema.virtual
        if spec is not None and virtual == 0 and path == self.path:
            raise ValueError(
                f"{path}: column {spec.column!r} never holds a value of the schema's virtual.values {list(spec.values)}, "
                "so no event is virtual; give the values the column holds for non-product events"
            )
        if spec is not None and longest == 0:
            raise ValueError(
                f"{path}: every event is virtual (column {spec.column!r} holds one of {list(spec.values)} on all "
                f"{virtual} rows), so no session has a product to predict; check the schema's virtual.values"
            )
        if kept == 0:
            what = "products" if spec is not None else "events"
            raise ValueError(
                f"{path}: no session has {self.min_length} or more {what} (the {count} sessions "
                f"have at most {longest}{' after dropping repeats' if self.drop_repeats else ''}), so there is "
                f"nothing to train on or evaluate; check the schema's session_id column ({self.schema.session_id!r})"
            )

    def check_shared(self, path: str, shared: tuple[object, str] | None) -> None:
        """Refuse a session of file `path` that has events in an earlier file of the source too (`shared`: the
        session and that file, `first_shared`): its events would be split between two periods, its start trained
        on and its end tested."""
        if shared is not None:
            session, other = shared
            raise ValueError(
                f"{path}: session {session} also has events in {other}; a session belongs to the period of its last "
                "event, so its events must all lie in one file: move them into one file, or give the sessions of each "
                "file their own ids"
            )

    def split_labels(self, end: np.ndarray | None, count: int, order: np.ndarray | None = None) -> np.ndarray:
        """(N,) split of each session of `path`: 0 train, 1 valid, 2 test (`frame.time_labels`).

        Args:
            end: (N,) end time of each session, None when they carry no timestamps.
            count: N.
            order: keys ordering sessions of equal end times (see `frame.time_labels`); None: positions.

        The test sessions come from `test_path` when it is given (none of `path` is labelled test), the
        validation sessions from `valid_path` likewise.
        """
        labels = np.zeros(count, dtype=np.int64)
        if self.test_path is None:
            labels = frame.time_labels(end, test_days=self.test_days, test_fraction=self.test_fraction, order=order)
        if self.valid_path is None:
            train = np.flatnonzero(labels == 0)
            sub = frame.time_labels(
                None if end is None else end[train],
                test_days=self.valid_days,
                test_fraction=None if self.valid_days is not None else self.valid_fraction,
                order=None if order is None else order[train],
            )
            labels[train[sub == 2]] = 1
        return labels

    def splits_of(self) -> list[tuple[str, tuple[str, ...]]]:
        """The source's files and the splits each provides: `path`, then `test_path` and `valid_path`."""
        main = tuple(s for s in ("train", "valid", "test") if not (s == "test" and self.test_path)
                     and not (s == "valid" and self.valid_path))
        files = [(self.path, main)]
        files += [(p, (s,)) for p, s in ((self.test_path, "test"), (self.valid_path, "valid")) if p is not None]
        return files

    def check_file(self, periods: SplitPeriods, path: str, spans: dict[str, Span]) -> None:
        """Add the sessions of one of the source's files to `periods`: `spans` (`split_spans`) the count and
        the first and last end time of each split it provides (the file's one split for a `test_path` /
        `valid_path`); `periods` refuses an empty split or one that starts before the split before it ends."""
        splits = tuple(spans)
        for split, (count, first, last) in spans.items():
            periods.add(split, count, first, last,
                        path if len(splits) == 1 else f"{path}, {NAMES[split]} split"
                        + ("" if split == "train" else f" ({self.setting(split)})"),
                        lambda split=split: self.emptied(split, path, spans))

    def setting(self, split: str) -> str:
        """The setting that holds `split` out of the main file, in words: ``test_days 1``."""
        days = getattr(self, f"{split}_days")
        return f"{split}_days {days:g}" if days is not None else f"{split}_fraction {getattr(self, f'{split}_fraction'):g}"

    def emptied(self, split: str, path: str, spans: dict[str, Span]) -> str:
        """Why the main file's `split` holds no session: the settings that emptied it, with their dates or counts."""
        total = sum(count for count, _, _ in spans.values())
        if split == "train":
            held = []
            for s in ("test", "valid"):
                if getattr(self, f"{s}_path") is None:
                    count, first, _ = spans[s]
                    since = "" if first is None else f", ending from {iso(first)}"
                    held.append(f"{self.setting(s)} ({count} sessions{since})")
            firsts = [first for _, first, _ in spans.values() if first is not None]
            lasts = [last for _, _, last in spans.values() if last is not None]
            span = "" if not firsts else f", which end from {iso(min(firsts))} to {iso(max(lasts))}"
            return (f"{path}: no session is left for training: {' and '.join(held)} hold out all its {total} "
                    f"sessions{span}; shorten those periods")
        # a period of days holds at least the latest session it is cut from: only a fraction can round to none
        pool = spans["train"][0] + spans["valid"][0] if split == "valid" else total  # the sessions it is chosen from
        return (f"{path}: the {NAMES[split]} split is empty: {self.setting(split)} of its {pool} sessions rounds to "
                f"none; lengthen {split}_fraction")

    def load(self) -> SessionSplits:
        sessions = self.sessions(self.path)
        end = frame.end_times(sessions)
        labels = self.split_labels(end, sessions.num_rows)
        periods = SplitPeriods()
        self.check_file(periods, self.path, split_spans(self.splits_of()[0][1], labels, end))
        train, valid, test = (sessions.filter(pa.array(labels == k)) for k in range(3))
        read = [(self.path, sessions.column(frame.SESSION))]
        if self.test_path is not None:
            test = self.sessions(self.test_path)
            check_id_types(self.test_path, test.schema.field(frame.ITEMS).type.value_type, self.path,
                           sessions.schema.field(frame.ITEMS).type.value_type, "item")
            self.check_shared(self.test_path, first_shared(self.test_path, test.column(frame.SESSION), read))
            read.append((self.test_path, test.column(frame.SESSION)))
            self.check_file(periods, self.test_path, split_spans(("test",), np.full(test.num_rows, 2), frame.end_times(test)))
        if self.valid_path is not None:
            valid = self.sessions(self.valid_path)
            check_id_types(self.valid_path, valid.schema.field(frame.ITEMS).type.value_type, self.path,
                           sessions.schema.field(frame.ITEMS).type.value_type, "item")
            self.check_shared(self.valid_path, first_shared(self.valid_path, valid.column(frame.SESSION), read))
            self.check_file(periods, self.valid_path,
                            split_spans(("valid",), np.full(valid.num_rows, 1), frame.end_times(valid)))
        return SessionSplits(train=train, valid=valid, test=test, source=str(self.path))


class SyntheticSource(SessionSource):
    """Sessions from `generate_sessions`, split by time (last day test, the day before validation).

    Sessions of two products or more are kept. Their page views are marked by the schema's
    `VirtualSpec` (``event_type`` ``page_view``, keyed by ``page``): kept as virtual items with
    `page_views`, else dropped once the sessions are filtered and split, so the two give the same
    sessions and evaluation pairs.

    Args:
        num_sessions: sessions generated (`generate_sessions`).
        num_items: products in the catalogue.
        num_clusters: groups of related products that sessions draw from.
        days: the span of the sessions' start times.
        seed: seeds the generator.
        test_days: the last days' sessions are the test set.
        valid_days: the days before it, validation.
        page_views: keep the page views as virtual items (input tokens, never targets).
    """

    def __init__(
        self,
        num_sessions: int = 20_000,
        num_items: int = 1_000,
        num_clusters: int = 20,
        days: float = 14.0,
        test_days: float = 1.0,
        valid_days: float = 1.0,
        seed: int = 0,
        page_views: bool = False,
    ) -> None:
        frame.check_periods("SyntheticSource", days=days, test_days=test_days, valid_days=valid_days)
        for name, count in (("num_sessions", num_sessions), ("num_items", num_items), ("num_clusters", num_clusters)):
            if count < 1:
                raise ValueError(f"SyntheticSource: {name} must be >= 1, got {count}")
        if test_days + valid_days >= days:
            raise ValueError(f"SyntheticSource: test_days {test_days:g} and valid_days {valid_days:g} leave no training day "
                             f"of the {days:g} days generated")
        self.kwargs = dict(num_sessions=num_sessions, num_items=num_items, num_clusters=num_clusters, days=days, seed=seed)
        self.test_days, self.valid_days, self.page_views = test_days, valid_days, page_views

    def load(self) -> SessionSplits:
        events = generate_sessions(**self.kwargs)
        schema = Schema(virtual=VirtualSpec("event_type", ["page_view"], key=["page"], keep=self.page_views))
        events = frame.sort_events(schema.validate(events, source="synthetic"), schema)
        sessions = frame.filter_lengths(frame.group_sessions(events, schema), min_length=2)
        split = frame.time_split(sessions, test_days=self.test_days, valid_days=self.valid_days)
        for name, part, setting in zip(NAMES.values(), split, ("", f"valid_days {self.valid_days:g}",
                                                               f"test_days {self.test_days:g}"), strict=True):
            if part.num_rows == 0:  # a run would train without validation, or test nothing, and say nothing
                held = f" ({setting} of the {self.kwargs['days']:g} days generated)" if setting else ""
                raise ValueError(f"SyntheticSource: the {name} split{held} holds none of the {sessions.num_rows} sessions "
                                 f"of two products or more; generate more sessions (num_sessions {self.kwargs['num_sessions']})")
        train, valid, test = (part if self.page_views else frame.drop_virtual(part) for part in split)
        return SessionSplits(train=train, valid=valid, test=test)


class UserSequenceSource(SessionSource):
    """One sequence per user, split leave-one-out (SASRec/BERT4Rec/S3-Rec protocol).

    Train on each sequence without its last two items, validate on predicting the second to
    last from what precedes it, test on predicting the last item from everything before it. In
    the validation and test splits only that held-out item is `targetable` (the events before it
    are trained on), so every protocol, ``all_prefixes`` included, scores it alone. The split is by
    position within each user, not by time: a user's test item may come before another user's
    training items (the protocol of the papers; `EventLogSource` splits by time).

    Args:
        path: the file.
        layout: ``pairs`` (``user item`` per line, in time order), ``lines`` (``user item item ...``), or
            ``events``: an event log (CSV/TSV/parquet, as `EventLogSource` reads) whose `schema` names the
            user (``session_id``), the item and the time, each user's events ordered by time (then the
            schema's ``order_by``); the times and side features travel with the items.
        min_length: users with fewer interactions are dropped; at least 3 (leave-one-out holds out two).
        schema: column roles of an ``events`` file (the other layouts have fixed columns).
        delimiter: text-file separator of an ``events`` file; sniffed when None.
    """

    def __init__(self, path: str, layout: Literal["pairs", "lines", "events"] = "pairs", min_length: int = 3,
                 schema: Schema | None = None, delimiter: str | None = None) -> None:
        if min_length < 3:
            raise ValueError(f"UserSequenceSource: min_length must be >= 3, got {min_length}: leave-one-out holds out each "
                             "user's last two items, so a user of fewer than 3 has none left to train on")
        if layout not in ("pairs", "lines", "events"):
            raise ValueError(f"UserSequenceSource: layout must be 'pairs', 'lines' or 'events', got {layout!r}")
        if layout != "events" and (schema is not None or delimiter is not None):
            raise ValueError(f"UserSequenceSource: schema and delimiter describe an event log (layout 'events'); layout "
                             f"{layout!r} has fixed columns")
        if schema is not None and schema.virtual is not None:
            raise ValueError("UserSequenceSource: leave-one-out holds out each user's last items, and virtual events "
                             "(schema.virtual) are never targets: drop them from the file or read it with EventLogSource")
        check_delimiter(delimiter, "UserSequenceSource")
        self.path, self.layout, self.min_length = path, layout, min_length
        self.schema, self.delimiter = schema if schema is not None else Schema(), delimiter

    def users(self) -> pa.Table:
        """One row per user of the file: the session id and its list columns (items; an event log's times and
        side features), in time order."""
        if self.layout == "events":
            events = frame.sort_events(read_events(self.path, self.schema, self.delimiter), self.schema)
            return frame.group_sessions(events, self.schema)
        events = read_user_sequences(self.path, self.layout)
        return frame.group_sessions(events, Schema(timestamp=None, order_by="position")).select([frame.SESSION, frame.ITEMS])

    def load(self) -> SessionSplits:
        users = self.users()
        sessions = frame.filter_lengths(users, min_length=self.min_length)
        if sessions.num_rows == 0:
            raise ValueError(
                f"{self.path}: no user has {self.min_length} or more interactions (the {users.num_rows} users have "
                f"at most {int(frame.session_lengths(users).max(initial=0))}), so leave-one-out has nothing to train on"
            )
        lists = [name for name in sessions.column_names if name != frame.SESSION]
        offsets = frame.list_offsets(sessions.column(frame.ITEMS))[1]

        def cut(drop: int, held_out: bool) -> pa.Table:
            """The sequences without their last `drop` events; `held_out`: only the last event left is a target."""
            lengths = np.diff(offsets) - drop
            keep = pa.array(np.arange(offsets[-1]) < np.repeat(offsets[:-1] + lengths, lengths + drop))
            new_off = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            columns = {frame.SESSION: sessions.column(frame.SESSION)}
            for name in lists:
                columns[name] = pa.ListArray.from_arrays(new_off, frame.list_offsets(sessions.column(name))[0].filter(keep))
            if held_out:
                last = np.arange(int(lengths.sum())) == np.repeat(np.cumsum(lengths) - 1, lengths)
                columns[frame.TARGETABLE] = pa.ListArray.from_arrays(new_off, pa.array(last))
            return pa.table(columns)

        dropped = users.num_rows - sessions.num_rows
        notes = (f"{self.path}: {dropped:,} of the {users.num_rows:,} users have fewer than {self.min_length} "
                 f"interactions and are left out (min_length {self.min_length}: leave-one-out holds out each user's last "
                 "two)",) if dropped else ()
        return SessionSplits(train=cut(2, False), valid=cut(1, True), test=cut(0, True), source=str(self.path),
                             notes=notes)


class TimeWindowSource(SessionSource):
    """The sessions of an event log in one time window, tested on a window after it (retraining).

    A session belongs to the window of its last event, as in `frame.time_split`, so no event of
    a test session is trained on. Training is on the sessions ending in
    [`train_from`, `train_until`) (the latest `valid_fraction` of them held out for checkpoint
    selection), testing on those ending in [`test_from`, `test_until`), `test_from` by default
    `train_until` (the window right after).

    Args:
        paths: the event files, read together (e.g. a dataset's training and test files); a column of another
            type than in the first file (text session ids beside integers) is refused naming both files.
        schema: column roles of the files (with a timestamp).
        train_from: start of the training window, as an ISO-8601 date or time (UTC, e.g.
            ``2014-04-04`` or ``2014-04-04T06:00``) or seconds since the epoch.
        train_until: end of the training window and start of the test window (same forms).
        test_until: end of the test window (same forms).
        test_from: start of the test window, at or after `train_until` (same forms); None: `train_until`.
        valid_fraction: latest share of the training window's sessions used for validation (a share that
            rounds to no session is refused).
        min_length: drop sessions with fewer events.
        drop_repeats: remove consecutive repeats of the same item.
    """

    def __init__(
        self,
        paths: list[str],
        schema: Schema = Schema(),
        train_from: str | float = 0.0,
        train_until: str | float = 0.0,
        test_until: str | float = 0.0,
        valid_fraction: float = 0.1,
        min_length: int = 2,
        drop_repeats: bool = False,
        test_from: str | float | None = None,
    ) -> None:
        if schema.timestamp is None:
            raise ValueError("TimeWindowSource needs a timestamp column in the schema")
        self.paths, self.schema = list(paths), schema
        if not self.paths:
            raise ValueError("TimeWindowSource needs at least one event file in paths")
        first: dict[Path, str] = {}
        for path in self.paths:  # a file read twice would double every event of its sessions
            if Path(path).resolve() in first:
                raise ValueError(f"TimeWindowSource: paths give one file twice ({first[Path(path).resolve()]!r} and "
                                 f"{path!r}), which would read each of its events twice; list each file once")
            first[Path(path).resolve()] = path
        test_from = train_until if test_from is None else test_from
        self.bounds = [to_seconds(t, name) for t, name in ((train_from, "train_from"), (train_until, "train_until"),
                                                           (test_from, "test_from"), (test_until, "test_until"))]
        if not self.bounds[0] < self.bounds[1] <= self.bounds[2] < self.bounds[3]:
            raise ValueError(f"need train_from < train_until <= test_from < test_until, got {train_from}, {train_until}, "
                             f"{test_from}, {test_until}")
        if not 0.0 < valid_fraction < 1.0:
            raise ValueError(f"valid_fraction must be in (0, 1), got {valid_fraction}")
        if min_length < 1:
            raise ValueError(f"TimeWindowSource: min_length must be >= 1 (a session has one event or more), got {min_length}")
        self.valid_fraction, self.min_length, self.drop_repeats = valid_fraction, min_length, drop_repeats

    def load(self) -> SessionSplits:
        tables = [read_events(path, self.schema) for path in self.paths]
        for path, table in zip(self.paths[1:], tables[1:]):
            for name in table.column_names:
                ours, first = table.column(name), tables[0].column(name)
                if ours.type != first.type:
                    text = " (the schema's string_ids: true reads both as text)" if name in self.schema.id_columns else ""
                    raise SchemaError(
                        f"{path}: column {name!r} holds {ours.type} values (e.g. {ours[0].as_py()!r} at row 0), where "
                        f"{self.paths[0]} holds {first.type} values (e.g. {first[0].as_py()!r} at row 0); give the files "
                        f"one type of {name!r}{text}"
                    )
        events = pa.concat_tables(tables, promote_options="default")
        events = frame.sort_events(events, self.schema)
        sessions = frame.filter_lengths(frame.group_sessions(events, self.schema, self.drop_repeats), self.min_length)
        end = frame.last_times(sessions)
        start, middle, test_from, stop = self.bounds
        train = sessions.filter(pa.array((end >= start) & (end < middle)))
        test = sessions.filter(pa.array((end >= test_from) & (end < stop)))
        source = " + ".join(self.paths)
        for name, part, (a, b) in (("training", train, (start, middle)), ("test", test, (test_from, stop))):
            if part.num_rows == 0:
                raise ValueError(f"{source}: no session of {self.min_length}+ events ends in the {name} window, from "
                                 f"{iso(a)} to {iso(b)}")
        if round(train.num_rows * self.valid_fraction) == 0:
            raise ValueError(f"{source}: the validation split is empty: valid_fraction {self.valid_fraction:g} of the training "
                             f"window's {train.num_rows} sessions rounds to none; lengthen valid_fraction or the training window")
        train, _, valid = frame.time_split(train, test_fraction=self.valid_fraction)
        if self.schema.virtual is not None and not self.schema.virtual.keep:
            train, valid, test = (frame.drop_virtual(part) for part in (train, valid, test))
        return SessionSplits(train=train, valid=valid, test=test, source=source)
