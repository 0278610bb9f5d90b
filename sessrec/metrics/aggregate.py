"""Metrics accumulated over batches and reduced across processes (torchmetrics), and AUC.

`TopKMetrics` (next item over the full catalogue) and `RankingMetrics` (clicked rows within
their queries) sum the values of `sessrec.metrics.ranks`; `binary_auc` is torchmetrics' binary
AUROC. See `sessrec.metrics` for the definitions and the tie rule.

Shape letters: B batch, V items, C clicked rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_auroc

from sessrec.metrics.ranks import clicked_ranks, rank_sums, rank_values, target_ranks


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



def cutoffs(ks: Sequence[int]) -> list[int]:
    """The distinct cut-offs `ks` in increasing order; a ValueError unless they are one or more integers >= 1."""
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be positive integer cut-offs, got {list(ks)}")
    return sorted(set(ks))


# -- accumulated over batches ------------------------------------------------------------------------
class TopKMetrics(Metric):
    """Recall@K, NDCG@K and MRR@K for several K, summed over batches and reduced across processes, and
    ``unrankable``: the share of targets that no list can hold (`target_ranks`' inf: scored -inf, as an item
    of the session under ``exclude_seen`` or an item the model never recommends, or outside the vocabulary).
    Each counts as a miss; the share says how much of a figure the protocol decided before any model
    (on data where users repeat items, ``exclude_seen`` can rule out most targets).

    Examples:
        >>> m = TopKMetrics(ks=[1, 2])
        >>> m.update(torch.tensor([[0., 0., 3., 2., 1.], [0., 0., 1., 2., float("-inf")]]), torch.tensor([3, 4]))
        >>> {k: round(float(v), 4) for k, v in m.compute().items()}
        {'recall@1': 0.0, 'ndcg@1': 0.0, 'mrr@1': 0.0, 'recall@2': 0.5, 'ndcg@2': 0.3155, 'mrr@2': 0.25, 'unrankable': 0.5}
    """

    full_state_update = False

    def __init__(self, ks: Sequence[int] = (10, 20)) -> None:
        super().__init__()
        self.ks = cutoffs(ks)
        n = len(self.ks)
        self.add_state("recall", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("ndcg", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("mrr", default=torch.zeros(n, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("unrankable", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    @property
    def names(self) -> list[str]:
        """The keys of `compute`, in its order."""
        return [*(f"{name}@{k}" for k in self.ks for name in ("recall", "ndcg", "mrr")), "unrankable"]

    def update(self, scores: torch.Tensor, targets: torch.Tensor) -> None:  # type: ignore[override]
        ranks = target_ranks(scores.detach(), targets)  # (B,)
        sums = rank_sums(ranks, self.ks)
        for name in ("recall", "ndcg", "mrr"):
            getattr(self, name).add_(torch.stack([sums[f"{name}@{k}"] for k in self.ks]))
        self.unrankable += torch.isinf(ranks).sum()
        self.count += ranks.numel()

    def compute(self) -> dict[str, torch.Tensor]:  # type: ignore[override]
        n = self.count.clamp(min=1.0)
        out: dict[str, torch.Tensor] = {}
        for i, k in enumerate(self.ks):
            out[f"recall@{k}"] = (self.recall[i] / n).float()
            out[f"ndcg@{k}"] = (self.ndcg[i] / n).float()
            out[f"mrr@{k}"] = (self.mrr[i] / n).float()
        out["unrankable"] = (self.unrankable / n).float()
        return out


class RankingMetrics(Metric):
    """AUC, log-loss (for logits), MRR and recall@k of clicked rows within their queries.

    Queries must not be split across ``update`` calls (the evaluation loader cuts batches at
    query boundaries).
    """

    full_state_update = False

    def __init__(self, ks: list[int] = [1, 5, 20], logits: bool = True) -> None:  # noqa: B006 - read only
        super().__init__()
        self.ks, self.logits = cutoffs(ks), logits
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        self.add_state("rr", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("hits", default=torch.zeros(len(self.ks), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("queries", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    @property
    def names(self) -> list[str]:
        """The keys of `compute`, in its order."""
        return ["auc", "mrr", *(["logloss"] if self.logits else []), *(f"recall@{k}" for k in self.ks)]

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
