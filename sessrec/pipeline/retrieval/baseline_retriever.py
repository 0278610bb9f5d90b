"""`BaselineRetriever`: candidates from a session-kNN baseline (`VSKNN`, `STAN`) or most-popular.

The baseline scores the catalogue per batch, only the items its neighbours reach
(`SessionBaseline.positive_scores`; see `sessrec.baselines.knn`); the top-K of those are the
candidates (ties: the lower id), and the same entries, kept in the batch's cache, score any other
candidate. Items no neighbour reached score 0 and are never returned as candidates.

Shape letters: B sessions, K candidates, V items, N training sessions, L positions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sessrec.baselines import SessionBaseline
from sessrec.baselines.baseline import time_order
from sessrec.pipeline.candidates import RequestSessions, Retrieved
from sessrec.pipeline.retrieval.retriever import Retriever, lookup_sparse, products_only, top_k_sparse


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
            sessions = sessions[time_order(times, len(sessions))]
        self.sessions = sessions.astype(np.int32)
        self.baseline.fit(self.sessions, num_items)
        return self

    def _scores(self, sessions: RequestSessions) -> tuple[np.ndarray, np.ndarray]:
        """The positive scores of the batch (`SessionBaseline.positive_scores`): keys row * V + item,
        ascending, and float32 values; cached on the batch."""
        key = f"scores:{id(self)}"
        if key not in sessions.cache:
            items = sessions.items
            width = self.sessions.shape[1] if self.sessions is not None else items.shape[1]
            items = items[:, -width:] if items.shape[1] > width else items
            v = self.baseline.num_items
            # the baselines compute on the host, whatever the default device (a device context costs every torch call)
            with contextlib.nullcontext() if torch.get_default_device().type == "cpu" else torch.device("cpu"):
                parts = [self.baseline.positive_scores(items[lo : lo + self.chunk]) for lo in range(0, len(items), self.chunk)]
            keys = np.concatenate([part[0] + i * self.chunk * v for i, part in enumerate(parts)] or [np.zeros(0, np.int64)])
            values = np.concatenate([part[1] for part in parts] or [np.zeros(0, np.float32)])
            sessions.cache[key] = (keys, values)
        return sessions.cache[key]

    def retrieve(self, sessions: RequestSessions, k: int) -> Retrieved:
        v = self.baseline.num_items
        keys, values = products_only(*self._scores(sessions), v, self.products)
        return top_k_sparse(keys, values, len(sessions), v, min(k, v), sessions.items.device)

    def score(self, sessions: RequestSessions, items: torch.Tensor) -> torch.Tensor:
        keys, values = self._scores(sessions)
        cand = items.detach().cpu().long().numpy()
        rows = np.arange(len(cand))[:, None]  # (B, 1): each line of candidates in its session's row
        return torch.from_numpy(lookup_sparse(keys, values, rows, cand, self.baseline.num_items)).to(items.device)

    def state_dict(self) -> dict[str, Any]:
        if self.sessions is None:
            raise RuntimeError("BaselineRetriever is not fitted: nothing to save")
        return {"sessions": self.sessions, "num_items": int(self.baseline.num_items)}

    def load_state_dict(self, state: Mapping[str, Any]) -> BaselineRetriever:
        return self.fit(np.asarray(state["sessions"]), int(state["num_items"]))
