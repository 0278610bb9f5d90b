"""Stage 2 of the pipeline: filters that blank candidates a session must not be shown.

Each filter has one verb, ``apply(sessions, candidates) -> candidates``, over the whole (B, K)
candidate matrix: it blanks slots with `Candidates.keep` and never changes the shape (the
pipeline compacts afterwards). Lookups are sorts and searchsorted calls, never a Python loop
over sessions or candidates.

Filters built from raw item ids (a table file) get the vocabulary through ``bind(vocab)``, which
reads the file (``read()`` reads it earlier, to check it) and encodes the ids to model ids; raw
ids the vocabulary does not know are dropped and counted in ``num_unknown``. The building blocks
for that (`read_item_table`, `ItemRows`, `RawItemRule`) serve the ordering rules too.

Saving: every stage is `Configurable` (its constructor arguments are its config, which rebuilds
it without reading any file); ``state_dict()`` gives what binding produced, as numpy arrays of
model ids (not raw ids, so a saved pipeline needs neither the original file nor a second
encoding) and ``num_unknown``; ``load_state_dict(state)`` takes it back without unpickling.

Shape letters: B sessions, L positions, K candidates per session, N table rows, U distinct
items of a table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from sessrec.data.columns import SchemaError, check_id
from sessrec.data.readers import read_table
from sessrec.data.times import PLAUSIBLE_SECONDS
from sessrec.data.vocab import NUM_SPECIAL, OOV, ItemVocab
from sessrec.pipeline.candidates import Candidates, RequestSessions
from sessrec.pipeline.clock import LATEST
from sessrec.saved.registry import Configurable

__all__ = [
    "ItemRows",
    "ItemTableFilter",
    "NonProductFilter",
    "SeenItemsFilter",
    "find_sorted",
    "read_item_table",
]


# ------------------------------------------------------------------------------ building blocks
def find_sorted(keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Look `values` up in ascending `keys` with one searchsorted.

    Args:
        keys: (U,) keys shared by all rows, or (B, L) keys per row; ascending along the last dim.
        values: (B, K) values to find.

    Returns:
        (B, K) int64 position of each value in `keys` (valid where found) and (B, K) bool found.
    """
    if keys.shape[-1] == 0:
        return torch.zeros_like(values), torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    pos = torch.searchsorted(keys, values).clamp_(max=keys.shape[-1] - 1)
    at = keys[pos] if keys.dim() == 1 else keys.gather(-1, pos)
    return pos, at == values


def read_item_table(
    path: str | Path, item_column: str, required: tuple[str, ...] = ()
) -> tuple[pa.Array, pa.Table]:
    """Read a parquet/CSV table of raw item ids and check its item column.

    A CSV file's ids are read as the text they are written as (``01050`` stays ``"01050"``), which the
    vocabulary matches as `ItemVocab.encode` matches text: exactly, or as the decimals of its int64 ids.

    Args:
        path: the file.
        item_column: column of raw item ids (integers or strings, no nulls).
        required: further columns that must be present.

    Returns:
        The raw ids (N,) (int64 or string) and the whole table.

    Raises:
        SchemaError: the file is missing or unreadable, a column is missing, or an id is null.
    """
    if not Path(path).is_file():
        raise SchemaError(f"{path}: no such file")
    table = read_table(path, string_columns=[item_column])
    for name in (item_column, *required):
        if name not in table.column_names:
            raise SchemaError(
                f"{path}: column {name!r} is missing; the file has columns {table.column_names}"
            )
    return check_id(table, item_column, str(path)).combine_chunks(), table


