"""Most-popular: every prefix gets the same scores, the items' counts in the training sessions.

Shape letters: B prefixes, L positions, V items.

Examples:
    >>> import torch
    >>> pop = Popularity().fit(torch.tensor([[0, 2, 3], [3, 3, 4]]), num_items=5)
    >>> pop.score(torch.tensor([[0, 0, 2]])).tolist()
    [[-inf, -inf, 1.0, 3.0, 1.0]]
"""

from __future__ import annotations

import numpy as np
import torch

from sessrec.baselines.baseline import SessionBaseline
from sessrec.data.vocab import NUM_SPECIAL


class Popularity(SessionBaseline):
    """Score = how often the item occurs in the training sessions (independent of the prefix).

    Args:
        per_session: count each item at most once per session (sessions containing it) instead
            of every event.
    """

    def __init__(self, per_session: bool = False) -> None:
        self.per_session = per_session
        self.counts: torch.Tensor | None = None

    def _fit(self, sessions: np.ndarray) -> None:
        if self.per_session:
            rows, cols = np.nonzero(sessions >= NUM_SPECIAL)
            keys = np.unique(rows * self.num_items + sessions[rows, cols])
            items = keys % self.num_items
        else:
            items = sessions[sessions >= NUM_SPECIAL]
        counts = np.bincount(items, minlength=self.num_items).astype(np.float32)
        self.counts = torch.from_numpy(counts)  # (V,)

    def _score(self, prefixes: np.ndarray) -> torch.Tensor:
        return self.counts.expand(len(prefixes), -1).clone()  # (B, V)
