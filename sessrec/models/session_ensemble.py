"""`SessionEnsemble`: several trained session models scoring the next item as one.

The ensemble's score of an item is the weighted mean of the members' log-probabilities (the
log-softmax of each member's scores over the catalogue): the log of a normalised geometric mean
of their next-item distributions. Scores on different scales (a cosine x 16, a dot product) are
comparable after the softmax, and a member that is sure of an item counts as much as its
probability says, not as its raw logit. Items that no member may recommend (padding, OOV,
virtual) stay at -inf.

Members are trained `SessionModel`s, each read with the objective it was trained with (how it
reads a session; a `sessrec.artifacts.SessionRecommender` holds both). They must score the same
catalogue: same size, same recommendable items (whoever loads them checks that their
vocabularies are one). Each member reads the latest items of its window (its inference settings'
``max_length``, by default its network's), and event times when its encoder uses them.

Examples:
    >>> import torch
    >>> from sessrec.models import SessionModel, GRU4RecEncoder
    >>> a = SessionModel(num_items=12, encoder=GRU4RecEncoder(d_model=8), max_length=4)
    >>> b = SessionModel(num_items=12, encoder=GRU4RecEncoder(d_model=8), max_length=4)
    >>> SessionEnsemble([a, b], weights=[3, 1])(torch.tensor([[0, 4, 5, 6]])).shape
    torch.Size([1, 12])

Shape letters: B sessions, L positions, V items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from sessrec.data.batch import SessionBatch
from sessrec.models.objective import EVENT_TIMES, Objective, latest
from sessrec.models.session_model import SessionModel


def check_weights(weights: Sequence[float], count: int, of: str = "members") -> list[float]:
    """`weights` as floats, refused unless there is one positive, finite weight for each of `count` `of`."""
    weights = [float(w) for w in weights]
    if len(weights) != count:
        raise ValueError(f"{len(weights)} weights for {count} {of}: give one weight per {of.rstrip('s')}")
    bad = [w for w in weights if not (math.isfinite(w) and w > 0)]
    if bad:
        raise ValueError(f"{of.rstrip('s')} weights must be positive and finite, got {bad[0]}")
    return weights


class SessionEnsemble(nn.Module):
    """Weighted mean of the next-item log-probabilities of trained `SessionModel`s.

    Args:
        members: the trained networks.
        weights: one positive weight per member (normalised to sum 1); None: equal weights.
        names: how errors name each member (its file, say); default ``member 0``, ``member 1`` ...
        objectives: the objective each member was trained with (how it reads a session); None, or
            None for a member: the default way for its encoder (`SessionModel.default_objective`).
        windows: the latest items each member reads (its inference settings' ``max_length``), at most its
            network's ``max_length``; None, or None for a member: its network's ``max_length``.
    """

    def __init__(
        self,
        members: Sequence[SessionModel],
        weights: Sequence[float] | None = None,
        names: Sequence[str] | None = None,
        objectives: Sequence[Objective | None] | None = None,
        windows: Sequence[int | None] | None = None,
    ) -> None:
        super().__init__()
        members = list(members)
        names = [f"member {i}" for i in range(len(members))] if names is None else [str(n) for n in names]
        if not members:
            raise ValueError("an ensemble needs at least one member")
        if len(names) != len(members):
            raise ValueError(f"{len(names)} names for {len(members)} members")
        for name, member in zip(names, members):
            if not isinstance(member, SessionModel):
                raise TypeError(f"{name}: an ensemble member must be a SessionModel, got {type(member).__name__}")
            if member.side_info is not None:
                raise ValueError(
                    f"{name}: the model reads side features, which an ensemble does not feed its members; "
                    "ensemble models trained on items (and event times) only"
                )
        objectives = [None] * len(members) if objectives is None else list(objectives)
        if len(objectives) != len(members):
            raise ValueError(f"{len(objectives)} objectives for {len(members)} members")
        objectives = [m.default_objective() if o is None else o for m, o in zip(members, objectives)]
        for name, member, objective in zip(names, members, objectives):
            try:
                objective.check(member.encoder)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None
        windows = [None] * len(members) if windows is None else list(windows)
        if len(windows) != len(members):
            raise ValueError(f"{len(windows)} windows for {len(members)} members")
        windows = [m.max_length if w is None else int(w) for m, w in zip(members, windows)]
        for name, member, window in zip(names, members, windows):
            if not 1 <= window <= member.max_length:
                raise ValueError(f"{name}: a window of {window} items, where its network reads 1 to {member.max_length}")
        _check_same_catalogue(members, names)
        weights = check_weights([1.0] * len(members) if weights is None else weights, len(members))
        self.members = nn.ModuleList(members)
        self.names = names
        self.windows = windows
        self.objectives = objectives  # a plain list: an objective's own layers (RTD's) are no part of the ensemble
        total = sum(weights)
        self.register_buffer("weights", torch.tensor([w / total for w in weights]), persistent=False)

    @property
    def num_items(self) -> int:
        return int(self.members[0].num_items)

    @property
    def recommendable(self) -> torch.Tensor:
        return self.members[0].recommendable

    @property
    def uses_times(self) -> bool:
        """Whether some member reads event times (then the batches should carry them)."""
        return any(m.uses_times for m in self.members)

    @property
    def needs_times(self) -> bool:
        """Whether some member was trained with event times (then it refuses sessions without them)."""
        return any(m.needs_times for m in self.members)

    def forward(
        self, items: torch.Tensor | SessionBatch, features: dict[str, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """(B, V) ensemble log-probabilities of right-aligned (B, L) sessions or a `SessionBatch`.

        With a batch, each member takes what it reads of it (`SessionModel.batch_features`); with
        items and `features`, event times (`EVENT_TIMES`) go only to the members that use them.
        """
        total = None
        for weight, member, objective, window in zip(self.weights, self.members, self.objectives, self.windows):
            if isinstance(items, SessionBatch):
                own_items, own = items.items, member.batch_features(items)
            else:
                own_items, own = items, features
                if features is not None and not member.uses_times and EVENT_TIMES in features:
                    own = {k: v for k, v in features.items() if k != EVENT_TIMES} or None
            own_items, own = latest(own_items, own, window)
            scores = member(own_items, objective, own)
            part = weight * torch.log_softmax(scores.float(), dim=-1)
            total = part if total is None else total + part
        return total


def _check_same_catalogue(members: list[SessionModel], names: list[str]) -> None:
    """Refuse members that do not score the same items under the same ids."""
    first, name0 = members[0], names[0]
    for name, member in zip(names[1:], members[1:]):
        if member.num_items != first.num_items:
            raise ValueError(
                f"{name}: scores {member.num_items} items where {name0} scores {first.num_items}: ensemble members "
                "must be trained on one vocabulary"
            )
        if not torch.equal(member.recommendable.cpu(), first.recommendable.cpu()):
            raise ValueError(f"{name}: recommends other ids than {name0} (its virtual items differ)")
