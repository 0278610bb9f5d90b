"""Click-out ranking rows from a trivago log: one row per (click-out, impressed hotel), label = clicked.

A click-out shows a list of hotels (``impressions``, with aligned ``prices``); the user clicks one
(``reference``). Each shown hotel becomes a row, grouped by its click-out (the *query*), so a
scorer can be judged on how it orders the list (MRR of the clicked hotel) as well as on AUC.
Vectorized on Arrow and NumPy: no Python loop over events or rows. Encoding and batching of the
rows: `sessrec.datasets.clickout_rows`.

Features (all from the click-out itself or from events *before* it in its session; nothing later):

- sparse (embedded): ``hotel``, ``position`` (0-based place in the list), ``platform``, ``city``,
  ``device``, ``last_action`` (action type of the previous event in the session, ``<start>`` if
  none) and ``filters`` (multi-hot: the ``|``-separated ``current_filters``);
- dense (`DENSE_FEATURES`): log price, price rank within the list (0 = cheapest, ties by
  position) scaled to [0, 1], log price relative to the list's mean log price, position scaled to
  [0, 1], list length, number of earlier events in the session, whether and how often this hotel
  was an item action's ``reference`` earlier in the session, whether it was the most recent one,
  seconds since that last interaction (log), and a session-model score with its presence flag.

The session-model score is an optional input (``session_scores``): a table with ``session_id``,
``step`` (the click-out's step), ``item_id`` and ``score``, e.g. a next-item model's score of each
impressed hotel given the session so far. Rows without a score get 0 and ``has_session_score`` 0.

The split is by click-out time (`split_by_time`): click-outs in the last `test_hours` of the log
are the test set, the `valid_hours` before are validation.

Shape letters: E events, Q click-outs (queries), N rows (click-out x shown hotel).
"""


from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sessrec.data.columns import SchemaError, check_text
from sessrec.data.times import parse_time
from sessrec.datasets.trivago import ITEM_ACTIONS

CLICKOUT = "clickout item"
START = "<start>"
REQUIRED = (
    "session_id", "timestamp", "step", "action_type", "reference", "platform", "city", "device",
    "current_filters", "impressions", "prices",
)
ONE_HOT = ("hotel", "position", "platform", "city", "device", "last_action")
MULTI_HOT = ("filters",)
SPARSE_FEATURES = ONE_HOT + MULTI_HOT
DENSE_FEATURES = (
    "log_price", "price_rank", "relative_price", "position_scaled", "log_num_impressions", "log_prior_actions",
    "interacted_before", "log_interactions", "last_interacted", "log_seconds_since", "session_score",
    "has_session_score",
)
CLICKS = "clicks"  # vocabulary of clicked hotels in training: the popularity baseline's counts
SPLITS = ("train", "valid", "test")


