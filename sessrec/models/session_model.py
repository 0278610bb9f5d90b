"""`SessionModel`: item embedding -> encoder -> tied next-item head. Plain PyTorch.

The model owns what every sequence encoder needs around it: the item table (padding id 0),
a learned [MASK] embedding, a learned position embedding, optional side information
(`SideInfoEmbedding`), and a head that scores the whole catalogue with the item table's
weights. Only *recommendable* ids are scored as recommendations: padding, OOV and virtual
(non-product, input-only) items get -inf, and the objectives never make them targets; the
`recommendable` buffer is the one place that says which ids those are.

Positions never depend on the left padding of the right-aligned inputs. For a bidirectional
encoder they count the distance from the end of the session (a [MASK] slot appended for the next
item is always at distance 0). For a causal encoder (``encoder.causal``) they count from the
first real item: the distance to the end would tell position i how many items follow it, which
a causal model must not know, and the last item read at evaluation would sit at a distance that
training never reads.

How the next item is read (a [MASK] slot, the last item, XLNet's query stream) belongs to the
training objective: ``model(items, objective)``; without one, a [MASK] slot for bidirectional
encoders and the last item for causal ones. The network holds no vocabulary and saves nothing
itself: a trained one is saved with its objective and vocabulary as a
`sessrec.artifacts.SessionRecommender`.

Shape letters: B batch, L sequence, D width, V items (incl. padding and OOV), N selected positions.

Examples:
    >>> from sessrec.models import SessionModel, XLNetEncoder
    >>> model = SessionModel(num_items=100, encoder=XLNetEncoder(d_model=16, n_head=2, n_layer=1))
    >>> scores = model(torch.tensor([[0, 5, 7], [3, 4, 9]]))  # (B, V) next-item scores
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from sessrec.data.batch import SessionBatch
from sessrec.data.vocab import NUM_SPECIAL
from sessrec.models.catalogue_softmax import catalogue_cross_entropy
from sessrec.models.causal_lm import CausalLanguageModeling
from sessrec.models.dropout import use_fast_dropout
from sessrec.models.hf_encoder import symbolic
from sessrec.models.masking import MaskedItemModeling
from sessrec.models.objective import EVENT_TIMES, Objective
from sessrec.models.side_info import SideInfoEmbedding
from sessrec.saved.directory import loads_no_directory
from sessrec.saved.registry import Configurable, check_integers, check_probabilities, check_switches


def exclude_seen(scores: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """(B, V) scores with the items of each (B, L) input session set to -inf (a new tensor).

    The full-ranking leave-one-out protocol of RecBole and of Klenitskiy & Vasilev (RecSys 2023)
    never recommends what the user already has; off by default, because in session logs a repeat
    of an earlier click is a common next item. Only the input window counts as seen.
    """
    index = torch.where(items < scores.shape[1], items, 0).long()  # column 0 (padding) is never recommended
    return scores.scatter(1, index, float("-inf"))


def top_recommendable(scores: torch.Tensor, k: int, recommendable: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best min(`k`, `recommendable`) ids of (B, V) next-item scores and their scores, best first, of a
    catalogue with `recommendable` ids that can be recommended. A session with fewer (its own items excluded:
    `exclude_seen`) gets id 0 (padding) past the last one, whose -inf score it keeps, and decoding drops
    those slots: a `k` larger than what a session can be recommended returns what there is.

    Examples:
        >>> top_recommendable(torch.tensor([[-float("inf"), 0.5, -float("inf"), 2.0]]), 3, 3)[0].tolist()
        [[3, 1, 0]]

    A `k` that is no integer of 1 or more is a ValueError naming it.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    top = scores.topk(min(k, recommendable), dim=1)
    return top.indices.masked_fill(top.values == float("-inf"), 0), top.values


def next_item_scores(
    model: SessionModel, objective: Objective | None, items: torch.Tensor, features: dict[str, torch.Tensor] | None = None,
    exclude: bool = False,
) -> torch.Tensor:
    """(B, V) next-item scores of (B, L) sessions read the way `objective` trained `model`; with
    `exclude`, the session's own items among the latest ``model.max_length`` (those the network reads,
    and all a server passes it) get -inf (`exclude_seen`). What evaluation, prediction, serving and
    export all compute."""
    scores = model(items, objective, features)
    return exclude_seen(scores, items[:, -model.max_length :]) if exclude else scores


def check_item_ids(items: torch.Tensor, num_items: int) -> None:
    """Refuse (B, L) `items` that are not right-aligned sessions of model ids of a vocabulary of `num_items` ids: a
    tensor of another shape than (B, L) with L >= 1 (naming its shape), a tensor that is not of integers, or an id
    below 0 or from `num_items` on (a ValueError naming the first such value, its position and the valid range,
    rather than the embedding's IndexError), or a row with padding (0) after an item (naming the row: its last
    column would be read as its latest item)."""
    if items.dim() != 2 or items.shape[1] == 0:
        raise ValueError(f"items: sessions are a (B, L) tensor of model ids, L >= 1, got shape {tuple(items.shape)}")
    if items.dtype == torch.bool or items.is_floating_point() or items.is_complex():
        bad = items != items.round() if items.is_floating_point() else torch.ones_like(items, dtype=torch.bool)
        at = (bad if bool(bad.any()) else torch.ones_like(bad)).nonzero()  # the first non-integer, else the first value
        first = f": {items[tuple(at[0].tolist())].item()!r} at {at[0].tolist()}" if len(at) else ""
        raise ValueError(f"items: model ids are integers (int64) 0..{num_items - 1}, got a {str(items.dtype)[6:]} "
                         f"tensor{first}")
    if items.numel() == 0:
        return
    low, high = (int(v) for v in torch.aminmax(items))
    if low < 0 or high >= num_items:
        at = ((items < 0) | (items >= num_items)).nonzero()[0]
        raise ValueError(f"items: model id {int(items[tuple(at.tolist())])} at {at.tolist()} is out of range: the model's ids "
                         f"are 0..{num_items - 1} (0 padding, 1 out-of-vocabulary)")
    real = items != 0
    after_item = real[:, :-1] & ~real[:, 1:]  # (B, L - 1) an item followed by padding
    if bool(after_item.any()):
        row = int(after_item.any(dim=1).nonzero()[0])
        raise ValueError(f"items must be right-aligned: padding (0) only on the left of each row; row {row} has padding "
                         f"after an item: {items[row].tolist()}")


def check_side_features(features: dict[str, torch.Tensor] | None, items: torch.Tensor, side_info: SideInfoEmbedding) -> None:
    """Refuse side features that `side_info` cannot embed for the (B, L) `items`: one of another shape than the
    items, a categorical one that is not of integers or holds an id outside its table, or a continuous one that is
    no finite number at a real item (padding's values are not read); a ValueError naming the feature (and the
    first such value and its position). A missing one is `SideInfoEmbedding`'s to refuse."""
    for name in side_info.names:
        values = (features or {}).get(name)
        if values is None:
            continue
        if values.shape != items.shape:
            raise ValueError(f"side feature {name!r} has shape {tuple(values.shape)}, the items {tuple(items.shape)}")
        if name not in side_info.categorical:
            bad = ~torch.isfinite(values) & (items != 0)
            if bool(bad.any()):
                at = bad.nonzero()[0].tolist()
                raise ValueError(f"side feature {name!r}: {values[tuple(at)].item()} at {at} of a real item is not a "
                                 "finite number")
            continue
        if values.dtype == torch.bool or values.is_floating_point() or values.is_complex():
            raise ValueError(f"side feature {name!r} holds category ids (integers), got a {str(values.dtype)[6:]} tensor")
        size = side_info.categorical[name].num_embeddings
        bad = (values < 0) | (values >= size)
        if bool(bad.any()):
            at = bad.nonzero()[0].tolist()
            raise ValueError(f"side feature {name!r}: id {int(values[tuple(at)])} at {at} is out of range: its ids "
                             f"are 0..{size - 1}")


