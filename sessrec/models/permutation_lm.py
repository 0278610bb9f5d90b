"""Permutation item modelling (PLM): XLNet's two-stream objective.

A random factorization order is drawn per session: the context (non-target) items come first and
see each other in both directions; the targets follow in a random order, and each target sees the
context plus the targets before it in that order, never itself. XLNet's query stream carries the
position of the target but not its content, so no [MASK] token is needed and the targets stay in
the inputs (the content stream needs them for the targets that come later). Needs XLNetEncoder.

At evaluation a slot is appended after the last item that nothing attends to, and the query
stream is read there: it sees every observed item, and the next item is not among them.

Shape letters: B batch, L sequence, D width, P most targets of one session, N targets in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from sessrec.models.masking import MaskedItemModeling
from sessrec.models.objective import Features, MaskingResult, Network, Objective, ObjectiveOutput, append_slot
from sessrec.saved.registry import check_probabilities


@dataclass
class PermutationResult(MaskingResult):
    """`MaskingResult` plus XLNet's attention pattern.

    Args:
        perm_mask: (B, L, L) float, 1 where position i may not attend to position j.
        target_mapping: (B, P, L) float one-hot rows: the k-th target of a session sits at the
            position of its k-th `read` column; rows past a session's target count are zero.
        valid: (B, P) bool, the rows of `target_mapping` that hold a target.
    """

    perm_mask: torch.Tensor | None = None
    target_mapping: torch.Tensor | None = None
    valid: torch.Tensor | None = None


@dataclass
class PermutationLanguageModeling(Objective):
    """Partial prediction over a random factorization order (Yang et al., XLNet, 2019).

    Args:
        target_prob: per-item probability of being a target (XLNet's 1/K).
        last_item_prob: share of sessions whose only target is the last item (the evaluation shape).
            Targets are chosen as `MaskedItemModeling` chooses masked items (padding, OOV and
            virtual items never), except that at least one item of a session stays context: when
            every item was chosen the earliest is not a target, and a one-item session has none.
    """

    needs_causal: ClassVar[bool] = False
    needs_two_stream: ClassVar[bool] = True

    target_prob: float = 0.2
    last_item_prob: float = 0.1

    def __post_init__(self) -> None:
        check_probabilities({"target_prob": self.target_prob}, "PermutationLanguageModeling ", zero=False, one=True)
        check_probabilities({"last_item_prob": self.last_item_prob}, "PermutationLanguageModeling ", one=True)

    def mask(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> PermutationResult:
        choose = MaskedItemModeling(mask_prob=self.target_prob, last_item_prob=self.last_item_prob)
        target = choose.select(items, generator, recommendable)  # (B, L)
        # The first target of the order sees only the context. Without any, its query stream
        # would attend to nothing, and XLNet's attention (scores minus 1e30 at every masked key)
        # then spreads evenly over all keys, its own content among them: the target leaks. So a
        # session keeps at least one context item; a one-item session has no target.
        no_context = ~((items != 0) & ~target).any(dim=1, keepdim=True)  # (B, 1)
        target = target & ~(no_context & (target.cumsum(dim=1) == 1))
        # order: every context item first (rank 0), then the targets in a random order (ranks in (1, 2))
        rank = torch.where(target, 1.0 + torch.rand(items.shape, generator=generator, device=items.device), 0.0)
        # i may attend to j unless j is a target that does not come strictly before i (so never itself)
        perm_mask = target[:, None, :] & (rank[:, None, :] >= rank[:, :, None])  # (B, L, L)

        counts = target.sum(dim=1)  # (B,)
        p = max(int(counts.max()), 1)
        valid = torch.arange(p, device=items.device) < counts[:, None]  # (B, P)
        slot = (target.cumsum(dim=1) - 1).clamp(min=0)  # (B, L) row of target_mapping for each target
        target_mapping = items.new_zeros(items.shape[0], p, items.shape[1], dtype=torch.float)
        b, pos = target.nonzero(as_tuple=True)
        target_mapping[b, slot[b, pos], pos] = 1.0
        return PermutationResult(
            inputs=items,
            masked=torch.zeros_like(target),
            read=target,
            targets=items[target],
            perm_mask=perm_mask.float(),
            target_mapping=target_mapping,
            valid=valid,
        )

    def training_output(
        self,
        model: Network,
        items: torch.Tensor,
        generator: torch.Generator | None = None,
        features: Features | None = None,
    ) -> ObjectiveOutput:
        self.check_training(model, items)
        m = self.mask(items, generator, model.recommendable)
        # the targets stay inputs of the content stream: the look-ahead features before them are hidden
        query = model.encode(
            m.inputs, m.masked, features, predicted=m.read, perm_mask=m.perm_mask, target_mapping=m.target_mapping
        )  # (B, P, D)
        return ObjectiveOutput(hidden=query[m.valid], targets=m.targets)

    def next_item_hidden(self, model: Network, items: torch.Tensor, features: Features | None = None) -> torch.Tensor:
        """(B, L) observed sessions -> (B, D): the query stream at an appended, unseen slot."""
        inputs, features = append_slot(items, features, model.max_length)
        b, length = inputs.shape
        perm_mask = inputs.new_zeros(b, length, length, dtype=torch.float)
        perm_mask[:, :, -1] = 1.0  # nothing attends to the slot (it holds no item either)
        target_mapping = inputs.new_zeros(b, 1, length, dtype=torch.float)
        target_mapping[:, 0, -1] = 1.0
        masked = torch.zeros_like(inputs, dtype=torch.bool)
        return model.encode(inputs, masked, features, perm_mask=perm_mask, target_mapping=target_mapping)[:, 0]
