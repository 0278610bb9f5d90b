"""`BaselineRetriever`: candidates from a session-kNN baseline (`VSKNN`, `STAN`) or most-popular.

The baseline scores the whole catalogue per batch (sparse products over the training sessions,
see `sessrec.baselines.knn`); the top-K are the candidates, and the same score row, kept in the
batch's cache, scores any other candidate. Items no neighbour reached score 0 and are never
returned as candidates.

Shape letters: B sessions, K candidates, V items, N training sessions, L positions.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from sessrec.baselines import SessionBaseline
from sessrec.pipeline.candidates import Retrieved, Sessions
from sessrec.pipeline.retrieval.base import Retriever, top_k_dense
from sessrec.saved.registry import instantiate, register


def baseline_config(baseline: SessionBaseline) -> dict[str, Any]:
    """``class_path`` and constructor arguments of a baseline (each kept as an attribute of that name)."""
    params = [p for p in inspect.signature(type(baseline).__init__).parameters if p != "self"]
    cls = type(baseline)
    return {"class_path": f"sessrec.baselines.{cls.__name__}", "init_args": {p: getattr(baseline, p) for p in params}}


def build_baseline(config: Any, source: str = "the retriever's config", key: str = "baseline") -> SessionBaseline:
    """The baseline a `baseline_config` describes: a registered `SessionBaseline` (`sessrec.saved.registry`)."""
    return instantiate(config, expected=SessionBaseline, source=source, key=key)


@register
class BaselineRetriever(Retriever):
    """Wrap a `SessionBaseline`, fitted here on the training sessions.

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

    def _scores(self, sessions: Sessions) -> torch.Tensor:
        """(B, V) scores, 0 = not reached, cached on the batch."""
        key = f"scores:{id(self)}"
        if key not in sessions.cache:
            items = sessions.items
            width = self.sessions.shape[1] if self.sessions is not None else items.shape[1]
            items = items[:, -width:] if items.shape[1] > width else items
            parts = [self.baseline.score(items[lo : lo + self.chunk]) for lo in range(0, len(items), self.chunk)]
            sessions.cache[key] = torch.cat(parts) if parts else torch.zeros(0, self.baseline.num_items)
        return sessions.cache[key]

    def retrieve(self, sessions: Sessions, k: int) -> Retrieved:
        scores = self._scores(sessions)
        reached = torch.where(scores > 0, scores, torch.full_like(scores, float("-inf")))
        return top_k_dense(reached, k)

    def score(self, sessions: Sessions, items: torch.Tensor) -> torch.Tensor:
        scores = self._scores(sessions).gather(1, items.long())
        return torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))

    def state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if self.sessions is None:
            raise RuntimeError("BaselineRetriever is not fitted: nothing to save")
        config = {"baseline": baseline_config(self.baseline), "num_items": self.baseline.num_items, "chunk": self.chunk}
        return config, {"sessions": self.sessions}

    @classmethod
    def from_state(cls, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> BaselineRetriever:
        retriever = cls(build_baseline(config["baseline"]), chunk=int(config.get("chunk", 512)))
        return retriever.fit(arrays["sessions"], int(config["num_items"]))
