"""`TrivagoSource`: hotel-search sessions of the trivago RecSys Challenge 2019 log.

Each row of the log is an action of a session: item actions (click-out, image, info, rating,
deals, search for item) carry a hotel id in ``reference``; the others (search for destination
or POI, filter selection, change of sort order) carry a non-product value there. Those are
dropped, or kept as *virtual items* (Coveo SIGIR'21): input-only tokens keyed by a column
expression, e.g. ``action_type:reference`` = ``filter selection:4 Star``. The split, the
session filter and therefore the evaluation pairs do not depend on that choice, so the two are
directly comparable.

Shape letters: E events (rows), N sessions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data import frame
from sessrec.data.readers import read_table
from sessrec.data.schema import FeatureSpec, Schema, SchemaError
from sessrec.data.sources import SessionSource, SessionSplits

ITEM_ACTIONS = [
    "clickout item",
    "interaction item image",
    "interaction item info",
    "interaction item rating",
    "interaction item deals",
    "search for item",
]
PRICE = "price"  # derived: the price of the clicked hotel, read from ``impressions``/``prices``


class TrivagoSource(SessionSource):
    """Sessions from the raw trivago log, split by the time each session starts.

    Events are sorted by session, timestamp and ``step``. Sessions that start in the last
    `test_hours` of the log are the test set, those starting in the `valid_hours` before are
    validation, the rest train; a session is never cut. With the ``last`` protocol each held-out
    session's last product is predicted from the events before it.

    Args:
        path: the log (parquet, or CSV with the challenge's columns).
        virtual_items: keep non-product events as virtual items (input tokens only, never
            targets nor recommendations) instead of dropping them.
        virtual_key: columns whose values, joined by `virtual_separator`, key a virtual item.
        virtual_separator: separator of the key's parts.
        product_actions: action types whose ``reference`` is a hotel id.
        features: per-event columns carried into the session table as side-feature lists: any
            column of the file, or ``price`` (the clicked hotel's price on click-outs, else null).
        min_products: drop sessions with fewer product events (0 keeps every session that has
            an event left).
        test_hours: sessions starting in this final period of the log are the test set.
        valid_hours: the period before it, for validation.
    """

    def __init__(
        self,
        path: str,
        virtual_items: bool = False,
        virtual_key: list[str] = ["action_type", "reference"],  # noqa: B006 - read only
        virtual_separator: str = ":",
        product_actions: list[str] = ITEM_ACTIONS,
        features: list[str] = [],  # noqa: B006 - read only
        min_products: int = 2,
        test_hours: float = 8.0,
        valid_hours: float = 8.0,
    ) -> None:
        if not virtual_key:
            raise ValueError("virtual_key needs at least one column")
        if min_products < 0 or test_hours <= 0 or valid_hours < 0:
            raise ValueError(
                f"need min_products >= 0, test_hours > 0, valid_hours >= 0; got {min_products}, {test_hours}, {valid_hours}"
            )
        reserved = {frame.SESSION, frame.ITEMS, frame.TIMES, frame.VIRTUAL}
        if reserved & set(features):
            raise ValueError(f"features may not be named {sorted(reserved & set(features))}: those columns are always there")
        self.path, self.virtual_items = path, virtual_items
        self.virtual_key, self.virtual_separator = list(virtual_key), virtual_separator
        self.product_actions, self.features = list(product_actions), list(features)
        self.min_products, self.test_hours, self.valid_hours = min_products, test_hours, valid_hours

    def events(self) -> pa.Table:
        """Validated, sorted events: ``session_id``, ``item_id`` (text), ``timestamp``, ``virtual`` and the features.

        Non-product events are kept here (``virtual`` True, their key in ``item_id``).
        """
        source = str(self.path)
        raw = read_table(Path(self.path))
        needed = ["session_id", "timestamp", "step", "action_type", "reference", *self.virtual_key]
        needed += [c for c in self.features if c != PRICE]
        needed += ["impressions", "prices"] if PRICE in self.features else []
        for col in needed:
            if col not in raw.column_names:
                raise SchemaError(
                    f"{source}: column {col!r} is missing; the file has columns {raw.column_names}"
                )
        schema = Schema(session_id="session_id", item_id="reference", timestamp="timestamp", order_by="step")
        valid = schema.validate(raw, source=source)  # ids without nulls, numeric times and steps
        action = raw.column("action_type")
        if action.null_count:
            row = int(np.flatnonzero(action.is_null().to_numpy(zero_copy_only=False))[0])
            raise SchemaError(f"{source}: column 'action_type' has a null value at row {row}")
        product = pc.is_in(action, value_set=pa.array(self.product_actions, action.type)).to_numpy(zero_copy_only=False)
        item = valid.column("reference").cast(pa.string())
        parts = [pc.cast(raw.column(c), pa.string()).fill_null("") for c in self.virtual_key]
        key = pc.binary_join_element_wise(*parts, self.virtual_separator)
        cols = {
            frame.SESSION: valid.column("session_id"),
            frame.ITEMS: pc.if_else(pa.array(product), item, key),
            frame.TIMES: valid.column("timestamp"),
            "step": valid.column("step"),
            frame.VIRTUAL: pa.array(~product),
        }
        for name in self.features:
            try:
                cols[name] = _clicked_price(raw) if name == PRICE else raw.column(name)
            except SchemaError as err:
                raise SchemaError(f"{source}: {err}") from err
        events = pa.table(cols)
        return frame.sort_events(events, Schema(session_id=frame.SESSION, timestamp=frame.TIMES, order_by="step"))

    def load(self) -> SessionSplits:
        events = self.events()
        carried = [frame.VIRTUAL, *self.features]
        schema = Schema(session_id=frame.SESSION, features=[FeatureSpec(c) for c in carried])
        sessions = frame.group_sessions(events, schema)
        _, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
        virtual = frame.list_offsets(sessions.column(frame.VIRTUAL))[0].to_numpy(zero_copy_only=False)
        times = frame.list_offsets(sessions.column(frame.TIMES))[0].to_numpy(zero_copy_only=False)

        # the split and the session filter are decided on whole sessions, before any event is dropped
        start = times[offsets[:-1]] if len(times) else np.zeros(0)
        end_of_log = times.max() if len(times) else 0.0
        t_test = end_of_log - self.test_hours * 3600.0
        t_valid = t_test - self.valid_hours * 3600.0
        split = np.where(start > t_test, 2, np.where(start > t_valid, 1, 0))
        session_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        n_products = np.bincount(session_of[~virtual], minlength=len(offsets) - 1)
        keep = n_products >= self.min_products

        if not self.virtual_items:
            sessions = _filter_events(sessions, ~virtual, offsets)
        keep &= frame.session_lengths(sessions) > 0
        parts = [sessions.filter(pa.array(keep & (split == k))) for k in range(3)]
        return SessionSplits(train=parts[0], valid=parts[1], test=parts[2], source=str(self.path))


def _filter_events(sessions: pa.Table, keep: np.ndarray, offsets: np.ndarray) -> pa.Table:
    """Keep the events where `keep` (E,) is True in every list column; sessions may become empty."""
    lengths = np.diff(offsets)
    session_of = np.repeat(np.arange(len(lengths)), lengths)
    new_offsets = np.concatenate([[0], np.cumsum(np.bincount(session_of[keep], minlength=len(lengths)))])
    out = {}
    mask = pa.array(keep)
    for name in sessions.column_names:
        col = sessions.column(name)
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            values, _ = frame.list_offsets(col)
            out[name] = pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), values.filter(mask))
        else:
            out[name] = col
    return pa.table(out)


def _clicked_price(raw: pa.Table) -> pa.Array:
    """(E,) float64 price of the hotel in ``reference`` among the row's ``impressions``; null when absent.

    ``impressions`` and ``prices`` are ``|``-separated lists of the same length on click-outs.
    """
    impressions = pc.split_pattern(raw.column("impressions").combine_chunks(), "|")
    prices = pc.split_pattern(raw.column("prices").combine_chunks(), "|")
    n_imp = pc.list_value_length(impressions).fill_null(0).to_numpy(zero_copy_only=False)
    n_pr = pc.list_value_length(prices).fill_null(0).to_numpy(zero_copy_only=False)
    if (n_imp != n_pr).any():
        row = int(np.flatnonzero(n_imp != n_pr)[0])
        raise SchemaError(
            f"columns 'impressions' and 'prices' differ in length at row {row} ({n_imp[row]} hotels, "
            f"{n_pr[row]} prices: {raw.column('prices')[row].as_py()!r}); they must be aligned"
        )
    out = np.full(raw.num_rows, np.nan)
    rows = np.flatnonzero(n_imp > 0)
    if len(rows):
        imp = impressions.take(pa.array(rows))
        parent = pc.list_parent_indices(imp).to_numpy(zero_copy_only=False)  # (K,) row of each shown hotel
        ref = raw.column("reference").combine_chunks().cast(pa.string()).take(pa.array(rows))
        hit = pc.equal(pc.list_flatten(imp), ref.take(pa.array(parent))).fill_null(False).to_numpy(zero_copy_only=False)
        flat_prices = pc.list_flatten(prices.take(pa.array(rows)))
        try:
            numbers = pc.cast(flat_prices, pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise SchemaError(f"column 'prices' holds a value that is not a number: {err}") from err
        first = np.full(len(rows), len(hit), dtype=np.int64)
        hits = np.flatnonzero(hit)
        np.minimum.at(first, parent[hits], hits)  # the first match of a row
        found = first < len(hit)
        out[rows[found]] = numbers[first[found]]
    return pa.array(out, pa.float64(), from_pandas=True)
