"""Replaced item detection (RTD): ELECTRA's objective (Clark et al., 2020), with a next-item head.

Each training session gets two disjoint sets of positions: masked ones (the next-item targets,
chosen exactly as `MaskedItemModeling` chooses them) and replaced ones. A small generator, an
MLM over the same item table, sees both sets behind [MASK] and proposes an item for each
replaced position. The encoder (the discriminator) then sees the session with the masked
positions still behind [MASK] and the replaced ones holding the generator's proposals, and
learns two things at once: the masked items (cross-entropy, through the model's tied head) and,
at every other real position, whether the item there was replaced (binary cross-entropy). A
proposal equal to the original counts as not replaced, as in ELECTRA.

No hidden item reaches the discriminator: masked items stay behind [MASK], and the proposals
come from a generator that saw neither set. Evaluation reads a [MASK] slot appended after the
last item, as for MLM. Needs a bidirectional encoder (and generator).

Shape letters: B batch, L sequence, D width, G generator width, V items, K hidden positions of
the generator, R replaced positions, N next-item targets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.models.dropout import use_fast_dropout
from sessrec.models.electra import ElectraEncoder
from sessrec.models.masking import MaskedItemModeling
from sessrec.models.objective import (
    Features,
    MaskingResult,
    Network,
    Objective,
    ObjectiveOutput,
    encoder_is_causal,
    targetable,
)
from sessrec.saved.registry import Configurable, check_probabilities


@dataclass
class ReplacementResult(MaskingResult):
    """`MaskingResult` of the discriminator (``inputs`` still hold the original items at the
    replaced positions) plus the positions that the generator fills in.

    Args:
        replace: (B, L) bool, positions to replace; never a masked position, padding, OOV or a
            virtual item (the generator only proposes, and learns, targetable items).
    """

    replace: torch.Tensor | None = None


class ReplacedTokenDetection(nn.Module, Objective, Configurable):
    """ELECTRA-style training of the encoder, jointly with next-item prediction at [MASK] slots.

    An `nn.Module` because the generator and the discriminator head have parameters. They are
    built by `bind` (which `NextItemTask` calls), once the model's width is known.

    Args:
        mask_prob: per-item probability of a [MASK] next-item target (as in `MaskedItemModeling`).
        last_item_prob: share of sessions whose only [MASK] target is the last item.
        replace_prob: per-item probability that one of the remaining known items is replaced.
        generator_encoder: the generator's bidirectional encoder; by default one 1-head
            `ElectraEncoder` layer of the model's width. A width G other than D gets linear maps
            D -> G before it and G -> D after it (the item table and head are shared).
        generator_weight: weight of the generator's MLM loss.
        discriminator_weight: weight of the replaced/original binary cross-entropy.
        temperature: sampling temperature of the generator's proposals.
    """

    needs_causal: ClassVar[bool] = False

    def __init__(
        self,
        mask_prob: float = 0.2,
        last_item_prob: float = 0.1,
        replace_prob: float = 0.15,
        generator_encoder: nn.Module | None = None,
        generator_weight: float = 1.0,
        discriminator_weight: float = 1.0,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.masking = MaskedItemModeling(mask_prob=mask_prob, last_item_prob=last_item_prob)
        check_probabilities({"replace_prob": replace_prob}, "ReplacedTokenDetection ", one=True)
        if not all(math.isfinite(w) and w >= 0 for w in (generator_weight, discriminator_weight)):
            raise ValueError(f"loss weights must be finite numbers >= 0, got {generator_weight} and {discriminator_weight}")
        if not (math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite positive number, got {temperature}")
        if generator_encoder is not None and encoder_is_causal(generator_encoder):
            raise ValueError(
                f"the generator must be bidirectional (it fills in [MASK] slots), but {type(generator_encoder).__name__} "
                "is causal: use e.g. ElectraEncoder or BertEncoder"
            )
        self.replace_prob = replace_prob
        self.generator_weight, self.discriminator_weight, self.temperature = generator_weight, discriminator_weight, temperature
        self.generator_encoder = generator_encoder
        self.generator_in: nn.Module = nn.Identity()
        self.generator_out: nn.Module = nn.Identity()
        self.discriminator: nn.Linear | None = None

    def bind(self, model: Network) -> None:
        """Check the encoder and build the generator (if none was given) and the heads at its width."""
        self.check(model.encoder)
        d = int(model.encoder.d_model)
        if self.generator_encoder is None:
            self.generator_encoder = ElectraEncoder(d_model=d, n_head=1, n_layer=1)
        use_fast_dropout(self.generator_encoder)
        g = int(self.generator_encoder.d_model)
        self.generator_in = nn.Identity() if g == d else nn.Linear(d, g)
        self.generator_out = nn.Identity() if g == d else nn.Linear(g, d)
        self.discriminator = nn.Linear(d, 1)

    def forward(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> ReplacementResult:
        return self.mask(items, generator, recommendable)

    def mask(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> ReplacementResult:
        masked = self.masking.select(items, generator, recommendable)  # (B, L)
        rand = torch.rand(items.shape, generator=generator, device=items.device)
        replace = targetable(items, recommendable) & ~masked & (rand < self.replace_prob)
        return ReplacementResult(
            inputs=items.masked_fill(masked, 0), masked=masked, read=masked, targets=items[masked], replace=replace
        )

    @staticmethod
    def corrupt(m: ReplacementResult, samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Put the (R,) `samples` at the replaced positions (row-major order).

        Returns:
            The discriminator's (B, L) input ids and (B, L) float labels: 1 exactly where a
            sample differs from the original item.
        """
        inputs = m.inputs.masked_scatter(m.replace, samples.to(m.inputs.dtype))
        return inputs, (inputs != m.inputs).float()

    def propose(self, logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """(R, V) generator scores -> (R,) items sampled from softmax(logits / temperature).

        Gumbel-max, so the draw follows the seeded `generator`; padding, OOV and virtual items
        (-inf) are never drawn.
        """
        u = torch.rand(logits.shape, generator=generator, device=logits.device).clamp_min(1e-20)
        return (logits / self.temperature - torch.log(-torch.log(u))).argmax(dim=1)

    def training_output(
        self,
        model: Network,
        items: torch.Tensor,
        generator: torch.Generator | None = None,
        features: Features | None = None,
    ) -> ObjectiveOutput:
        if self.discriminator is None or self.generator_encoder is None:
            raise RuntimeError("ReplacedTokenDetection is not bound to a model: call objective.bind(model) first")
        self.check_training(model, items)
        m = self.mask(items, generator, model.recommendable)

        # generator: an MLM over the shared item table and head, with both sets behind [MASK]
        hide = m.masked | m.replace  # (B, L)
        g_inputs = items.masked_fill(hide, 0)
        g_x = self.generator_in(model.embed(g_inputs, hide, features))  # (B, L, G)
        g_hidden = self.generator_out(self.generator_encoder(g_x, (g_inputs != 0) | hide)[hide])  # (K, D)
        g_logits = model.score(g_hidden)  # (K, V)
        g_loss = F.cross_entropy(g_logits, items[hide].long(), reduction="sum") / max(len(g_logits), 1)
        with torch.no_grad():
            samples = self.propose(g_logits[m.replace[hide]], generator)  # (R,)

        # discriminator = the model's encoder: next items at [MASK], replaced-or-not elsewhere
        inputs, labels = self.corrupt(m, samples)
        hidden = model.encode(inputs, m.masked, features)  # (B, L, D)
        judged = (items != 0) & ~m.masked
        d_logits = self.discriminator(hidden[judged]).squeeze(-1)
        d_loss = F.binary_cross_entropy_with_logits(d_logits, labels[judged], reduction="sum") / max(len(d_logits), 1)
        return ObjectiveOutput(
            hidden=hidden[m.read],
            targets=m.targets,
            aux_loss=self.generator_weight * g_loss + self.discriminator_weight * d_loss,
            logs={"rtd_generator_loss": g_loss.detach(), "rtd_discriminator_loss": d_loss.detach(),
                  "rtd_replaced": labels[judged].sum() / max(len(d_logits), 1)},
        )
