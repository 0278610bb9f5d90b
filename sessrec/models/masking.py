"""Masked item modelling (MLM): which positions of a session become training targets.

Shape letters: B batch, L sequence, N masked positions in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sessrec.data.vocab import NUM_SPECIAL


@dataclass
class MaskingResult:
    """Inputs for the encoder and the targets to predict.

    Args:
        inputs: (B, L) item ids with masked positions set to 0: a masked item never reaches the model.
        masked: (B, L) bool, positions replaced by the [MASK] embedding.
        targets: (N,) item ids at the masked positions, in row-major order of `masked`.
    """

    inputs: torch.Tensor
    masked: torch.Tensor
    targets: torch.Tensor


@dataclass
class MaskedItemModeling:
    """Random masking with at least one target per session.

    Each real, in-vocabulary item is masked with probability `mask_prob`. With probability
    `last_item_prob` a session instead has only its last item masked, the exact shape of the
    evaluation task (a [MASK] after the observed items). A session that drew no mask gets one
    at a random eligible position. Padding and OOV items are never targets.

    Args:
        mask_prob: per-item masking probability.
        last_item_prob: share of sessions trained on next-item prediction at the end.
    """

    mask_prob: float = 0.2
    last_item_prob: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {self.mask_prob}")
        if not 0.0 <= self.last_item_prob <= 1.0:
            raise ValueError(f"last_item_prob must be in [0, 1], got {self.last_item_prob}")

    def __call__(self, items: torch.Tensor, generator: torch.Generator | None = None) -> MaskingResult:
        eligible = items >= NUM_SPECIAL  # (B, L)
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
        return MaskingResult(inputs=items.masked_fill(masked, 0), masked=masked, targets=items[masked])
