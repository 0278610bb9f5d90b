"""Ranks of targets and the metric values of ranks: plain torch, no torchmetrics (the pipeline and
the server import this part only). See `sessrec.metrics` for the definitions and the tie rule.

Shape letters: B batch, V items, W list width, C clicked rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from sessrec.data.vocab import NUM_SPECIAL

_CUT = re.compile(r"^(recall|ndcg|mrr)@([1-9][0-9]*)$")


# -- ranks ------------------------------------------------------------------------------------------
def pessimistic_ranks(
    scores: torch.Tensor, target_scores: torch.Tensor, candidates: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) float64 number of candidates scoring at least as high as each row's target: the target's
    1-based rank when it is among the candidates, ties counted against it, and so is a candidate scored
    NaN (no score can be said to lie above it: a model that scores some items NaN earns no rank from them).

    Args:
        scores: (B, W) the scores of a row's candidates.
        target_scores: (B, 1) the score of each row's target.
        candidates: (B, W) bool, the entries that count (None: all of them).
    """
    at_least = torch.lt(scores, target_scores).logical_not_()  # >=, or NaN
    return (at_least if candidates is None else at_least & candidates).sum(dim=1).to(torch.float64)


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """1-based pessimistic rank (B,) of each target in its row of scores (B, V); inf if unrankable (a special id,
    or scored -inf or NaN).
    Scores of another shape than (B, V), or targets of another than (B,), are a ValueError naming the shapes."""
    if scores.dim() != 2:
        raise ValueError(f"scores must be (B, V) rows of item scores, got shape {tuple(scores.shape)}")
    if targets.shape != scores.shape[:1]:
        raise ValueError(f"targets must be ({scores.shape[0]},) item ids, one per row of the {tuple(scores.shape)} "
                         f"scores, got shape {tuple(targets.shape)}")
    target_score = scores.gather(1, targets.unsqueeze(1))  # (B, 1)
    ranks = pessimistic_ranks(scores, target_score)
    unrankable = (targets < NUM_SPECIAL) | ~(target_score.squeeze(1) > float("-inf"))  # scored -inf or NaN
    return ranks.masked_fill(unrankable, float("inf"))


