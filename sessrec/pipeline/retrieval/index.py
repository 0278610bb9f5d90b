"""Maximum-inner-product top-K over an item table: exact (`ExactIndex`) or approximate (`FaissIndex`).

The session-model retriever scores a query vector h against every item vector by inner product
(it folds the output bias into an extra column, so the plain inner product is the exact score).
Both indexes take the same calls: ``build(vectors, ids)``, ``search(queries, k)`` and
``state_dict()`` / ``load_state_dict(state)`` (numpy arrays, no pickling); their constructor
arguments are their config (`Configurable`: a saved pipeline rebuilds them from it).

Which to choose (FAISS's guidelines; recall and speed at 1M items: ``docs/benchmarks.md``,
Pipeline: FAISS against exact retrieval):

- `ExactIndex` (a blocked matrix product, like FAISS's Flat) is the only exact one. Cost is
  N x D multiply-adds per query, memory bounded by the block size. Right for catalogues up to
  some hundred thousand items, for batch jobs, and as the reference for the others' recall.
- `FaissIndex(kind="hnsw")` is the best approximate choice when RAM allows: (4 D + 8 M) bytes per
  vector (M links per node, ``hnsw_m``), no training, build cost grows with ``ef_construction``.
  Recall and latency are traded at query time by ``ef_search`` (raised to k when below it).
- `FaissIndex(kind="ivf")` (inverted lists, Flat inside) needs k-means training and less memory
  (4 D bytes per vector plus the lists); about 4 sqrt(N) lists (the guideline is 4 sqrt(N) to
  16 sqrt(N) below 1M vectors). Recall and latency are traded by ``nprobe``, the lists visited.

Approximate results may hold fewer than k hits; missing slots, like slots beyond N when k > N,
come back with id 0 (padding, never recommended) and score -inf.

Shape letters: B queries, N items, D vector width, K results per query.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch

from sessrec.saved.registry import Configurable, check_integers


def _as_table(
    vectors: np.ndarray | torch.Tensor, ids: np.ndarray | torch.Tensor
) -> tuple[np.ndarray, np.ndarray]:
    """Validated (N, D) float32 and (N,) int64 numpy copies-or-views of an item table."""
    v = vectors.detach().cpu().numpy() if isinstance(vectors, torch.Tensor) else np.asarray(vectors)
    i = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    if v.ndim != 2:
        raise ValueError(f"vectors must be 2-d (N, D), got shape {v.shape}")
    if v.shape[0] == 0 or v.shape[1] == 0:
        raise ValueError(f"vectors must hold at least one item of width >= 1, got shape {v.shape}")
    if i.shape != (v.shape[0],):
        raise ValueError(f"ids must have shape (N,) = ({v.shape[0]},) to match vectors {v.shape}, "
                         f"got {i.shape}")
    if not np.issubdtype(i.dtype, np.integer):
        raise TypeError(f"ids must be integers, got dtype {i.dtype}")
    v = np.ascontiguousarray(v, dtype=np.float32)
    bad = ~np.isfinite(v)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise ValueError(
            f"vectors hold {int(bad.sum())} non-finite values "
            f"(first: {v[row, col]} at row {row}, column {col})"
        )
    return v, np.ascontiguousarray(i, dtype=np.int64)


def _check_search(queries: torch.Tensor, k: int, dim: int | None) -> torch.Tensor:
    """(B, D) float32 queries, after checking the index is built, the width and k."""
    if dim is None:
        raise RuntimeError("search called before build: call build(vectors, ids) or load_state_dict first")
    check_integers({"k": k})
    if not isinstance(queries, torch.Tensor):
        raise TypeError(f"queries must be a torch.Tensor (B, D), got {type(queries).__name__}")
    if queries.dim() != 2 or queries.shape[1] != dim:
        raise ValueError(
            f"queries must have shape (B, {dim}) to match the index width, got {tuple(queries.shape)}"
        )
    return queries.detach().float()


def _pad(scores: torch.Tensor, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Widen (B, K') results to (B, k) with score -inf and id 0."""
    missing = k - scores.shape[1]
    if missing <= 0:
        return scores, ids
    b = scores.shape[0]
    return (
        torch.cat([scores, scores.new_full((b, missing), float("-inf"))], dim=1),
        torch.cat([ids, ids.new_zeros((b, missing))], dim=1),
    )


