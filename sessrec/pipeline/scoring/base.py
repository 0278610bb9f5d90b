"""`Scorer`: the interface of the ranking stage, and the session split for its early stopping.

Shape letters: B sessions, K candidates, F dense features.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sessrec.pipeline.features import RankingInputs


class Scorer:
    """Fit on labelled candidate rows, then score candidate matrices."""

    def fit(self, inputs: RankingInputs, labels: torch.Tensor) -> Scorer:
        """Train on (B, K) 0/1 `labels` (1 = the session's next item); sessions without a positive are skipped."""
        raise NotImplementedError

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        """(B, K) float32 scores, -inf at empty slots."""
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        raise NotImplementedError

    @classmethod
    def from_state(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> Scorer:
        raise NotImplementedError


def early_stopping_split(labels: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows (sessions) to train on and to stop on: sessions with a positive, split at random by session.

    Returns:
        (train rows, stop rows), int64 indices into the B sessions.
    """
    rows = torch.nonzero(labels.sum(dim=1) > 0).squeeze(1)
    if len(rows) < 2:
        raise ValueError(
            f"the ranker needs sessions whose next item is among the candidates; found {len(rows)} of {len(labels)}"
        )
    perm = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))]
    n_stop = max(1, int(len(rows) * fraction))
    return perm[n_stop:].sort().values, perm[:n_stop].sort().values


def mrr_of(scores: torch.Tensor, labels: torch.Tensor, cut: int = 20) -> float:
    """Mean reciprocal rank (within `cut`) of the positive of each row, pessimistic on ties."""
    target = torch.where(labels > 0.5, scores, torch.full_like(scores, float("-inf"))).amax(dim=1, keepdim=True)
    rank = (scores >= target).sum(dim=1).double()
    return float(torch.where(rank <= cut, 1.0 / rank, torch.zeros_like(rank)).mean())