def clicked_ranks(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """1-based pessimistic rank of each clicked row within its group: 1 + other rows scoring at least as high.

    Args:
        scores: (B,) scores.
        labels: (B,) 1 for a clicked row.
        groups: (B,) query id of each row (queries need not be contiguous).

    Returns:
        (C,) float64 ranks, one per clicked row (inf, a miss, for one scored NaN, as `target_ranks`);
        queries without a click contribute nothing. Labels or
        groups of another shape than the scores' are a ValueError naming the shapes.

    Examples:
        >>> clicked_ranks(torch.tensor([3., 1., 2., 5., 5.]), torch.tensor([0, 0, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1])).tolist()
        [2.0, 2.0]
    """
    if scores.dim() != 1 or labels.shape != scores.shape or groups.shape != scores.shape:
        raise ValueError(f"labels {tuple(labels.shape)} and groups {tuple(groups.shape)} must be {tuple(scores.shape)} "
                         "as the scores, one score, label and query id per row")
    _, local = torch.unique(groups, return_inverse=True)  # (B,) query index 0..G-1
    clicked = torch.nonzero(labels > 0.5).squeeze(1)  # (C,)
    same = local.unsqueeze(0) == local[clicked].unsqueeze(1)  # (C, B) the rows of each click's query, itself included
    ranks = pessimistic_ranks(scores.unsqueeze(0), scores[clicked].unsqueeze(1), same)
    return ranks.masked_fill(torch.isnan(scores[clicked]), float("inf"))  # a clicked row scored NaN: a miss


def list_ranks(recommended: torch.Tensor, scores: torch.Tensor, targets: torch.Tensor, by_score: bool = True) -> torch.Tensor:
    """(N,) float64 1-based rank of each target within its served list; inf when it is not found. Shapes
    other than those below are a ValueError naming them.

    Args:
        recommended: (N, W) item ids as served, 0 at empty slots.
        scores: (N, W) their scores.
        targets: (N,) the items to find.
        by_score: the lists are served in score order (the top-k by score). Their order among
            equal scores says nothing, so ties count against the target: its rank is 1 + the
            number of other listed items scoring at least as high, and since unlisted items score
            no higher than a full list's last entry, a target scoring no higher than that entry
            counts as a miss. False: the lists are served in another order (sampled), and the rank
            of a target is its position in the list.

    Examples:
        >>> list_ranks(torch.tensor([[4, 7, 9], [4, 9, 7]]), torch.tensor([[3., 2., 2.], [3., 2., 1.]]), torch.tensor([7, 9])).tolist()
        [inf, 2.0]
    """
    if recommended.dim() != 2 or scores.shape != recommended.shape or targets.shape != recommended.shape[:1]:
        raise ValueError(f"list_ranks takes (N, W) recommended ids and scores and (N,) targets, got shapes "
                         f"{tuple(recommended.shape)}, {tuple(scores.shape)} and {tuple(targets.shape)}")
    hit = recommended == targets.long().unsqueeze(1)
    found = hit.any(dim=1)
    if by_score:
        target_score = torch.where(hit, scores, torch.full_like(scores, float("-inf"))).amax(dim=1, keepdim=True)
        rank = 1.0 + pessimistic_ranks(scores, target_score, (recommended != 0) & ~hit)  # the other listed items
        # a full list says nothing of the unlisted items that tie with its last entry: count them all against the target
        found &= ~((recommended[:, -1] != 0) & (target_score.squeeze(1) <= scores[:, -1]))
    else:
        rank = (hit.int().argmax(dim=1) + 1).double()  # (N,) the position served
    return torch.where(found, rank, torch.full_like(rank, float("inf")))


# -- values of ranks -----------------------------------------------------------------------------
def rank_values(ranks: torch.Tensor, metric: str) -> torch.Tensor:
    """(P,) float64 value of `metric` for each target from its 1-based rank (inf: a miss).

    ``recall@K``: 1 if rank <= K; ``ndcg@K``: 1 / log2(rank + 1) if rank <= K; ``mrr@K``: 1 / rank
    if rank <= K; ``mrr``: 1 / rank (no cut-off: the click-out MRR). Else 0. A rank below 1 or NaN
    (a 0-based rank, say) is a ValueError naming the first.

    Examples:
        >>> rank_values(torch.tensor([1.0, 3.0, float("inf")]), "mrr@2").tolist()
        [1.0, 0.0, 0.0]
    """
    # a tensor keeps its device (torch.as_tensor would move it to the default device of a `torch.device` context)
    ranks = ranks.to(torch.float64) if isinstance(ranks, torch.Tensor) else torch.as_tensor(ranks, dtype=torch.float64)
    bad = ~(ranks >= 1.0)  # NaN included
    if bool(bad.any()):
        at = int(bad.reshape(-1).nonzero()[0])
        raise ValueError(f"ranks are 1-based (1: first, inf: a miss), got {ranks.reshape(-1)[at].item()} at {at}")
    if metric == "mrr":
        return 1.0 / ranks
    cut = _CUT.match(metric)
    if cut is None:
        raise ValueError(f"metric {metric!r} is not a mean over test pairs; use recall@K, ndcg@K, mrr@K or mrr")
    name, k = cut.group(1), int(cut.group(2))
    hit = ranks <= k
    if name == "recall":
        return hit.to(torch.float64)
    finite = torch.where(hit, ranks, torch.ones_like(ranks))
    value = 1.0 / torch.log2(finite + 1.0) if name == "ndcg" else 1.0 / finite
    return torch.where(hit, value, torch.zeros_like(value))


def rank_sums(ranks: torch.Tensor, ks: Sequence[int]) -> dict[str, torch.Tensor]:
    """Sums over targets of Recall@K, NDCG@K and MRR@K for each K in `ks` (float64 scalars, to divide by N).

    Examples:
        >>> {k: round(float(v), 4) for k, v in rank_sums(torch.tensor([2.0, float("inf")]), [2]).items()}
        {'recall@2': 1.0, 'ndcg@2': 0.6309, 'mrr@2': 0.5}
    """
    return {f"{name}@{k}": rank_values(ranks, f"{name}@{k}").sum() for k in ks for name in ("recall", "ndcg", "mrr")}