QUERY_ROWS = 32  # queries scored at once on the host: their (32, N) scores stay in cache (256 queries, 42,919 items: 99 -> 71 ms)
GROUP_ROWS = 128  # scores per group whose maximum bounds the k-th largest score from below (`host_top_k`)
BOUNDED_ROWS = 4  # rows from which `host_top_k` bounds: 0.1 ms slower than topk for one row of 42,919, faster from 4


def host_top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``scores.topk(k, dim=1)`` of (b, N) host scores: the (b, k) largest of each row, best first, and their
    columns, ties to the lower column (in ``torch.topk``'s order where it ranks them); k <= N.

    Each row's columns fall into k or more groups of consecutive ones (`GROUP_ROWS`, fewer where N < `GROUP_ROWS` k;
    the rest one more group): the k-th largest of a row's group maxima is at or below its k-th largest
    score, so only the scores at or above it (about 1.2 k of 42,919 at k = 100) are sorted (numpy's `lexsort`: by
    row, score descending, column), in half the time of ``topk`` over all of them (32 rows of 42,919, k = 100, one
    thread). Scores holding a NaN (which ``topk`` ranks first) are ranked by ``topk``, as are few columns (N < 4 k)
    and fewer rows than `BOUNDED_ROWS`.
    """
    b, n = scores.shape
    size = min(GROUP_ROWS, n // k)  # columns per group
    if size < 4 or b < BOUNDED_ROWS:
        return _top_k_of_all(scores, k)
    groups = n // size
    whole = groups * size
    maxima = scores[:, :whole].reshape(b, groups, size).amax(dim=2)  # (b, G)
    if whole < n:
        maxima = torch.cat([maxima, scores[:, whole:].amax(dim=1, keepdim=True)], dim=1)
    if bool(maxima.isnan().any()):  # a group's maximum is NaN where it holds one
        return _top_k_of_all(scores, k)
    bound = maxima.kthvalue(maxima.shape[1] - k + 1, dim=1, keepdim=True).values  # (b, 1) the k-th largest maximum
    host = scores.detach().numpy()
    at = np.flatnonzero(np.greater_equal(host, bound.numpy()))  # (c,) row-major: by row, then column
    row, column = np.divmod(at, n)
    counts = np.bincount(row, minlength=b)  # k or more each
    values = host.reshape(-1)[at]
    order = np.lexsort((column, -values, row))  # row by row, the best first, ties to the lower column
    take = order[((np.cumsum(counts) - counts)[:, None] + np.arange(k)).reshape(-1)]
    return torch.from_numpy(values[take].reshape(b, k)), torch.from_numpy(column[take].reshape(b, k))


def _top_k_of_all(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``topk`` of each row of (b, N) scores: (b, k) values and columns."""
    top = scores.topk(k, dim=1)
    return top.values, top.indices


