"""`BaselineRetriever`: candidates from a session-kNN baseline (`VSKNN`, `STAN`) or most-popular.

The baseline scores the whole catalogue per batch (sparse products over the training sessions,
see `sessrec.baselines.knn`); the top-K are the candidates, and the same score row, kept in the
batch's cache, scores any other candidate. Items no neighbour reached score 0 and are never
returned as candidates.

Shape letters: B sessions, K candidates, V items, N training sessions, L positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sessrec.baselines import SessionBaseline
from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.pipeline.retrieval.retriever import Retriever, top_k_dense


class BaselineRetriever(Retriever):
    """Wrap a `SessionBaseline`, fitted here on the training sessions.

    Its state is the training sessions (time-ordered, as fitted) and ``num_items``: loading
    fits the baseline on them again.

    Args:
        baseline: an unfitted (or fitted) baseline, e.g. ``VSKNN(k=100, sample_size=1000)``.
        chunk: sessions scored at once (bounds the (chunk, V) score matrix).
    """

    def __init__(self, baseline: SessionBaseline, chunk: int = 512) -> None:
        self.baseline, self.chunk = baseline, chunk
        self.sessions: np.ndarray | None = None

    def fit(self, sessions: np.ndarray | torch.Tensor, num_items: int, times: np.ndarray | None = None) -> BaselineRetriever:
        """Fit on (N, L) right-aligned training sessions; `times` (N,) puts them in time order first."""
        sessions = np.asarray(sessions.numpy() if isinstance(sessions, torch.Tensor) else sessions)
        if times is not None:
            sessions = sessions[np.argsort(np.asarray(times), kind="stable")]
        self.sessions = sessions.astype(np.int32)
        self.baseline.fit(self.sessions, num_items)
        return self

    def _scores(self, sessions: RequestSessions) -> torch.Tensor:
        """(B, V) scores on the sessions' device, 0 = not reached, cached on the batch."""
        key = f"scores:{id(self)}"
        if key not in sessions.cache:
            items = sessions.items
            width = self.sessions.shape[1] if self.sessions is not None else items.shape[1]
            items = items[:, -width:] if items.shape[1] > width else items
            # the baselines compute on the host, whatever the default device (a device context costs every torch call)
            with contextlib.nullcontext() if torch.get_default_device().type == "cpu" else torch.device("cpu"):
                parts = [self.baseline.score(items[lo : lo + self.chunk]) for lo in range(0, len(items), self.chunk)]
                scores = torch.cat(parts) if parts else torch.zeros(0, self.baseline.num_items)
            sessions.cache[key] = scores.to(items.device)
        return sessions.cache[key]

    def retrieve(self, sessions: RequestSessions, k: int) -> Retrieved:
        scores = self._scores(sessions)
        reached = torch.where(scores > 0, scores, torch.full_like(scores, float("-inf")))
        return top_k_dense(reached, k)

    def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
        scores = self._scores(sessions).gather(1, items.long())
        return torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))

    def state_dict(self) -> dict[str, Any]:
        if self.sessions is None:
            raise RuntimeError("BaselineRetriever is not fitted: nothing to save")
        return {"sessions": self.sessions, "num_items": int(self.baseline.num_items)}

    def load_state_dict(self, state: Mapping[str, Any]) -> BaselineRetriever:
        return self.fit(np.asarray(state["sessions"]), int(state["num_items"]))
