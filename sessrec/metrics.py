"""Rank metrics, in one place: next-item tasks, click-out ranking, the pipeline's served lists, the
ranker's early stopping and the retraining gate all compute them here.

Every metric is a function of the 1-based rank of a target (`rank_values`): Recall@K (= HR@K)
is 1, NDCG@K = 1 / log2(rank + 1) and MRR@K = 1 / rank when rank <= K, else 0; ``mrr`` (no
cut-off) is 1 / rank. A rank of inf is a miss. The ranks come from

- `target_ranks`: a target among a full catalogue row of scores (`TopKMetrics`);
- `clicked_ranks`: a clicked row among the rows of its query (`RankingMetrics`);
- `list_ranks`: a target within a served list (the pipeline's evaluation);
- `pessimistic_ranks`: the shared rule below, for any row of scores and a target score.

Ties are broken pessimistically everywhere: the rank of the target is 1 + the number of *other*
candidates scoring at least as high, so a model that scores everything equally earns nothing.
A target that cannot be recommended (padding or OOV, scored -inf) is a miss. AUC is torchmetrics'
binary AUROC (`binary_auc`), tied scores counted half.

Shape letters: B batch, V items, W list width, C clicked rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_auroc

from sessrec.data.vocab import NUM_SPECIAL

_CUT = re.compile(r"^(recall|ndcg|mrr)@([1-9][0-9]*)$")


# -- ranks ------------------------------------------------------------------------------------------
def pessimistic_ranks(
    scores: torch.Tensor, target_scores: torch.Tensor, candidates: torch.Tensor | None = None
) -> torch.Tensor:
    """(B,) float64 number of candidates scoring at least as high as each row's target: the target's
    1-based rank when it is among the candidates, ties counted against it.

    Args:
        scores: (B, W) the scores of a row's candidates.
        target_scores: (B, 1) the score of each row's target.
        candidates: (B, W) bool, the entries that count (None: all of them).
    """
    at_least = scores >= target_scores
    return (at_least if candidates is None else at_least & candidates).sum(dim=1).to(torch.float64)


def target_ranks(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """1-based pessimistic rank (B,) of each target in its row of scores (B, V); inf if unrankable."""
    target_score = scores.gather(1, targets.unsqueeze(1))  # (B, 1)
    ranks = pessimistic_ranks(scores, target_score)
    unrankable = (targets < NUM_SPECIAL) | ~torch.isfinite(target_score.squeeze(1))
    return ranks.masked_fill(unrankable, float("inf"))


def clicked_ranks(scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """1-based pessimistic rank of each clicked row within its group: 1 + other rows scoring at least as high.

    Args:
        scores: (B,) scores.
        labels: (B,) 1 for a clicked row.
        groups: (B,) query id of each row (queries need not be contiguous).

    Returns:
        (C,) float64 ranks, one per clicked row; queries without a click contribute nothing.

    Examples:
        >>> clicked_ranks(torch.tensor([3., 1., 2., 5., 5.]), torch.tensor([0, 0, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1])).tolist()
        [2.0, 2.0]
    """
    _, local = torch.unique(groups, return_inverse=True)  # (B,) query index 0..G-1
    clicked = torch.nonzero(labels > 0.5).squeeze(1)  # (C,)
    same = local.unsqueeze(0) == local[clicked].unsqueeze(1)  # (C, B) the rows of each click's query, itself included
    return pessimistic_ranks(scores.unsqueeze(0), scores[clicked].unsqueeze(1), same)


def list_ranks(recommended: torch.Tensor, scores: torch.Tensor, targets: torch.Tensor, by_score: bool = True) -> torch.Tensor:
    """(N,) float64 1-based rank of each target within its served list; inf when it is not found.

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
    if rank <= K; ``mrr``: 1 / rank (no cut-off: the click-out MRR). Else 0.

    Examples:
        >>> rank_values(torch.tensor([1.0, 3.0, float("inf")]), "mrr@2").tolist()
        [1.0, 0.0, 0.0]
    """
    ranks = torch.as_tensor(ranks, dtype=torch.float64)
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


def binary_auc(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ROC AUC (torchmetrics' binary AUROC, exact) with tied scores counted half; NaN when one class is absent.

    The scores go in as their order (dense ranks scaled into [0, 1]), so logits of any size keep
    their order and ties exactly.

    Examples:
        >>> float(binary_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0., 0., 1., 1.])))
        0.75
    """
    scores, labels = scores.double().flatten(), labels.flatten() > 0.5
    n_pos = int(labels.sum())
    if n_pos == 0 or n_pos == labels.numel():
        return torch.tensor(float("nan"), dtype=torch.float64)
    distinct, order = torch.unique(scores, return_inverse=True)
    preds = order.double() / max(len(distinct) - 1, 1)  # (B,) in [0, 1], the order and ties of the scores
    return binary_auroc(preds, labels.long(), thresholds=None).double()


