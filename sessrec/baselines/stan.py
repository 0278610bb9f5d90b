"""STAN: sequence- and time-aware neighbourhood (Garg et al., SIGIR 2019).

Session kNN with three exponential decays. For a prefix s with events 1..|s| (latest last):

1. Candidates: training sessions that share an item with s; keep the `sample_size` most recent.
2. lambda_1 (position in the current session): each distinct item i of s weighs
   w1(i) = exp((p_i - |s|) / lambda_1), p_i the position of its latest occurrence (1 for the
   last item). sim(s, n) = sum_{i in s & n} w1(i) / (||w1||_2 * sqrt(|n|)), |n| the distinct
   items of n (a cosine between the weighted prefix and the binary neighbour).
3. lambda_2 (recency of the neighbour): sim(s, n) *= exp(-age(n) / lambda_2). The SR-GNN data
   carry no timestamps, so time is measured in sessions on every dataset (see
   `sessrec.baselines.knn`): age(n) = how many training sessions are more recent than n (0
   for the most recent), and lambda_2 is in sessions too. A published lambda_2 in days
   converts with the dataset's training sessions per day (DIGINETICA's SR-GNN file: about
   1,300). The prefix's own time would multiply a whole row by one factor: it changes no ranking.
4. Neighbours: the `k` candidates of highest positive (decayed) similarity (ties: the more recent).
5. lambda_3 (distance in the neighbour): score(i) = sum over neighbours n containing i of
   sim(s, n) * exp(-|q_n(i) - q_n(i*)| / lambda_3), with q_n the positions inside n (latest
   occurrence) and i* the shared item that comes last in n (session-rec's reading of the paper).

A lambda set to None switches its decay off (weight 1). Items of the prefix itself are scored
like any other; items no neighbour contains score 0 and tie, ranked pessimistically by
`TopKMetrics`. Everything runs per batch of prefixes: an item -> sessions index finds the candidates,
and the neighbours' weighted items are summed per (prefix, item) reached (`positive_sums`).

Shape letters: N training sessions, B prefixes, L positions, V items, P candidate pairs,
E (neighbour, item) entries.

Examples:
    >>> import torch
    >>> train = torch.tensor([[0, 2, 3, 4], [0, 0, 3, 5], [0, 0, 6, 7]])
    >>> stan = STAN(k=10, sample_size=0, lambda_1=None, lambda_2=None, lambda_3=None).fit(train, num_items=8)
    >>> [round(v, 4) for v in stan.score(torch.tensor([[0, 0, 2, 3]]))[0, 2:].tolist()]  # items 2..7
    [0.8165, 1.3165, 0.8165, 0.5, 0.0, 0.0]
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from sessrec.baselines.baseline import SessionBaseline
from sessrec.baselines.knn import (
    MAX_POSITIONS,
    PRODUCT_PAIRS,
    SessionIndex,
    by_rows,
    highest_position,
    item_sums,
    positive_sums,
    session_items,
    top_k,
)


class STAN(SessionBaseline):
    """Sequence- and time-aware neighbourhood.

    Args:
        k: neighbours per prefix.
        sample_size: candidate sessions per prefix, the most recent ones; 0 = all candidates.
        lambda_1: position decay inside the prefix, in events; None = off.
        lambda_2: recency decay of neighbours, in training sessions; None = off.
        lambda_3: decay with the distance from the shared item inside a neighbour, in events; None = off.
    """

    def __init__(
        self,
        k: int = 100,
        sample_size: int = 5000,
        lambda_1: float | None = 1.02,
        lambda_2: float | None = None,
        lambda_3: float | None = 2.05,
    ) -> None:
        if k < 1 or sample_size < 0:
            raise ValueError(f"STAN needs k >= 1 and sample_size >= 0, got k={k}, sample_size={sample_size}")
        for name, value in (("lambda_1", lambda_1), ("lambda_2", lambda_2), ("lambda_3", lambda_3)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None (decay off), got {value}")
        self.k, self.sample_size = k, sample_size
        self.lambda_1, self.lambda_2, self.lambda_3 = lambda_1, lambda_2, lambda_3
        self.index: SessionIndex | None = None

    def _fit(self, sessions: np.ndarray) -> None:
        self.index = SessionIndex(sessions, self.num_items, session_bits=True)

    def _position_weight(self, position: np.ndarray | int, length: np.ndarray) -> np.ndarray:
        """w1 of an item at `position` (1 = oldest) in a prefix of `length` events."""
        if self.lambda_1 is None:
            return np.ones(np.broadcast(np.asarray(position), np.asarray(length)).shape)
        return np.exp((np.asarray(position, dtype=np.float64) - length) / self.lambda_1)

    def _positive_scores(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        prefix = session_items(prefixes, self.num_items)
        w1 = self._position_weight(prefix.positions, prefix.lengths[prefix.entry_rows()])
        pairs = self.index.candidates(prefix, self.sample_size, w1)
        norm = prefix.row_norms(w1)  # (B,)
        size = self.index.session_sizes[pairs.col]
        sim = pairs.overlap / np.maximum(norm[pairs.row] * np.sqrt(size), 1e-300)
        if self.lambda_2 is not None:
            sim = sim * np.exp(-(self.index.num_sessions - 1 - pairs.col) / self.lambda_2)
        chosen = top_k(pairs.row, pairs.col, sim, self.k)  # by prefix, then oldest first: the order summed in
        neighbours = pairs.take(chosen)
        # i*: highest position inside the neighbour among the shared items (a training session may be wider than the batch)
        anchor = highest_position(neighbours.session_bits)
        starts, item, position = self.index.neighbour_items(neighbours)  # (E,) items, pair by pair
        counts = np.diff(starts)
        weight = np.repeat(sim[chosen], counts)
        if self.lambda_3 is not None:  # exp(-distance / lambda_3) of the distances 0..62, read off per entry
            decay = np.exp(-np.arange(MAX_POSITIONS) / self.lambda_3)
            weight = weight * decay[np.abs(position - np.repeat(anchor, counts))]
        if len(chosen) < PRODUCT_PAIRS:
            return item_sums(np.repeat(neighbours.row, counts), item, weight, self.num_items)
        # each row's pairs summed: (B, P) 1.0 at each row's neighbours @ (P, V) weights of their items
        pair_items = sp.csr_matrix((weight, item, starts), shape=(len(counts), self.num_items))
        rows = by_rows(neighbours.row, np.arange(len(counts)), np.ones(len(counts)), (len(prefixes), len(counts)))
        return positive_sums(rows, pair_items)
