"""`Scorer`: the interface of the ranking stage, `RankerRows` (the rows it fits on, read a chunk of
sessions at a time), and the session split for its early stopping.

Shape letters: B sessions, K candidates, F dense features.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from sessrec.metrics.ranks import pessimistic_ranks, rank_values
from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.saved.registry import Configurable


class RankerRows:
    """The candidate rows a scorer fits on, their features read `chunk` sessions at a time.

    What is known of all B sessions at once is small: their `valid` slots, `groups`, the feature
    `names` and `cardinality`; `inputs` builds the features of the sessions asked for, and a
    subclass decides how (`InputRows`: rows of one `RankingInputs`;
    `sessrec.pipeline_training.fitting.FeatureMatrix`: from the features of the valid slots alone, built
    once, so that no grid of all sessions' features exists). `valid_rows` gives the valid slots' dense
    features as one matrix (LightGBM's input).

    Args:
        valid: (B, K) the filled candidate slots.
        groups: (B,) the session each row was cut from (None: every row its own).
        names: the F dense feature names.
        cardinality: the id range of each sparse feature that has a known one.
        chunk: the most sessions one `_build` call is asked for.
    """

    def __init__(self, valid: torch.Tensor, groups: torch.Tensor | None, names: list[str], cardinality: dict[str, int],
                 chunk: int) -> None:
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1 sessions, got {chunk}")
        self.valid, self.groups, self.names, self.cardinality, self.chunk = valid, groups, list(names), dict(cardinality), chunk

    @staticmethod
    def of(rows: RankingInputs | RankerRows) -> RankerRows:
        """`rows` as `RankerRows` (a `RankingInputs` as `InputRows`, in one chunk)."""
        return rows if isinstance(rows, RankerRows) else InputRows(rows)

    def __len__(self) -> int:
        return len(self.valid)

    @property
    def device(self) -> torch.device:
        return self.valid.device

    def inputs(self, rows: torch.Tensor) -> RankingInputs:
        """The `RankingInputs` of sessions `rows` ((R,) int64 indices, in that order), built `chunk` sessions at a time."""
        parts = [self._build(rows[lo : lo + self.chunk]) for lo in range(0, len(rows), self.chunk)]
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        cat = lambda name: torch.cat([getattr(p, name) for p in parts])  # noqa: E731
        return RankingInputs(
            cat("dense"), {n: torch.cat([p.sparse[n] for p in parts]) for n in first.sparse}, cat("valid"), first.names,
            None if first.groups is None else cat("groups"), first.cardinality,
        )

    def valid_rows(self, rows: torch.Tensor) -> np.ndarray:
        """(M_r, F) float32 dense features of the valid slots of sessions `rows` ((R,) indices), row by row in that order."""
        parts = [(part.dense[part.valid]).cpu().numpy() for part in
                 (self._build(rows[lo : lo + self.chunk]) for lo in range(0, len(rows), self.chunk))]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.names)), dtype=np.float32)

    def _build(self, rows: torch.Tensor) -> RankingInputs:
        """The `RankingInputs` of sessions `rows`, at most `chunk` of them."""
        raise NotImplementedError


class InputRows(RankerRows):
    """`RankerRows` of features held whole in one `RankingInputs` (small data, tests).

    Args:
        inputs: the features of all B sessions.
        chunk: the most sessions one `_build` call is asked for (None: all of them).
    """

    def __init__(self, inputs: RankingInputs, chunk: int | None = None) -> None:
        super().__init__(inputs.valid, inputs.groups, inputs.names, inputs.cardinality, chunk or max(1, len(inputs.valid)))
        self.whole = inputs

    def _build(self, rows: torch.Tensor) -> RankingInputs:
        w = self.whole
        rows = rows.to(w.valid.device)
        return RankingInputs(w.dense[rows], {n: v[rows] for n, v in w.sparse.items()}, w.valid[rows], w.names,
                             None if w.groups is None else w.groups[rows], w.cardinality)


def true_positions(mask: torch.Tensor) -> torch.Tensor:
    """(n,) int64 positions of the True entries of `mask` flattened row-major, ascending: numpy's `flatnonzero`
    on the host (a sixth of ``torch.nonzero``'s time at a `RankGauss` block's 32,768 entries, on one thread),
    ``torch.nonzero`` on other devices."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.reshape(-1).nonzero().squeeze(1)


def slot_positions(offsets: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(M_r,) int64 positions of the slots of rows `rows` ((R,) indices, in that order), row i's slots being
    ``offsets[i]:offsets[i + 1]`` of a flat array, row by row.

    Examples:
        >>> slot_positions(torch.tensor([0, 2, 3, 6]), torch.tensor([2, 0])).tolist()
        [3, 4, 5, 0, 1]
    """
    rows = rows.long().to(offsets.device)
    starts, counts = offsets[rows], offsets[rows + 1] - offsets[rows]
    begins = counts.cumsum(0) - counts  # where each row's slots begin in the output
    return torch.repeat_interleave(starts - begins, counts) + torch.arange(int(counts.sum()), device=counts.device)


class Scorer(Configurable):
    """Fit on labelled candidate rows, then score candidate matrices.

    A scorer's constructor arguments are its config (every subclass registers itself and records
    them); the trained ranker is its `state_dict`.
    """

    def fit(self, inputs: RankingInputs | RankerRows, labels: torch.Tensor) -> Scorer:
        """Train on (B, K) 0/1 `labels` (1 = the session's next item); sessions without a positive are skipped.

        Args:
            inputs: the B sessions' features, whole or as `RankerRows` (read a chunk of sessions at a time).
            labels: (B, K) on the device of the inputs' ``valid``.
        """
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


def check_dense(scorer: Scorer, rows: RankerRows) -> None:
    """Refuse, in one line, rows without a dense feature for a `scorer` that reads them (the feature groups
    left build only ids, or nothing)."""
    if not rows.names:
        raise ValueError(
            f"{type(scorer).__name__} reads the dense features and the ranker's rows have none: the feature groups "
            "switched on (features.groups) build none here (ids alone, covisitation without a co-visitation retriever, "
            "time without event times); switch on retrievers, popularity, session, context or encodings"
        )


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

    Examples:
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
    return float(rank_values(pessimistic_ranks(scores, target), f"mrr@{cut}").mean())
