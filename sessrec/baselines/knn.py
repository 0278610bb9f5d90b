"""Shared machinery of the session-kNN baselines (`VSKNN`, `STAN`), vectorized over the pairs of a batch.

Shape letters: N training sessions, B prefixes, L positions, V items, P candidate pairs
(prefix, training session) of a batch.

Positions. The events of a session are numbered 1..len from the oldest (padding has no
position). An item seen several times takes the position of its latest occurrence. An OOV
event (id 1) keeps its place in the numbering but is not an item: it never matches and is
not counted among a session's items.

Time. The training sessions are indexed in time order (`SessionBaseline.fit` sorts them by
their timestamps when the data have some; the SR-GNN files have none but list sessions by
date), and time is measured in sessions: the rank of a session in that order (N - 1 = the
most recent). "Most recent" candidates and STAN's recency decay use this rank; every
evaluation prefix comes after all training sessions.

Bit masks. Per (prefix, training session) pair the kNN methods need the positions of the items
the two share: to weight the similarity and to find the most recent shared item. Each item of a
prefix carries 2**(position - 1); the training sessions of its items are gathered from an
item -> sessions index (only those, never an array over all N sessions), sorted by (prefix,
session), and the powers of the shared items OR-ed per pair. Positions of distinct items differ,
so the OR (their sum) is exactly the bit mask of the shared positions (int64: up to 63 positions,
the longest ``max_length`` these baselines accept); the same gather gives the positions inside
the training session (STAN). The prefix weights of the shared items are summed per pair in that
pass too (one bincount, oldest prefix position first), and the most recent shared position is the
mask's highest bit (`highest_position`).

Sums. The neighbours' weights are spread over their items and summed per (prefix, item) by a
sparse product (`positive_sums`: scipy adds each entry's terms in the neighbours' order into a
dense row accumulator), or for fewer than `PRODUCT_PAIRS` neighbours by a stable sort of every
(neighbour, item) (`item_sums`); both give the same float32 scores bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from sessrec.data.vocab import NUM_SPECIAL

MAX_POSITIONS = 63
# neighbours of a batch from which their weights are spread by `positive_sums` (a sparse product) rather than
# `item_sums` (a sort of every (neighbour, item)): scipy's fixed cost of about 0.1 ms a call loses below
PRODUCT_PAIRS = 2000


@dataclass
class SessionItems:
    """Distinct items of sessions with the position of their latest occurrence, as the arrays of a
    (S, V) CSR matrix (no scipy object: a request's prefix builds one per call).

    Attributes:
        indptr: (S + 1,) where each session's entries begin.
        items: (nnz,) int64 item of each entry, ascending within a session.
        positions: (nnz,) int64 1-based position of the item's last occurrence in the session.
        lengths: (S,) events per session (OOV included, padding not).
    """

    indptr: np.ndarray
    items: np.ndarray
    positions: np.ndarray
    lengths: np.ndarray

    @property
    def num_distinct(self) -> np.ndarray:
        """(S,) distinct known items per session."""
        return np.diff(self.indptr)

    def entry_rows(self) -> np.ndarray:
        """(nnz,) session of each (session, item) entry."""
        return np.repeat(np.arange(len(self.lengths)), self.num_distinct)

    def row_norms(self, values: np.ndarray) -> np.ndarray:
        """(S,) L2 norm over each session's entries of per-entry `values` (nnz,)."""
        return np.sqrt(np.bincount(self.entry_rows(), values**2, minlength=len(self.lengths)))


def session_items(items: np.ndarray, num_items: int) -> SessionItems:
    """`SessionItems` of right-aligned sessions (S, L) of model ids (checked by the caller)."""
    n, width = items.shape
    if width > MAX_POSITIONS:
        raise ValueError(
            f"session kNN baselines encode positions as int64 bits: sessions of at most {MAX_POSITIONS} "
            f"events, got max_length {width}; lower data.max_length"
        )
    lengths = (items != 0).sum(axis=1)
    position = np.arange(1, width + 1)[None, :] - (width - lengths)[:, None]  # (S, L), <= 0 on padding
    rows, cols = np.nonzero(items >= NUM_SPECIAL)  # row-major: later events of a row come later
    keys = rows * num_items + items[rows, cols]
    # np.unique keeps the first occurrence of each key: on the reversed order that is the latest event
    uniq, first_reversed = np.unique(keys[::-1], return_index=True)
    latest = len(keys) - 1 - first_reversed
    values = position[rows[latest], cols[latest]].astype(np.int64)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(uniq // num_items, minlength=n), out=indptr[1:])
    return SessionItems(indptr=indptr, items=uniq % num_items, positions=values, lengths=lengths)


@dataclass
class Pairs:
    """Candidate (prefix, training session) pairs of a batch: sessions sharing an item with the prefix.

    Attributes:
        row: (P,) prefix index in the batch.
        col: (P,) training session index.
        prefix_bits: (P,) bit mask of the prefix positions of the shared items.
        overlap: (P,) float64 sum of the prefix weights of the shared items, added from 0 and from the
            oldest prefix position up.
        session_bits: (P,) bit mask of the training-session positions of the shared items
            (only when asked for).
    """

    row: np.ndarray
    col: np.ndarray
    prefix_bits: np.ndarray
    overlap: np.ndarray
    session_bits: np.ndarray | None = None

    def take(self, keep: np.ndarray) -> Pairs:
        bits = None if self.session_bits is None else self.session_bits[keep]
        return Pairs(self.row[keep], self.col[keep], self.prefix_bits[keep], self.overlap[keep], bits)


class SessionIndex:
    """The training sessions as sparse matrices, for neighbour search.

    Args:
        sessions: (N, L) right-aligned training sessions of model ids.
        num_items: V.
        session_bits: also keep the positions of items inside training sessions (STAN).
    """

    def __init__(self, sessions: np.ndarray, num_items: int, session_bits: bool = False) -> None:
        self.items = session_items(sessions, num_items)
        self.num_sessions, self.num_items = len(sessions), num_items
        self.session_bits = session_bits
        m = self.items
        by_session = sp.csr_matrix((m.positions, m.items, m.indptr), shape=(len(sessions), num_items))
        self._by_item = by_session.T.tocsr()  # (V, N): each item's training sessions, its position in each
        self._item_sessions = np.diff(self._by_item.indptr)  # (V,) training sessions of each item
        self.session_sizes = self.items.num_distinct  # (N,) distinct items of each training session
        # (N, V): 1.0 at each training session's items, the right factor of `positive_sums` for per-neighbour weights
        self.session_matrix = sp.csr_matrix((np.ones(len(m.items)), m.items, m.indptr), shape=(len(sessions), num_items))

    def document_frequency(self) -> np.ndarray:
        """(V,) number of training sessions that contain each item."""
        return np.bincount(self.items.items, minlength=self.num_items)

    def candidates(self, prefix: SessionItems, sample_size: int, weights: np.ndarray) -> Pairs:
        """Training sessions sharing at least one item with each prefix, the `sample_size` most recent.

        Args:
            prefix: `SessionItems` of the batch of prefixes (B rows).
            sample_size: keep the most recent candidates of each prefix; 0 keeps all.
            weights: (entries,) float64 weight of each (prefix, item) entry, summed per pair into ``overlap``.
        """
        rows = prefix.entry_rows()
        by_position = np.argsort(rows * (MAX_POSITIONS + 1) + prefix.positions)  # each pair's entries oldest first
        items, rows, weights = prefix.items[by_position], rows[by_position], weights[by_position]
        bits = np.left_shift(np.int64(1), prefix.positions[by_position] - 1)
        index = self._by_item
        counts = self._item_sessions[items]  # (entries,) training sessions holding each item of each prefix
        flat = ranges(index.indptr[items], counts)
        key = np.repeat(rows.astype(np.int64), counts) * self.num_sessions + index.indices[flat]
        order = np.argsort(key, kind="stable")  # by prefix, then training session (oldest to most recent)
        key = key[order]
        begins = np.ones(len(key), dtype=bool)  # where each (prefix, session) pair's entries begin
        np.not_equal(key[1:], key[:-1], out=begins[1:])
        first = np.flatnonzero(begins)
        # each pair's weights added in their order: from 0 and the oldest shared prefix position up
        overlap = np.bincount(np.cumsum(begins) - 1, np.repeat(weights, counts)[order], minlength=len(first))

        def mask(values: np.ndarray) -> np.ndarray:  # positions of distinct items differ: OR = sum = the bit mask
            return np.bitwise_or.reduceat(values[order], first) if len(key) else np.zeros(0, np.int64)

        key, rows = key[first], len(prefix.lengths)
        ends = np.searchsorted(key, np.arange(1, rows + 1) * self.num_sessions)  # past each prefix's last pair
        row = np.repeat(np.arange(rows), np.diff(ends, prepend=0))
        pairs = Pairs(row=row, col=key - row * self.num_sessions, prefix_bits=mask(np.repeat(bits, counts)),
                      overlap=overlap.astype(np.float64, copy=False))
        if self.session_bits:
            pairs.session_bits = mask(np.left_shift(np.int64(1), index.data[flat] - 1))
        if sample_size > 0 and len(row) and np.diff(ends, prepend=0).max() > sample_size:
            from_end = ends[row] - 1 - np.arange(len(row))  # 0 = most recent candidate
            pairs = pairs.take(from_end < sample_size)
        return pairs

    def neighbour_items(self, pairs: Pairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every (pair, item of its training session), pair by pair: where each pair's entries begin ((P + 1,)
        offsets), item id and item position (each (E,))."""
        m = self.items
        counts = self.session_sizes[pairs.col]
        starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
        flat = ranges(m.indptr[pairs.col], counts)
        return starts, m.items[flat], m.positions[flat]


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``starts[j], ..., starts[j] + counts[j] - 1`` of every j, one after the other.

    Examples:
        >>> ranges(np.array([5, 0]), np.array([2, 3])).tolist()
        [5, 6, 0, 1, 2]
    """
    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(ends[-1] if len(ends) else 0)


def highest_position(bits: np.ndarray) -> np.ndarray:
    """(P,) int64 highest set position of non-negative int64 bit masks (bit p - 1 set = position p), 0 where none:
    the biased binary exponent of the upper 32 bits as a float64 (exact; 1023 + k for [2 ** k, 2 ** (k + 1))),
    read off its bits, else that of the lower 32 bits.

    Examples:
        >>> highest_position(np.array([0, 1, 6, 2**62 + 5, 2**40 - 1])).tolist()
        [0, 1, 3, 63, 40]
    """
    upper = (bits >> 32).astype(np.float64).view(np.int64) >> 52  # 0 for 0
    lower = (bits & 0xFFFFFFFF).astype(np.float64).view(np.int64) >> 52
    return np.where(upper > 0, upper - 1023 + 33, np.maximum(lower - 1023 + 1, 0))


def kth_highest(row: np.ndarray, value: np.ndarray, k: int) -> np.ndarray:
    """(rows,) the `k`-th highest value of each row's entries, -inf for a row of at most k; `row` ascending
    (each row's entries one run), found by a partial sort of each longer run (`np.partition`, linear in it).
    One call a row: the runs differ in length, and one partition of them padded to the longest took 2-4
    times as long at 16 and 256 rows of 2,000-10,000 entries.

    Examples:
        >>> kth_highest(np.array([0, 0, 0, 2]), np.array([0.5, 0.2, 0.9, 1.0]), 2).tolist()
        [0.5, -inf, -inf]
    """
    sizes = np.bincount(row) if len(row) else np.zeros(0, dtype=np.int64)
    ends = np.cumsum(sizes)
    out = np.full(len(sizes), -np.inf, dtype=np.float64)
    for r in np.flatnonzero(sizes > k):
        run = value[ends[r] - sizes[r] : ends[r]]
        out[r] = np.partition(run, len(run) - k)[len(run) - k]
    return out


def top_k(row: np.ndarray, col: np.ndarray, score: np.ndarray, k: int) -> np.ndarray:
    """Ascending indices of the `k` highest positive scores per row; ties go to the more recent (higher) col.

    The entries come sorted by (row, col), as `SessionIndex.candidates` gives its pairs: the scores above
    a row's k-th highest (`kth_highest`) are kept, and of those equal to it the latest ones (the end of
    the row's run) until the row holds k.

    Examples:
        >>> top_k(np.array([0, 0, 0, 1]), np.array([3, 5, 8, 2]), np.array([0.5, 0.2, 0.5, 0.0]), 1).tolist()
        [2]
    """
    if not len(row):
        return np.zeros(0, dtype=np.int64)
    threshold = np.maximum(kth_highest(row, score, k), 0.0)[row]  # 0: every positive score of a row of at most k
    keep = score > threshold
    tied = np.flatnonzero((score == threshold) & (threshold > 0))
    if len(tied):
        rows, tied_row = int(row[-1]) + 1, row[tied]
        room = k - np.bincount(row[keep], minlength=rows)  # places left beside the scores above
        from_end = (np.cumsum(np.bincount(tied_row, minlength=rows)) - 1)[tied_row] - np.arange(len(tied))
        keep[tied[from_end < room[tied_row]]] = True
    return np.flatnonzero(keep)


def stable_order(keys: np.ndarray) -> np.ndarray:
    """The stable argsort of (E,) non-negative integers: radix sorts on 16 bits (one for keys below 2 ** 16, the
    lower then the upper half below 2 ** 32: a batch's rows, (row, item) and (row, session) keys), the same
    order as a comparison sort's.

    Examples:
        >>> stable_order(np.array([1, 0, 1, 0])).tolist()
        [1, 3, 0, 2]
        >>> stable_order(np.array([70_000, 5, 70_000, 65_536])).tolist()
        [1, 3, 0, 2]
    """
    top = int(keys.max()) if len(keys) else 0
    if top >> 32:
        return np.argsort(keys, kind="stable")
    order = np.argsort(keys.astype(np.uint16), kind="stable")  # the lower 16 bits (all of them below 2 ** 16)
    if top >> 16:
        order = order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]
    return order


def ranks_in_rows(sorted_rows: np.ndarray) -> np.ndarray:
    """(E,) 0-based place of each entry within its run of equal rows, for ascending non-negative row indices.

    Examples:
        >>> ranks_in_rows(np.array([0, 0, 2, 2, 2])).tolist()
        [0, 1, 0, 1, 2]
    """
    if not len(sorted_rows):
        return np.zeros(0, dtype=np.int64)
    counts = np.bincount(sorted_rows)
    return np.arange(len(sorted_rows)) - (np.cumsum(counts) - counts)[sorted_rows]


def by_rows(row: np.ndarray, col: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> sp.csr_matrix:
    """The CSR matrix of entries (row, col, value) given by ascending `row`, each row's in the order given.

    Examples:
        >>> by_rows(np.array([0, 0, 2]), np.array([1, 0, 1]), np.array([0.5, 0.25, 1.0]), (3, 2)).toarray().tolist()
        [[0.25, 0.5], [0.0, 0.0], [0.0, 1.0]]
    """
    indptr = np.zeros(shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=shape[0]), out=indptr[1:])
    return sp.csr_matrix((values, col, indptr), shape=shape)


def positive_sums(left: sp.csr_matrix, right: sp.csr_matrix,
                  col_factor: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The positive entries of the float64 product ``left @ right`` ((B, M) @ (M, V) CSR matrices), each times
    ``col_factor[col]`` when given, then as float32: ``keys`` row * V + col, ascending, and the values.

    scipy's product adds the terms of each (row, col) into a dense accumulator of one row, from 0 and in the
    order of the row's entries in `left` (``(0 + t1) + t2 ...``): the sums of the terms in that order, found
    without sorting them and without a (B, V) array. With 1.0 entries on either side the terms are the other
    side's values, unrounded.

    Examples:
        >>> left = by_rows(np.array([0, 0, 1]), np.array([0, 1, 1]), np.array([0.5, 0.25, 1.0]), (2, 2))
        >>> right = by_rows(np.array([0, 1, 1]), np.array([2, 0, 2]), np.ones(3), (2, 3))
        >>> keys, sums = positive_sums(left, right)
        >>> keys.tolist(), sums.tolist()
        ([0, 2, 3, 5], [0.25, 0.75, 1.0, 1.0])
    """
    out = left @ right
    out.sort_indices()
    cols = out.indices
    sums = (out.data if col_factor is None else out.data * col_factor[cols]).astype(np.float32)
    keys = np.repeat(np.arange(out.shape[0], dtype=np.int64) * out.shape[1], np.diff(out.indptr)) + cols
    keep = sums > 0
    return keys[keep], sums[keep]


def item_sums(row: np.ndarray, col: np.ndarray, values: np.ndarray, num_items: int,
              col_factor: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The float64 sums of `values` (E,) per (row, col), added in the order given, each then times
    ``col_factor[col]`` when given, as float32, where positive: ``keys`` row * `num_items` + col (ascending)
    and the sums. Only the pairs present are held (no (B, V) array); `positive_sums` gives the same sums
    without sorting the entries, faster from `PRODUCT_PAIRS` neighbours on.

    Examples:
        >>> keys, sums = item_sums(np.array([0, 0, 1]), np.array([2, 2, 0]), np.array([0.5, 0.25, 1.0]), 3)
        >>> keys.tolist(), sums.tolist()
        ([2, 3], [0.75, 1.0])
    """
    keys = row * num_items + col
    order = stable_order(keys)  # the entries of one pair keep the order given
    step = np.diff(keys[order], prepend=-1) != 0  # where each pair's entries begin
    at = np.empty(len(keys), dtype=np.int64)
    at[order] = np.cumsum(step) - 1  # each entry's pair
    keys = keys[order][step]
    sums = np.bincount(at, values, minlength=len(keys)).astype(np.float64, copy=False)  # int64 when empty
    if col_factor is not None:
        sums *= col_factor[keys % num_items]  # after the sum, as the sum of the spread weights times the item's factor
    sums = sums.astype(np.float32)
    return keys[sums > 0], sums[sums > 0]
