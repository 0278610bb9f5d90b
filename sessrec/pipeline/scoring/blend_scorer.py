"""`BlendScorer`: several rankers fitted on the same rows, their scores averaged per session.

Scorers put their scores on different scales (a DLRM's logits, LightGBM's lambdarank margins),
and only the order within a session matters; so each member's scores are standardised within
each session (mean 0, standard deviation 1 over its valid candidates) before the weighted sum.
Trees and a neural ranker err on different candidates, and two tree models with different seeds
(early-stopping split, bagging) on different ones again: the default blend of a DLRM and two
LightGBM rankers ranks better than any one of them (``benchmarks/pipeline_eval.py``, the
``pipeline-blend`` line against its members' ``pipeline-dlrm`` and ``pipeline-gbdt``).

With a `shortlist`, the blend is a cascade: the first member scores every candidate, the others only
its `shortlist` best of each session (the trees walk a quarter of the rows at 50 of 200), and the
candidates off the shortlist follow the blended ones in the first member's order.

Shape letters: B sessions, K candidates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from sessrec.pipeline.candidate_features import RankingInputs
from sessrec.pipeline.scoring.dlrm_scorer import DLRMScorer
from sessrec.pipeline.scoring.gbdt_scorer import GBDTScorer, HostRows
from sessrec.pipeline.scoring.scorer import RankerRows, Scorer
from sessrec.saved.registry import check_integers


def standardised(scores: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """(..., B, K) scores -> (..., B, K) float64 scores of mean 0 and standard deviation 1 within each row's valid
    slots (`valid`: (B, K)), 0 at the others.

    Examples:
        >>> standardised(torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[True, True, False]])).tolist()
        [[-1.0, 1.0, 0.0]]
    """
    scores = scores.double().masked_fill(~valid, 0.0)
    n = valid.sum(dim=-1, keepdim=True).clamp(min=1)
    mean = scores.sum(dim=-1, keepdim=True) / n
    centred = (scores - mean).masked_fill(~valid, 0.0)
    std = (centred.square().sum(dim=-1, keepdim=True) / n).sqrt()
    return torch.where(std > 1e-12, centred / std.clamp(min=1e-12), 0.0)


class BlendScorer(Scorer):
    """The weighted sum of the per-session standardised scores of its members.

    Args:
        scorers: the members, each fitted on the same rows; None: a `DLRMScorer` and two
            `GBDTScorer`s (seeds 0 and 1: two early-stopping splits and baggings), their defaults otherwise.
        weights: one weight per member; None: equal weights.
        shortlist: the candidates of each session the members after the first score: the first
            member's best `shortlist` (ties to the earlier slot), blended there and ranked above the
            others, which keep the first member's order; None: every member scores every candidate.
            Fitting is the same either way.

    Examples:
        >>> blend = BlendScorer([DLRMScorer(max_epochs=5), GBDTScorer(threads=1)], weights=[0.5, 0.5])
        >>> [type(s).__name__ for s in blend.scorers]
        ['DLRMScorer', 'GBDTScorer']
    """

    def __init__(self, scorers: Sequence[Scorer] | None = None, weights: Sequence[float] | None = None,
                 shortlist: int | None = None) -> None:
        self.scorers = list(scorers) if scorers is not None else [DLRMScorer(), GBDTScorer(), GBDTScorer(seed=1)]
        if not self.scorers or not all(isinstance(s, Scorer) for s in self.scorers):
            raise ValueError(f"BlendScorer needs one or more scorers, got {[type(s).__name__ for s in self.scorers]}")
        if any(isinstance(s, BlendScorer) for s in self.scorers):
            raise ValueError("BlendScorer members are rankers, not blends: list the rankers themselves")
        self.weights = [1.0] * len(self.scorers) if weights is None else [float(w) for w in weights]
        if (len(self.weights) != len(self.scorers) or not all(math.isfinite(w) and w >= 0 for w in self.weights)
                or sum(self.weights) <= 0):
            raise ValueError(f"BlendScorer needs one finite, non-negative weight per scorer ({len(self.scorers)}), not all 0; "
                             f"got {list(self.weights)}")
        if shortlist is not None:
            check_integers({"shortlist": shortlist}, "BlendScorer ")
            if len(self.scorers) < 2:
                raise ValueError("BlendScorer shortlist needs two or more scorers: the first shortlists for the others")
        self.shortlist = shortlist

    def fit(self, inputs: RankingInputs | RankerRows, labels: torch.Tensor) -> BlendScorer:
        """Fit every member on the same rows (a `RankerRows` is read again by each)."""
        for scorer in self.scorers:
            scorer.fit(inputs, labels)
        return self

    def score(self, inputs: RankingInputs) -> torch.Tensor:
        """(B, K) blended scores; the tree members read the host rows of their inputs prepared once (`HostRows`)."""
        valid, scores, rows = inputs.valid, [], None
        for i, (scorer, weight) in enumerate(zip(self.scorers, self.weights)):
            rows = HostRows.of(inputs, rows)
            scores.append(self.member_score(scorer, inputs, rows) if weight > 0 or (i == 0 and self.shortlist) else None)
            if i == 0:
                inputs = self.narrow(inputs, scores[0])
        return self.combine(scores, valid)

    @staticmethod
    def member_score(scorer: Scorer, inputs: RankingInputs, rows: HostRows) -> torch.Tensor:
        """(B, K) scores of member `scorer` on `inputs`, a tree member's on `rows` (`HostRows` of `inputs`)."""
        return scorer.score(inputs, rows) if isinstance(scorer, GBDTScorer) else scorer.score(inputs)

    def shortlisted(self, first: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """(B, K) the `valid` slots among the `shortlist` best of the first member's (B, K) scores `first`
        (all of `valid` without a shortlist); ties go to the earlier slot, so a session's shortlist is the
        same in any batch."""
        if self.shortlist is None or self.shortlist >= valid.shape[-1]:
            return valid
        order = torch.sort(first.masked_fill(~valid, float("-inf")), dim=-1, descending=True, stable=True).indices
        short = torch.zeros_like(valid).scatter_(-1, order[..., : self.shortlist], True)
        return short & valid

    def narrow(self, inputs: RankingInputs, first: torch.Tensor | None) -> RankingInputs:
        """`inputs` as the members after the first read them: only the shortlisted slots valid."""
        if self.shortlist is None or first is None:
            return inputs
        return dataclasses.replace(inputs, valid=self.shortlisted(first, inputs.valid))

    def combine(self, scores: Sequence[torch.Tensor | None], valid: torch.Tensor) -> torch.Tensor:
        """(B, K) blend of the members' (B, K) `scores` (in member order; None for a member of weight 0,
        each after the first scored on `narrow`'s slots), -inf where not `valid`."""
        short = valid if scores[0] is None else self.shortlisted(scores[0], valid)
        used = [(member, weight) for member, weight in zip(scores, self.weights) if weight > 0]
        members = standardised(torch.stack([member.to(valid.device) for member, _ in used]), short)  # all at once
        total = torch.zeros(valid.shape, dtype=torch.float64, device=valid.device)
        for each, (_, weight) in zip(members, used):
            total += weight * each
        if short is not valid:  # the rest below the lowest blended score of their session, in the first member's order
            rest = valid & ~short
            first = scores[0].to(valid.device).double()
            lowest = total.masked_fill(~short, math.inf).amin(dim=-1, keepdim=True)
            highest = first.masked_fill(~rest, -math.inf).amax(dim=-1, keepdim=True)
            total = torch.where(rest, first - highest + lowest - 1.0, total)
        return total.float().masked_fill(~valid, float("-inf"))

    def to(self, device: torch.device | str) -> BlendScorer:
        """Move every member to `device`; returns self."""
        for scorer in self.scorers:
            scorer.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        """``scorers``: each member's state dict under its position (``"0"``, ``"1"``, ...)."""
        return {"scorers": {str(i): scorer.state_dict() for i, scorer in enumerate(self.scorers)}}

    def load_state_dict(self, state: Mapping[str, Any]) -> BlendScorer:
        members = state.get("scorers")
        if not isinstance(members, Mapping) or sorted(members) != sorted(str(i) for i in range(len(self.scorers))):
            found = sorted(members) if isinstance(members, Mapping) else type(members).__name__
            raise ValueError(f"the BlendScorer state holds members {found}, its config {len(self.scorers)} scorers")
        for i, scorer in enumerate(self.scorers):
            scorer.load_state_dict(members[str(i)])
        return self
