"""The objects every pipeline stage passes on: a batch of sessions and its candidate matrix.

A stage never loops over sessions or candidates: retrievers fill a (B, K) matrix of model item
ids, filters blank entries of it, the feature builder adds (B, K) columns, scorers fill (B, K)
scores and orderers pick the final (B, k). Empty slots hold item id 0 (padding), which is never
recommended.

Shape letters: B sessions, L positions, K candidates per session, V items.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

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

    def compact(self) -> Candidates:
        """Move the filled slots to the front of each row (stable) and drop all-empty columns."""
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)
        width = max(int(self.valid.sum(dim=1).max()) if len(self.items) else 0, 1)
        order = order[:, :width]
        pick = lambda t: t.gather(1, order)  # noqa: E731
        scores = None if self.scores is None else pick(self.scores)
        return Candidates(pick(self.items), {k: pick(v) for k, v in self.features.items()}, scores)


@dataclass
class Recommendations:
    """Final top-k of a batch: (B, k) model ids, best first (0 = fewer than k left), and their scores."""

    items: torch.Tensor
    scores: torch.Tensor


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
    source = torch.cat(
        [torch.full(retrieved[n].items.shape, i, dtype=torch.long, device=device) for i, n in enumerate(names)], 1
    )
    rank = torch.cat([torch.arange(1, r.items.shape[1] + 1, device=device).expand(b, -1) for r in retrieved.values()], 1)
    score = torch.cat([r.scores.float() for r in retrieved.values()], 1)
    valid = items >= NUM_SPECIAL
    # one key per (row, item): sort them, number the distinct ones within each row
    row = torch.arange(b, device=device).unsqueeze(1).expand_as(items)
    big = int(items.max()) + 1 if items.numel() else 1
    key = torch.where(valid, row * big + items, torch.full_like(items, b * big))  # invalid last
    flat_key, order = key.flatten().sort(stable=True)
    uniq, inverse = torch.unique_consecutive(flat_key, return_inverse=True)
    keep = uniq < b * big
    uniq = uniq[keep]
    n_uniq = len(uniq)
    u_row, u_item = uniq // big, uniq % big  # u_row ascending: uniq is sorted
    # per distinct (row, item): features of each source, scattered from the stacked entries
    entry = inverse  # (S * B,) distinct index of each sorted entry; >= n_uniq for invalid ones
    ok = entry < n_uniq
    e_src, e_rank, e_score = source.flatten()[order][ok], rank.flatten()[order][ok], score.flatten()[order][ok]
    e_idx = entry[ok]
    feats = {}
    # priority: the sum of 1 / rank added source by source in the order given, so that every device
    # rounds it alike (an index_add_ on CUDA adds in no fixed order, and float sums depend on it)
    priority = torch.zeros(n_uniq, dtype=torch.float64, device=device)
    for i, n in enumerate(names):
        m = e_src == i
        r = torch.zeros(n_uniq, device=device)
        s = torch.zeros(n_uniq, device=device)
        r[e_idx[m]] = e_rank[m].float()  # a source lists an item once, so no collisions
        s[e_idx[m]] = e_score[m]
        priority += torch.where(r > 0, 1.0 / r.double().clamp(min=1), 0.0)  # ranks are small integers: exact in float32
        feats[f"{n}_rank"], feats[f"{n}_score"] = r, s
    feats["sources"] = torch.zeros(n_uniq, device=device).index_add_(0, e_idx, torch.ones(len(e_idx), device=device))
    # lay the distinct items out per row, by decreasing priority (ties: the lower item id)
    counts = torch.bincount(u_row, minlength=b)
    width = max(int(counts.max()) if n_uniq else 0, 1)
    by = torch.argsort(-priority, stable=True)
    by = by[torch.argsort(u_row[by], stable=True)]  # by row, then by decreasing priority
    starts = torch.cumsum(counts, 0) - counts
    col = torch.arange(n_uniq, device=device) - starts[u_row[by]]
    out_items = torch.zeros(b, width, dtype=torch.long, device=device)
    out_items[u_row[by], col] = u_item[by]
    out_feats = {}
    for name, values in feats.items():
        grid = torch.zeros(b, width, device=device)
        grid[u_row[by], col] = values[by]
        out_feats[name] = grid
    return Candidates(out_items, out_feats)
