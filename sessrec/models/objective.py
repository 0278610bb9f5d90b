"""What every training objective returns and the contract it follows.

An objective decides, for a batch of right-aligned sessions, what the encoder sees (item ids and
which slots carry the [MASK] embedding), which hidden positions are read, and which items they
must predict. It also says how a trained model is read for the next item at evaluation, so that
training and evaluation ask the same question. Only recommendable items are targets: never
padding (0), OOV (1) or a virtual (input-only) item; `targetable` is that rule, given the
model's ``recommendable`` mask. Side features (B, L) travel with the items into the model, and so
do event times, carried among them under `EVENT_TIMES` for an encoder that reads them.

The objectives: `MaskedItemModeling` (MLM), `CausalLanguageModeling` (CLM),
`PermutationLanguageModeling` (PLM, XLNet only) and `ReplacedTokenDetection` (RTD, ELECTRA-style).
Each names the kind of encoder it needs; `Objective.check` refuses the others with an error that
says why, and `NextItemTask` runs it when it is constructed, i.e. before any training.

Shape letters: B batch, L sequence, D width, N targets in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import torch
from torch import nn

from sessrec.data.vocab import NUM_SPECIAL
from sessrec.saved.registry import Configurable


@dataclass
class MaskingResult:
    """What the encoder sees and what it must predict.

    Args:
        inputs: (B, L) item ids fed to the item table; 0 at padding and at [MASK] slots, so a
            hidden item never reaches the model.
        masked: (B, L) bool, slots embedded as [MASK].
        read: (B, L) bool, positions whose hidden states predict `targets`.
        targets: (N,) item ids, in row-major order of `read`.
        source: (B, L) column of the original batch that each column of `inputs` holds (< 0:
            padding), when the objective moved the items (MLM's random prefixes); side features
            are moved the same way (`realign`). None: the columns did not move.
    """

    inputs: torch.Tensor
    masked: torch.Tensor
    read: torch.Tensor
    targets: torch.Tensor
    source: torch.Tensor | None = None


@dataclass
class ObjectiveOutput:
    """One training step's next-item question, ready for the task's loss.

    Args:
        hidden: (N, D) hidden states that predict the next items.
        targets: (N,) int64 items to predict (widened here from the batch's int32 ids: losses
            index with them).
        aux_loss: scalar loss of the objective's own heads (RTD), added to the next-item loss.
        logs: scalars worth logging, by name.
    """

    hidden: torch.Tensor
    targets: torch.Tensor
    aux_loss: torch.Tensor | None = None
    logs: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.targets = self.targets.long()


Features = dict[str, torch.Tensor]

EVENT_TIMES = "event_times"
"""The key of the (B, L) event times (seconds) in a features dict, for an encoder with ``uses_times``."""


class Network(Protocol):
    """What an objective reads of the network it trains and evaluates (`SessionModel` is the one):
    its encoder, its position count, the ids that may be targets, and its embed / encode / score steps.
    An objective module needs no import of the network's own."""

    encoder: nn.Module
    max_length: int  # items read; the position table has one more row, for the [MASK] slot
    recommendable: torch.Tensor  # (V,) bool

    def embed(
        self, inputs: torch.Tensor, masked: torch.Tensor, features: Features | None = None,
        predicted: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) ids, (B, L) bool [MASK] slots and side features -> (B, L, D) encoder input; `predicted`: (B, L)
        bool targets left in the inputs (PLM's), before which look-ahead features are hidden."""
        ...

    def encode(
        self, inputs: torch.Tensor, masked: torch.Tensor, features: Features | None = None,
        predicted: torch.Tensor | None = None, **encoder_kwargs: torch.Tensor
    ) -> torch.Tensor:
        """(B, L) ids, (B, L) bool [MASK] slots and side features -> (B, L, D) the encoder's output (`embed`'s `predicted`)."""
        ...

    def score(self, hidden: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """(N, D) hidden states -> (N, V) scores, or (N, K) scores of the (K,) `candidates` ids."""
        ...


def targetable(items: torch.Tensor, recommendable: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) ids -> (B, L) bool, the positions whose item may be a training target.

    Args:
        items: right-aligned item ids.
        recommendable: (V,) bool mask of the ids that can be recommended (`SessionModel.recommendable`);
            without it, every id but padding and OOV.
    """
    if recommendable is None:
        return items >= NUM_SPECIAL
    return recommendable[items]


def append_slot(items: torch.Tensor, features: Features | None, max_length: int) -> tuple[torch.Tensor, Features | None]:
    """Keep the latest `max_length` items and append an empty slot (id 0, features 0) after the last one.

    The slot's event time (`EVENT_TIMES`) is the last item's, the latest time known: the next
    event's own time would tell when the item it asks for happened.
    """
    pad = lambda t, fill=None: torch.cat([t, t.new_zeros(t.shape[0], 1) if fill is None else fill], dim=1)[:, -(max_length + 1):]
    if features is None:
        return pad(items), None
    slotted = {k: pad(v, v[:, -1:] if k == EVENT_TIMES else None) for k, v in features.items()}
    return pad(items), slotted


def realign(values: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """(B, L) values moved to the (B, L) `source` columns; a negative source gives 0 (padding)."""
    return values.gather(1, source.clamp(min=0)).masked_fill(source < 0, 0)


def latest(items: torch.Tensor, features: Features | None, max_length: int) -> tuple[torch.Tensor, Features | None]:
    """The latest `max_length` columns of the items and of each side feature."""
    return items[:, -max_length:], None if features is None else {k: v[:, -max_length:] for k, v in features.items()}


def encoder_is_causal(encoder: nn.Module) -> bool:
    """The encoder's ``causal`` class attribute; a clear error when it has none."""
    causal = getattr(encoder, "causal", None)
    if not isinstance(causal, bool):
        raise TypeError(
            f"{type(encoder).__name__} does not say whether it is causal: give it a class attribute "
            "`causal: bool` (True when position i sees only positions <= i)"
        )
    return causal


class Objective(Configurable):
    """Base class of the training objectives (each subclass registers itself: a saved config may name it).

    Subclasses implement `mask`; the defaults below run the encoder once on the masked inputs
    (`training_output`) and read an appended [MASK] slot at evaluation (`next_item_hidden`).

    Class attributes:
        needs_causal: True if the objective needs a causal encoder, False if a bidirectional one.
        needs_two_stream: the encoder must take XLNet's ``perm_mask``/``target_mapping``.
    """

    needs_causal: ClassVar[bool] = False
    needs_two_stream: ClassVar[bool] = False

    def mask(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> MaskingResult:
        """(B, L) right-aligned sessions -> inputs, [MASK] slots, read positions and targets.

        Targets are only items that `targetable(items, recommendable)` allows.
        """
        raise NotImplementedError

    def __call__(
        self, items: torch.Tensor, generator: torch.Generator | None = None, recommendable: torch.Tensor | None = None
    ) -> MaskingResult:
        return self.mask(items, generator, recommendable)

    def check(self, encoder: nn.Module) -> None:
        """Raise ValueError if this objective cannot train `encoder`."""
        name, enc = type(self).__name__, type(encoder).__name__
        if self.needs_two_stream and not getattr(encoder, "two_stream", False):
            raise ValueError(
                f"{name} needs XLNet's two-stream attention (perm_mask/target_mapping), which {enc} does not "
                "have: use XLNetEncoder, or another objective with this encoder"
            )
        causal = encoder_is_causal(encoder)
        if self.needs_causal and not causal:
            raise ValueError(
                f"{name} trains each position on the next item and needs a causal encoder, but {enc} is "
                "bidirectional (every position would see the item it predicts): use a causal encoder "
                "(GPT2Encoder, SASRecEncoder, GRU4RecEncoder) or MaskedItemModeling"
            )
        if not self.needs_causal and causal:
            raise ValueError(
                f"{name} predicts hidden items from the context on both sides and needs a bidirectional "
                f"encoder, but {enc} is causal: use CausalLanguageModeling with {enc}, or a bidirectional "
                "encoder (XLNetEncoder, BertEncoder, ElectraEncoder)"
            )

    def bind(self, model: Network) -> None:
        """Check the pair and build any parameters of the objective's own (RTD's heads).

        An encoder with a query stream (XLNet) trains its query embedding only for an objective
        that reads it; otherwise it is frozen, so that every trained parameter takes part in the
        loss (what data-parallel training requires).
        """
        self.check(model.encoder)
        query_stream = getattr(model.encoder, "use_query_stream", None)
        if query_stream is not None:
            query_stream(self.needs_two_stream)

    def check_training(self, model: Network, items: torch.Tensor) -> None:
        """Refuse a training batch this objective cannot train `model` on: an encoder of the wrong kind (`check`), or
        (B, L) sessions wider than the ``max_length`` items the network reads (their positions past it would share
        one embedding, and evaluation reads only the latest ``max_length``)."""
        self.check(model.encoder)
        if items.shape[-1] > model.max_length:
            raise ValueError(
                f"training sessions of {items.shape[-1]} items are wider than the {model.max_length} the network reads "
                f"(SessionModel max_length): build it with max_length={items.shape[-1]}, or pass each session's latest "
                f"{model.max_length} items"
            )

    def training_output(
        self,
        model: Network,
        items: torch.Tensor,
        generator: torch.Generator | None = None,
        features: Features | None = None,
    ) -> ObjectiveOutput:
        """Mask a training batch (B, L) (with its side features), run the model and return the hidden states to score.

        An encoder this objective cannot train is refused (`check`), also where `bind` was not called, and so are
        sessions wider than the network reads (`check_training`).
        """
        self.check_training(model, items)
        m = self.mask(items, generator, model.recommendable)
        if m.source is not None and features is not None:  # the items moved: their features move with them
            features = {k: realign(v, m.source) for k, v in features.items()}
        hidden = model.encode(m.inputs, m.masked, features)[m.read]  # (N, D)
        return ObjectiveOutput(hidden=hidden, targets=m.targets)

    def next_item_hidden(self, model: Network, items: torch.Tensor, features: Features | None = None) -> torch.Tensor:
        """(B, L) observed sessions (and side features) -> (B, D): the state that predicts the item after them.

        A [MASK] slot is appended after the last item and read; the target is never an input.
        """
        inputs, features = append_slot(items, features, model.max_length)
        masked = torch.zeros_like(inputs, dtype=torch.bool)
        masked[:, -1] = True
        return model.encode(inputs, masked, features)[:, -1]