@dataclass
class ItemRows:
    """Rows of an item table in model ids, sorted by item: what rules look candidates up in.

    Args:
        ids: (N,) int64 model ids, ascending; an item may hold several rows (several windows).
        columns: name -> (N,) value of each row, in the order of `ids`.
    """

    ids: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids = np.asarray(self.ids, dtype=np.int64)
        keys, start, count = np.unique(self.ids, return_index=True, return_counts=True)
        self._keys = torch.from_numpy(keys)  # (U,)
        self._start = torch.from_numpy(start).long()  # (U,) first row of each item
        self._count = torch.from_numpy(count).long()  # (U,) rows of each item
        self.max_rows = int(count.max()) if len(count) else 0

    @classmethod
    def encode(cls, vocab: ItemVocab, raw: pa.Array, columns: dict[str, np.ndarray]) -> tuple[ItemRows, int]:
        """The rows of raw ids `raw` (N,) in model ids, and how many rows had an unknown id (dropped)."""
        ids = vocab.encode(raw).ids
        known = ids != OOV
        order = np.argsort(ids[known], kind="stable")
        kept = {name: np.asarray(values)[known][order] for name, values in columns.items()}
        return cls(ids[known][order], kept), int((~known).sum())

    def find(self, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, K) index of each candidate's first row (valid where found), and (B, K) bool found."""
        pos, found = find_sorted(self._keys.to(items.device), items)
        return (self._start.to(items.device)[pos] if len(self.ids) else pos), found

    def contains(self, items: torch.Tensor) -> torch.Tensor:
        """(B, K) bool: the candidate has a row."""
        return self.find(items)[1]

    def rows(self, items: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """For r in 0 .. max_rows - 1: the (B, K) index of each candidate's r-th row, and whether it has one.

        The loop runs over the repeat count of one item (a few validity windows), not over
        candidates: each step is one gather over the whole (B, K) matrix.
        """
        if not len(self.ids):  # no rows (every id of the table unknown to the vocabulary): nothing to look up
            return
        pos, found = find_sorted(self._keys.to(items.device), items)
        start, count = self._start.to(items.device)[pos], self._count.to(items.device)[pos]
        for r in range(self.max_rows):
            yield (start + r).clamp_(max=len(self.ids) - 1), found & (r < count)


class RawItemRule(Configurable):
    """Base of the stages built from raw item ids: ``bind(vocab)`` encodes them into `rows`.

    Subclasses read their raw ids (N,) and the columns that go with them in `read_raw`; the
    constructor only checks its arguments, so a saved stage is rebuilt from its config without
    its file and takes its encoded rows from `load_state_dict`.
    """

    _raw: pa.Array | None = None
    _raw_columns: dict[str, np.ndarray]
    rows: ItemRows | None = None
    num_unknown: int = 0  # raw ids that `bind` dropped because the vocabulary does not know them

    def read_raw(self) -> tuple[pa.Array, dict[str, np.ndarray]]:
        """The raw ids (N,) and the columns (N,) of the rule's source, read and checked."""
        raise NotImplementedError

    def read(self) -> RawItemRule:
        """Read and check the rule's raw ids now (`bind` reads them otherwise); returns self.

        Raises:
            SchemaError: a missing or unreadable file, a missing column, a bad value.
        """
        if self._raw is None:
            self._raw, self._raw_columns = self.read_raw()
        return self

    def bind(self, vocab: ItemVocab) -> RawItemRule:
        """Encode the raw ids with `vocab` (unknown ones dropped, counted in `num_unknown`); returns self.

        A stage that `load_state_dict` gave its rows already holds model ids and is left as it is.
        """
        if self.rows is not None and self._raw is None:
            return self
        self.read()
        self.rows, self.num_unknown = ItemRows.encode(vocab, self._raw, self._raw_columns)
        return self

    def bound_rows(self) -> ItemRows:
        if self.rows is None:
            raise RuntimeError(
                f"{type(self).__name__} holds raw item ids: call bind(vocab) before using or saving it"
            )
        return self.rows

    def state_dict(self) -> dict[str, Any]:
        """The encoded rows: ``ids`` (N,) model ids, the rule's columns (N,), and ``num_unknown``."""
        rows = self.bound_rows()
        return {"ids": rows.ids, **rows.columns, "num_unknown": self.num_unknown}

    def load_state_dict(self, state: Mapping[str, Any]) -> RawItemRule:
        """Take the encoded rows of a `state_dict`; returns self."""
        arrays = {name: np.asarray(value) for name, value in state.items() if name != "num_unknown"}
        self.rows = ItemRows(arrays.pop("ids"), arrays)
        self.num_unknown = int(state.get("num_unknown", 0))
        self._raw, self._raw_columns = None, {}
        return self


class Stateless(Configurable):
    """Base of a stage whose constructor arguments are all it holds: its state dict is empty."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> Stateless:
        return self


# ------------------------------------------------------------------------------------- filters
class SeenItemsFilter(Stateless):
    """Remove candidates the session already holds: in its last `window` events, or anywhere.

    Args:
        window: how many of the latest events count; None: the whole session (``sessions.history``
            when the pipeline keeps one, up to its ``history_length`` events; else ``sessions.items``).

    Examples:
        >>> s = RequestSessions(torch.tensor([[0, 5, 7]]))
        >>> SeenItemsFilter(window=1).apply(s, Candidates(torch.tensor([[5, 7, 9]]))).items.tolist()
        [[5, 0, 9]]
    """

    def __init__(self, window: int | None = None) -> None:
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ValueError(f"SeenItemsFilter window must be an integer >= 1 or None (whole session), got {window!r}")
        self.window = window

    def apply(self, sessions: RequestSessions, candidates: Candidates) -> Candidates:
        history = sessions.items if sessions.history is None else sessions.history  # right-aligned
        if self.window is not None:
            history = history[:, -self.window :]
        seen = find_sorted(history.sort(dim=1).values, candidates.items)[1]  # (B, K) per-row isin
        return candidates.keep(~seen)


class NonProductFilter(Stateless):
    """Remove everything that is not a product: padding, OOV, virtual ids and ids beyond the vocabulary.

    Args:
        num_items: size of the id space, ``len(vocab)``.
        num_virtual: virtual ids at its end (``vocab.num_virtual``).
    """

    def __init__(self, num_items: int, num_virtual: int = 0) -> None:
        if not 0 <= num_virtual <= num_items - NUM_SPECIAL:
            raise ValueError(
                f"NonProductFilter needs 0 <= num_virtual <= num_items - {NUM_SPECIAL}, "
                f"got num_items={num_items}, num_virtual={num_virtual}"
            )
        self.num_items = num_items
        self.num_virtual = num_virtual

    def apply(self, sessions: RequestSessions, candidates: Candidates) -> Candidates:
        items = candidates.items
        return candidates.keep((items >= NUM_SPECIAL) & (items < self.num_items - self.num_virtual))


_DEFAULT_WINDOW = ("valid_from", "valid_to")


class ItemTableFilter(RawItemRule):
    """Allow or deny the items of a table, each row valid in a time window.

    Rows are ``item_id`` plus optional ``valid_from``/``valid_to`` (seconds since the epoch, or
    timestamp/date columns); a null bound is open-ended. A row holds at the request time t when
    ``valid_from <= t < valid_to``; an item may have several rows (several windows). With
    ``mode="allow"`` only items with a row holding at t survive; with ``"deny"`` those items are
    removed. t is ``sessions.now``, which `Pipeline.recommend`, the server and ``sessrec recommend``
    always set (`sessrec.pipeline.clock`); a caller that builds `RequestSessions` without one chooses no
    time, and then every row holds. A time of another frame than the windows' (relative, before 1990,
    against dates, or the reverse) is refused (`check_frame`, called by `Pipeline.wrap`).

    The table is read when the filter is bound (or by `read`), once; `bind` encodes it,
    `state_dict` gives the encoded rows.

    Args:
        path: parquet or CSV file.
        mode: ``allow`` (availability list) or ``deny`` (block list).
        item_column: column of raw item ids.
        valid_from: start column; None: no start. Absent from the file under its default name:
            open (so a plain id list works); absent under another name: an error.
        valid_to: end column, the same way.

    Raises (from `read` or `bind`):
        SchemaError: missing file or column, null item id, a window ending before it starts, a number
            of seconds after the year 3000 (milliseconds given as seconds).
    """

    def __init__(
        self,
        path: str,
        mode: Literal["allow", "deny"] = "deny",
        item_column: str = "item_id",
        valid_from: str | None = "valid_from",
        valid_to: str | None = "valid_to",
    ) -> None:
        if mode not in ("allow", "deny"):
            raise ValueError(f"ItemTableFilter mode must be 'allow' or 'deny', got {mode!r}")
        self.path, self.mode = str(path), mode
        self.item_column, self.valid_from, self.valid_to = item_column, valid_from, valid_to

    def read_raw(self) -> tuple[pa.Array, dict[str, np.ndarray]]:
        path, valid_from, valid_to = self.path, self.valid_from, self.valid_to
        named = tuple(
            c for c, default in zip((valid_from, valid_to), _DEFAULT_WINDOW) if c not in (None, default)
        )
        raw, table = read_item_table(path, self.item_column, required=named)
        start = _seconds(table, valid_from, path, -math.inf)
        end = _seconds(table, valid_to, path, math.inf)
        if (start > end).any():
            row = int(np.flatnonzero(start > end)[0])
            first, last = table.column(valid_from)[row].as_py(), table.column(valid_to)[row].as_py()
            raise SchemaError(
                f"{path}: row {row} has {valid_from}={first!r} after {valid_to}={last!r}; "
                "a validity window must not end before it starts"
            )
        return raw, {"valid_from": start, "valid_to": end}

    def bind(self, vocab: ItemVocab) -> ItemTableFilter:
        """`RawItemRule.bind`; an allow table none of whose ids the vocabulary holds is refused (it would blank
        every list: another file, or ids of another kind than the catalogue's)."""
        super().bind(vocab)
        if self.mode == "allow" and self.num_unknown and not len(self.bound_rows().ids):
            raise SchemaError(f"{self.path}: none of the allow table's {self.num_unknown} item ids is in the pipeline's "
                              f"vocabulary, so every list would be empty; check the file and its {self.item_column!r} ids")
        return self

    def check_frame(self, now: torch.Tensor, name: Callable[[int], str] = "session {}".format) -> None:
        """Refuse serving times counted from another origin than the table's windows.

        Event times before 1990 are relative (seconds from a session's start, `sessrec.data.times`),
        and a session with such times is served at its last one; a window dated in 1990..2100 never
        holds at such a time (nor a relative window at a date), so every list would silently come
        out as if the table were empty (allow) or absent (deny).

        Args:
            now: (B,) seconds each session is served at.
            name: how the message names row ``i`` of the batch.

        Raises:
            ValueError: one line naming the table, the session, its time and a bound of the other frame.
        """
        dated, undated = self._frames()
        relative = now < PLAUSIBLE_SECONDS[0]
        for clash, other, frame in ((relative, dated, "a date"), (~relative, undated, "a relative time (before 1990)")):
            if other is not None and bool(clash.any()):
                row = int(clash.nonzero()[0, 0])
                at = float(now[row])
                served = f"{at:.0f} s, a relative time (before 1990)" if relative[row] else _date(at)
                raise ValueError(
                    f"{name(row)} is served at {served}, but the {self.mode} table {self.path} has a validity window "
                    f"bound at {_shown_bound(other)}, {frame}, so no window of it would ever hold; give the "
                    "sessions' now in the table's frame"
                )

    def _frames(self) -> tuple[float | None, float | None]:
        """The earliest dated (1990 on) and earliest relative (after 0, before 1990) window bound, None where the table
        has none; worked out once for the bound rows."""
        rows = self.bound_rows()
        cached = getattr(self, "_frame_bounds", None)  # (the rows, their bounds): one assignment, read by any thread
        if cached is None or cached[0] is not rows:
            bounds = np.concatenate([rows.columns["valid_from"], rows.columns["valid_to"]])
            bounds = bounds[np.isfinite(bounds) & (bounds > 0)]  # 0: "since the epoch", an open start
            dated = bounds[bounds >= PLAUSIBLE_SECONDS[0]]
            undated = bounds[bounds < PLAUSIBLE_SECONDS[0]]
            cached = self._frame_bounds = (rows, tuple(float(b.min()) if len(b) else None for b in (dated, undated)))
        return cached[1]

    def apply(self, sessions: RequestSessions, candidates: Candidates) -> Candidates:
        rows = self.bound_rows()
        items = candidates.items
        if sessions.now is None:
            listed = rows.contains(items)
        else:
            now = sessions.now.to(items.device, torch.float64).unsqueeze(1)  # (B, 1)
            start = torch.from_numpy(rows.columns["valid_from"]).to(items.device)
            end = torch.from_numpy(rows.columns["valid_to"]).to(items.device)
            listed = torch.zeros(items.shape, dtype=torch.bool, device=items.device)
            for row, present in rows.rows(items):
                listed |= present & (start[row] <= now) & (now < end[row])
        return candidates.keep(listed if self.mode == "allow" else ~listed)


def _date(seconds: float) -> str:
    """A time in seconds since the epoch as its UTC date and time, for a message."""
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _shown_bound(seconds: float) -> str:
    """A window bound for a message: a date from 1990 on, else a number of seconds."""
    return _date(seconds) if seconds >= PLAUSIBLE_SECONDS[0] else f"{seconds:.0f} s"


_TICKS_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _seconds(table: pa.Table, name: str | None, path: str | Path, fill: float) -> np.ndarray:
    """(N,) float64 seconds of a time column; nulls and an absent column become `fill` (open-ended)."""
    if name is None or name not in table.column_names:
        return np.full(table.num_rows, fill)
    col = table.column(name)
    if pa.types.is_date(col.type):
        col = col.cast(pa.timestamp("s"))
    if pa.types.is_timestamp(col.type):
        ticks = col.cast(pa.int64())  # since the epoch (UTC) in the column's unit, whatever its time zone
        values = ticks.fill_null(0).to_numpy().astype(np.float64) / _TICKS_PER_SECOND[col.type.unit]
        return np.where(ticks.is_null().to_numpy(zero_copy_only=False), fill, values)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_null(col.type):
        values = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        late = np.isfinite(values) & (np.abs(values) >= LATEST)
        if late.any():  # read as seconds, milliseconds would open or close the window tens of millennia away
            row = int(np.flatnonzero(late)[0])
            raise SchemaError(
                f"{path}: column {name!r} holds {col[row].as_py()!r} at row {row}, after the year 3000 in seconds since "
                "the epoch; give its times in seconds (milliseconds?) or as timestamps"
            )
        return np.where(np.isnan(values), fill, values)
    raise SchemaError(
        f"{path}: column {name!r} has dtype {col.type}; expected seconds (numbers) or timestamps"
    )
