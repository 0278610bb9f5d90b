"""Masked item modelling (MLM): random items are hidden behind [MASK] and predicted from both sides.

BERT4Rec's objective. Needs a bidirectional encoder. At evaluation a [MASK] slot is appended
after the last item and read (`Objective.next_item_hidden`).

Shape letters: B batch, L sequence, N masked positions in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from sessrec.models.objective import MaskingResult, Objective, realign, targetable
from sessrec.saved.registry import check_probabilities


@dataclass
class MaskedItemModeling(Objective):
    """Random masking with at least one target per session.

    Each real, in-vocabulary item is masked with probability `mask_prob`. With probability
    `last_item_prob` a session instead has only its last item masked, the exact shape of the
    evaluation task (a [MASK] after the observed items). A session that drew no mask gets one
    at a random eligible position. Only targetable items are masked: never padding, OOV or a
    virtual item (see `targetable`).

    Args:
        mask_prob: per-item masking probability.
        last_item_prob: share of sessions trained on next-item prediction at the end.
        prefix_prob: share of sessions first cut to a random prefix (at least two items, kept
            right-aligned), before masking. The SR-GNN protocol scores every prefix of a test
            session; this shows the model such prefixes on the fly, without expanding the
            training data into all of them.

    Examples:
        >>> items = torch.tensor([[0, 4, 5, 6]])
        >>> m = MaskedItemModeling(mask_prob=0.5)(items, torch.Generator().manual_seed(0))
        >>> torch.equal(m.targets, items[m.masked]) and bool((m.inputs[m.masked] == 0).all())
        True
    """

    needs_causal: ClassVar[bool] = False

    mask_prob: float = 0.2
    last_item_prob: float = 0.1
    prefix_prob: float = 0.0

    def __post_init__(self) -> None:
        check_probabilities({"mask_prob": self.mask_prob}, "MaskedItemModeling ", zero=False, one=True)
        check_probabilities({"last_item_prob": self.last_item_prob, "prefix_prob": self.prefix_prob},
                            "MaskedItemModeling ", one=True)

    def check(self, encoder: nn.Module) -> None:
        """`Objective.check`, and refuse to train on sessions whose every item is hidden (``mask_prob`` 1 with
        ``last_item_prob`` 0): the encoder would read no item. (PLM chooses its targets with those settings
        and keeps context itself.)"""
        super().check(encoder)
        if self.mask_prob == 1.0 and self.last_item_prob == 0.0:
            raise ValueError("MaskedItemModeling mask_prob 1 with last_item_prob 0 hides every item of every session: "
                             "the model would read no item; lower mask_prob (e.g. 0.2) or raise last_item_prob")

    def prefix_source(self, items: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(B, L) column of `items` that each column of the cut sessions holds (< 0 = padding), for `realign`.

        A `prefix_prob` share of the sessions of n >= 3 items keeps its first k items, k uniform
        in [2, n - 1], shifted right so that they end in the last column; the dropped items never
        reach the model.
        """
        b, width = items.shape
        lengths = (items != 0).sum(dim=1)  # (B,)
        keep = torch.rand(b, generator=generator, device=items.device) * (lengths - 2).clamp(min=0).float()
        keep = (keep.long() + 2).minimum(lengths)  # uniform in [2, n - 1] for n >= 3
        cut = (torch.rand(b, generator=generator, device=items.device) < self.prefix_prob) & (lengths >= 3)
        shift = torch.where(cut, lengths - keep, torch.zeros_like(lengths))  # (B,)
        return torch.arange(width, device=items.device)[None, :] - shift[:, None]  # (B, L)

    def select(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) sessions -> (B, L) bool positions to hide; also used by PLM and RTD."""
        eligible = targetable(items, recommendable)  # (B, L)
        rand = torch.rand(items.shape, generator=generator, device=items.device)
        masked = eligible & (rand < self.mask_prob)

        # sessions trained on "predict the last item": right-aligned, so the last column
        last_only = torch.rand(items.shape[0], generator=generator, device=items.device) < self.last_item_prob
        last_only &= eligible[:, -1]
        masked[last_only] = False
        masked[last_only, -1] = True

        # at least one target per session that has an eligible item: the eligible position
        # with the smallest random draw
        none = ~masked.any(dim=1) & eligible.any(dim=1)
        if none.any():
            pick = rand.masked_fill(~eligible, 2.0).argmin(dim=1)
            masked[none, pick[none]] = True
        return masked

    def mask(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> MaskingResult:
        source = None
        if self.prefix_prob > 0.0:
            source = self.prefix_source(items, generator)
            items = realign(items, source)
        masked = self.select(items, generator, recommendable)
        return MaskingResult(
            inputs=items.masked_fill(masked, 0), masked=masked, read=masked, targets=items[masked], source=source
        )
