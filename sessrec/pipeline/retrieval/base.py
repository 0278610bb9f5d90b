"""`Retriever`: the interface of the first stage.

A retriever returns each session's top-K items from the whole catalogue (`retrieve`) and can
score any given candidates (`score`), so that every retriever's opinion of every merged
candidate becomes a ranking feature, not only of the items it retrieved itself.

Saving: `state` gives JSON-able settings and named numpy arrays; `from_state` rebuilds the
retriever from them (no pickled code). Shape letters: B sessions, K candidates, V items.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sessrec.pipeline.candidates import Retrieved, Sessions


class Retriever:
    """Base class of the retrievers; subclasses implement `retrieve`, `score`, `state` and `from_state`."""

    def retrieve(self, sessions: Sessions, k: int) -> Retrieved:
        """Top-`k` recommendable items (B, k) per session, best first, with their scores."""
        raise NotImplementedError

    def score(self, sessions: Sessions, items: torch.Tensor) -> torch.Tensor:
        """(B, K) float32 scores of the candidates `items` (B, K); any value at empty slots (id 0)."""
        raise NotImplementedError

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able settings, named arrays) from which `from_state` rebuilds this retriever."""
        raise NotImplementedError

    @classmethod
    def from_state(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> Retriever:
        raise NotImplementedError


def top_k_dense(scores: torch.Tensor, k: int) -> Retrieved:
    """Top-`k` of a (B, V) score matrix; entries at -inf (never recommendable) come back as id 0."""
    k = min(k, scores.shape[1])
    top = scores.topk(k, dim=1)
    items = torch.where(torch.isfinite(top.values), top.indices, torch.zeros_like(top.indices))
    return Retrieved(items=items, scores=top.values.float())
