"""Causal item modelling (CLM): every position predicts the item that follows it.

GPT-2's and SASRec's objective: one pass trains all next-item transitions of a session (with
``last_only``, the last one only: with the data module's ``train_prefixes``, every prefix of a session
is a row and trains on its next item once, the training pairs of S3-Rec's and BSARec's code). Needs a
causal encoder (position i sees positions <= i only), so no input is hidden. At evaluation the
hidden state of the last observed item is read; the right-aligned batch puts it in the last column.

Shape letters: B batch, L sequence, D width, N targets in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from sessrec.models.objective import Features, MaskingResult, Network, Objective, latest, targetable
from sessrec.saved.registry import check_switches


@dataclass
class CausalLanguageModeling(Objective):
    """Next-item prediction at every position of a causal encoder.

    Position i is read when it holds a real item (OOV and virtual items included) and the item at
    i + 1 is targetable (a known product, see `targetable`); the target is that item, so the
    targets are the session shifted left by one. Every session with two or more items, the second
    of them targetable, has a target. Nothing is masked.

    Args:
        last_only: read only the transition to each row's last item (the right-aligned rows' second to
            last column); a row whose last item is not targetable trains nothing.

    Examples:
        >>> m = CausalLanguageModeling()(torch.tensor([[0, 4, 1, 6]]))
        >>> m.read.tolist(), m.targets.tolist()
        ([[False, False, True, False]], [6])
        >>> CausalLanguageModeling()(torch.tensor([[0, 4, 5, 6]])).targets.tolist()
        [5, 6]
        >>> CausalLanguageModeling(last_only=True)(torch.tensor([[0, 4, 5, 6], [0, 4, 6, 1]])).targets.tolist()
        [6]
    """

    needs_causal: ClassVar[bool] = True
    last_only: bool = False

    def __post_init__(self) -> None:
        check_switches({"last_only": self.last_only}, "CausalLanguageModeling ")

    def mask(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> MaskingResult:
        read = torch.zeros_like(items, dtype=torch.bool)
        read[:, :-1] = (items[:, :-1] != 0) & targetable(items[:, 1:], recommendable)
        if self.last_only:
            read[:, :-2] = False
        return MaskingResult(
            inputs=items,
            masked=torch.zeros_like(read),
            read=read,
            targets=items[:, 1:][read[:, :-1]],
        )

    def next_item_hidden(self, model: Network, items: torch.Tensor, features: Features | None = None) -> torch.Tensor:
        """(B, L) observed sessions -> (B, D): the state at the last item, which has seen them all."""
        inputs, features = latest(items, features, model.max_length)
        return model.encode(inputs, torch.zeros_like(inputs, dtype=torch.bool), features)[:, -1]