class SessionModel(nn.Module, Configurable):
    """Next-item model around a sequence encoder.

    Args:
        num_items: size V of the score vector (vocabulary incl. padding, OOV and virtual items).
        encoder: module mapping ((B, L, D) embeddings, (B, L) bool mask) -> (B, L, D); must
            expose ``d_model`` and a class attribute ``causal`` (read for the positions; an
            encoder without one is taken as bidirectional). One with a ``window`` (the most
            positions it reads, `BSARecEncoder`'s) must cover `max_length` and the [MASK] slot.
        max_length: items of a session the network reads, at least 1 (longer inputs keep their latest
            items); the position table has one more row, for the [MASK] slot a bidirectional objective appends.
        position_embedding: add a learned position embedding (from the session end, or from its
            start for a causal encoder; see the module docstring).
        dropout: dropout on the input embeddings.
        input_norm: LayerNorm on the summed input embeddings.
        output_transform: a Linear-GELU-LayerNorm block before the tied head (BERT4Rec's).
            Both are off by default: on DIGINETICA each slows early learning.
        score_scale: when set (positive, finite), score by cosine similarity times this scale: the hidden
            state and every item vector are L2-normalised first (NISER, Gupta et al. 2019), which keeps
            popular items from winning on vector length alone. None = plain dot product.
        num_virtual: the last `num_virtual` ids are virtual items (`ItemVocab`'s layout): input
            tokens only, never targets nor recommendations.
        side_info: embeds side features and item vectors with the items (see `SideInfoEmbedding`);
            its width must be the encoder's. None = item ids only.
    """

    from_pretrained = loads_no_directory("sessrec.artifacts.SessionRecommender.from_pretrained({directory}).model")

    def __init__(
        self,
        num_items: int,
        encoder: nn.Module,
        max_length: int = 20,
        position_embedding: bool = True,
        dropout: float = 0.1,
        input_norm: bool = False,
        output_transform: bool = False,
        score_scale: float | None = None,
        num_virtual: int = 0,
        side_info: SideInfoEmbedding | None = None,
    ) -> None:
        super().__init__()
        check_integers({"num_items": num_items, "max_length": max_length}, "SessionModel ")
        check_integers({"num_virtual": num_virtual}, "SessionModel ", minimum=0)
        if num_items - num_virtual <= NUM_SPECIAL:
            raise ValueError(
                f"num_items must count padding, OOV, at least one item and the {num_virtual} virtual items; got {num_items}"
            )
        check_probabilities({"dropout": dropout}, "SessionModel ")
        check_switches({"position_embedding": position_embedding, "input_norm": input_norm,
                        "output_transform": output_transform}, "SessionModel ")
        if score_scale is not None and not (math.isfinite(score_scale) and score_scale > 0):
            raise ValueError(f"SessionModel score_scale must be a positive finite number or None, got {score_scale}")
        d = int(encoder.d_model)
        self.num_items, self.max_length, self.score_scale = num_items, max_length, score_scale
        self.causal = bool(getattr(encoder, "causal", False))
        window, reads = getattr(encoder, "window", None), max_length + (0 if self.causal else 1)
        if window is not None and window < reads:  # the most positions the encoder reads (BSARecEncoder's)
            raise ValueError(f"{type(encoder).__name__} window={window} is shorter than the {reads} positions the model "
                             f"reads (max_length {max_length} and the [MASK] slot): set window to {reads} or more")
        self.item_embedding = nn.Embedding(num_items, d, padding_idx=0)
        self.mask_embedding = nn.Parameter(torch.zeros(d))
        self.position_embedding = nn.Embedding(max_length + 1, d) if position_embedding else None
        self.input_norm = nn.LayerNorm(d) if input_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.encoder = encoder
        self.output_transform = (
            nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d)) if output_transform else nn.Identity()
        )
        self.side_info = side_info
        self.output_bias = nn.Parameter(torch.zeros(num_items))
        # only products are targets and recommendations: padding, OOV and virtual ids get -inf
        # added to their scores in the same addmm
        recommendable = torch.zeros(num_items, dtype=torch.bool)
        recommendable[NUM_SPECIAL : num_items - num_virtual] = True
        self.num_virtual = num_virtual
        self.register_buffer("recommendable", recommendable, persistent=False)
        self.register_buffer("never", torch.zeros(num_items).masked_fill(~recommendable, float("-inf")), persistent=False)
        nn.init.normal_(self.item_embedding.weight, std=0.02)
        nn.init.normal_(self.mask_embedding, std=0.02)
        with torch.no_grad():
            self.item_embedding.weight[0].zero_()
        if self.position_embedding is not None:
            nn.init.normal_(self.position_embedding.weight, std=0.02)
        use_fast_dropout(self)  # every nn.Dropout here and in the encoder: same masks' law, cheaper on CPU

    def positions(self, real: torch.Tensor) -> torch.Tensor:
        """(B, L) bool real positions -> (B, L) position ids (or (L,) when they do not depend on B)."""
        if self.causal:
            from_start = real.long().cumsum(dim=1) - 1  # first real item 0; left padding -1 -> 0
            return from_start.clamp(min=0, max=self.max_length)
        from_end = torch.arange(real.shape[1] - 1, -1, -1, device=real.device)
        return from_end.clamp(max=self.max_length)

    @property
    def uses_times(self) -> bool:
        """Whether the encoder reads event times (its ``uses_times``, as `HSTUEncoder`)."""
        return bool(getattr(self.encoder, "uses_times", False))

    @property
    def needs_times(self) -> bool:
        """Whether the model must be read with event times: its encoder was trained with them
        (`HSTUEncoder.trained_with_times`), and refuses sessions without them."""
        return bool(getattr(self.encoder, "trained_with_times", False))

    def batch_features(
        self, batch: SessionBatch, features: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor] | None:
        """What the model reads of a batch besides its items: the side features (`features`, else the
        batch's), with the batch's event times under `EVENT_TIMES` for an encoder that `uses_times`."""
        features = getattr(batch, "features", None) if features is None else features
        times = getattr(batch, "times", None)  # duck-typed batches (a scoring stream's) too
        if times is None or not self.uses_times:
            return features
        return {**(features or {}), EVENT_TIMES: times}

    def targetable(self, items: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L) bool: positions whose item may be a target (a recommendable id)."""
        return self.recommendable[items]

    def embed(
        self, inputs: torch.Tensor, masked: torch.Tensor, features: dict[str, torch.Tensor] | None = None,
        predicted: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) ids (0 at padding and masked slots), (B, L) bool [MASK] slots and side features
        (B, L) each -> (B, L, D) encoder input. Masked slots and padding get no side information.
        `predicted`: (B, L) bool positions predicted without a [MASK] (PLM's targets, inputs of the
        content stream); the look-ahead features of the event before each are hidden, as before a [MASK]."""
        x = self.item_embedding(inputs)  # (B, L, D)
        x = torch.where(masked.unsqueeze(-1), self.mask_embedding.to(x.dtype), x)
        if self.side_info is not None:
            visible = (inputs != 0) & ~masked
            # a look-ahead feature (time to the next event) only where the next event is a visible
            # input and not predicted; never in a causal model, where every position predicts the event after it
            ahead = torch.zeros_like(visible)
            if not self.causal:
                seen = visible if predicted is None else visible & ~predicted
                ahead[:, :-1] = visible[:, :-1] & seen[:, 1:]
            x = self.side_info(x, inputs, features, visible, ahead)
        if self.position_embedding is not None:
            x = x + self.position_embedding(self.positions((inputs != 0) | masked))
        return self.dropout(self.input_norm(x))

    def encode(
        self,
        inputs: torch.Tensor,
        masked: torch.Tensor,
        features: dict[str, torch.Tensor] | None = None,
        predicted: torch.Tensor | None = None,
        **encoder_kwargs: torch.Tensor,
    ) -> torch.Tensor:
        """(B, L) ids, (B, L) bool [MASK] slots and side features -> the encoder's output, (B, L, D).

        `predicted` is `embed`'s. Extra keyword arguments go to the encoder (XLNet's ``perm_mask`` and ``target_mapping``). An
        encoder that declares ``uses_times`` (`HSTUEncoder`) also gets ``times``: the (B, L) event
        times in seconds that `features` carries under `EVENT_TIMES`, or None.
        """
        if self.uses_times:
            encoder_kwargs["times"] = None if features is None else features.get(EVENT_TIMES)
        return self.encoder(self.embed(inputs, masked, features, predicted), (inputs != 0) | masked, **encoder_kwargs)

    def score(self, hidden: torch.Tensor, candidates: torch.Tensor | None = None) -> torch.Tensor:
        """(N, D) hidden states -> (N, V) scores, or (N, K) scores of the (K,) `candidates` ids.

        Over the whole catalogue, padding, OOV and virtual items get -inf. Candidate scores
        (sampled losses) are the same numbers for the chosen columns; candidates are expected to
        be real items.
        """
        h, table, bias = self.head(hidden, candidates)
        return torch.addmm(bias, h, table.T)

    def head(
        self, hidden: torch.Tensor, candidates: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(N, D) hidden states -> the factors of `score`: (N, D) rows, (V or K, D) item vectors and
        (V or K,) biases (-inf at padding, OOV and virtual ids), the scores being ``rows @ vectors.T + biases``."""
        h = self.output_transform(hidden)
        if candidates is None:
            table, bias = self.item_embedding.weight, self.output_bias + self.never
        else:  # (K, D), (K,)
            table = self.item_rows(candidates)
            bias = self.output_bias.index_select(0, candidates) + self.never.index_select(0, candidates)
        if self.score_scale is not None:
            h = F.normalize(h, dim=-1) * self.score_scale
            table = F.normalize(table, dim=-1)  # the all-zero padding row stays zero
        return h, table, bias

    def catalogue_loss(
        self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """Mean cross-entropy of ``score(hidden) / temperature`` against the (N,) `targets` over the whole
        catalogue, label smoothing spread over the recommendable items (`catalogue_cross_entropy`: the
        same numbers as building the scores and taking their cross-entropy, in less time and memory)."""
        return catalogue_cross_entropy(*self.head(hidden), targets, temperature, label_smoothing)

    def item_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """(K,) item ids -> (K, D) their rows of the item table, for the tied head.

        Their gradient is sparse (K rows): autograd adds it to the table's dense gradient from the
        input embedding, so a step writes one (V, D) gradient, not one more per lookup; the
        table's ``.grad`` stays dense, for any optimizer. At a million items each dense lookup
        gradient costs a (V, D) buffer filled with zeros (``docs/catalogues.md``).
        """
        return F.embedding(ids, self.item_embedding.weight, sparse=True)

    def score_targets(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(N, D) hidden states and (N,) item ids -> (N,) the score of each row's own item.

        The diagonal of ``score(hidden, targets)`` without the N x N product (sampled losses).
        """
        h, table, bias = self.output_transform(hidden), self.item_rows(targets), self.output_bias[targets]
        if self.score_scale is not None:
            h = F.normalize(h, dim=-1) * self.score_scale
            table = F.normalize(table, dim=-1)
        return (h * table).sum(dim=-1) + bias

    def forward(
        self,
        items: torch.Tensor | SessionBatch,
        objective: Objective | None = None,
        features: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Next-item scores (B, V) for right-aligned sessions (B, L) or a `SessionBatch`.

        The sessions are read the way `objective` trained the model (see
        `Objective.next_item_hidden`); by default a [MASK] slot appended after the last item
        (bidirectional encoders) or the last item (causal encoders). The target of an evaluation
        batch is never part of the input. Side `features` (B, L) each are taken from the batch
        when a `SessionBatch` is given, with its event times (`EVENT_TIMES`) for an encoder that uses them.
        """
        if isinstance(items, SessionBatch):
            items, features = items.items, self.batch_features(items, features)
        if not symbolic():  # a trace or an export has no values to check
            check_item_ids(items, self.num_items)
            if self.side_info is not None:
                check_side_features(features, items, self.side_info)
        if objective is None:
            objective = self.default_objective()
        return self.score(objective.next_item_hidden(self, items, features))  # (B, V)

    def default_objective(self) -> Objective:
        """How a model read without an objective reads the next item: a [MASK] slot, or the last item (causal)."""
        return CausalLanguageModeling() if self.causal else MaskedItemModeling()
