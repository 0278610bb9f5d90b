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

import torch

from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.saved.registry import Configurable


class Retriever(Configurable):
    """Base class of the retrievers; subclasses implement `retrieve`, `score`, `state_dict` and `load_state_dict`."""

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


def top_k_dense(scores: torch.Tensor, k: int) -> Retrieved:
    """Top-`k` of a (B, V) score matrix; entries at -inf (never recommendable) come back as id 0."""
    k = min(k, scores.shape[1])
    top = scores.topk(k, dim=1)
    items = torch.where(torch.isfinite(top.values), top.indices, torch.zeros_like(top.indices))
    return Retrieved(items=items, scores=top.values.float())