# -- building rows ------------------------------------------------------------------------------
def build_clickout_rows(raw: pa.Table, source: str = "<table>", session_scores: pa.Table | None = None,
                        scores_source: str = "<session scores>") -> pa.Table:
    """One row per (click-out, impressed hotel) with raw features and the label.

    Args:
        raw: the trivago log (columns `REQUIRED`), in any order; ``impressions``, ``prices`` and ``current_filters``
            as the challenge's ``|``-separated text or as lists.
        source: name of the input in error messages (the file path).
        session_scores: optional ``session_id``, ``step``, ``item_id``, ``score`` table.
        scores_source: name of `session_scores` in error messages (its file path).

    Returns:
        Table of N rows sorted by click-out then position: ``query`` (click-out number), ``session_id``,
        ``step``, ``timestamp``, ``hotel``, ``position``, ``num_impressions``, ``price``, ``price_rank``,
        ``platform``, ``city``, ``device``, ``last_action``, ``filters`` (list), ``prior_actions``,
        ``interactions``, ``last_interacted``, ``seconds_since`` (NaN when never interacted),
        ``session_score`` (NaN when absent), ``label`` (1 = clicked).

    Raises:
        SchemaError: a missing column, a null id/time, a time that is not plausible in seconds (`parse_time`),
            a text column of bytes that are not UTF-8, a click-out without impressions, with an empty hotel id or showing a hotel twice, a click-out of no
            ``reference`` (null or empty: no hotel clicked), a click-out of no ``platform``, ``city`` or ``device``,
            unaligned ``impressions``/``prices``, a price that is not a non-negative number, a log where no click-out's
            ``reference`` is among its ``impressions``, or session scores that `_join_scores` refuses.
    """
    missing = [c for c in REQUIRED if c not in raw.column_names]
    if missing:
        raise SchemaError(f"{source}: column {missing[0]!r} is missing; the file has columns {raw.column_names}")
    for name in REQUIRED:  # bytes (a parquet file written without a string type) as text, or the value that is not
        column = raw.column(name)
        if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            raw = raw.set_column(raw.column_names.index(name), name, check_text(column, name, source, 0))
    for col in ("session_id", "timestamp", "step", "action_type"):
        if raw.column(col).null_count:
            row = int(np.flatnonzero(raw.column(col).is_null().to_numpy(zero_copy_only=False))[0])
            raise SchemaError(f"{source}: column {col!r} has a null value at row {row}; every event needs one")
    for col in ("timestamp", "step"):
        if not pa.types.is_integer(raw.column(col).type) and not pa.types.is_floating(raw.column(col).type):
            raise SchemaError(
                f"{source}: column {col!r} must be numeric, got {raw.column(col).type} "
                f"(first value {raw.column(col)[0].as_py()!r})"
            )
    parse_time(raw, "timestamp", "s", source)  # finite, and seconds: not milliseconds (the split counts hours)
    raw = raw.take(pc.sort_indices(raw, sort_keys=[("session_id", "ascending"), ("timestamp", "ascending"),
                                                   ("step", "ascending")]))
    col = lambda name: raw.column(name).combine_chunks()
    n_events = raw.num_rows
    action = col("action_type").cast(pa.string())
    session_code = pc.dictionary_encode(col("session_id")).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    times = col("timestamp").cast(pa.float64()).to_numpy(zero_copy_only=False)

    # session context of every event: events before it, and the action right before it
    starts = np.flatnonzero(np.r_[True, session_code[1:] != session_code[:-1]]) if n_events else np.zeros(0, np.int64)
    session_start = np.repeat(starts, np.diff(np.r_[starts, n_events]))  # (E,)
    event = np.arange(n_events)
    prior_actions = event - session_start
    prev = np.maximum(event - 1, 0)
    last_action = pc.if_else(pa.array(prior_actions > 0), action.take(pa.array(prev)), pa.scalar(START))

    # item actions: a hotel id in `reference`; the most recent one strictly before each event
    ref = col("reference").cast(pa.string())
    is_item = (pc.is_in(action, value_set=pa.array(ITEM_ACTIONS)).to_numpy(zero_copy_only=False)
               & ref.is_valid().to_numpy(zero_copy_only=False))
    last_item_event = np.maximum.accumulate(np.where(is_item, event, -1)) if n_events else np.zeros(0, np.int64)
    before = np.r_[-1, last_item_event[:-1]] if n_events else last_item_event  # strictly before
    before = np.where(before >= session_start, before, -1)

    # click-outs and their shown hotels
    clicks = np.flatnonzero(pc.equal(action, CLICKOUT).to_numpy(zero_copy_only=False))
    clicks_arr = pa.array(clicks)
    # as text: a CSV whose lists are all one hotel long types these columns as numbers
    imp = _lists(col("impressions").take(clicks_arr), "impressions", source)
    prices = _lists(col("prices").take(clicks_arr), "prices", source)
    n_imp = pc.list_value_length(imp).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    n_pr = pc.list_value_length(prices).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    empty = np.flatnonzero(n_imp == 0)
    if len(empty):
        q = clicks[empty[0]]
        raise SchemaError(
            f"{source}: column 'impressions' is empty on a click-out (session {col('session_id')[q].as_py()!r}, "
            f"step {col('step')[q].as_py()}); every click-out needs its shown hotels"
        )
    blank = pc.list_parent_indices(imp).filter(pc.equal(pc.list_flatten(imp), "")).to_numpy(zero_copy_only=False)
    if len(blank):
        q = clicks[blank[0]]
        raise SchemaError(
            f"{source}: column 'impressions' holds an empty hotel id on a click-out (session "
            f"{col('session_id')[q].as_py()!r}, step {col('step')[q].as_py()}: {col('impressions')[q].as_py()!r}); "
            "every shown hotel needs its id"
        )
    unclicked = np.flatnonzero(pc.fill_null(pc.equal(ref.take(clicks_arr), ""), True).to_numpy(zero_copy_only=False))
    if len(unclicked):  # all its hotels would be learned as not clicked, and it would be left out of MRR
        q = clicks[unclicked[0]]
        raise SchemaError(
            f"{source}: column 'reference' is empty on a click-out (session {col('session_id')[q].as_py()!r}, "
            f"step {col('step')[q].as_py()}); every click-out needs the hotel clicked"
        )
    for name in ("platform", "city", "device"):  # a sparse feature of every row: a null is no value to embed
        unknown = np.flatnonzero(col(name).take(clicks_arr).is_null().to_numpy(zero_copy_only=False))
        if len(unknown):
            q = clicks[unknown[0]]
            raise SchemaError(
                f"{source}: column {name!r} is null on a click-out (session {col('session_id')[q].as_py()!r}, "
                f"step {col('step')[q].as_py()}); every click-out needs its {name}"
            )
    bad = np.flatnonzero(n_imp != n_pr)
    if len(bad):
        q = clicks[bad[0]]
        raise SchemaError(
            f"{source}: columns 'impressions' and 'prices' differ in length on a click-out (session "
            f"{col('session_id')[q].as_py()!r}, step {col('step')[q].as_py()}: {n_imp[bad[0]]} hotels, "
            f"{n_pr[bad[0]]} prices {col('prices')[q].as_py()!r}); they must be aligned"
        )
    parent = pc.list_parent_indices(imp).to_numpy(zero_copy_only=False).astype(np.int64)  # (N,) click-out of a row
    hotel = pc.list_flatten(imp)
    flat_prices = pc.list_flatten(prices)
    try:
        price = pc.cast(flat_prices, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise SchemaError(f"{source}: column 'prices' holds a value that is not a number: {err}") from err
    if (~np.isfinite(price) | (price < 0)).any():
        row = int(np.flatnonzero(~np.isfinite(price) | (price < 0))[0])
        raise SchemaError(
            f"{source}: column 'prices' holds {flat_prices[row].as_py()!r}; prices must be finite and >= 0"
        )
    offsets = np.r_[0, np.cumsum(n_imp)]
    position = np.arange(len(parent)) - offsets[parent]
    hotel_code, ref_code = _shared_codes(hotel, ref)
    n_codes = int(max(hotel_code.max(initial=-1), ref_code.max(initial=-1))) + 2
    shown = parent * n_codes + hotel_code
    _, first_shown = np.unique(shown, return_index=True)
    if len(first_shown) != len(shown):  # a hotel twice in a list: its click would count twice, and which was clicked?
        again = np.ones(len(shown), dtype=bool)
        again[first_shown] = False
        row = int(np.flatnonzero(again)[0])
        q = clicks[parent[row]]
        raise SchemaError(
            f"{source}: column 'impressions' shows hotel {hotel[row].as_py()!r} twice on a click-out (session "
            f"{col('session_id')[q].as_py()!r}, step {col('step')[q].as_py()}: {col('impressions')[q].as_py()!r}); "
            "each hotel may be shown once per click-out"
        )
    order = np.lexsort((position, price, parent))  # by click-out, price, then position
    price_rank = np.empty(len(parent), dtype=np.int64)
    price_rank[order] = np.arange(len(parent)) - offsets[parent[order]]

    # earlier interactions with each shown hotel: one sort of (session, hotel) keys, no join
    row_event = clicks[parent]  # (N,) event index of each row's click-out
    item_events = np.flatnonzero(is_item)
    key = np.r_[session_code[row_event] * n_codes + hotel_code, session_code[item_events] * n_codes + ref_code[item_events]]
    at = np.r_[row_event, item_events]
    is_interaction = np.r_[np.zeros(len(row_event), bool), np.ones(len(item_events), bool)]
    # at the same event the row sorts first: the click-out itself is not an earlier interaction
    merged = np.lexsort((is_interaction, at, key))
    k, inter = key[merged], is_interaction[merged]
    key_start = np.maximum.accumulate(np.where(np.r_[True, k[1:] != k[:-1]], np.arange(len(k)), 0))
    seen = np.cumsum(inter) - inter  # interactions strictly before each position
    count_sorted = seen - (np.cumsum(inter) - inter)[key_start]
    last_sorted = np.maximum.accumulate(np.where(inter, np.arange(len(k)), -1))
    last_sorted = np.where(last_sorted >= key_start, last_sorted, -1)
    rows_sorted = np.flatnonzero(~inter)
    row_id = merged[rows_sorted]  # rows are the first len(row_event) entries
    interactions = np.empty(len(parent), dtype=np.int64)
    interactions[row_id] = count_sorted[rows_sorted]
    last_at = np.full(len(parent), -1, dtype=np.int64)
    last_at[row_id] = np.where(last_sorted[rows_sorted] >= 0, at[merged[np.maximum(last_sorted[rows_sorted], 0)]], -1)
    seconds_since = np.where(last_at >= 0, times[row_event] - times[np.maximum(last_at, 0)], np.nan)
    prev_item = before[row_event]
    last_interacted = (prev_item >= 0) & (ref_code[np.maximum(prev_item, 0)] == hotel_code)

    take = pa.array(row_event)
    label = pc.equal(hotel, ref.take(take)).fill_null(False).to_numpy(zero_copy_only=False)
    if len(clicks) and not label.any():  # every row a negative: ids of the clicked and shown hotels written otherwise
        q = clicks[0]
        raise SchemaError(
            f"{source}: no click-out's 'reference' is one of its 'impressions' (session {col('session_id')[q].as_py()!r}, "
            f"step {col('step')[q].as_py()}: reference {ref[q].as_py()!r}, impressions {col('impressions')[q].as_py()!r}); "
            "the clicked hotel's id must be written as the shown ones are"
        )
    filters = _lists(col("current_filters").take(take), "current_filters", source)
    filters = pc.if_else(filters.is_null(), pa.scalar([], pa.list_(pa.string())), filters)
    rows = pa.table({
        "query": parent,
        "session_id": col("session_id").take(take),
        "step": col("step").take(take),
        "timestamp": col("timestamp").take(take),
        "hotel": hotel,
        "position": position,
        "num_impressions": n_imp[parent],
        "price": price,
        "price_rank": price_rank,
        "platform": col("platform").take(take).cast(pa.string()),
        "city": col("city").take(take).cast(pa.string()),
        "device": col("device").take(take).cast(pa.string()),
        "last_action": last_action.take(take),
        "filters": filters,
        "prior_actions": prior_actions[row_event],
        "interactions": interactions,
        "last_interacted": last_interacted,
        "seconds_since": seconds_since,
        "label": label.astype(np.int8),
    })
    return rows.append_column("session_score", pa.array(_join_scores(rows, session_scores, source, scores_source)))


def _lists(column: pa.Array, name: str, source: str) -> pa.Array:
    """A column of ``|``-separated values (the challenge's text) or of lists (a parquet file written from lists), as
    lists of text; refused in one line naming the column for a list holding a null or values that are not text or
    numbers."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        try:
            lists = column.cast(pa.list_(pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SchemaError(f"{source}: column {name!r} holds lists of {column.type.value_type}, not of ids or "
                              "numbers") from None
        flat = pc.list_flatten(lists)
        if flat.null_count:
            row = int(pc.list_parent_indices(lists).to_numpy()[np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0]])
            raise SchemaError(f"{source}: column {name!r} holds a null in the list {column[row].as_py()!r}; every value "
                              "of a list needs one")
        return lists
    try:
        return pc.split_pattern(column.cast(pa.string()), "|")
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise SchemaError(f"{source}: column {name!r} is of type {column.type}; it holds '|'-separated text or lists") from None


def _shared_codes(hotel: pa.Array, ref: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of shown hotels (N,) and event references (E,) in one shared dictionary; -1 for null."""
    both = pc.dictionary_encode(pa.concat_arrays([hotel.cast(pa.string()), ref.cast(pa.string())]))
    codes = both.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes[: len(hotel)], codes[len(hotel):]


def _join_scores(rows: pa.Table, scores: pa.Table | None, source: str, scores_source: str) -> np.ndarray:
    """(N,) session-model score of each row from ``session_id, step, item_id, score``; NaN where absent.

    Refused in one line naming `scores_source`: a missing column, a null, a key that is not of the log's type, a
    score that is not finite or not a float32 (the dense features' type), a (session_id, step, item_id) scored
    twice, and scores of which none keys a shown hotel of the log's click-outs (`source`): a feature absent on
    every row; and, naming `source`, two click-outs of a session with one step, which the scores cannot tell apart."""
    out = np.full(rows.num_rows, np.nan)
    if scores is None:
        return out
    need = {"session_id": "session_id", "step": "step", "item_id": "hotel", "score": "score"}  # its column: the rows'
    missing = [c for c in need if c not in scores.column_names]
    if missing:
        raise SchemaError(f"{scores_source}: session scores lack column {missing[0]!r}; they need columns {list(need)}, "
                          f"the file has {scores.column_names}")
    types = {"session_id": rows.column("session_id").type, "step": rows.column("step").type,
             "item_id": pa.string(), "score": pa.float64()}
    columns = {}
    for name, key in need.items():
        column = scores.column(name)
        if column.null_count:
            row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise SchemaError(f"{scores_source}: column {name!r} has a null value at row {row}; every session score "
                              f"needs its {', '.join(need)}")
        try:
            columns[key] = column.cast(types[name])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            row, value = _uncastable(column, types[name])
            what = "a number" if name == "score" else f"of the type of the log's {key} ({types[name]})"
            raise SchemaError(f"{scores_source}: column {name!r} holds {value!r} at row {row}, not {what}") from None
    score = columns["score"].to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~(np.abs(score) <= np.finfo(np.float32).max))  # NaN, infinite, or past float32
    if len(bad):
        raise SchemaError(f"{scores_source}: column 'score' holds {float(score[bad[0]])!r} at row {int(bad[0])}; a "
                          "session score must be a finite float32 (leave out the rows of a hotel with no score)")
    scores = pa.table(columns)
    keys = ["session_id", "step", "hotel"]
    counts = scores.group_by(keys).aggregate([([], "count_all")])
    twice = counts.filter(pc.greater(counts.column("count_all"), 1))
    if twice.num_rows:
        first = twice.slice(0, 1).to_pylist()[0]
        raise SchemaError(f"{scores_source}: session scores hold {first['count_all']} scores for session_id "
                          f"{first['session_id']!r}, step {first['step']!r}, item_id {first['hotel']!r}; one each")
    clickouts = pa.table({"session_id": rows.column("session_id"), "step": rows.column("step"), "query": rows.column("query")})
    steps = clickouts.group_by(["session_id", "step"]).aggregate([("query", "count_distinct")])
    shared = steps.filter(pc.greater(steps.column("query_count_distinct"), 1))
    if shared.num_rows:  # a score keyed by that step would be joined to the rows of each of them
        first = shared.slice(0, 1).to_pylist()[0]
        raise SchemaError(f"{source}: {first['query_count_distinct']} click-outs of session {first['session_id']!r} have "
                          f"step {first['step']!r}: the session scores of {scores_source} key a click-out by its session_id "
                          "and step, which must tell them apart")
    left = pa.table({k: rows.column(k) for k in keys}).append_column("row", pa.array(np.arange(rows.num_rows)))
    joined = left.join(scores, keys=keys, join_type="inner")
    if scores.num_rows and rows.num_rows and not joined.num_rows:
        first = scores.slice(0, 1).to_pylist()[0]
        raise SchemaError(
            f"{scores_source}: none of its {scores.num_rows} session scores is of a hotel shown on a click-out of "
            f"{source} (its first: session_id {first['session_id']!r}, step {first['step']!r}, item_id "
            f"{first['hotel']!r}); the scores key a click-out by its session_id and step and a shown hotel by its id"
        )
    out[joined.column("row").to_numpy()] = joined.column("score").to_numpy(zero_copy_only=False)
    return out


def _uncastable(column: pa.ChunkedArray | pa.Array, to: pa.DataType) -> tuple[int, object]:
    """The row and value of the first entry of `column` that a safe cast to `to` refuses (the error path only)."""
    for row, value in enumerate(column.to_pylist()):
        try:
            pa.array([value], column.type).cast(to)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return row, value
    return 0, column[0].as_py()


def split_by_time(rows: pa.Table, end_of_log: float, test_hours: float, valid_hours: float) -> np.ndarray:
    """(N,) split code per row (0 train, 1 valid, 2 test) from its click-out's time."""
    t = rows.column("timestamp").to_numpy(zero_copy_only=False).astype(np.float64)
    t_test = end_of_log - test_hours * 3600.0
    t_valid = t_test - valid_hours * 3600.0
    return np.where(t > t_test, 2, np.where(t > t_valid, 1, 0)).astype(np.int8)
