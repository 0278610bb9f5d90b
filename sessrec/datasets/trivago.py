"""`TrivagoSource`: hotel-search sessions of the trivago RecSys Challenge 2019 log.

Each row of the log is an action of a session: item actions (click-out, image, info, rating,
deals, search for item) carry a hotel id in ``reference``; the others (search for destination
or POI, filter selection, change of sort order) carry a non-product value there. `SCHEMA` says so
with the schema's virtual role (`VirtualSpec`), so any reader of event logs (``EventLogSource``,
``sessrec prepare``) reads the log with it. Those events are dropped, or kept as *virtual items*
(Coveo SIGIR'21): input-only tokens keyed by ``action_type:reference``, e.g. ``filter
selection:4 Star``. The split, the session filter and therefore the evaluation pairs do not
depend on that choice, so the two are directly comparable.

Shape letters: E events (rows), N sessions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data import frame
from sessrec.data.readers import read_table
from sessrec.data.schema import FeatureSpec, Schema, SchemaError, VirtualSpec
from sessrec.data.sources import SessionSource, SessionSplits

ITEM_ACTIONS = [
    "clickout item",
    "interaction item image",
    "interaction item info",
    "interaction item rating",
    "interaction item deals",
    "search for item",
]
NON_ITEM_ACTIONS = ["search for destination", "search for poi", "filter selection", "change of sort order"]
SCHEMA = Schema(
    session_id="session_id",
    item_id="reference",
    timestamp="timestamp",
    order_by="step",
    virtual=VirtualSpec("action_type", NON_ITEM_ACTIONS, key=["action_type", "reference"]),
)
"""The log's columns; the `ITEM_ACTIONS` name a hotel in ``reference``, the `NON_ITEM_ACTIONS` are virtual."""
PRICE = "price"  # derived: the price of the clicked hotel, read from ``impressions``/``prices``


class TrivagoSource(SessionSource):
    """Sessions from the raw trivago log, split by the time each session starts.

    Events are sorted by session, timestamp and ``step``. Sessions that start in the last
    `test_hours` of the log are the test set, those starting in the `valid_hours` before are
    validation, the rest train; a session is never cut. With the ``last`` protocol each held-out
    session's last product is predicted from the events before it.

    Args:
        path: the log (parquet, or CSV with the challenge's columns).
        virtual_items: keep non-product events (`SCHEMA`'s virtual role) as virtual items (input
            tokens only, never targets nor recommendations) instead of dropping them.
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
        features: list[str] = [],  # noqa: B006 - read only
        min_products: int = 2,
        test_hours: float = 8.0,
        valid_hours: float = 8.0,
    ) -> None:
        if min_products < 0 or test_hours <= 0 or valid_hours < 0:
            raise ValueError(
                f"need min_products >= 0, test_hours > 0, valid_hours >= 0; got {min_products}, {test_hours}, {valid_hours}"
            )
        reserved = {frame.SESSION, frame.ITEMS, frame.TIMES, frame.VIRTUAL}
        if reserved & set(features):
            raise ValueError(f"features may not be named {sorted(reserved & set(features))}: those columns are always there")
        self.path, self.virtual_items, self.features = path, virtual_items, list(features)
        self.min_products, self.test_hours, self.valid_hours = min_products, test_hours, valid_hours

    def events(self) -> pa.Table:
        """Validated, sorted events: ``session_id``, ``item_id`` (text), ``timestamp``, ``virtual`` and the features.

        Non-product events are kept here (``virtual`` True, their key in ``item_id``).
        """
        source = str(self.path)
        raw = read_table(Path(self.path))
        needed = [c for c in self.features if c != PRICE] + (["impressions", "prices"] if PRICE in self.features else [])
        for col in needed:
            if col not in raw.column_names:
                raise SchemaError(
                    f"{source}: column {col!r} is missing; the file has columns {raw.column_names}"
                )
        valid = SCHEMA.validate(raw, source=source)  # ids without nulls, numeric times and steps, virtual keys
        cols = {
            frame.SESSION: valid.column("session_id"),
            frame.ITEMS: valid.column("reference"),
            frame.TIMES: valid.column("timestamp"),
            "step": valid.column("step"),
            frame.VIRTUAL: valid.column(frame.VIRTUAL),
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
        schema = Schema(session_id=frame.SESSION, features=[FeatureSpec(c) for c in self.features], virtual=SCHEMA.virtual)
        sessions = frame.group_sessions(events, schema)
        _, offsets = frame.list_offsets(sessions.column(frame.ITEMS))
        times = frame.list_offsets(sessions.column(frame.TIMES))[0].to_numpy(zero_copy_only=False)

        # the split and the session filter are decided on whole sessions, before any event is dropped
        start = times[offsets[:-1]] if len(times) else np.zeros(0)
        end_of_log = times.max() if len(times) else 0.0
        t_test = end_of_log - self.test_hours * 3600.0
        t_valid = t_test - self.valid_hours * 3600.0
        split = np.where(start > t_test, 2, np.where(start > t_valid, 1, 0))
        keep = frame.product_lengths(sessions) >= self.min_products
        if not self.virtual_items:
            sessions = frame.drop_virtual(sessions)
        keep &= frame.session_lengths(sessions) > 0
        parts = [sessions.filter(pa.array(keep & (split == k))) for k in range(3)]
        return SessionSplits(train=parts[0], valid=parts[1], test=parts[2], source=str(self.path))


def _clicked_price(raw: pa.Table) -> pa.Array:
    """(E,) float64 price of the hotel in ``reference`` among the row's ``impressions``; null when absent.

    ``impressions`` and ``prices`` are ``|``-separated lists of the same length on click-outs.
    """
    # as text: a CSV whose lists are all one hotel long types these columns as numbers
    impressions = pc.split_pattern(raw.column("impressions").combine_chunks().cast(pa.string()), "|")
    prices = pc.split_pattern(raw.column("prices").combine_chunks().cast(pa.string()), "|")
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
