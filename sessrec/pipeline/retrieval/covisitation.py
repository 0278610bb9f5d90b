"""`CoVisitation`: item-to-item co-visitation counts, the strongest single candidate generator in OTTO.

Fit. In every training session, each ordered pair (a, b) of real items (ids >= 2) standing
d <= `window` positions apart adds ``weight(session) / d`` to W[a, b]: b after a with
``direction="forward"``, either order with ``"both"``. Every occurrence counts (an item seen
twice pairs twice). OOV events (id 1) keep their place in the numbering, so a distance counts
them, but pair with nothing; a == b pairs are left out (repeat behaviour is a feature of its
own). Each row of W then keeps its `max_neighbours` largest entries (ties: the lower id, i.e.
the more frequent item) and, with `normalize`, is divided by its sum.

Retrieve. A session's query is its last `last_items` distinct real items, the most recent
weighing 1 and the r-th before it ``recency_decay ** r`` (r counts distinct items, not events),
and its scores are the query times W: score(i) = sum_j q_j W[j, i]. Items of the session
itself can be returned when they co-visit with the others (filters remove them if wanted).
W is a scipy matrix on the host; a batch's scores are summed over the rows of W its queries name
(no (V,) array per call); results come back on the sessions' device.

The defaults come from rsc15_100k validation (last-item prefixes). Over the usual ranges,
window, last_items, recency_decay and max_neighbours barely move the ranking quality; two
settings matter: ``direction="both"`` (every pair counts in both rows, so rows fill faster and
recall reaches deeper than forward only) and ``normalize`` (a popular query item does not drown
the others). A longer window and more neighbours raise the recall of long candidate lists a
little, at more memory and time. Since W leaves out a == b pairs, a target that repeats an item
of the session is found only through the items it co-visits with; the repeat features and the
other retrievers cover repeats. Recall as a pipeline retriever: ``docs/results.md``, The pipeline.

Examples:
    >>> import torch
    >>> from sessrec.pipeline.candidates import RequestSessions
    >>> cv = CoVisitation(window=1, direction="forward", normalize=False).fit(torch.tensor([[2, 3, 4], [0, 2, 4]]), 5)
    >>> cv.retrieve(RequestSessions(torch.tensor([[0, 0, 2]])), k=3).items.tolist()
    [[3, 4, 0]]

Shape letters: N training sessions, B sessions, L positions, K candidates, V items,
E co-visitation entries.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
import torch

from sessrec.baselines.baseline import _as_ids
from sessrec.baselines.knn import ranges
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.pipeline.retrieval.retriever import (
    Retriever,
    lookup_sparse,
    products_only,
    row_ranks,
    top_k_sparse,
)

Direction = Literal["forward", "both"]
_FITS = itertools.count()  # numbers each fitted matrix: its products' key in `RequestSessions.cache`


class CoVisitation(Retriever):
    """Item-to-item co-visitation counts from training sessions; a session's candidates are the weighted sum of its recent items' rows.

    Args:
        window: pairs at most this many positions apart co-visit (1 = adjacent events).
        max_neighbours: entries kept per row of W (the largest).
        last_items: distinct recent items of a session that make its query.
        recency_decay: in (0, 1]; weight of the r-th most recent of them relative to the last.
        direction: ``"forward"`` counts b after a only (W[a] = what follows a);
            ``"both"`` counts both orders (W symmetric before truncation).
        normalize: divide each row of W by its sum after truncation, so that every query item
            spreads the same mass whatever its popularity.

    Its state is V (``num_items``, set by `fit`) and W as a CSR matrix (``indptr`` (V + 1,),
    ``indices``, ``data``).
    """

    def __init__(
        self,
        window: int = 5,
        max_neighbours: int = 100,
        last_items: int = 5,
        recency_decay: float = 0.5,
        direction: Direction = "both",
        normalize: bool = True,
    ) -> None:
        for name, value in (
            ("window", window),
            ("max_neighbours", max_neighbours),
            ("last_items", last_items),
        ):
            if int(value) != value or value < 1:
                raise ValueError(f"CoVisitation {name} must be an integer >= 1, got {value!r}")
        if not 0.0 < recency_decay <= 1.0:
            raise ValueError(f"CoVisitation recency_decay must be in (0, 1], got {recency_decay!r}")
        if direction not in ("forward", "both"):
            raise ValueError(f"CoVisitation direction must be 'forward' or 'both', got {direction!r}")
        self.window, self.max_neighbours, self.last_items = int(window), int(max_neighbours), int(last_items)
        self.recency_decay, self.direction, self.normalize = float(recency_decay), direction, bool(normalize)
        self.num_items = 0  # V, set by `fit`
        self.matrix: sp.csr_matrix | None = None  # (V, V) W, rows with sorted distinct columns
        self._keys: np.ndarray | None = None  # (E,) row * V + column of W's entries, ascending
        self._cache_key = ""

    # -- fitting -------------------------------------------------------------------------------
    def fit(
        self, sessions: np.ndarray | torch.Tensor, num_items: int, weights: np.ndarray | None = None
    ) -> CoVisitation:
        """Count co-visitations in training sessions.

        Args:
            sessions: (N, L) right-aligned model ids (0 = padding, 1 = OOV).
            num_items: V (items + padding + OOV), ``SessionDataModule.num_items``.
            weights: (N,) optional non-negative weight of each session (e.g. its recency);
                every pair of the session counts that much (times 1 / distance).

        Returns:
            self, fitted.
        """
        if num_items <= NUM_SPECIAL:
            raise ValueError(f"num_items must count padding, OOV and at least one item; got {num_items}")
        items = _as_ids(sessions, num_items, "training sessions")
        n, width = items.shape
        if weights is None:
            weights = np.ones(n)
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (n,):
            raise ValueError(
                f"weights must hold one value per training session ({n}), got shape {weights.shape}"
            )
        if not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(f"weights must be finite and >= 0, got min {weights.min()}")
        rows, cols, values = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
        for d in range(1, min(self.window, width - 1) + 1):  # a loop over offsets, vectorized over sessions
            a, b = items[:, :-d], items[:, d:]  # (N, L - d): pairs d apart, b after a
            s, p = np.nonzero((a >= NUM_SPECIAL) & (b >= NUM_SPECIAL) & (a != b))
            w = weights[s] / d
            rows.append(a[s, p])
            cols.append(b[s, p])
            values.append(w)
            if self.direction == "both":
                rows.append(b[s, p])
                cols.append(a[s, p])
                values.append(w)
        pairs = (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols)))
        counts = sp.coo_matrix(pairs, shape=(num_items, num_items)).tocsr()  # sums duplicates
        counts.eliminate_zeros()  # sessions of weight 0
        self.num_items = int(num_items)
        self._set_matrix(self._truncate(counts))
        return self

    def _truncate(self, counts: sp.csr_matrix) -> sp.csr_matrix:
        """Keep the `max_neighbours` largest entries of each row (ties: lower id), then normalise."""
        counts.sort_indices()
        row = _entry_rows(counts)
        keep = row_ranks(row, counts.data, counts.indices) < self.max_neighbours
        data, indices, row = counts.data[keep], counts.indices[keep], row[keep]
        if self.normalize:
            data = data / np.bincount(row, data, minlength=self.num_items)[row]
        indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=self.num_items))])
        return sp.csr_matrix((data.astype(np.float32), indices, indptr), shape=counts.shape)

    def _set_matrix(self, matrix: sp.csr_matrix) -> None:
        self.matrix = matrix
        self._keys = _entry_rows(matrix) * self.num_items + matrix.indices
        self._row_sizes = np.diff(matrix.indptr)  # (V,) entries of each row of W
        # not id(self): a freed retriever's id is reused, and a refit must not read the old product
        self._cache_key = f"covisitation:{next(_FITS)}"

    def _check_fitted(self) -> None:
        if self.matrix is None:
            raise RuntimeError("CoVisitation is not fitted: call fit(training_sessions, num_items) first")

    # -- querying ------------------------------------------------------------------------------
    def query(self, sessions: RequestSessions) -> sp.csr_matrix:
        """(B, V) sparse query: recency weights of each session's last `last_items` distinct items."""
        row, item, weight = self._query_entries(sessions)
        return sp.csr_matrix((weight, (row, item)), shape=(len(sessions), self.num_items))

    def _query_entries(self, sessions: RequestSessions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The entries of `query` by (row, item) ascending: row (Q,), item (Q,) and float64 weight (Q,)."""
        self._check_fitted()
        items = _as_ids(sessions.items, self.num_items, "sessions")
        v = self.num_items
        rows, cols = np.nonzero(items >= NUM_SPECIAL)  # row-major: later events come later
        keys = rows * v + items[rows, cols]
        # np.unique keeps the first occurrence of each key: on the reversed order that is the latest event
        uniq, first_reversed = np.unique(keys[::-1], return_index=True)
        latest = cols[len(keys) - 1 - first_reversed]  # (distinct,) position of each item's latest event
        u_row = uniq // v
        recency = row_ranks(u_row, latest, np.zeros_like(latest))  # 0 = the most recent distinct item
        keep = recency < self.last_items
        return u_row[keep], uniq[keep] % v, self.recency_decay ** recency[keep].astype(np.float64)

    def session_scores(self, sessions: RequestSessions) -> tuple[np.ndarray, np.ndarray]:
        """The nonzero (B, V) scores query @ W as ``keys`` (row * V + column, ascending) and their float64
        ``values``; kept in ``sessions.cache``.

        The rows of W that the query names are gathered and summed per (row, column) in the order of
        the sparse product (query entries by item, then W's row order), so the sums are its numbers
        bit for bit, without the product's (V,) work arrays.
        """
        if self._cache_key not in sessions.cache:
            row, item, weight = self._query_entries(sessions)  # checks the sessions
            m = self.matrix
            counts = self._row_sizes[item]
            flat = ranges(m.indptr[item], counts)
            keys = np.repeat(row, counts) * self.num_items + m.indices[flat]
            uniq, at = np.unique(keys, return_inverse=True)
            sums = np.bincount(at, np.repeat(weight, counts) * m.data[flat].astype(np.float64), minlength=len(uniq))
            nonzero = sums != 0
            sessions.cache[self._cache_key] = (uniq[nonzero], sums[nonzero])
        return sessions.cache[self._cache_key]

    def retrieve(self, sessions: RequestSessions, k: int) -> Retrieved:
        """Top-`k` items per session by co-visitation score.

        Args:
            sessions: the batch (B sessions).
            k: width of the result.

        Returns:
            `Retrieved` (B, k): ids best first (ties: the lower id), id 0 and score -inf where
            fewer than k items co-visit with the session.
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        keys, data = products_only(*self.session_scores(sessions), self.num_items, self.products)
        return top_k_sparse(keys, data, len(sessions), self.num_items, k, sessions.items.device)

    def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
        """(B, K) float32 co-visitation scores of candidates `items` (B, K); 0 where none (and at id 0)."""
        cand = self._check_items(items, "items")
        if cand.shape[0] != len(sessions):
            raise ValueError(f"items has {cand.shape[0]} rows for {len(sessions)} sessions")
        keys, data = self.session_scores(sessions)
        rows = np.arange(len(cand))[:, None]  # (B, 1): each line of candidates in its session's row
        return torch.from_numpy(lookup_sparse(keys, data, rows, cand, self.num_items)).to(items.device)

    def pair_weights(self, anchors: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, K) float32 W[anchor, item]: the co-visitation of each candidate with an anchor item.

        Args:
            anchors: (B,) one anchor per session (e.g. its last item), or (B, K) one per candidate.
            items: (B, K) candidate ids.

        Returns:
            (B, K) weights, 0 where the pair never co-visits or either id is < 2.
        """
        self._check_fitted()
        cand = self._check_items(items, "items")
        anchor = self._check_items(anchors.unsqueeze(1) if anchors.dim() == 1 else anchors, "anchors")
        if anchor.shape[0] != cand.shape[0] or anchor.shape[1] not in (1, cand.shape[1]):
            raise ValueError(
                f"anchors of shape {tuple(anchors.shape)} do not match items {tuple(items.shape)}"
            )
        return torch.from_numpy(lookup_sparse(self._keys, self.matrix.data, anchor, cand, self.num_items)).to(items.device)

    def anchored_weights(self, anchors: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, A, K) float32 W[anchors[b, a], items[b, k]]: each candidate's co-visitation with each of its session's
        A anchors (e.g. its last items), as `pair_weights` gives it for every anchor beside every candidate.

        Looked up the other way round: each entry of an anchor's row of W (at most `max_neighbours`) is searched for
        among its session's candidates, sorted once, instead of each candidate among all of W's entries.

        Args:
            anchors: (B, A) anchor ids.
            items: (B, K) candidate ids.

        Returns:
            (B, A, K) weights, 0 where the pair never co-visits or either id is < 2.
        """
        cand = self._check_items(items, "items")
        anchor = self._check_items(anchors, "anchors")
        if anchor.shape[0] != cand.shape[0]:
            raise ValueError(f"anchors of shape {tuple(anchors.shape)} do not match items {tuple(items.shape)}")
        (b, a), k, v = anchor.shape, cand.shape[1], self.num_items
        out = np.zeros((b, a, k), dtype=np.float32)
        if out.size:
            order = np.argsort(cand, axis=1)  # each session's candidates sorted: keys b * V + item
            ordered = np.take_along_axis(cand, order, 1)
            keys = (ordered + (np.arange(b) * v)[:, None]).ravel()
            size = self._row_sizes[anchor].ravel()  # (B A,)
            entry = ranges(self.matrix.indptr[anchor].ravel(), size)  # (E,) the entries of every anchor's row
            pair = np.repeat(np.arange(b * a), size)  # (E,) the (session, anchor) of each entry
            column = self.matrix.indices[entry].astype(np.int64)
            want = pair // a * v + column
            at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)  # the first sorted slot of an equal candidate
            found = (keys[at] == want) & (column >= NUM_SPECIAL)
            out.reshape(-1)[(pair * k + order.reshape(-1)[at])[found]] = self.matrix.data[entry[found]]
            if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= NUM_SPECIAL)).any():  # an item listed twice:
                # each of its slots takes the weights of its first sorted slot (empty slots, ids < 2, weigh 0 anyway)
                first = np.searchsorted(keys, keys).reshape(b, k) % k  # (B, K) the first sorted slot of its item
                source = np.empty_like(order)
                np.put_along_axis(source, order, np.take_along_axis(order, first, 1), 1)
                out = np.take_along_axis(out, np.broadcast_to(source[:, None], out.shape), 2)
        return torch.from_numpy(out).to(items.device)

    def _check_items(self, items: torch.Tensor, what: str) -> np.ndarray:
        """(B, K) int64 numpy ids in [0, V)."""
        self._check_fitted()
        ids = items.detach().cpu().long().numpy()
        if ids.ndim != 2:
            raise ValueError(f"{what} must be (B, K), got shape {tuple(items.shape)}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_items):
            raise ValueError(
                f"{what} hold ids outside [0, {self.num_items}): min {ids.min()}, max {ids.max()}"
            )
        return ids

    # -- saving --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """V (``num_items``) and W as ``indptr`` (V + 1,), ``indices`` and ``data`` (E,)."""
        self._check_fitted()
        m = self.matrix
        return {"num_items": self.num_items, "indptr": m.indptr.copy(), "indices": m.indices.copy(), "data": m.data.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> CoVisitation:
        v = int(state["num_items"])
        indptr, indices, data = (np.asarray(state[name]) for name in ("indptr", "indices", "data"))
        if indptr.shape != (v + 1,) or indices.shape != data.shape or indptr[-1] != len(indices):
            raise ValueError(
                f"CoVisitation arrays do not form a ({v}, {v}) CSR matrix: indptr {indptr.shape}, "
                f"indices {indices.shape}, data {data.shape}"
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= v):
            raise ValueError(f"CoVisitation arrays hold columns outside [0, {v}): min {indices.min()}, max {indices.max()}")
        self.num_items = v
        self._set_matrix(sp.csr_matrix((data.astype(np.float32), indices, indptr), shape=(v, v)))
        return self


def _entry_rows(matrix: sp.csr_matrix) -> np.ndarray:
    """(E,) int64 row of each stored entry of a CSR matrix."""
    return np.repeat(np.arange(matrix.shape[0], dtype=np.int64), np.diff(matrix.indptr))
