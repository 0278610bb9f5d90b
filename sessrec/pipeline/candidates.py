"""The objects every pipeline stage passes on: a batch of sessions and its candidate matrix.

A stage never loops over sessions or candidates: retrievers fill a (B, K) matrix of model item
ids, filters blank entries of it, the feature builder adds (B, K) columns, scorers fill (B, K)
scores and orderers pick the final (B, k). Empty slots hold item id 0 (padding), which is never
recommended.

Shape letters: B sessions, L positions, K candidates per session, V items.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sessrec.data.vocab import NUM_SPECIAL, PAD


@dataclass
class RequestSessions:
    """A batch of request sessions entering the pipeline (retrieve -> filter -> score -> order).

    Not a training batch: models train and are evaluated on `sessrec.data.SessionBatch` (int32
    ids, targets, side features, from `SessionLoader`). `RequestSessions` is what a recommendation
    request holds: int64 ids, the request time that rule tables are checked at, the whole history
    for filters, and a cache shared by the stages of one call.

    Args:
        items: (B, L) int64 model item ids, right-aligned (0 = padding on the left, 1 = OOV).
        times: (B, L) float64 event times in seconds (0 on padding), or None when unknown.
        now: (B,) float64 request time in seconds (validity windows of rule tables); None:
            the time of each session's last event when `times` is given, else no time.
        history: (B, H) int64 the whole session (its last H events, H >= L), right-aligned, for
            filters of everything seen; None: `items` is all there is.
        cache: per-batch results that several stages reuse (e.g. a retriever's full score
            matrix, read again when another retriever's candidates are scored); never saved.
    """

    items: torch.Tensor
    times: torch.Tensor | None = None
    now: torch.Tensor | None = None
    history: torch.Tensor | None = None
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.items.dim() != 2:
            raise ValueError(f"RequestSessions.items must be (B, L), got shape {tuple(self.items.shape)}")
        self.items = self.items.long()
        if self.times is not None and self.times.shape != self.items.shape:
            raise ValueError(f"RequestSessions.times has shape {tuple(self.times.shape)}, items {tuple(self.items.shape)}")
        if self.now is None and self.times is not None:
            self.now = self.times[:, -1].double()

    def __len__(self) -> int:
        return self.items.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) events per session (OOV included, padding not)."""
        return (self.items != PAD).sum(dim=1)

    def to(self, device: torch.device | str) -> RequestSessions:
        """The sessions on `device`: self when already there, else a copy that shares this batch's
        cache (so that what one stage cached is found by the next, on whichever copy it runs)."""
        if self.items.device == torch.device(device):
            return self
        move = lambda t: None if t is None else t.to(device)
        return RequestSessions(self.items.to(device), move(self.times), move(self.now), move(self.history), self.cache)

    def take(self, rows: torch.Tensor) -> RequestSessions:
        """The sessions at `rows` (a fresh cache)."""
        pick = lambda t: None if t is None else t[rows]  # noqa: E731
        return RequestSessions(self.items[rows], pick(self.times), pick(self.now), pick(self.history))


@dataclass
class Retrieved:
    """One retriever's top-K: (B, K) model ids, best first (0 = fewer than K found), and scores."""

    items: torch.Tensor
    scores: torch.Tensor


@dataclass
class Candidates:
    """The candidate matrix of a batch and everything known about each candidate.

    Args:
        items: (B, K) int64 model ids; 0 marks an empty slot.
        features: name -> (B, K) float32 feature of each candidate (value at empty slots unspecified).
        scores: (B, K) float32 scores of the scoring stage, -inf at empty slots; None before scoring.
    """

    items: torch.Tensor
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    scores: torch.Tensor | None = None

    @property
    def valid(self) -> torch.Tensor:
        """(B, K) bool: slots holding a candidate."""
        return self.items != PAD

    def keep(self, mask: torch.Tensor) -> Candidates:
        """Blank the slots where `mask` (B, K) is False (features stay; scores become -inf there)."""
        items = torch.where(mask, self.items, torch.zeros_like(self.items))
        scores = None if self.scores is None else self.scores.masked_fill(~mask, float("-inf"))
        return replace(self, items=items, scores=scores)

    def compact(self, width: int | None = None) -> Candidates:
        """Move the filled slots to the front of each row (stable) and drop all-empty columns; with
        `width`, then keep that many columns (cut, or padded with empty slots and zero features)."""
        valid = self.valid
        filled = max(int(valid.sum(dim=1).max()) if len(self.items) else 0, 1)
        keep = min(filled if width is None else min(filled, width), self.items.shape[1])
        pad = 0 if width is None else width - keep
        if not bool((valid[:, 1:] > valid[:, :-1]).any()):  # no empty slot before a filled one (as `merge` lays them)
            pick = lambda t: F.pad(t[..., :keep], (0, pad))  # noqa: E731 - the order below is 0, 1, ... there
        else:
            order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)[:, :keep]
            pick = lambda t: F.pad(t.gather(-1, order.expand(*t.shape[:-2], *order.shape)), (0, pad))  # noqa: E731
        names = list(self.features)
        features = dict(zip(names, pick(torch.stack([self.features[n] for n in names])).unbind(0))) if names else {}
        return Candidates(pick(self.items), features, None if self.scores is None else pick(self.scores))


