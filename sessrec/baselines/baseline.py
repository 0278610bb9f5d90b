"""`SessionBaseline`: the interface of the non-neural next-item baselines.

A baseline is fitted on the training sessions and scores a batch of evaluation prefixes over
the whole catalogue, exactly like a neural model's head: one (B, V) tensor per batch, with
padding and OOV at -inf, ranked by the same `sessrec.metrics.TopKMetrics`. It sees only
the prefix tensor, never a target.

Shape letters: N training sessions, B prefixes, L positions, V items (score vector size).
"""

from __future__ import annotations

import numpy as np
import torch

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.saved.registry import Configurable


def time_order(times: np.ndarray, count: int) -> np.ndarray:
    """The (N,) order that puts `count` training sessions in the order of their (N,) `times`, ties kept in place; times
    of another shape, or one that is no finite number (NaN would sort last: the most recent session), are a ValueError."""
    times = np.asarray(times)
    if times.shape != (count,):
        raise ValueError(f"times must hold one value per training session, got shape {times.shape} for {count} sessions")
    bad = np.flatnonzero(~np.isfinite(times.astype(np.float64)))
    if len(bad):
        raise ValueError(f"times: session {int(bad[0])} has time {times[bad[0]]}, not a finite number")
    return np.argsort(times, kind="stable")


class SessionBaseline(Configurable):
    """Base class: `fit` on right-aligned training sessions, then `score` prefixes.

    Every subclass registers itself and records its constructor arguments (`Configurable`), so a
    saved pipeline names a baseline by its config and rebuilds it.

    Subclasses implement `_fit`, and `_score` (dense) or `_positive_scores` (the positive entries
    only, which a retriever reads without a (B, V) matrix); each has a default from the other. This
    class checks the inputs and masks the special ids. Scores of items that a baseline does not reach are 0, so they tie with each
    other; `TopKMetrics` ranks ties pessimistically (the target is placed after every item
    scoring at least as high), which never flatters a baseline.
    """

    num_items: int = 0

    @property
    def fitted(self) -> bool:
        return self.num_items > 0

    def fit(
        self, sessions: torch.Tensor | np.ndarray, num_items: int, times: np.ndarray | None = None
    ) -> SessionBaseline:
        """Fit on training sessions (N, L), right-aligned, 0 = padding, 1 = OOV.

        Args:
            sessions: (N, L) model item ids of whole training sessions.
            num_items: score vector size V (items + padding + OOV), ``SessionDataModule.num_items``.
            times: (N,) time of each session (e.g. of its last event): the sessions are put in
                this order (stable) first, so that row order is time order. None: the rows are
                already in time order (the SR-GNN files, which carry no timestamps).

        Returns:
            self, fitted.
        """
        if num_items <= NUM_SPECIAL:
            raise ValueError(f"num_items must count padding, OOV and at least one item; got {num_items}")
        items = _as_ids(sessions, num_items, "training sessions")
        if times is not None:
            items = items[time_order(times, len(items))]
        self.num_items = int(num_items)
        self._fit(items)
        return self

    def score(self, prefixes: torch.Tensor | np.ndarray) -> torch.Tensor:
        """Next-item scores (B, V) float32 for right-aligned prefixes (B, L); padding/OOV are -inf."""
        if not self.fitted:
            raise RuntimeError(
                f"{type(self).__name__} is not fitted: call fit(training_sessions, num_items) first"
            )
        items = _as_ids(prefixes, self.num_items, "prefixes")
        scores = self._score(items)
        assert scores.shape == (len(items), self.num_items), scores.shape
        scores[:, :NUM_SPECIAL] = float("-inf")
        return scores

    __call__ = score

    def positive_scores(self, prefixes: torch.Tensor | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The positive entries of `score` (B, V): ``keys`` row * V + item, ascending, and their float32
        scores; every other entry scores 0 (not reached) or -inf (a special id)."""
        if not self.fitted:
            raise RuntimeError(
                f"{type(self).__name__} is not fitted: call fit(training_sessions, num_items) first"
            )
        return self._positive_scores(_as_ids(prefixes, self.num_items, "prefixes"))

    def _fit(self, sessions: np.ndarray) -> None:
        raise NotImplementedError

    def _score(self, prefixes: np.ndarray) -> torch.Tensor:
        """(B, V) float32 scores, writable; the special columns are overwritten by `score`. By default
        the entries of `_positive_scores`, 0 elsewhere."""
        if type(self)._positive_scores is SessionBaseline._positive_scores:
            raise NotImplementedError(f"{type(self).__name__} implements neither _score nor _positive_scores")
        keys, values = self._positive_scores(prefixes)
        scores = np.zeros(len(prefixes) * self.num_items, dtype=np.float32)
        scores[keys] = values
        return torch.from_numpy(scores.reshape(len(prefixes), self.num_items))

    def _positive_scores(self, prefixes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`positive_scores` of checked prefixes; by default read off `_score`'s dense matrix."""
        scores = self._score(prefixes)
        scores[:, :NUM_SPECIAL] = float("-inf")
        flat = scores.flatten().numpy()
        keys = np.flatnonzero(flat > 0)
        return keys, flat[keys]


def _as_ids(items: torch.Tensor | np.ndarray, num_items: int, what: str) -> np.ndarray:
    """(N, L) int64 numpy ids, checked: 2-d, ids in [0, num_items), right-aligned."""
    if isinstance(items, torch.Tensor):
        items = items.detach().cpu().numpy()
    items = np.asarray(items)
    if items.ndim != 2:
        raise ValueError(f"{what} must be a (rows, length) matrix of item ids, got shape {items.shape}")
    if not np.issubdtype(items.dtype, np.integer):
        raise TypeError(f"{what} must hold integer item ids, got dtype {items.dtype}")
    items = items.astype(np.int64, copy=False)
    if items.size and (items.min() < 0 or items.max() >= num_items):
        raise ValueError(
            f"{what} hold ids outside [0, {num_items}): min {items.min()}, max {items.max()}; "
            "were they encoded with the vocabulary the baseline was fitted with?"
        )
    real = items != 0
    if items.shape[1] > 1 and (real[:, :-1] & ~real[:, 1:]).any():
        raise ValueError(f"{what} must be right-aligned: padding (0) only on the left of each row")
    return items
