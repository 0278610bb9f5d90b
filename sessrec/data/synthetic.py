"""Synthetic session logs with learnable structure, for the quickstart and the tests.

Items fall into clusters; item popularity is Zipf-distributed; within a session the next
product follows a fixed per-item Markov transition (to one of a few "successor" items of the
same cluster) with probability `markov_prob`, else a popular item of the session's cluster.
A share of events are non-product page views (search, filter, category and home pages) with a
null ``item_id``; a category page names the session's cluster (``category 7``), the other pages
say nothing. A model that learns the transitions beats popularity by a wide margin, so the
quickstart has something to show; the page views can be kept as virtual items (`VirtualSpec`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

PAGE_TYPES = np.array(["search", "filter", "category", "home"])


def generate_sessions(
    num_sessions: int = 20_000,
    num_items: int = 1_000,
    num_clusters: int = 20,
    mean_length: float = 6.0,
    max_length: int = 30,
    zipf_exponent: float = 1.1,
    markov_prob: float = 0.7,
    num_successors: int = 3,
    page_view_share: float = 0.1,
    days: float = 14.0,
    seed: int = 0,
) -> pa.Table:
    """Generate an event log.

    Returns:
        Table with ``session_id`` (int64), ``item_id`` (int64, null for page views, raw ids start
        at 1000 so they differ from model ids), ``timestamp`` (float seconds), ``event_type``
        (``product`` or ``page_view``) and ``page`` (the page of a page view, else null: its type, and
        for a category page the session's cluster, ``category 7``).
    """
    if num_items < num_clusters:
        raise ValueError(f"num_items ({num_items}) must be at least num_clusters ({num_clusters})")
    rng = np.random.default_rng(seed)
    cluster_of = rng.integers(0, num_clusters, num_items)
    popularity = 1.0 / np.arange(1, num_items + 1) ** zipf_exponent
    popularity = popularity[rng.permutation(num_items)]

    # per-cluster sampling tables: cumulative popularity within each cluster
    order = np.lexsort((-popularity, cluster_of))
    sorted_cluster = cluster_of[order]
    cluster_start = np.searchsorted(sorted_cluster, np.arange(num_clusters))
    cluster_end = np.searchsorted(sorted_cluster, np.arange(num_clusters), side="right")
    cum = np.cumsum(popularity[order])
    base = np.where(cluster_start > 0, cum[np.maximum(cluster_start - 1, 0)], 0.0)
    base[cluster_start == 0] = 0.0

    def sample_in_cluster(clusters: np.ndarray) -> np.ndarray:
        lo, hi = base[clusters], cum[cluster_end[clusters] - 1]
        u = lo + rng.random(len(clusters)) * (hi - lo)
        idx = np.searchsorted(cum, u, side="right")
        return order[np.clip(idx, cluster_start[clusters], cluster_end[clusters] - 1)]

    successors = sample_in_cluster(np.repeat(cluster_of, num_successors)).reshape(num_items, num_successors)

    lengths = np.clip(rng.geometric(1.0 / (mean_length - 1), num_sessions) + 1, 2, max_length)
    session_cluster = rng.integers(0, num_clusters, num_sessions)
    items = np.zeros((num_sessions, max_length), dtype=np.int64)
    items[:, 0] = sample_in_cluster(session_cluster)
    for t in range(1, max_length):  # a loop over positions; every session advances at once
        follow = rng.random(num_sessions) < markov_prob
        nxt = successors[items[:, t - 1], rng.integers(0, num_successors, num_sessions)]
        items[:, t] = np.where(follow, nxt, sample_in_cluster(session_cluster))

    valid = np.arange(max_length)[None, :] < lengths[:, None]
    session = np.repeat(np.arange(1, num_sessions + 1), lengths)
    item = items[valid] + 1000
    start = np.sort(rng.random(num_sessions)) * days * 86400.0 + 1.7e9
    gaps = rng.exponential(45.0, valid.sum())
    step = np.arange(valid.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cum_gap = np.cumsum(gaps)
    first_gap = np.repeat(cum_gap[np.cumsum(lengths) - lengths], lengths)
    timestamp = np.repeat(start, lengths) + (cum_gap - first_gap)
    is_page = (rng.random(len(item)) < page_view_share) & (step > 0)
    page_type = PAGE_TYPES[rng.integers(0, len(PAGE_TYPES), len(item))]
    category = np.char.add("category ", np.repeat(session_cluster, lengths).astype(str))
    page = np.where(is_page, np.where(page_type == "category", category, page_type), None)
    return pa.table(
        {
            "session_id": pa.array(session, pa.int64()),
            "item_id": pa.array(item, pa.int64(), mask=is_page),
            "timestamp": pa.array(timestamp, pa.float64()),
            "event_type": pa.array(np.where(is_page, "page_view", "product")),
            "page": pa.array(page, pa.string()),
        }
    )
