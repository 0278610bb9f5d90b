"""`Retriever`: the interface of the first stage.

A retriever returns each session's top-K items from the whole catalogue (`retrieve`) and can
score any given candidates (`score`), so that every retriever's opinion of every merged
candidate becomes a ranking feature, not only of the items it retrieved itself.

Saving: a retriever is rebuilt from its constructor config (every subclass is `Configurable`:
it registers itself and records its arguments, `config_of`), then takes what it learned or was
given from `load_state_dict`; `state_dict` gives that state as named numpy arrays and small
JSON-able values (no pickled code).

Devices: a retriever returns its results on the device of ``sessions.items``. One that holds
tensors (a session model's weights, an exact index) moves them with `to`; one that computes on the
host (kNN, co-visitation) keeps its state there and moves only its results.

Shape letters: B sessions, K candidates, V items.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sessrec.baselines.knn import kth_highest, ranks_in_rows, stable_order
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.saved.registry import Configurable


class Retriever(Configurable):
    """Base class of the retrievers; subclasses implement `retrieve`, `score`, `state_dict` and `load_state_dict`.

    `products`: the ids below it are products, those from it on virtual (input-only) items, which `retrieve` never
    returns; None: every id is a product. The `Pipeline` sets it from its vocabulary.
    """

    products: int | None = None

    def retrieve(self, sessions: RequestSessions, k: int) -> Retrieved:
        """Top-`k` recommendable items (B, k) per session, best first, with their scores."""
        raise NotImplementedError

    def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
        """(B, K) float32 scores of the candidates `items` (B, K); any value at empty slots (id 0)."""
        raise NotImplementedError

    def to(self, device: torch.device | str) -> Retriever:
        """Keep the tensors the retriever computes with on `device` (none by default: it computes on
        the host and moves its results); returns self."""
        return self

    def state_dict(self) -> dict[str, Any]:
        """What the retriever learned or was given beyond its config: named numpy arrays (nested
        dicts allowed) and small JSON-able values."""
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> Retriever:
        """Take a `state_dict` of a retriever of the same config; returns self."""
        raise NotImplementedError


def products_only(keys: np.ndarray, values: np.ndarray, width: int, products: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The entries (``keys`` row * width + column, ``values``) of a sparse score matrix whose column is below
    `products` (None: all of them): a retriever's top-K holds no virtual item, which the pipeline would drop."""
    if products is None or products >= width:
        return keys, values
    keep = keys % width < products
    return keys[keep], values[keep]


def top_k_sparse(keys: np.ndarray, values: np.ndarray, rows: int, width: int, k: int,
                 device: torch.device | str = "cpu") -> Retrieved:
    """Top-`k` per row of a sparse (rows, width) score matrix: its entries are ``keys`` (row * width +
    column, ascending) and ``values``; nothing else is a candidate. Best first, ties: the lower
    column; id 0 and score -inf past a row's entries. On `device`. Only the entries at or above their
    row's k-th highest value (`kth_highest`, linear) are ranked: the same ranks below k, fewer to sort."""
    row = keys // width
    if len(row) > 2 * k:
        near = np.flatnonzero(values >= kth_highest(row, values, k)[row])
        keys, values, row = keys[near], values[near], row[near]
    col = keys % width
    rank = row_ranks(row, values, col)
    top = rank < k
    items = np.zeros((rows, k), dtype=np.int64)  # laid out on the host
    scores = np.full((rows, k), -np.inf, dtype=np.float32)
    items[row[top], rank[top]] = col[top]
    scores[row[top], rank[top]] = values[top]
    return Retrieved(items=torch.from_numpy(items).to(device), scores=torch.from_numpy(scores).to(device))


def lookup_sparse(keys: np.ndarray, values: np.ndarray, rows: np.ndarray, cols: np.ndarray, width: int) -> np.ndarray:
    """float32 values at (rows, cols) of a sparse matrix given by ascending `keys` = row * width + col.

    0 where there is no entry or where ``cols`` is < 2 (padding, OOV); `rows` are valid rows, of the shape of `cols`
    or one that broadcasts to it (``(B, 1)``: one row per line of `cols`); `keys` are distinct.

    From `REVERSED_LOOKUP` wanted values (a batch's candidates) and up to as many entries per wanted value (their
    sparse scores), the entries are looked up among the wanted keys sorted, a search of sorted values, instead of
    each wanted key among the entries.
    """
    if not len(keys) or not cols.size:
        return np.zeros(cols.shape, dtype=np.float32)
    want = rows * width + cols
    if want.size < REVERSED_LOOKUP[0] or len(keys) > REVERSED_LOOKUP[1] * want.size:
        at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
        found = (keys[at] == want) & (cols >= NUM_SPECIAL)
        return np.where(found, values[at], 0).astype(np.float32)
    want = np.where(cols >= NUM_SPECIAL, want, -1).reshape(-1)  # -1: no entry's key
    order = np.argsort(want)
    ordered = want[order]
    at = np.minimum(np.searchsorted(ordered, keys), len(ordered) - 1)  # each entry's first slot among the sorted keys
    found = ordered[at] == keys
    got = np.zeros(len(ordered), dtype=np.float32)  # over the sorted wanted keys
    got[at[found]] = values[found]
    if ((ordered[1:] == ordered[:-1]) & (ordered[1:] >= 0)).any():  # a key wanted twice: each takes its first's value
        got = got[np.searchsorted(ordered, ordered)]
    out = np.empty(len(ordered), dtype=np.float32)
    out[order] = got
    return out.reshape(cols.shape)


# `lookup_sparse` searches the entries among the wanted keys from this many wanted keys, up to this many entries each
# (one thread, 200 candidates a session: at batch 1 the sort costs more than it saves, at batch 256 it saves a fifth;
# the bound of 2,048 between them is not tuned)
REVERSED_LOOKUP = (2048, 4)


def row_ranks(row: np.ndarray, value: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """(E,) 0-based rank of each entry within its row, by decreasing `value`, ties by increasing `tie`.

    Many entries already by (row, tie) ascending (a batch's sparse keys) take two stable sorts, by value and then
    by row (`stable_order`, a radix sort); any others a three-key sort (faster below `RADIX_ENTRIES` entries).
    """
    if len(row) >= RADIX_ENTRIES and bool(np.all((np.diff(row) > 0) | ((np.diff(row) == 0) & (np.diff(tie) >= 0)))):
        by_value = np.argsort(-value, kind="stable")
        order = by_value[stable_order(row[by_value])]
    else:
        order = np.lexsort((tie, -value, row))
    ranks = np.empty(len(row), dtype=np.int64)
    ranks[order] = ranks_in_rows(row[order])
    return ranks


RADIX_ENTRIES = 16_384  # entries from which `row_ranks` sorts by value and row apart (one thread, 2026 CPUs)