# -- accumulated over batches ------------------------------------------------------------------------
class TopKMetrics(Metric):
    """Recall@K, NDCG@K and MRR@K for several K, summed over batches and reduced across processes.

    Examples:
        >>> m = TopKMetrics(ks=[1, 2])
        >>> m.update(torch.tensor([[0., 0., 3., 2., 1.]]), torch.tensor([3]))
        >>> {k: round(float(v), 4) for k, v in m.compute().items()}
        {'recall@1': 0.0, 'ndcg@1': 0.0, 'mrr@1': 0.0, 'recall@2': 1.0, 'ndcg@2': 0.6309, 'mrr@2': 0.5}
    """

    full_state_update = False

    def __init__(self, ks: Sequence[int] = (10, 20)) -> None:
        super().__init__()
        if not ks or min(ks) < 1:
            raise ValueError(f"ks must be positive cut-offs, got {list(ks)}")
        self.ks = sorted(set(int(k) for k in ks))
        n = len(self.ks)
        self.add_state("recall", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("ndcg", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("mrr", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        ranks = target_ranks(scores.detach(), targets)  # (B,)
        sums = rank_sums(ranks, self.ks)
        for name in ("recall", "ndcg", "mrr"):
            getattr(self, name).add_(torch.stack([sums[f"{name}@{k}"] for k in self.ks]))
        self.count += ranks.numel()

    def compute(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        n = self.count.clamp(min=1.0)
        out: dict[str, torch.Tensor] = {}
        for i, k in enumerate(self.ks):
            out[f"recall@{k}"] = (self.recall[i] / n).float()
            out[f"ndcg@{k}"] = (self.ndcg[i] / n).float()
            out[f"mrr@{k}"] = (self.mrr[i] / n).float()
        return out


class RankingMetrics(Metric):
    """AUC, log-loss (for logits), MRR and recall@k of clicked rows within their queries.

    Queries must not be split across ``update`` calls (the evaluation loader cuts batches at
    query boundaries).
    """

    full_state_update = False

    def __init__(self, ks: list[int] = [1, 5, 20], logits: bool = True) -> None:  # noqa: B006 - read only
        super().__init__()
        self.ks, self.logits = sorted(set(ks)), logits
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        self.add_state("rr", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("hits", default=torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("queries", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> None:  # type: ignore[override]
        scores = scores.detach().float()
        ranks = clicked_ranks(scores, labels, groups)
        self.rr += rank_values(ranks, "mrr").sum()
        self.hits += torch.stack([rank_values(ranks, f"recall@{k}").sum() for k in self.ks]).to(self.hits.device)
        self.queries += ranks.numel()
        self.scores.append(scores)
        self.labels.append(labels.detach().float())

    def compute(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        scores = torch.cat(self.scores) if isinstance(self.scores, list) else self.scores
        labels = torch.cat(self.labels) if isinstance(self.labels, list) else self.labels
        n = self.queries.clamp(min=1.0)
        out = {"auc": binary_auc(scores, labels).float(), "mrr": (self.rr / n).float()}
        if self.logits:
            out["logloss"] = F.binary_cross_entropy_with_logits(scores, labels)
        for i, k in enumerate(self.ks):
            out[f"recall@{k}"] = (self.hits[i] / n).float()
        return out