@dataclass
class Recommendations:
    """Final top-k of a batch: (B, k) model ids, best first (0 = fewer than k left), and their scores."""

    items: torch.Tensor
    scores: torch.Tensor


@functools.lru_cache(maxsize=64)
def stacked_columns(widths: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(S,) the source and the 1-based rank there of each column of sources of `widths` stacked side by side, on
    `device` (made once for each layout: every request of a pipeline stacks the same)."""
    source = torch.from_numpy(np.repeat(np.arange(len(widths)), widths)).to(device)
    rank = torch.from_numpy(np.concatenate([np.arange(1, w + 1) for w in widths])).to(device)
    return source, rank


def merge(retrieved: dict[str, Retrieved]) -> Candidates:
    """Union of several retrievers' top-K per session, with each source's score and rank as features.

    The merged row lists every distinct item any retriever returned, ordered by the sum over
    sources of 1 / rank (items several sources agree on first). Features per source ``name``:
    ``{name}_rank`` (1-based rank in that source, 0 where it did not return the item) and
    ``{name}_score`` (its score there, 0 where absent); and ``sources`` (how many returned it).
    Computed on the device of the retrieved items, where the result is.

    Args:
        retrieved: source name -> its `Retrieved` (same B for all).
    """
    if not retrieved:
        raise ValueError("merge needs at least one retriever's candidates")
    names = list(retrieved)
    b = retrieved[names[0]].items.shape[0]
    device = retrieved[names[0]].items.device
    items = torch.cat([retrieved[n].items for n in names], dim=1).long()  # (B, S) stacked sources
    score = torch.cat([retrieved[n].scores.float() for n in names], 1)
    col_source, col_rank = stacked_columns(tuple(retrieved[n].items.shape[1] for n in names), device)
    valid = items >= NUM_SPECIAL
    # one key per (row, item): sort them (invalid last), number the distinct ones within each row
    row = torch.arange(b, device=device).unsqueeze(1)
    shift = int(items.max()).bit_length() if items.numel() else 0  # (row, item) as row * 2^shift + item
    key = torch.where(valid, (row << shift) | items, b << shift)
    flat_key, order = key.flatten().sort(stable=True)
    n_valid = int(valid.sum())
    uniq, entry = torch.unique_consecutive(flat_key[:n_valid], return_inverse=True)  # entry: distinct index of each
    order = order[:n_valid]
    n_uniq = len(uniq)
    u_row, u_item = uniq >> shift, uniq & ((1 << shift) - 1)  # u_row ascending: uniq is sorted
    # per distinct (row, item) and source: its rank and score there (a source lists an item once)
    column = order % items.shape[1]
    source = col_source[column]
    ranks = torch.zeros(n_uniq * len(names), 2, device=device)  # (rank, score) of each (distinct item, source)
    ranks.index_copy_(0, entry * len(names) + source, torch.stack([col_rank[column].float(), score.flatten()[order]], 1))
    ranks = ranks.view(n_uniq, len(names), 2)
    # priority: the sum of 1 / rank added source by source in the order given, so that every device
    # rounds it alike (a sum along a dimension adds in no fixed order, and float sums depend on it)
    rank = ranks[..., 0]
    inverse = torch.where(rank > 0, rank.double().clamp(min=1).reciprocal(), 0.0)  # ranks are small integers: exact in float32
    priority = torch.zeros(n_uniq, dtype=torch.float64, device=device)
    for i in range(len(names)):
        priority += inverse[:, i]
    # the features as columns: {name}_rank, {name}_score of each source, then sources
    feats = torch.cat([ranks.view(n_uniq, 2 * len(names)), (rank > 0).sum(dim=1, keepdim=True).float()], dim=1)
    # lay the distinct items out per row, by decreasing priority (ties: the lower item id): each row's items (by id,
    # as `uniq` holds them) sorted within the row, the slots past a row's items last
    counts = torch.bincount(u_row, minlength=b)
    width = max(int(counts.max()) if n_uniq else 0, 1)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(width, device=device)
    at = torch.where(slot < counts.unsqueeze(1), starts.unsqueeze(1) + slot, n_uniq)  # (B, width) distinct items, by id
    key = torch.cat([-priority, priority.new_full((1,), float("inf"))])[at]
    at = at.gather(1, torch.sort(key, dim=1, stable=True).indices)  # by decreasing priority
    out_items = torch.cat([u_item, u_item.new_zeros(1)])[at]
    grid = torch.cat([feats, feats.new_zeros(1, feats.shape[1])]).T[:, at]  # (F, B, width), 0 at empty slots
    feature_names = [f"{n}_{what}" for n in names for what in ("rank", "score")] + ["sources"]
    return Candidates(out_items, dict(zip(feature_names, grid.unbind(0))))