class ExactIndex(Configurable):
    """Exact top-K by blocked matrix product: bounded memory for any catalogue size.

    The item table is scored `block_size` rows at a time; each block's top-k is merged into a
    running top-k, so peak memory is O(B * (block_size + k)), never (B, N).

    Args:
        block_size: item rows scored per matrix product.

    Examples:
        >>> index = ExactIndex().build(np.eye(3, dtype=np.float32), np.array([7, 8, 9]))
        >>> index.search(torch.tensor([[0.0, 2.0, 1.0]]), k=2)[1]
        tensor([[8, 9]])
    """

    def __init__(self, block_size: int = 65536) -> None:
        check_integers({"block_size": block_size})
        self.block_size = block_size
        self._vectors: torch.Tensor | None = None  # (N, D) float32
        self._ids: torch.Tensor | None = None  # (N,) int64

    def __len__(self) -> int:
        return 0 if self._ids is None else len(self._ids)

    @property
    def dim(self) -> int | None:
        """D, or None before `build`."""
        return None if self._vectors is None else self._vectors.shape[1]

    def build(self, vectors: np.ndarray | torch.Tensor, ids: np.ndarray | torch.Tensor) -> ExactIndex:
        """Index the item table.

        Args:
            vectors: (N, D) float item vectors, finite.
            ids: (N,) int64 item id of each row (what `search` returns).

        Returns:
            self.
        """
        v, i = _as_table(vectors, ids)
        self._vectors, self._ids = torch.from_numpy(v), torch.from_numpy(i)
        return self

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-`k` items by inner product.

        Args:
            queries: (B, D) query vectors.
            k: results per query; beyond N they are padding (score -inf, id 0).

        Returns:
            scores (B, k) float32 and ids (B, k) int64, best first, on the queries' device.
        """
        q = _check_search(queries, k, self.dim)
        vectors, device = self._vectors, queries.device
        q = q.to(vectors.device)
        if len(vectors) <= self.block_size:  # one block: its top-k is the answer
            width = min(k, len(vectors))
            if vectors.device.type == "cpu":
                tops = [host_top_k(q[lo:lo + QUERY_ROWS] @ vectors.T, width) for lo in range(0, max(len(q), 1), QUERY_ROWS)]
            else:
                tops = [(q @ vectors.T).topk(width, dim=1)]
            values, indices = torch.cat([t[0] for t in tops]), torch.cat([t[1] for t in tops])
            scores, ids = _pad(values, self._ids[indices], k)
            return scores.to(device), ids.to(device)
        best = q.new_empty((q.shape[0], 0))  # (B, <=k) running top-k scores
        rows = torch.empty((q.shape[0], 0), dtype=torch.long, device=q.device)  # (B, <=k) their rows
        for start in range(0, len(vectors), self.block_size):
            scores = q @ vectors[start:start + self.block_size].T  # (B, block)
            top = scores.topk(min(k, scores.shape[1]), dim=1)
            best = torch.cat([best, top.values], dim=1)  # (B, <= 2k)
            rows = torch.cat([rows, top.indices + start], dim=1)
            keep = best.topk(min(k, best.shape[1]), dim=1)  # sorted, also when fewer than k so far
            best, rows = keep.values, rows.gather(1, keep.indices)
        scores, ids = _pad(best, self._ids[rows], k)
        return scores.to(device), ids.to(device)

    def to(self, device: torch.device | str) -> ExactIndex:
        """Keep the item table on `device` (searches run there); returns self."""
        if self._vectors is not None:
            self._vectors, self._ids = self._vectors.to(device), self._ids.to(device)
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        """The item table: ``vectors`` (N, D) and ``ids`` (N,)."""
        if self._vectors is None:
            raise RuntimeError("state_dict called before build: there is nothing to save")
        return {"vectors": self._vectors.cpu().numpy(), "ids": self._ids.cpu().numpy()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> ExactIndex:
        """Index the item table of a `state_dict`; returns self."""
        return self.build(state["vectors"], state["ids"])


class FaissIndex(Configurable):
    """Approximate top-K with FAISS (inner product): HNSW (default) or IVF.

    Needs the optional ``faiss-cpu`` package (imported on first use). FAISS's own thread count
    (``faiss.omp_set_num_threads``) is left to the caller.

    Args:
        kind: ``"hnsw"`` (graph, no training) or ``"ivf"`` (k-means inverted lists, Flat inside).
        hnsw_m: HNSW links per node (4-64; memory (4 D + 8 M) bytes per vector).
        ef_construction: HNSW candidate-list size while building (higher: better graph, slower build).
        ef_search: HNSW candidate-list size while searching (at least k is used).
        nlist: IVF lists; None: about 4 sqrt(N) (at most N).
        nprobe: IVF lists visited per query (at most nlist).
        seed: seeds the IVF training sample and k-means.

    Examples:
        >>> vectors = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
        >>> index = FaissIndex("hnsw").build(vectors, np.arange(1000) + 2)
        >>> scores, ids = index.search(torch.from_numpy(vectors[:2]), k=10)
    """

    def __init__(
        self,
        kind: Literal["hnsw", "ivf"] = "hnsw",
        hnsw_m: int = 32,
        ef_construction: int = 80,
        ef_search: int = 128,
        nlist: int | None = None,
        nprobe: int = 16,
        seed: int = 0,
    ) -> None:
        if kind not in ("hnsw", "ivf"):
            raise ValueError(f"kind must be 'hnsw' or 'ivf', got {kind!r}")
        check_integers({"hnsw_m": hnsw_m}, minimum=2)
        check_integers({"ef_construction": ef_construction, "ef_search": ef_search, "nprobe": nprobe})
        if nlist is not None and (isinstance(nlist, bool) or not isinstance(nlist, int) or nlist < 1):
            raise ValueError(f"nlist must be None (about 4 sqrt(N)) or an integer >= 1, got {nlist!r}")
        self.kind, self.hnsw_m, self.ef_construction = kind, hnsw_m, ef_construction
        self.ef_search, self.nlist, self.nprobe, self.seed = ef_search, nlist, nprobe, seed
        self._index: Any = None  # the faiss index, rows 0..N-1
        self._ids: np.ndarray | None = None  # (N,) int64 item id of each faiss row

    def __len__(self) -> int:
        return 0 if self._ids is None else len(self._ids)

    @property
    def dim(self) -> int | None:
        """D, or None before `build`."""
        return None if self._index is None else int(self._index.d)

    @staticmethod
    def _faiss() -> Any:
        try:
            import faiss
        except ImportError as error:
            raise ImportError("FaissIndex needs the optional faiss package: pip install faiss-cpu (or pip install 'sessrec[pipeline]')") from error
        return faiss

    @property
    def num_lists(self) -> int | None:
        """The IVF lists of the built index (``nlist``, or the number it chose); None for HNSW or before `build`."""
        return int(self._index.nlist) if self.kind == "ivf" and self._index is not None else None

    def _configure(self) -> None:
        """Apply the query-time settings to the faiss index."""
        if self.kind == "hnsw":
            self._index.hnsw.efSearch = self.ef_search
        else:
            self._index.nprobe = min(self.nprobe, self._index.nlist)

    def build(self, vectors: np.ndarray | torch.Tensor, ids: np.ndarray | torch.Tensor) -> FaissIndex:
        """Index the item table (HNSW: add; IVF: k-means on a seeded sample, then add).

        Args:
            vectors: (N, D) float item vectors, finite.
            ids: (N,) int64 item id of each row (what `search` returns).

        Returns:
            self.
        """
        faiss = self._faiss()
        v, i = _as_table(vectors, ids)
        n, d = v.shape
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.ef_construction
        else:
            nlist = self.nlist if self.nlist is not None else min(n, max(1, round(4 * math.sqrt(n))))
            if nlist > n:
                raise ValueError(f"nlist={nlist} exceeds the {n} vectors to train on: use nlist <= N or None")
            index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = self.seed
            sample = min(n, 64 * nlist)  # FAISS warns below 39 points per list; 64 keeps k-means short
            rows = np.sort(np.random.default_rng(self.seed).choice(n, size=sample, replace=False))
            index.train(v[rows])
        index.add(v)
        self._index, self._ids = index, i
        self._configure()
        return self

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Approximate top-`k` items by inner product.

        Args:
            queries: (B, D) query vectors.
            k: results per query; slots FAISS leaves empty (and beyond N) are padding
                (score -inf, id 0).

        Returns:
            scores (B, k) float32 and ids (B, k) int64, best first, on the queries' device.
        """
        q = np.ascontiguousarray(_check_search(queries, k, self.dim).cpu().numpy())
        params = None
        if self.kind == "hnsw" and k > self.ef_search:  # the candidate list must hold k results
            params = self._faiss().SearchParametersHNSW(efSearch=k)
        scores, rows = self._index.search(q, k, params=params)  # (B, k), row -1 = no result
        found = rows >= 0
        ids = np.where(found, self._ids[np.where(found, rows, 0)], 0)
        scores = np.where(found, scores, np.float32(-np.inf)).astype(np.float32, copy=False)
        return torch.from_numpy(scores).to(queries.device), torch.from_numpy(ids).to(queries.device)

    def to(self, device: torch.device | str) -> FaissIndex:
        """FAISS searches on the host whatever `device` (results come back on the queries' device); returns self."""
        return self

    def state_dict(self) -> dict[str, np.ndarray]:
        """``index`` (the serialized faiss index, uint8) and ``ids`` (N,)."""
        if self._index is None:
            raise RuntimeError("state_dict called before build: there is nothing to save")
        return {"index": self._faiss().serialize_index(self._index), "ids": self._ids}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> FaissIndex:
        """Take the built index of a `state_dict`; the query settings (``ef_search``, ``nprobe``) are this
        index's own. Returns self."""
        index = self._faiss().deserialize_index(np.ascontiguousarray(state["index"], dtype=np.uint8))
        if (self.kind == "hnsw") != hasattr(index, "hnsw"):
            raise ValueError(f"the saved faiss index is not of kind {self.kind!r} ({type(index).__name__})")
        ids = np.ascontiguousarray(state["ids"], dtype=np.int64)
        if ids.shape != (index.ntotal,):
            raise ValueError(f"ids must have shape ({index.ntotal},) to match the saved index, "
                             f"got {ids.shape}")
        self._index, self._ids = index, ids
        self._configure()
        return self
