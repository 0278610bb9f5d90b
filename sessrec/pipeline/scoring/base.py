"""`Scorer`: the interface of the ranking stage, and the session split for its early stopping.

Shape letters: B sessions, K candidates, F dense features.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from sessrec.pipeline.features import RankingInputs
from sessrec.saved.registry import Configurable


class Scorer(Configurable):
    """Fit on labelled candidate rows, then score candidate matrices.

    A scorer's constructor arguments are its config (every subclass registers itself and records
    them); the trained ranker is its `state_dict`.
    """

    def fit(self, inputs: RankingInputs, labels: torch.Tensor) -> Scorer:
        """Train on (B, K) 0/1 `labels` (1 = the session's next item); sessions without a positive are skipped."""
        raise NotImplementedError

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        """(B, K) float32 scores, -inf at empty slots."""
        raise NotImplementedError

    def to(self, device: torch.device | str) -> Scorer:
        """Keep the tensors the scorer computes with on `device` (none by default: it scores on the
        host and returns its scores on the inputs' device); returns self."""
        return self

    def state_dict(self) -> dict[str, Any]:
        """The trained ranker: named numpy arrays (nested dicts allowed) and small JSON-able values."""
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> Scorer:
        """Take the trained ranker of a `state_dict` of a scorer of the same config; returns self."""
        raise NotImplementedError


def early_stopping_split(
    labels: torch.Tensor, fraction: float, seed: int, groups: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows to train on and to stop on: the rows with a positive, split at random by session.

    Args:
        labels: (B, K) 0/1 labels of the B rows.
        fraction: share of the sessions held out to stop on (at least one).
        seed: seed of the split.
        groups: (B,) the session each row was cut from: all the rows of a session fall on the same
            side (the prefixes of one session share items and targets); None: every row its own.

    Returns:
        (train rows, stop rows), int64 indices into the B rows, each sorted.

    Example:
        >>> labels = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1]])
        >>> train, stop = early_stopping_split(labels, 0.5, seed=0, groups=torch.tensor([7, 7, 9, 9]))
        >>> sorted(map(tuple, (train.tolist(), stop.tolist())))
        [(0, 1), (2, 3)]
    """
    rows = torch.nonzero(labels.sum(dim=1) > 0).squeeze(1)
    if groups is None:
        if len(rows) < 2:
            raise ValueError(
                f"the ranker needs sessions whose next item is among the candidates; found {len(rows)} of {len(labels)}"
            )
        perm = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).to(rows.device)]
        n_stop = max(1, int(len(rows) * fraction))
        return perm[n_stop:].sort().values, perm[:n_stop].sort().values
    if groups.shape != labels.shape[:1]:
        raise ValueError(f"groups has shape {tuple(groups.shape)}, expected ({labels.shape[0]},): one session per row")
    sessions, member = torch.unique(groups[rows], return_inverse=True)  # member: (R,) session of each row
    if len(sessions) < 2:
        raise ValueError(
            f"the ranker needs two or more sessions whose next item is among the candidates; found {len(sessions)} "
            f"({len(rows)} of {len(labels)} rows)"
        )
    perm = torch.randperm(len(sessions), generator=torch.Generator().manual_seed(seed))
    held = torch.zeros(len(sessions), dtype=torch.bool, device=groups.device)
    held[perm[: max(1, int(len(sessions) * fraction))].to(groups.device)] = True
    stop = held[member]
    return rows[~stop], rows[stop]


def mrr_of(scores: torch.Tensor, labels: torch.Tensor, cut: int = 20) -> float:
    """Mean reciprocal rank (within `cut`) of the positive of each row, pessimistic on ties."""
    target = torch.where(labels > 0.5, scores, torch.full_like(scores, float("-inf"))).amax(dim=1, keepdim=True)
    rank = (scores >= target).sum(dim=1).double()
    return float(torch.where(rank <= cut, 1.0 / rank, torch.zeros_like(rank)).mean())
