"""`EvalPairs`: the (prefix, target) pairs of an evaluation split, with the session of each pair.

Shape letters: N pairs, L padded length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class EvalPairs:
    """(prefix, target) pairs, each tied to the session it was cut from.

    Args:
        items: (N, L) model item ids of the prefixes, right-aligned (0 = padding on the left).
        targets: (N,) model id of the item that follows each prefix.
        sessions: (N,) int64 index of each pair's session within its split: the pairs of one
            session share it (``all_prefixes`` cuts several pairs from one session).
        times: (N, L) float64 event times of the prefixes in seconds since the epoch, aligned
            with `items` (0 on padding); None when the source has no timestamps.

    Examples:
        >>> pairs = EvalPairs(torch.tensor([[0, 4], [4, 5]]), torch.tensor([5, 6]), torch.tensor([0, 0]))
        >>> len(pairs), pairs.take(torch.tensor([1])).items.tolist()
        (2, [[4, 5]])
    """

    items: torch.Tensor
    targets: torch.Tensor
    sessions: torch.Tensor
    times: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.items.dim() != 2:
            raise ValueError(f"EvalPairs.items must be (N, L), got shape {tuple(self.items.shape)}")
        n = self.items.shape[0]
        for name in ("targets", "sessions"):
            value = getattr(self, name)
            if value.shape != (n,):
                raise ValueError(f"EvalPairs.{name} has shape {tuple(value.shape)}, expected ({n},) like the items")
        if self.times is not None and self.times.shape != self.items.shape:
            raise ValueError(f"EvalPairs.times has shape {tuple(self.times.shape)}, items {tuple(self.items.shape)}")

    def __len__(self) -> int:
        return self.items.shape[0]

    def take(self, rows: torch.Tensor | slice) -> EvalPairs:
        """The pairs at `rows` (an index tensor or a slice), in that order."""
        return EvalPairs(
            self.items[rows], self.targets[rows], self.sessions[rows], None if self.times is None else self.times[rows]
        )
