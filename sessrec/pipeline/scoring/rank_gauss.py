"""`RankGauss`: dense values -> standard-normal scores of their interpolated ranks among per-feature quantiles
(the scaling of `DLRMScorer`'s dense inputs).

Shape letters: G features, Q quantiles a feature, D distinct quantiles of a feature, W rows of a feature in the
host tables.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sessrec.pipeline.scoring.scorer import true_positions

BLOCK_VALUES = 1 << 17  # values a host's RankGauss scales at once (`RankGauss`)
BUCKET_ENTRIES = 1 << 21  # int32 bucket entries of a host's RankGauss at most, all features together (8 MiB)
FINEST_SHIFT = 12  # the buckets hold 2^12 float bit patterns at least


def _normal(u: torch.Tensor, q: int) -> torch.Tensor:
    """float64 ranks in (0, 1) -> float32 standard-normal scores, the ranks clipped to [0.5 / q, 1 - 0.5 / q]."""
    return (math.sqrt(2.0) * torch.erfinv(2 * u.clamp(0.5 / q, 1 - 0.5 / q) - 1)).float()


def _bucket_ends(shift: int) -> tuple[np.ndarray, np.ndarray]:
    """(2^(32 - shift),) float32 lowest and highest value of each bucket of the float32 values whose int32 bits
    ``>> shift`` are -2^(31 - shift) .. 2^(31 - shift) - 1, in that order: an interval of floats each (a
    negative bucket's values descend as the bits ascend); the ends of NaN patterns are the infinity beside them
    (both NaN: a bucket of NaNs only)."""
    bits = np.arange(-(1 << (31 - shift)), 1 << (31 - shift), dtype=np.int64) << shift
    low = bits.astype(np.int32).view(np.float32)
    high = (bits | ((1 << shift) - 1)).astype(np.int32).view(np.float32)
    negative = bits < 0
    first, last = np.where(negative, high, low), np.where(negative, low, high)
    first = np.where(np.isnan(first) & ~np.isnan(last), np.float32(-np.inf), first)
    last = np.where(np.isnan(last) & ~np.isnan(first), np.float32(np.inf), last)
    return first, last


class RankGauss:
    """(..., G) values -> (..., G) standard-normal scores of their interpolated ranks among (G, Q) quantiles.

    A value equal to a run of equal quantiles (a point mass, e.g. zeros) takes the middle rank of
    the run; a value between two quantiles the rank interpolated between theirs; values beyond the
    extremes take the extreme ranks. What a value needs is j, the number of its feature's distinct
    quantiles below it: its score is read from a column at (feature, j) when it equals the j-th
    distinct quantile, and interpolated otherwise (the lower quantile, the gap, at least 1e-12,
    and the rank read from three more columns, then the same operations as `_normal` in the same
    order, float64 `erfinv` the costliest of them) for the values equal to no quantile only (about
    45% of a pipeline's, whose features are mostly counts, ranks and flags), gathered into a compact
    tensor (their positions found by `true_positions`).

    On the host (float32 values, ascending quantiles), j is read from a bucket table, on blocks of
    `BLOCK_VALUES`: a value minus its feature's center (`_center`: the middle of the narrowest quarter
    of its quantiles), its float32 bits shifted right by the feature's shift (12 to 31), is a bucket,
    an interval of floats (narrower nearer the center); the table holds j0, the distinct quantiles
    below each bucket. One gather and one comparison give j0 or j0 + 1, and a second gather the
    quantile at j, which decides whether the value equals it and whether it lies beyond it: only
    where a bucket holds two or more distinct quantiles (2% of a pipeline's values) is j searched
    further, on those values only, by a branchless search over the bucket's quantiles. A feature's
    shift is the largest that keeps every distinct quantile in a bucket of its own, and no finer
    than the tables' bound `BUCKET_ENTRIES` allows (2^(32 - shift) entries a feature); the tables are
    derived from the quantiles when the scaling is built (about 0.1 s; 6.3 MiB for a pipeline's 64
    features of 256 quantiles; not saved). The comparisons and the interpolation's arithmetic run in
    numpy (a comparison into bool takes a ninth of torch's time on one thread), the gathers in torch.
    On a saved pipeline's inputs (one thread, CPU time, the two alternated in one process) this takes
    35.7 against 54.9 ms at a batch's 49,074 x 64 values (0.65x) and 208 against 276 us at a request's
    200 x 64 (0.75x; 318 against 338 us inside `DLRMScorer.score`, whose other work leaves less of the
    tables in the cache) of the binary search below, the same floats bit for bit. The interpolation
    (positions, gathers, float64 `erfinv`, writes) takes about half of that time.

    Elsewhere (another device, float64 values, quantiles out of order) j is found by that
    branchless binary search, all values at once, over the (G, P + 1) quantiles padded with +inf
    (P: the power of two at or above Q) in position space, each step one gather and one
    comparison into int32.

    Examples:
        >>> scale = RankGauss(torch.tensor([[0.0, 0.0, 1.0, 2.0, 3.0]]))
        >>> [round(v, 4) for v in scale(torch.tensor([[0.0], [1.5], [9.0]])).squeeze(1).tolist()]
        [-1.1503, 0.3186, 1.2816]
    """

    def __init__(self, quantiles: torch.Tensor) -> None:
        g, q = quantiles.shape
        device = quantiles.device
        self.q, self.steps = q, [1 << k for k in reversed(range(max(q - 1, 1).bit_length()))]
        p = 2 * self.steps[0]  # P >= Q
        quantiles = quantiles.float().contiguous()
        position = torch.arange(q, device=device)
        ends = torch.searchsorted(quantiles, quantiles, right=True)  # (G, Q) end of each quantile's run
        middle = _normal((position + ends - 1).double() / (2 * (q - 1)), q)  # (G, Q)
        top = _normal(torch.ones(g, p + 1 - q, dtype=torch.float64, device=device), q)  # (G, P + 1 - Q)
        upper = torch.arange(p + 1, device=device).clamp(1, q - 1)  # (P + 1,) interpolation between upper - 1 and upper
        lo, hi = quantiles[:, upper - 1], quantiles[:, upper]  # (G, P + 1)
        self.search = torch.cat([quantiles, torch.full((g, p + 1 - q), float("inf"), device=device)], dim=1).reshape(-1)
        self.middle = torch.cat([middle, top], dim=1).reshape(-1)  # (G (P + 1),)
        self.lo, self.gap, self.rank = (column.reshape(-1).contiguous() for column in (
            lo, (hi - lo).clamp(min=1e-12), (upper - 1).float().expand(g, p + 1)))
        self.offsets = torch.arange(g, device=device, dtype=torch.int32) * (p + 1)  # (G,) first rows; int32 gathers faster
        self.first = self.search[self.offsets.long() + self.steps[0] - 1]  # (G,) the quantile the first step compares with
        ordered = bool((quantiles[:, 1:] >= quantiles[:, :-1]).all())  # False with NaN
        self.host = _BucketTables(quantiles, middle, top[0, 0]) if device.type == "cpu" and ordered else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape, g = x.shape, x.shape[-1]
        flat = x.reshape(-1, g)  # (N, G)
        host = (self.host is not None and flat.device.type == "cpu" and flat.dtype == torch.float32
                and not flat.requires_grad)
        if host:
            flat = flat.contiguous()
        block = max(1, BLOCK_VALUES // g) if flat.device.type == "cpu" else len(flat)
        out = torch.empty(flat.shape, dtype=torch.float32, device=flat.device)
        for lo in range(0, len(flat), block):
            (self.host.scale if host else self._scale)(flat[lo : lo + block], out[lo : lo + block])
        return out.view(shape)

    def _scale(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        """(N, G) values -> their (N, G) scores, written into `out` (contiguous), all at once, by the binary search."""
        below = torch.empty(flat.shape, dtype=torch.int32, device=flat.device)  # comparisons write int32: twice as fast as bool
        at = torch.add(self.offsets, torch.lt(self.first, flat, out=below), alpha=self.steps[0])  # (N, G) table row
        rows = at.view(-1)
        for step in self.steps[1:]:  # add `step` where the quantile at at + step - 1 lies below the value
            at.add_(torch.lt(self.search[step - 1:].index_select(0, rows).view_as(flat), flat, out=below), alpha=step)
        found = self.search.index_select(0, rows).view_as(flat)  # the quantile at at: below the value only as the P-th
        at.add_(torch.lt(found, flat, out=below))
        scores = torch.index_select(self.middle, 0, rows, out=out.view(-1))  # right where the value equals the quantile at i
        apart = true_positions(torch.ne(found, flat))  # (n,) the values equal to no quantile
        at, value = rows.index_select(0, apart), flat.reshape(-1).index_select(0, apart)
        between = _between(value, self.lo.index_select(0, at), self.gap.index_select(0, at), self.rank.index_select(0, at), self.q)
        scores.index_copy_(0, apart, between)


def _between(value: torch.Tensor, lo: torch.Tensor, gap: torch.Tensor, rank: torch.Tensor, q: int) -> torch.Tensor:
    """(n,) float32 scores of values between quantiles: the rank interpolated, then `_normal`'s operations in its order."""
    u = value.sub_(lo).div_(gap).clamp_(0, 1).add_(rank).div_(q - 1).double()
    return u.clamp_(0.5 / q, 1 - 0.5 / q).mul_(2).sub_(1).erfinv_().mul_(math.sqrt(2.0)).float()


class _BucketTables:
    """A host `RankGauss`'s tables in distinct-quantile space (see `RankGauss`): for feature f, row f W + j holds
    the j-th distinct quantile (+inf from D on), the score of a value equal to it, and the interpolation's
    lower quantile, gap and rank for a value with j distinct quantiles below it; the bucket table holds f W + j0."""

    def __init__(self, quantiles: torch.Tensor, middle: torch.Tensor, top: torch.Tensor) -> None:
        g, q = quantiles.shape
        self.q = q
        values = quantiles.numpy() + np.float32(0)  # -0.0 -> +0.0: the same comparisons, one bit pattern
        distinct = [np.unique(row) for row in values]
        centers = np.array([_center(row) for row in values], dtype=np.float32)
        self.center = torch.from_numpy(centers)  # (G,)
        shifted = [u - c for u, c in zip(distinct, centers)]  # as the values will be: float32 minus the center
        apart = [_coarsest_apart(u) for u in shifted]  # the largest shift keeping every distinct quantile apart
        finest = FINEST_SHIFT
        while finest < 31 and sum(1 << (32 - max(s, finest)) for s in apart) > BUCKET_ENTRIES:
            finest += 1
        shifts = [max(s, finest) for s in apart]
        buckets, adds, most, size = [], [], 1, 0
        for u, s in zip(shifted, shifts):
            first, last = _bucket_ends(s)
            below = np.searchsorted(u, first, side="left")  # distinct quantiles below each bucket
            inside = np.searchsorted(u, last, side="right") - below
            below[np.isnan(first)] = 0  # a bucket of NaNs: j0 0, no distinct quantile inside
            most = max(most, int(inside[~np.isnan(first)].max()))
            buckets.append(below)
            adds.append(size + (1 << (31 - s)))  # the feature's first entry is its bucket -2^(31 - s)
            size += 1 << (32 - s)
        self.depth = max(1, (most - 1).bit_length())  # search steps over a bucket's distinct quantiles
        w = max(len(u) for u in distinct) + 2 + (1 << self.depth)  # the search may read 2^depth rows past j0 + 1
        self.shift, self.add = torch.tensor(shifts, dtype=torch.int32), torch.tensor(adds, dtype=torch.int32)
        self.table = torch.from_numpy(np.concatenate([b + f * w for f, b in enumerate(buckets)]).astype(np.int32))
        rows = (torch.full((g, w), float("inf")), torch.full((g, w), float(top)),
                torch.zeros(g, w), torch.ones(g, w), torch.zeros(g, w))
        distinct_at, score, lo, gap, rank = rows
        for f, u in enumerate(distinct):
            d = len(u)
            distinct_at[f, :d] = torch.from_numpy(u)
            first = torch.searchsorted(quantiles[f], distinct_at[f, :d])  # (D,) the first position of each
            score[f, :d] = middle[f, first]
            upper = torch.cat([first, torch.full((w - d,), q)]).clamp(1, q - 1)
            lower, higher = quantiles[f, upper - 1], quantiles[f, upper]
            lo[f], gap[f], rank[f] = lower, (higher - lower).clamp(min=1e-12), (upper - 1).float()
        self.distinct, self.score, self.lo, self.gap, self.rank = (t.reshape(-1).contiguous() for t in rows)

    def scale(self, flat: torch.Tensor, out: torch.Tensor) -> None:
        """(N, G) contiguous float32 values -> their (N, G) scores, written into `out` (contiguous)."""
        buckets = torch.sub(flat, self.center).view(torch.int32).bitwise_right_shift_(self.shift).add_(self.add)
        rows = self.table.index_select(0, buckets.view(-1))  # (n,) f W + j0
        x, at = flat.numpy().reshape(-1), rows.numpy()
        at += np.less(self.distinct.index_select(0, rows).numpy(), x)  # j0 + 1 where the j0-th lies below
        found = self.distinct.index_select(0, rows).numpy()  # the quantile at j: below the value only in a shared bucket
        beyond = np.flatnonzero(np.less(found, x))
        if len(beyond):  # j lies in j + 1 .. j + 2^depth - 1
            value, further, distinct = x[beyond], at[beyond] + 1, self.distinct.numpy()
            for step in [1 << k for k in reversed(range(self.depth))]:  # numpy: fewer, cheaper calls on these few values
                further += np.less(distinct[step - 1 :].take(further), value) * np.int32(step)
            at[beyond] = further
            found[beyond] = distinct.take(further)
        scores = torch.index_select(self.score, 0, rows, out=out.view(-1))
        apart = torch.from_numpy(np.flatnonzero(np.not_equal(found, x)))  # the values equal to no quantile
        at, value = rows.index_select(0, apart), flat.view(-1).index_select(0, apart).numpy()
        lo, gap, rank = (column.index_select(0, at).numpy() for column in (self.lo, self.gap, self.rank))
        scores.numpy()[apart.numpy()] = _between_host(value, lo, gap, rank, self.q)


def _between_host(value: np.ndarray, lo: np.ndarray, gap: np.ndarray, rank: np.ndarray, q: int) -> np.ndarray:
    """`_between` in numpy (its smaller operations take less time there; the same IEEE operations in the
    same order, the same floats) and torch's float64 `erfinv`; `value` is overwritten."""
    with np.errstate(all="ignore"):  # NaN in, NaN out, as in torch
        u = np.subtract(value, lo, out=value)
        np.divide(u, gap, out=u)
        np.clip(u, 0, 1, out=u)
        np.add(u, rank, out=u)
        np.divide(u, np.float32(q - 1), out=u)
        wide = u.astype(np.float64)
        np.clip(wide, 0.5 / q, 1 - 0.5 / q, out=wide)
        np.multiply(wide, 2, out=wide)
        np.subtract(wide, 1, out=wide)
        torch.from_numpy(wide).erfinv_()
        np.multiply(wide, math.sqrt(2.0), out=wide)
    return wide.astype(np.float32)


def _center(quantiles: np.ndarray) -> np.float32:
    """The float32 a feature's values are taken relative to before their bits are read: the middle of the narrowest
    quarter of its finite quantiles, where the buckets (intervals of floats, narrower nearer 0) are the narrowest."""
    finite = quantiles[np.isfinite(quantiles)]
    window = max(1, len(quantiles) // 4)
    if len(finite) <= window:
        return finite[len(finite) // 2] if len(finite) else np.float32(0)
    with np.errstate(over="ignore"):
        start = int(np.argmin(finite[window:] - finite[:-window]))
    return finite[start + window // 2]


def _coarsest_apart(shifted: np.ndarray) -> int:
    """The largest shift (at most 31) whose buckets hold at most one of these ascending float32 values, and
    `FINEST_SHIFT` where none does (values equal after the subtraction, or too close)."""
    bits = shifted.view(np.int32)
    for shift in range(31, FINEST_SHIFT - 1, -1):
        if not (np.diff(bits >> shift) == 0).any():
            return shift
    return FINEST_SHIFT
