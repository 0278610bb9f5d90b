"""V-SKNN: session kNN with position-weighted similarity (Ludewig & Jannach, UMUAI 2018).

"Evaluation of session-based recommendation algorithms" (Ludewig & Jannach, 2018), the
``VMContextKNN`` of session-rec. For a prefix s with events 1..|s| (latest last):

1. Candidates: training sessions that share an item with s; keep the `sample_size` most recent.
2. Similarity: each distinct item i of s weighs w(p_i), p_i the position of its latest
   occurrence (``weighting``; ``div`` is the paper's linear decay p/|s|: 1 for the last item).
   ``dot``: sim(s, n) = sum_{i in s & n} w(p_i) / |s|, with |s| the distinct items of s
   (session-rec's ``vec``); ``cosine``: the same sum / (||w||_2 * sqrt(|n|)).
3. Neighbours: the `k` candidates of highest positive similarity (ties: the more recent).
4. Scores: score(i) = sum over neighbours n containing i of
   sim(s, n) * decay(d_n) * (1 + idf_weighting * idf(i)), where d_n = |s| - p + 1 is how far
   from the end of s the most recent item shared with n is (``weighting_score``), and
   idf(i) = log(N / sessions containing i).

Items of the prefix itself are scored like any other ("remind"). Items no neighbour contains
score 0 and tie; `TopKMetrics` ranks ties pessimistically. Differences from session-rec: time
is the training sessions' rank in time order (see `sessrec.baselines.knn`), idf counts sessions rather
than events, ``linear`` is 1 - 0.1 * (events from the end) clipped at 0 both as ``weighting`` and as
``weighting_score`` (session-rec's ``weighting`` is 0 from the 11th event of the prefix on and goes
negative 11 or more events from the end; its ``weighting_score`` goes negative from 11 events from the end
up to 100, 0 after), and scores are not divided by their maximum (the ranking is the same).

Everything runs per batch of prefixes: an item -> sessions index finds the candidates, and the
neighbours' weights are summed per (prefix, item) reached by a sparse product (see `sessrec.baselines.knn`).

Shape letters: N training sessions, B prefixes, L positions, V items, P candidate pairs.

Examples:
    >>> import torch
    >>> train = torch.tensor([[0, 2, 3, 4], [0, 0, 3, 5], [0, 0, 6, 7]])
    >>> knn = VSKNN(k=10, sample_size=0).fit(train, num_items=8)
    >>> knn.score(torch.tensor([[0, 0, 2, 3]]))[0, 2:].tolist()  # items 2..7
    [0.75, 1.25, 0.75, 0.5, 0.0, 0.0]

    Weights 1/2 (item 2) and 2/2 (item 3); session [2, 3, 4] shares both: (0.5 + 1) / 2 = 0.75;
    [3, 5] shares item 3: 1 / 2 = 0.5; both share the last item (decay 1). Item 3 gets 0.75 + 0.5.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from sessrec.baselines.baseline import SessionBaseline
from sessrec.baselines.knn import (
    PRODUCT_PAIRS,
    SessionIndex,
    by_rows,
    highest_position,
    item_sums,
    positive_sums,
    session_items,
    top_k,
)

Weighting = Literal["same", "div", "linear", "quadratic", "log"]


def position_weight(kind: Weighting, position: np.ndarray | int, length: np.ndarray) -> np.ndarray:
    """Weight of an item at `position` (1 = oldest) in a prefix of `length` events."""
    p, n = np.asarray(position, dtype=np.float64), np.asarray(length, dtype=np.float64)
    if kind == "same":
        return np.ones(np.broadcast(p, n).shape)
    if kind == "div":
        return p / n
    if kind == "linear":
        return np.clip(1.0 - 0.1 * (n - p), 0.0, None)
    if kind == "quadratic":
        return (p / n) ** 2
    return 1.0 / np.log10(n - p + 1.7)  # log


def step_decay(kind: Weighting, step: np.ndarray) -> np.ndarray:
    """Decay of a neighbour whose most recent shared item is `step` events from the end (1 = last)."""
    d = np.asarray(step, dtype=np.float64)
    if kind == "same":
        return np.ones_like(d)
    if kind == "div":
        return 1.0 / d
    if kind == "linear":
        return np.clip(1.0 - 0.1 * d, 0.0, None)
    if kind == "quadratic":
        return 1.0 / d**2
    return 1.0 / np.log10(d + 1.7)  # log


class VSKNN(SessionBaseline):
    """Vector-multiplication session kNN.

    Args:
        k: neighbours per prefix.
        sample_size: candidate sessions per prefix, the most recent ones; 0 = all candidates.
        weighting: position weight w(p) of the prefix's items in the similarity.
        weighting_score: decay of a neighbour's contribution by how far from the end of the
            prefix its most recent shared item is.
        similarity: ``dot`` (weighted overlap / distinct prefix items) or ``cosine``.
        idf_weighting: multiply each item's contribution by (1 + idf_weighting * idf); 0 = off.
    """

    def __init__(
        self,
        k: int = 100,
        sample_size: int = 1000,
        weighting: Weighting = "div",
        weighting_score: Weighting = "div",
        similarity: Literal["dot", "cosine"] = "dot",
        idf_weighting: float = 0.0,
    ) -> None:
        if k < 1 or sample_size < 0:
            raise ValueError(f"VSKNN needs k >= 1 and sample_size >= 0, got k={k}, sample_size={sample_size}")
        if similarity not in ("dot", "cosine"):
            raise ValueError(f"similarity must be 'dot' or 'cosine', got {similarity!r}")
        for name, kind in (("weighting", weighting), ("weighting_score", weighting_score)):
            if kind not in ("same", "div", "linear", "quadratic", "log"):
                raise ValueError(f"{name} must be one of same, div, linear, quadratic, log; got {kind!r}")
        if idf_weighting < 0:
            raise ValueError(f"idf_weighting must be >= 0, got {idf_weighting}")
        self.k, self.sample_size, self.similarity = k, sample_size, similarity
        self.weighting, self.weighting_score, self.idf_weighting = weighting, weighting_score, idf_weighting
        self.index: SessionIndex | None = None
        self.item_factor: np.ndarray | None = None

    def _fit(self, sessions: np.ndarray) -> None:
        self.index = SessionIndex(sessions, self.num_items)
        df = self.index.document_frequency()
        idf = np.log(max(len(sessions), 1) / np.maximum(df, 1))  # items in no session: 0, never reached
        self.item_factor = 1.0 + self.idf_weighting * idf  # (V,)

    def _positive_scores(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        prefix = session_items(prefixes, self.num_items)
        w = position_weight(self.weighting, prefix.positions, prefix.lengths[prefix.entry_rows()])
        pairs = self.index.candidates(prefix, self.sample_size, w)
        length = prefix.lengths[pairs.row]  # (P,) events of each pair's prefix
        overlap = pairs.overlap
        if self.similarity == "dot":
            sim = overlap / np.maximum(prefix.num_distinct, 1)[pairs.row]
        else:
            norm = prefix.row_norms(w)  # (B,)
            size = self.index.session_sizes[pairs.col]
            sim = overlap / np.maximum(norm[pairs.row] * np.sqrt(size), 1e-300)
        chosen = top_k(pairs.row, pairs.col, sim, self.k)  # by prefix, then oldest first: the order summed in
        neighbours = pairs.take(chosen)
        latest = highest_position(neighbours.prefix_bits)  # the prefix position of the most recent shared item
        weight = sim[chosen] * step_decay(self.weighting_score, length[chosen] - latest + 1)
        factor = self.item_factor if self.idf_weighting else None
        if len(chosen) >= PRODUCT_PAIRS:  # each neighbour's weight spread over its items: (B, N) weights @ (N, V) items
            left = by_rows(neighbours.row, neighbours.col, weight, (len(prefixes), self.index.num_sessions))
            return positive_sums(left, self.index.session_matrix, factor)
        starts, item, _ = self.index.neighbour_items(neighbours)  # (E,) every item of every neighbour
        counts = np.diff(starts)
        return item_sums(np.repeat(neighbours.row, counts), item, np.repeat(weight, counts), self.num_items, factor)
